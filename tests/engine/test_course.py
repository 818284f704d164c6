"""The grading config is parsed once per command (autograder/course.py): cli.py reads it into a Course and every
stage takes that object; a stage given a Course reads no config file at all."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from autograder import cli
from autograder.authoring.suite import reference_env
from autograder.config import GradingConfig
from autograder.course import Course
from autograder.grading.judge import grade_namespace
from autograder.report import write_report

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "lesson_demo"


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every grading config validated from now on (load_config's one way in), by its `near` folder."""
    seen: list[object] = []
    validate = GradingConfig.model_validate

    def counted(obj: object, **kwargs: object) -> GradingConfig:
        seen.append((kwargs.get("context") or {}).get("near"))  # type: ignore[union-attr]
        return validate(obj, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(GradingConfig, "model_validate", counted)
    return seen


def _graded(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the demo course (its config not yet read in this process) and a grades folder of the
    reference's result, judged in-process as the grader stores it."""
    course = tmp_path / "course"
    shutil.copytree(FIXTURE, course)
    suite = Course.load(course / "grading_config.yaml").suite
    grades = tmp_path / "grades"
    (grades / "results").mkdir(parents=True)
    record = grade_namespace(suite, reference_env(suite), name="reference").to_dict()
    (grades / "results" / "reference.json").write_text(json.dumps(record))
    return course / "grading_config.yaml", grades


def test_a_command_parses_its_config_once(tmp_path: Path, parses: list[object],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    config, grades = _graded(tmp_path)
    parses.clear()
    assert cli.main(["--config", str(config), "report", str(grades), "--out", str(tmp_path / "report")]) == 0
    assert (tmp_path / "report" / "index.html").is_file(), capsys.readouterr()
    assert parses == [config.parent], parses  # the report's suite, its fingerprint and lesson: all from one parse


def test_a_stage_given_a_course_reads_no_config(tmp_path: Path, parses: list[object]) -> None:
    config, grades = _graded(tmp_path)
    course = Course.load(config)
    parses.clear()
    write_report(grades, out=tmp_path / "report", course=course)
    assert parses == []
