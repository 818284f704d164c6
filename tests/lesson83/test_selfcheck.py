"""The self-check: the reference earns full marks, the committed blank template none, and the table says so."""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat

from autograder.authoring.questions import mc_answers
from autograder.authoring.suite import Suite
from autograder.config import ROOT
from autograder.course import Course
from autograder.release.sample import filled_notebook
from autograder.selfcheck import selfcheck

TEMPLATES = ROOT / "student_templates"


def test_reference_earns_everything_and_the_blank_template_nothing(course: Course, suite: Suite) -> None:
    check = selfcheck(course=course)
    assert check.passed and check.failures == []
    total = f"{suite.notebook_points:g}"
    assert check.rows[0] == ["question", "points", "reference", "blank"]
    assert check.rows[-1] == ["total (notebook)", total, total, "0"]
    assert {r[0]: r[2] for r in check.rows}["q9_written"] == "manual"
    assert check.text().splitlines()[-1].startswith("self-check passed")


def test_a_template_that_already_earns_points_fails_the_check(course: Course, tmp_path: Path, suite: Suite) -> None:
    name = suite.config.assignment
    shutil.copytree(TEMPLATES / name, tmp_path / name)
    notebook = tmp_path / name / f"{name}.ipynb"
    filled = filled_notebook(notebook, answers=mc_answers(list(suite.questions)), lesson=suite.lesson)
    nbformat.write(filled, str(notebook))
    check = selfcheck(templates=tmp_path, course=course)
    assert not check.passed and check.rows[-1][3] != "0"
    assert check.text().splitlines()[-1] == "SELF-CHECK FAILED"
