"""The sandbox's front door: code outside autograder/sandbox/ imports it through `autograder.sandbox` and names in
its __all__ only, never one of its modules (a test that tests an internal module through its public names aside)."""

from __future__ import annotations

import ast
import io
import tokenize
from collections import Counter
from pathlib import Path

import autograder.sandbox as sandbox
from autograder.config import ROOT

PACKAGE = "autograder.sandbox"
FOLDERS = ("autograder", "tests", "assignments", "reference", "benchmarks", "student_templates")
# Tests that test an internal module through its public names (the file, relative to the checkout: the modules).
INTERNAL = {"tests/engine/test_execute_guard.py": {"guard", "frames"},  # the guard itself, and its check mark
            "tests/engine/test_harness_modules.py": {"guard"},  # the guard's list of the child's modules
            "tests/engine/test_notebook.py": {"child"},  # the child's fast path through IPython
            "tests/engine/test_cluster_engine.py": {"isolation"},  # the uid blocks two graders reserve
            "tests/lesson83/test_batch.py": {"frames"}}  # an attack that forges frames on the child's channel


def _outside() -> list[Path]:
    inside = ROOT / "autograder" / "sandbox"
    return sorted(p for d in FOLDERS for p in (ROOT / d).rglob("*.py")
                  if not p.is_relative_to(inside) and "__pycache__" not in p.parts)


def door_violations(path: Path, tree: ast.AST) -> list[str]:
    """Each import in `tree` that goes past the front door: `from autograder.sandbox.X import`, `import
    autograder.sandbox.X`, or a name of `from autograder.sandbox import` that its __all__ does not hold."""
    rel = path.relative_to(ROOT).as_posix()
    allowed = {f"{PACKAGE}.{m}" for m in INTERNAL.get(rel, ())}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [f"{rel}:{node.lineno} import {a.name}" for a in node.names
                      if a.name.startswith(PACKAGE + ".") and a.name not in allowed]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if node.module.startswith(PACKAGE + ".") and node.module not in allowed:
                found.append(f"{rel}:{node.lineno} from {node.module} import ...")
            elif node.module == PACKAGE:
                found += [f"{rel}:{node.lineno} from {PACKAGE} import {a.name} (not in its __all__)"
                          for a in node.names if a.name not in sandbox.__all__]
    return found


def test_code_outside_the_sandbox_imports_it_through_its_front_door() -> None:
    files = _outside()
    assert len(files) > 50 and ROOT / "autograder" / "grading" / "batch.py" in files
    bad = [v for path in files for v in door_violations(path, ast.parse(path.read_text(), str(path)))]
    assert not bad, "import the sandbox from autograder.sandbox (its __all__):\n" + "\n".join(bad)


def test_the_check_finds_each_way_past_the_door() -> None:
    path = ROOT / "autograder" / "grading" / "x.py"
    tree = ast.parse("import autograder.sandbox.pool\nfrom autograder.sandbox.worker import Worker\n"
                     "from autograder.sandbox import pool\nfrom autograder.sandbox import WorkerPool\n")
    assert [v.split(" ", 1)[0] for v in door_violations(path, tree)] == [
        "autograder/grading/x.py:1", "autograder/grading/x.py:2", "autograder/grading/x.py:3"]


def test_every_public_name_of_the_front_door_resolves() -> None:
    assert sandbox.__all__ == sorted(sandbox.__all__)
    for name in sandbox.__all__:
        assert getattr(sandbox, name) is not None, name


def spellings(source: str) -> Counter[str]:
    """How often each identifier is written in Python code, as a name or as a string of its own (docstrings and
    comments, which only mention names, aside)."""
    found: Counter[str] = Counter()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.NAME:
            found[tok.string] += 1
        elif tok.type == tokenize.STRING and tok.string[1:-1].isidentifier():
            found[tok.string[1:-1]] += 1
    return found


def test_the_front_doors_names_are_written_once() -> None:
    """Each public name is written once in the front door (its import under TYPE_CHECKING), its __all__ and its map
    of lazy imports read from there: a new name is one line."""
    written = spellings((ROOT / "autograder" / "sandbox" / "__init__.py").read_text())
    assert len(sandbox.__all__) > 40
    assert {name: written[name] for name in sandbox.__all__ if written[name] != 1} == {}
    # what the check finds: a name listed again in __all__ and in a map of its module
    assert spellings('from x import Limits\n__all__ = ["Limits"]\nMAP = {"Limits": "limits"}\n')["Limits"] == 3
