"""The grader's threads parse Python one at a time (autograder/pyast.py): CPython 3.11 keeps the counter of its
syntax-tree conversion per interpreter, and two threads that parse at once (a review beside an in-process run of a
trusted notebook, say) made one raise `SystemError: AST constructor recursion depth mismatch`: the cell that
defined `alibi_*` was then skipped and an honest notebook scored 72 of 86 under load
(`test_ids_are_unique_readable_and_spreadsheet_safe`, issue 40 item 4's first flake)."""

from __future__ import annotations

import ast
import gc
import threading
import time
from pathlib import Path

from autograder.config import ROOT
from autograder.pyast import parse

SOURCE = "x = " + "(" * 120 + "[1, 2]" + ")" * 120 + "\n" + "def f(a):\n    return [b for b in a if b]\n" * 40
# Modules of the grader process that may parse in more than one thread: no syntax tree built past the lock.
THREADED = ("grading", "report")


def _hammer(fn: object, *, threads: int, each: int) -> list[BaseException]:
    """Parse SOURCE `each` times in each of `threads` threads, a thread switch forced inside every garbage
    collection (as a finalizer that runs Python makes one); the SystemErrors seen."""
    errors: list[BaseException] = []

    def run() -> None:
        for _ in range(each):
            try:
                fn(SOURCE)  # type: ignore[operator]
            except SystemError as exc:
                errors.append(exc)

    switch = lambda *_: time.sleep(0)  # noqa: E731
    old = gc.get_threshold()
    gc.set_threshold(20, 1, 1)
    gc.callbacks.append(switch)
    try:
        workers = [threading.Thread(target=run) for _ in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    finally:
        gc.callbacks.remove(switch)
        gc.set_threshold(*old)
    return errors


def test_threads_that_parse_through_the_lock_never_see_the_counter_race() -> None:
    assert _hammer(parse, threads=6, each=60) == []


def test_no_module_the_grader_runs_in_threads_builds_a_syntax_tree_past_the_lock() -> None:
    found = []
    for folder in THREADED:
        for path in sorted((ROOT / "autograder" / folder).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                called = node.func if isinstance(node, ast.Call) else None
                if isinstance(called, ast.Attribute) and called.attr == "parse" and \
                        isinstance(called.value, ast.Name) and called.value.id == "ast":
                    found.append(f"{Path(path).relative_to(ROOT)}:{node.lineno} ast.parse")
                if isinstance(called, ast.Name) and called.id == "compile":
                    found.append(f"{Path(path).relative_to(ROOT)}:{node.lineno} compile")
    assert found == [], "parse with autograder.pyast.parse / compile_tree: " + ", ".join(found)
