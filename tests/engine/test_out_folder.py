"""`grade` and `nbgrader-autograde` refuse an --out inside the class folder, and a class folder inside --out, naming
both, before anything is written (issue 42, finding 4: `grade SUBS --out SUBS` ran, and the next run graded its own
feedback/, results/ and summary.json as students, with results/ and its reference values among the students'
files). On the demo lesson's config; nothing here grades."""

from __future__ import annotations

from pathlib import Path

import pytest

from autograder.cli import main as cli_main
from autograder.config import ROOT
from autograder.grading.submissions import OutputInClass, check_out_folder

CONFIG = ROOT / "tests" / "fixtures" / "lesson_demo" / "grading_config.yaml"


def _tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.fixture
def klass(tmp_path: Path) -> Path:
    subs = tmp_path / "work" / "class"
    subs.mkdir(parents=True)
    (subs / "alice.ipynb").write_text("{}")
    return subs


def test_the_check_names_both_folders(klass: Path, tmp_path: Path) -> None:
    for out in (klass, klass / "grades", klass / "a" / "b", klass.parent, tmp_path):
        with pytest.raises(OutputInClass) as err:
            check_out_folder(klass, out)
        assert str(klass) in str(err.value) and str(out.resolve()) in str(err.value), err.value
    (tmp_path / "link").symlink_to(klass)
    with pytest.raises(OutputInClass):
        check_out_folder(tmp_path / "link", klass / "grades")  # links are resolved
    for out in (klass.parent / "grades", klass.parent / "class-grades", tmp_path / "elsewhere" / "grades"):
        check_out_folder(klass, out)  # beside it or anywhere else: fine


@pytest.mark.parametrize("where", ["inside", "same", "holds"])
def test_grade_refuses_before_anything_is_written(klass: Path, where: str, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = {"inside": klass / "grades", "same": klass, "holds": klass.parent}[where]
    before, outside = _tree(klass), _tree(klass.parent)
    monkeypatch.chdir(klass)
    assert cli_main(["--config", str(CONFIG), "grade", str(klass), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert str(klass) in err and str(out) in err and "nothing was written" in err, err
    assert ("is inside the output folder" if where == "holds" else f"{out} is") in err, err
    assert _tree(klass) == before and _tree(klass.parent) == outside
    # grade's default --out is ./grades: run inside the class folder, that is inside it too
    assert cli_main(["--config", str(CONFIG), "grade", ".", "--quiet"]) == 2
    assert "is inside the class folder" in capsys.readouterr().err
    assert _tree(klass) == before


@pytest.mark.parametrize("where", ["inside", "holds"])
def test_nbgrader_autograde_refuses_before_anything_is_written(tmp_path: Path, where: str,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    course = tmp_path / "dist" / "nbgrader"
    (course / "source" / "lesson_demo").mkdir(parents=True)
    (course / "nbgrader_config.py").write_text("")
    (course / "submitted" / "alice" / "lesson_demo").mkdir(parents=True)
    out = course / "grades" if where == "inside" else tmp_path
    before = _tree(tmp_path)
    assert cli_main(["--config", str(CONFIG), "nbgrader-autograde", str(course), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert str(course) in err and str(out) in err and "nbgrader course folder" in err, err
    assert _tree(tmp_path) == before
