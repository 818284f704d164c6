"""An operator's lower hard limits (a shared server's `ulimit -v`, a container's `ulimit -n`): the grader gives each
submission the lower value, says so, and grades honest work normally (on the demo lesson with its milestone plug-in;
Lesson 83's torch checkpoint reader under the same limits: tests/lesson83/test_execute_lesson83.py)."""

from __future__ import annotations

import json
import resource
import shutil
from dataclasses import asdict, fields
from pathlib import Path

import nbformat
import pytest

from autograder.authoring.questions import mc_answers
from autograder.config import ROOT, Execution
from autograder.course import Course
from autograder.grading.runner import sandbox_limits
from autograder.release.sample import filled_notebook
from autograder.sandbox import Limits, fit_hard, lowered_limits
from helpers.demo import MILESTONE, fitted_line  # the demo's milestone question, a fitted line
from helpers.ulimits import grade_under_lower_ulimits

FIXTURE = ROOT / "tests" / "fixtures" / "lesson_demo"


def test_limits_above_the_hard_limit_are_lowered_to_it() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert fit_hard(resource.RLIMIT_NOFILE, soft) == (soft, soft)
    if hard != resource.RLIM_INFINITY:
        assert fit_hard(resource.RLIMIT_NOFILE, hard + 10) == (hard, hard)
        assert fit_hard(resource.RLIMIT_NOFILE, hard - 1, hard + 10) == (hard - 1, hard)
        notes = lowered_limits([(resource.RLIMIT_NOFILE, hard + 10)], who="the sandbox")
        assert notes == [f"the sandbox: open files lowered to {hard} (the grader's hard limit, ulimit -n) "
                         f"from the configured {hard + 10}"]
    assert lowered_limits([(resource.RLIMIT_NOFILE, soft)], who="the sandbox") == []


SANDBOX_OWN = {"result_mb", "scratch_mb", "threads"}  # limits of the sandbox that no config key sets


def test_each_limit_has_one_name_from_the_config_to_the_sandbox() -> None:
    """A limit of grading_config.yaml's execution section is the field of Limits of the same name, with the same
    default, and reaches the sandbox by that name alone (Limits.configured: no hand mapping to keep)."""
    configured = set(Execution.model_fields) - {"workers"}  # how many submissions run at once: not a limit
    assert configured and configured <= {f.name for f in fields(Limits)}
    assert {f.name for f in fields(Limits)} - configured == SANDBOX_OWN
    assert {n: Execution.model_fields[n].default for n in configured} == {n: getattr(Limits(), n) for n in configured}
    values = {"cell_timeout_s": 7.0, "probe_timeout_s": 3.0, "question_timeout_s": 11.0, "wall_timeout_s": 97.0,
              "cpu_timeout_s": 89, "memory_mb": 1234, "max_processes": 21, "max_file_mb": 13, "max_output_kb": 77}
    assert set(values) == configured  # a new limit: one field here, in Limits and in config.Execution
    limits = Limits.configured(Execution(**values, workers=3))
    assert {n: v for n, v in asdict(limits).items() if n in configured} == values
    assert {n: getattr(limits, n) for n in SANDBOX_OWN} == {n: getattr(Limits(), n) for n in SANDBOX_OWN}
    course = Course.load(FIXTURE / "grading_config.yaml")
    assert sandbox_limits(course.config) == Limits.configured(course.config.execution)


@pytest.fixture
def course(tmp_path: Path) -> Path:
    """A copy of the demo course whose lesson grades a checkpoint (its milestone plug-in, in the engine's reader
    child), the reader asking for more memory than the ulimit leaves: its grading config."""
    root = tmp_path / "lesson_demo"
    shutil.copytree(FIXTURE, root, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "assignments" / "lesson_demo" / "q4_line.md").write_text(MILESTONE)
    config = (root / "grading_config.yaml").read_text().replace("total_points: 10", "total_points: 13")
    config = config.replace("questions:\n", "questions:\n  q4_line: {points: 1}\n")
    (root / "grading_config.yaml").write_text(config + "\nmilestone: {points: 2}\n"
                                              "submissions: {checkpoint_memory_mb: 4096}\n")
    return root / "grading_config.yaml"


@pytest.mark.build
@pytest.mark.sandbox
def test_grade_under_an_operators_lower_ulimits_gives_full_marks_and_says_so(tmp_path: Path, course: Path,
                                                                            demo_course: Course) -> None:
    subs, out = tmp_path / "subs", tmp_path / "out"
    suite = Course.load(course).suite
    assert suite.checkpoint_files == ("fit.json",)  # the reader starts
    nb = filled_notebook(demo_course.lesson.notebook, answers=mc_answers(list(suite.questions)),
                         lesson=demo_course.lesson)
    (subs / "honest").mkdir(parents=True)
    nbformat.write(nb, str(subs / "honest" / "lesson_demo.ipynb"))
    points = json.loads((FIXTURE / "reference" / "lesson_demo_points.json").read_text())["points"]
    slope, intercept, mse = fitted_line(points)
    (subs / "honest" / "fit.json").write_text(json.dumps({"slope": slope, "intercept": intercept, "mse": mse}))
    grade_under_lower_ulimits(course, subs, out, auto_points=suite.auto_points)


