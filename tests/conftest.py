"""Shared fixtures (one fresh release build per test session, the grading suite) and the test tiers.

Tiers: the markers of pyproject.toml (sandbox, build, browser, training, deploy). `make check` runs the tests that
carry none of them; `make test` runs them all. A test that uses fresh_build is marked `build` here; the test
modules mark the rest. A test without the marker that starts the sandbox, the checkpoint reader or training
fails and names the marker to add, so the quick tier stays quick.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import pytest

from autograder import checkpoint
from autograder.authoring.suite import Suite
from autograder.config import ROOT
from autograder.course import Course, course_of
from autograder.release import build, release
from autograder.sandbox import WorkerPool
from helpers.isolation import readable_python  # noqa: F401 - a fixture of the uid fallback's tests, shared from here


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist, each worker computes on one torch thread: the workers already fill the cores, and two
    threads per worker on tensors this small spin against each other (make check took half again as long)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "fresh_build" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.build)


@pytest.fixture(autouse=True)
def _tier_is_marked(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Within a test, starting what a tier's marker names needs that marker (fixtures of wider scope start
    before this guard and are not seen by it)."""
    marks = {m.name for m in request.node.iter_markers()}

    def refuse(what: str, marker: str) -> Callable[..., NoReturn]:
        def stop(*_: Any, **__: Any) -> NoReturn:
            pytest.fail(f"{request.node.nodeid} {what} but is not marked {marker}: add @pytest.mark.{marker} "
                        "(the tiers are in pyproject.toml)", pytrace=False)
        return stop

    if "sandbox" not in marks:
        monkeypatch.setattr(WorkerPool, "__init__", refuse("starts the grader's sandbox", "sandbox"))
        monkeypatch.setattr(checkpoint.Verifier, "start", refuse("starts the checkpoint reader", "sandbox"))
    lesson = course_of().lesson
    if "training" not in marks and lesson.trainer_file is not None:
        monkeypatch.setattr(lesson.trainer, "train", refuse("trains the milestone's model", "training"))



@pytest.fixture(scope="session")
def course() -> Course:
    """The package's own course (grading_config.yaml beside autograder/): every stage is given its course, none
    falls back to this one by itself. A test module may define its own `course` fixture in place of this one."""
    return course_of()


@pytest.fixture(scope="session")
def suite(course: Course) -> Suite:
    return course.suite


@pytest.fixture(scope="session")
def fresh_build(course: Course, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The whole release, built from the sources with the real otter assign and nbgrader."""
    return build(work=tmp_path_factory.mktemp("release"), course=course)


DEMO = ROOT / "tests" / "fixtures" / "lesson_demo"


@pytest.fixture(scope="session")
def demo_course(tmp_path_factory: pytest.TempPathFactory) -> Course:
    """A copy of the demo lesson's course folder (tests/fixtures/lesson_demo), released once per session with the
    real otter assign and nbgrader: its student notebook is `course.lesson.student_dir / "lesson_demo.ipynb"`, its
    sample class `course.lesson.root / "dist" / "samples"`. The engine's tests grade and attack this lesson."""
    root = tmp_path_factory.mktemp("demo-release") / "lesson_demo"
    shutil.copytree(DEMO, root, ignore=shutil.ignore_patterns("__pycache__"))
    course = Course.load(root / "grading_config.yaml")
    release(course=course)
    return course
