"""A probe module importable while a block runs (a checks module for the sandbox)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest


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
