"""When a class's grading starts its sandbox (issue 43, item 2): a first run into an empty grades folder asks for
the pool before the suite is read, so that the two overlap; a re-run into a folder that holds results asks only
once it knows it has something to run, and not at all when it has nothing to run."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from autograder.course import Course
from autograder.grading import batch
from autograder.grading.batch import grade_batch

EMPTY_NOTEBOOK = {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def _watch(monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], threading.Event]:
    """Record, in order, when the pool is asked for and when the suite is read; a read waits (20 s at most) for the
    pool to be asked, so that a pool asked first is seen first."""
    events: list[str] = []
    asked = threading.Event()
    read = Course.read_suite

    def fake_pool(course: Course, *, size: int, **_: Any) -> Any:
        events.append("pool")
        asked.set()
        raise RuntimeError("no sandbox in this test")

    def watched_read(self: Course, **kwargs: Any) -> Any:
        asked.wait(timeout=20)
        events.append("suite")
        return read(self, **kwargs)

    monkeypatch.setattr(batch, "make_pool", fake_pool)
    monkeypatch.setattr(Course, "read_suite", watched_read)
    return events, asked


def _one_student(root: Path, course: Course) -> Path:
    folder = root / "class" / "ada"
    folder.mkdir(parents=True)
    (folder / f"{course.lesson.name}.ipynb").write_text(json.dumps(EMPTY_NOTEBOOK))
    return root / "class"


def test_a_first_run_asks_for_the_sandbox_before_the_suite_is_read(course: Course, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    events, _ = _watch(monkeypatch)
    summary = grade_batch(_one_student(tmp_path, course), out=tmp_path / "grades", course=Course.load(course.path),
                          progress=False)
    assert events == ["pool", "suite"]
    assert summary.graded_now == 0  # the (fake) sandbox could not start: the row says so and nothing is stored


def test_a_rerun_asks_only_when_it_has_something_to_run(course: Course, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A grades folder that holds a result (here a damaged one: it is graded again) is a re-run: the suite is read
    first and the pool asked after; an empty class folder then asks for no pool at all."""
    events, asked = _watch(monkeypatch)
    asked.set()  # nothing to wait for: the order is the code's own
    grades = tmp_path / "grades" / "results"
    grades.mkdir(parents=True)
    (grades / "someone.json").write_text("{}")
    grade_batch(_one_student(tmp_path, course), out=tmp_path / "grades", course=Course.load(course.path),
                progress=False)
    assert events == ["suite", "pool"]
    events.clear()
    (tmp_path / "empty").mkdir()
    grade_batch(tmp_path / "empty", out=tmp_path / "grades", course=Course.load(course.path), progress=False)
    assert events == ["suite"]
