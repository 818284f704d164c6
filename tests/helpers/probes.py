"""A probe module importable while a block runs (a checks module for the sandbox)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

# The smallest checks module: a probe calls the notebook's function of its name with the case's `args`.
CALL_CHECKS = '''
def run_probe(env, name, args):
    fn = env.get(name)
    if fn is None:
        return {"error": {"type": "NameError", "message": f"{name} is not defined"}}
    try:
        return {"value": fn(*args.get("args", []))}
    except Exception as exc:
        return {"error": {"type": type(exc).__name__, "message": str(exc)[:200]}}
'''


@contextmanager
def importable(tmp_path_factory: pytest.TempPathFactory, name: str, source: str) -> Iterator[str]:
    """A module `name` holding `source`, importable (a probe module for the sandbox) while the block runs."""
    folder = tmp_path_factory.mktemp("probes")
    (folder / f"{name}.py").write_text(source)
    sys.path.insert(0, str(folder))
    try:
        yield name
    finally:
        sys.path.remove(str(folder))
