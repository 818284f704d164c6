"""Notebooks and a checks module for the sandbox's time-limit tests, and a copy of the demo course with other
limits."""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import yaml

from autograder.config import ROOT

FIXTURE = ROOT / "tests" / "fixtures" / "lesson_demo"

FAKE_CHECKS = '''
def run_probe(env, name, args):
    fn = env.get(name)
    if fn is None:
        return {"error": {"type": "NameError", "message": f"{name} is not defined"}}
    return {"value": fn(*args.get("args", []))}
'''


def nb(*cells: str) -> bytes:
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_markdown_cell("# A notebook"), *map(nbformat.v4.new_code_cell, cells)]
    return nbformat.writes(notebook).encode()


def demo_copy(tmp: Path, **execution: float) -> Path:
    """A copy of the demo course (tests/fixtures/lesson_demo) with these execution limits; its config's path."""
    root = tmp / "lesson_demo"
    shutil.copytree(FIXTURE, root, ignore=shutil.ignore_patterns("__pycache__"))
    raw = yaml.safe_load((root / "grading_config.yaml").read_text())
    raw["execution"] |= execution
    path = root / "grading_config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path
