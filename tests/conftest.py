"""Shared fixtures: one fresh release build per test session, and the grading suite."""

from __future__ import annotations

from pathlib import Path

import pytest

from autograder.build import build
from autograder.suite import Suite, load_suite


@pytest.fixture(scope="session")
def suite() -> Suite:
    return load_suite()


@pytest.fixture(scope="session")
def fresh_build(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The whole release, built from the sources with the real otter assign and nbgrader."""
    return build(work=tmp_path_factory.mktemp("release"))
