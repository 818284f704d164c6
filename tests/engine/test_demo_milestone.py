"""The demo lesson's own milestone plug-in (assignments/lesson_demo/lesson_demo_checkpoint.py in its fixture)
built, graded and reported: a copy of the demo course declares a milestone question with a checkpoint (fit.json),
and the engine loads the plug-in only then (autograder/checkpoint.py). Nothing here knows Lesson 83."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from autograder.course import Course, course_of
from helpers.demo import FIXTURE, MILESTONE, fitted_line

PLUGIN = "lesson_demo_checkpoint"
NOTEBOOK = json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5})


@pytest.fixture()
def course(tmp_path: Path) -> Path:
    """A copy of the demo course whose lesson grades a checkpoint: the milestone question and its points."""
    root = tmp_path / "course"
    shutil.copytree(FIXTURE, root)
    (root / "assignments" / "lesson_demo" / "q4_line.md").write_text(MILESTONE)
    config = (root / "grading_config.yaml").read_text().replace("total_points: 10", "total_points: 13")
    config = config.replace("questions:\n", "questions:\n  q4_line: {points: 1}\n") + "\nmilestone: {points: 2}\n"
    (root / "grading_config.yaml").write_text(config)
    return root



def test_no_milestone_no_plugin(tmp_path: Path) -> None:
    """The demo lesson as it is declares no checkpoint: its suite has no checkpoint cases and nothing loads the
    plug-in that sits in its folder."""
    suite = course_of(FIXTURE / "grading_config.yaml").suite
    assert suite.checkpoint_files == () and suite.checkpoint_cases == []
    assert PLUGIN not in sys.modules


@pytest.mark.sandbox
def test_demo_checkpoint_is_graded_and_reported(course: Path, tmp_path: Path) -> None:
    from autograder.grading.batch import grade_batch
    from autograder.report.model import catalogue
    from autograder.report.write import write_report

    demo = Course.load(course / "grading_config.yaml")
    suite = demo.suite
    assert suite.checkpoint_files == ("fit.json",) and suite.checkpoint_question == "q4_checkpoint"
    assert [c.id for c in suite.checkpoint_cases] == ["q4_checkpoint/fit", "q4_checkpoint/claim"]
    points = json.loads((course / "reference" / "lesson_demo_points.json").read_text())["points"]
    slope, intercept, mse = fitted_line(points)
    fits = {"good": {"slope": slope, "intercept": intercept, "mse": mse},
            "bad": {"slope": 0.0, "intercept": intercept, "mse": mse}}  # a flat line, claiming the good one's error
    for name, fit in fits.items():
        (tmp_path / "subs" / name).mkdir(parents=True)
        (tmp_path / "subs" / name / "lesson_demo.ipynb").write_text(NOTEBOOK)
        (tmp_path / "subs" / name / "fit.json").write_text(json.dumps(fit))
    summary = grade_batch(tmp_path / "subs", out=tmp_path / "grades", course=demo, progress=False)
    rows = {r["id"]: r for r in summary.rows}
    assert rows["good"]["q4_checkpoint"] == 2 and rows["bad"]["q4_checkpoint"] == 0, rows
    cases = {c["id"]: c for c in json.loads((tmp_path / "grades" / "results" / "bad.json").read_text())["cases"]}
    assert cases["q4_checkpoint/fit"]["diagnosis"] == "fit_too_far"
    assert cases["q4_checkpoint/claim"]["diagnosis"] == "fit_claim_disagrees"
    assert "above 0.5" in cases["q4_checkpoint/fit"]["message"]
    assert catalogue(suite)["fit_too_far"][0] == "q4_checkpoint"  # the report's section: the plug-in's problems
    report = write_report(tmp_path / "grades", out=tmp_path / "report", course=demo)
    text = "".join(p.read_text(errors="replace") for p in Path(report).parent.rglob("*.html"))
    assert "fit_too_far" in text or "above the bound" in text
