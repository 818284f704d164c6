"""Every hint a command prints can be pasted as is, from any folder, and writes where the user expects (issue 42,
finding 8): the next step's program by its full path, every path absolute, --config when the course is not the
default, and the report's --out beside the grades. `grade`'s own hint is run as printed in
test_report_engine.py; these are the other verbs' hints, with their stages stubbed (nothing is graded here)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from autograder import cli
from autograder.config import ROOT
from autograder.grading import nbgrader
from autograder.grading.batch import BatchSummary
from autograder.grading.gradebook import Summary
from autograder.grading.summaries import report_folder
from autograder.grading.tables import Tables

CONFIG = ROOT / "tests" / "fixtures" / "lesson_demo" / "grading_config.yaml"


def _hint(out: str, label: str) -> list[str]:
    line = next(x for x in out.splitlines() if label in x)
    return shlex.split(line.split(label, 1)[1])


def test_report_folder_is_beside_the_grades(tmp_path: Path) -> None:
    assert report_folder(tmp_path / "dist" / "grades") == tmp_path / "dist" / "report"
    assert report_folder(tmp_path / "dist" / "nbgrader-grades") == tmp_path / "dist" / "nbgrader-report"
    assert report_folder(tmp_path / "fall") == tmp_path / "fall-report"


def test_nbgrader_autograde_prints_the_feedback_and_report_commands_to_paste(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    course, grades = tmp_path / "dist" / "nbgrader", tmp_path / "dist" / "nbgrader-grades"
    course.mkdir(parents=True)

    def fake(folder: Path, **_: Any) -> nbgrader.NbgraderRun:
        empty = Tables([], Summary(0, {}, {}, {}, {}, 0.0, 0.0, 0.0, None, [], []), {})
        return nbgrader.NbgraderRun(BatchSummary(grades, empty, 0, 0, "fake"), "fake")

    monkeypatch.setattr(nbgrader, "nbgrader_autograde", fake)
    monkeypatch.chdir(course)
    assert cli.main(["--config", str(CONFIG), "nbgrader-autograde", "."]) == 0
    out = capsys.readouterr().out
    feedback = _hint(out, "Students' feedback pages: ")
    assert feedback[:3] == ["cd", str(course), "&&"] and feedback[4:] == ["generate_feedback", "lesson_demo", "--force"]
    assert Path(feedback[3]).is_absolute() and Path(feedback[3]).name == "nbgrader", feedback
    report = _hint(out, "TA report: ")
    assert Path(report[0]).is_absolute() and report[1:3] == ["--config", str(CONFIG)], report
    assert report[3:] == ["report", str(grades), "--out", str(tmp_path / "dist" / "nbgrader-report")], report


def test_a_stale_release_names_a_command_that_runs_anywhere(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cli, "stale_files", lambda **_: ["student_templates/x"])
    assert cli.main(["--config", str(CONFIG), "release", "--check"]) == 1
    first = capsys.readouterr().out.splitlines()[0]
    command = shlex.split(re.search(r"run `([^`]*)`", first).group(1))  # not `make release`: only from the root
    assert Path(command[0]).is_absolute() and command[-3:] == ["--config", str(CONFIG), "release"], first
