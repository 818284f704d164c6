"""The command line runs any lesson by its course folder or config (`--lesson FOLDER`, or --config given a folder or
the file), before or after the verb, and its help names the lesson it works on, never the package's own one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from autograder import cli
from autograder.authoring.scaffold import scaffold
from autograder.config import DEFAULT_CONFIG
from autograder.course import Course


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return scaffold("lesson_cli", into=tmp_path / "course").parent


def _loaded(monkeypatch: pytest.MonkeyPatch) -> list[Course]:
    """The courses a `selfcheck` is run on (the stage itself is replaced: only the lesson's choice is tested)."""
    seen: list[Course] = []

    def fake(args: Any, course: Course) -> int:
        seen.append(course)
        return 0

    monkeypatch.setattr(cli, "cmd_selfcheck", fake)
    return seen


@pytest.mark.parametrize("how", [["--lesson", "{f}", "selfcheck"], ["selfcheck", "--lesson", "{f}"],
                                 ["--config", "{f}", "selfcheck"], ["--lesson", "{f}/grading_config.yaml", "selfcheck"],
                                 ["--config", "{f}/grading_config.yaml", "selfcheck"]])
def test_a_lesson_runs_by_its_folder_or_config(folder: Path, how: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _loaded(monkeypatch)
    assert cli.main([a.format(f=folder) for a in how]) == 0
    assert [(c.config.assignment, c.path) for c in seen] == [("lesson_cli", (folder / "grading_config.yaml").resolve())]


def test_the_default_stays_the_package_lesson(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _loaded(monkeypatch)
    assert cli.main(["selfcheck"]) == 0
    assert seen[0].path == DEFAULT_CONFIG.resolve()


def test_a_folder_without_a_config_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--lesson", str(tmp_path), "selfcheck"]) == 2
    assert f"error: {tmp_path}: a course folder holds grading_config.yaml" in capsys.readouterr().err


@pytest.mark.parametrize("verb", [[], ["release"], ["grade"]])
def test_the_help_of_another_lesson_names_it(folder: Path, verb: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["--lesson", str(folder), *verb, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert str(DEFAULT_CONFIG) not in out and DEFAULT_CONFIG.parent.name + "/grading_config.yaml" not in out
    assert str(folder / "grading_config.yaml") in "".join(out.split()), out  # argparse wraps a long path
    if not verb:
        assert "Lessonlesson_cli(" in "".join(out.split()) and f"--lesson{folder}" in "".join(out.split()[:4]), out


def test_the_help_of_the_package_lesson_names_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert f"({DEFAULT_CONFIG})" in out and "--lesson FOLDER (or --config) runs another lesson's course" in out
