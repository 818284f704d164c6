"""Judging on the demo lesson (tests/fixtures/lesson_demo): the reference earns every point, a blank template none,
a catalogued mistake is diagnosed, a failure says expected, received, the likely cause and what to revisit, a stub
reads as one line, the local checks and Otter's test files say what the grader says, and the checks runtime's plain
data refuses objects. Lesson 83's questions, mistakes and variants are judged in tests/lesson83/test_judge.py."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from autograder.authoring.suite import Suite, reference_env
from autograder.config import ROOT
from autograder.course import Course
from autograder.grading.judge import grade_namespace, notebook_env
from autograder.lesson import Lesson

DEMO_CONFIG = ROOT / "tests" / "fixtures" / "lesson_demo" / "grading_config.yaml"


@pytest.fixture(scope="module")
def demo() -> Course:
    """The demo course as committed (its suite and lesson; no release)."""
    return Course.load(DEMO_CONFIG)


@pytest.fixture(scope="module")
def suite(demo: Course) -> Suite:
    return demo.suite


@pytest.fixture(scope="module")
def lesson(demo: Course) -> Lesson:
    return demo.lesson


def _with(lesson: Lesson, suite: Suite, mistake_id: str) -> dict:
    """The reference namespace with one of the lesson's catalogued mistakes applied."""
    mistake = next(m for m in lesson.mistakes if m.id == mistake_id)
    return lesson.namespace(mistake, into=reference_env(suite))


def test_reference_earns_full_marks_on_every_question(suite: Suite) -> None:
    result = grade_namespace(suite, reference_env(suite), name="reference")
    assert [c.message for c in result.cases if not c.passed] == []
    graded = [q for q in suite.questions if q.graded and not q.manual and q.cases]
    assert [q.id for q in graded] == ["q1_center", "q2_pick"]
    for q in graded:
        assert result.question_scores()[q.id] == pytest.approx(q.points), q.id
    assert result.total == pytest.approx(suite.notebook_points)


@pytest.mark.build
def test_blank_template_earns_zero_without_crashing(demo_course: Course) -> None:
    env, _ = notebook_env(demo_course.lesson.student_dir / "lesson_demo.ipynb")
    result = grade_namespace(demo_course.suite, env, name="blank")
    assert result.total == 0
    assert all(c.message for c in result.cases if c.max_points > 0)


def test_every_catalogued_mistake_loses_points_and_is_diagnosed(suite: Suite, lesson: Lesson) -> None:
    assert lesson.mistakes
    points = {q.id: q.points for q in suite.questions}
    for mistake in lesson.mistakes:
        result = grade_namespace(suite, _with(lesson, suite, mistake.id), name=mistake.id)
        assert result.question_scores()[mistake.question] < points[mistake.question], mistake.id
        diagnosed = {c.diagnosis for c in result.cases if c.question == mistake.question and not c.passed}
        assert mistake.id in diagnosed, [c.message for c in result.cases if not c.passed]
        messages = "\n".join(c.message for c in result.cases if c.diagnosis == mistake.id)
        assert mistake.description in messages


def test_failure_message_says_expected_received_and_what_to_revisit(suite: Suite, lesson: Lesson) -> None:
    result = grade_namespace(suite, _with(lesson, suite, "center_rows"), name="rows")
    msg = next(c.message for c in result.cases if c.id == "q1_center/small")
    assert msg.startswith("q1_center/small: ")
    assert "expected" in msg and "received" in msg
    assert "Likely cause: the mean is taken over each row" in msg
    assert "Revisit: subtract the mean of each column (axis=0) from that column." in msg
    assert len(msg) < 1200  # a few values, not a wall of numbers


@pytest.mark.build
def test_stub_failures_of_a_question_read_as_one_line(demo_course: Course) -> None:
    """Every stub left empty fails its first case with one line; the question's other cases point at it."""
    suite = demo_course.suite
    env, _ = notebook_env(demo_course.lesson.student_dir / "lesson_demo.ipynb")
    result = grade_namespace(suite, env, name="blank")
    checks = demo_course.lesson.checks
    for q in {c.question for c in result.cases}:
        stub_lines = [c.message for c in result.cases if c.question == q and checks.STUB in c.message]
        assert len(stub_lines) <= 1 and all("\n" not in m for m in stub_lines), stub_lines
    q1 = [c.message for c in result.cases if c.question == "q1_center"]
    assert len(q1) == 2 and checks.STUB in q1[0]
    assert sum("not filled in yet (see q1_center/small)" in m for m in q1) == len(q1) - 1


def test_local_check_raises_with_the_message(suite: Suite, lesson: Lesson) -> None:
    from autograder.release.common import case_json, grader_limits

    case = next(c for c in suite.cases if c.id == "q1_center/hidden_tall")
    payload = case_json(case, suite.expected, {c.id: c for c in suite.cases}, lesson=lesson,
                        limits=grader_limits(suite.config))
    lesson.checks.run_case(reference_env(suite), payload)  # the reference passes silently
    with pytest.raises(AssertionError) as info:
        lesson.checks.run_case(_with(lesson, suite, "center_rows"), payload)
    said = str(info.value)  # the case by its name (the student reads no grader id)
    assert said.startswith("hidden_tall: ") and "the mean is taken over each row" in said, said


def test_otter_shows_a_failed_check_without_the_test_file_line(suite: Suite, lesson: Lesson, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from otter.test_files.exception_test import ExceptionTestFile

    from autograder.release.common import grader_limits
    from autograder.release.otter import otter_test

    monkeypatch.setitem(sys.modules, lesson.checks_name, lesson.checks)  # as the student's folder provides it
    cases = {c.id: c for c in suite.cases}
    test = otter_test(cases["q1_center/small"], suite.expected, cases, lesson=lesson,
                      limits=grader_limits(suite.config))
    test = test.partition("# END TEST CONFIG\n")[2]
    path = tmp_path / "q1_center.py"
    path.write_text("from otter.test_files import test_case\n\nOK_FORMAT = False\nname = 'q1_center'\n"
                    f"points = None\n\n@test_case(points=1, hidden=False)\n{test}")
    for env, passed in ((reference_env(suite), True), (_with(lesson, suite, "center_rows"), False)):
        test_file = ExceptionTestFile.from_file(str(path))
        test_file.run(env)
        assert test_file.passed_all is passed
    summary = test_file.summary()
    assert "the mean is taken over each row" in summary
    assert "Error at line" not in summary and "run_case(" not in summary


def test_plain_data_round_trip_refuses_objects(lesson: Lesson) -> None:
    checks = lesson.checks
    data = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": [1, "x", None, float("nan")]}
    back = checks.loads(checks.dumps(data))
    assert back["a"].dtype == np.float32 and (back["a"] == data["a"]).all()
    assert back["b"][:3] == [1, "x", None] and np.isnan(back["b"][3])
    with pytest.raises(TypeError):
        checks.to_plain(np.array([object()]))
    with pytest.raises(TypeError):
        checks.to_plain({"x": object()})
