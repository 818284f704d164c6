"""Results are keyed by what grading reads, not by the prose (issue 42, item 5): a text-only edit of a question keeps
the suite's fingerprint (so every stored result and the expected-values cache are reused); a change to a case, a
point or the engine changes it (so the class is graded again). On a copy of the demo lesson."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from autograder.authoring import suite as suite_module
from autograder.config import ROOT
from autograder.course import Course
from autograder.grading.batch import grade_batch

FIXTURE = ROOT / "tests" / "fixtures" / "lesson_demo"
Q1 = Path("assignments") / "lesson_demo" / "q1_center.md"


def _copy(tmp_path: Path, source: Path = FIXTURE) -> Path:
    root = tmp_path / "course"
    shutil.copytree(source, root, ignore=shutil.ignore_patterns("__pycache__", "dist", "student_templates"))
    return root


def _fingerprint(root: Path) -> str:
    return Course.load(root / "grading_config.yaml").suite.fingerprint


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


def test_a_text_only_edit_keeps_the_fingerprint_and_a_graded_change_does_not(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    before = _fingerprint(root)
    _edit(root / Q1, "Write `center(x)`, which subtracts", "Write `center(x)`, a function which subtracts")
    _edit(root / Q1, "title: Center the columns", "title: Centre the columns")
    assert _fingerprint(root) == before  # the prose students read: nothing graded changed
    _edit(root / Q1, "what: center([[1, 2], [3, 6]])", "what: center of [[1, 2], [3, 6]]")
    assert (case_text := _fingerprint(root)) != before  # a case's own words are part of its verdict's message
    _edit(root / Q1, "[[[1.0, 2.0], [3.0, 6.0]]]", "[[[1.0, 2.0], [3.0, 7.0]]]")
    assert (case_args := _fingerprint(root)) != case_text
    _edit(root / "grading_config.yaml", "q1_center: {points: 5}", "q1_center: {points: 4}")
    _edit(root / "grading_config.yaml", "total_points: 10", "total_points: 9")
    assert _fingerprint(root) != case_args


def test_the_engine_is_part_of_the_fingerprint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _copy(tmp_path)
    before = _fingerprint(root)
    engine = tmp_path / "engine"
    shutil.copytree(suite_module.ENGINE_ROOT, engine, ignore=shutil.ignore_patterns("__pycache__"))
    (engine / "grading" / "judge.py").write_text((engine / "grading" / "judge.py").read_text() + "\n# changed\n")
    monkeypatch.setattr(suite_module, "ENGINE_ROOT", engine)
    assert _fingerprint(root) != before


@pytest.mark.sandbox
@pytest.mark.build
def test_a_text_only_rebuild_reuses_every_result(demo_course: Course, tmp_path: Path) -> None:
    """The released demo lesson's sample class, graded, then its prose edited and the lesson released again: the
    rerun reuses every result; a changed case grades the class again."""
    from autograder.release import release

    root = tmp_path / "course"
    shutil.copytree(demo_course.lesson.root, root, ignore=shutil.ignore_patterns("__pycache__"))
    samples, out = root / "dist" / "samples", tmp_path / "grades"
    shutil.copytree(samples, tmp_path / "samples")  # the class, outside the folder a release rewrites
    first = grade_batch(tmp_path / "samples", out=out, course=Course.load(root / "grading_config.yaml"),
                        progress=False)
    assert first.graded_now == len(first.rows) >= 2
    _edit(root / Q1, "Write `center(x)`, which subtracts", "Write `center(x)`, a function which subtracts")
    course = Course.load(root / "grading_config.yaml")
    release(course=course)
    again = grade_batch(tmp_path / "samples", out=out, course=course, progress=False)
    assert again.reused == len(first.rows) and again.graded_now == 0
    assert [r["total"] for r in again.rows] == [r["total"] for r in first.rows]
    _edit(root / Q1, "[[[1.0, 2.0], [3.0, 6.0]]]", "[[[1.0, 2.0], [3.0, 7.0]]]")
    third = grade_batch(tmp_path / "samples", out=out, course=Course.load(root / "grading_config.yaml"),
                        progress=False)
    assert third.reused == 0 and third.graded_now == len(first.rows)
