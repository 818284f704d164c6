"""Parsing Python in the grader's threads: one lock around every syntax tree the grader builds or compiles.

CPython 3.11 keeps the depth counter of its syntax-tree conversion per interpreter, not per thread: two threads
that parse at once (a review beside a similarity fingerprint, say) can make one of them raise `SystemError: AST
constructor recursion depth mismatch`, and the cell it was reading is then taken for one that does not parse.
"""

from __future__ import annotations

import ast
import threading
from types import CodeType

_LOCK = threading.Lock()


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    """ast.parse(source, filename), one thread at a time."""
    with _LOCK:
        return ast.parse(source, filename)


def compile_tree(tree: ast.Module, filename: str) -> CodeType:
    """compile(tree, filename, "exec"), one thread at a time (it converts the tree back, with the same counter)."""
    with _LOCK:
        return compile(tree, filename, "exec")
