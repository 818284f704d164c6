"""One name per concept (issue 39): the checkpoint's verdict is CheckpointVerdict (the checks runtime's Verdict is a
case's), the notebook readers and the plug-in's reader pool each have one name, and the engine and the lessons use
the new names; the old ones stay as aliases for one release where plug-ins use them."""

from __future__ import annotations

import ast
from pathlib import Path

from autograder import checkpoint, model
from autograder.config import ROOT

FOLDERS = ("autograder", "assignments", "tests/fixtures")
# Where the old names stay, as aliases for one release (the plug-in API): each file's own alias line.
ALIASES = {"autograder/model.py", "autograder/checkpoint.py"}


def _files() -> list[Path]:
    return sorted(p for d in FOLDERS for p in (ROOT / d).rglob("*.py") if "__pycache__" not in p.parts)


def defined(name: str) -> list[str]:
    """The engine's modules that define `name` at their top level (a function or a class)."""
    return [p.relative_to(ROOT).as_posix() for p in sorted((ROOT / "autograder").rglob("*.py"))
            for node in ast.parse(p.read_text()).body
            if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name == name]


def old_names(tree: ast.AST) -> list[str]:
    """Each use of the checkpoint's old names in a module: `checkpoint.Verdict`, `checkpoint.pool`, and Verdict or
    pool imported from autograder.model or autograder.checkpoint."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "checkpoint" \
                and node.attr in ("Verdict", "pool"):
            found.append(f"{node.lineno}: checkpoint.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module in ("autograder.model", "autograder.checkpoint"):
            found += [f"{node.lineno}: from {node.module} import {a.name}" for a in node.names
                      if a.name in ("Verdict", "pool")]
    return found


def test_the_checkpoints_verdict_is_checkpoint_verdict_and_the_old_name_an_alias() -> None:
    assert model.CheckpointVerdict.__name__ == "CheckpointVerdict"
    assert model.Verdict is model.CheckpointVerdict  # for one release: the plug-in API
    assert checkpoint.CheckpointVerdict is checkpoint.Verdict is model.CheckpointVerdict
    assert {"CheckpointVerdict", "Verdict", "reader_pool", "pool"} <= set(checkpoint.__all__)
    assert checkpoint.pool is checkpoint.reader_pool
    assert defined("Verdict") == ["autograder/runtime/checks_runtime.py"]  # a case's verdict, nothing else
    assert defined("CheckpointVerdict") == ["autograder/model.py"]


def test_the_engine_and_the_lessons_use_the_new_names() -> None:
    bad = {p.relative_to(ROOT).as_posix(): found for p in _files()
           if p.relative_to(ROOT).as_posix() not in ALIASES and (found := old_names(ast.parse(p.read_text())))}
    assert bad == {}
    # what the check finds
    assert old_names(ast.parse("from autograder.model import PartVerdict, Verdict\nx = checkpoint.pool(p)\n")) == [
        "1: from autograder.model import Verdict", "2: checkpoint.pool"]


def test_each_notebook_reader_and_pool_has_one_name() -> None:
    """The grader's reader of a notebook's bytes is the sandbox's read_notebook, the report's reader of a recorded
    submission submission_cells; the pool of a plug-in's readers is reader_pool (the sandbox's, and the checkpoint
    engine's binding of it for the plug-ins), and no function is named pool."""
    assert defined("read_notebook") == ["autograder/sandbox/notebook.py"]
    assert defined("submission_cells") == ["autograder/report/code.py"]
    assert defined("pool") == []
    assert defined("reader_pool") == ["autograder/checkpoint.py", "autograder/sandbox/files.py"]


def test_the_words_of_a_blank_stub_are_spelled_once() -> None:
    """"not filled in yet" is written in one string of code, the shipped runtime's NOT_FILLED (its STUB, what a probe
    says of a blank stub, is made of it); the engine's messages and the lessons' checks take them from there."""
    spelled = []
    for path in _files():
        tree = ast.parse(path.read_text())
        docs = {id(n.body[0].value) for n in ast.walk(tree)  # docstrings say it in prose
                if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and n.body
                and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        spelled += [path.relative_to(ROOT).as_posix() for node in ast.walk(tree)
                    if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
                    and "filled in yet" in node.value]
    assert spelled == ["autograder/runtime/checks_runtime.py"], spelled
    from autograder.config import DEFAULT_CONFIG
    from autograder.course import course_of

    runtime = course_of(DEFAULT_CONFIG).lesson.runtime
    assert runtime.STUB == f"the stub is {runtime.NOT_FILLED}"
