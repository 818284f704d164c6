"""`grade --only ID[,ID...]`: regrade the named students after a fix (forced, even unchanged) and keep every other
row and every merged score; an unknown id is a clear error listing the nearest ids (issue 33, finding 4), on the
demo lesson (tests/conftest.py: demo_course)."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import nbformat
import pytest

from autograder.cli import main as cli_main
from autograder.config import ROOT
from autograder.course import Course
from autograder.grading.batch import UnknownSubmission, grade_batch
from autograder.grading.gradebook import MERGED_FILE
from autograder.model import Status
from autograder.release.sample import filled_notebook

DEMO_CONFIG = ROOT / "tests" / "fixtures" / "lesson_demo" / "grading_config.yaml"


def _grades(out: Path) -> dict[str, dict[str, str]]:
    with open(out / "grades.csv", newline="") as f:
        return {r["id"]: r for r in csv.DictReader(f)}


def _cli(config: Path, *args: str) -> int:
    return cli_main(["--config", str(config), *args])


@pytest.mark.sandbox
@pytest.mark.build
def test_only_regrades_the_named_students_and_keeps_every_other_row_and_merged_score(
        tmp_path: Path, demo_course: Course, capsys: pytest.CaptureFixture[str]) -> None:
    lesson, config = demo_course.lesson, str(demo_course.path)
    template = lesson.student_dir / f"{lesson.name}.ipynb"
    mistake = next(m for m in lesson.mistakes if m.id == "center_rows")
    subs, out = tmp_path / "submissions", tmp_path / "grades"
    subs.mkdir()
    nbformat.write(filled_notebook(template, lesson=lesson), str(subs / "alice.ipynb"))
    nbformat.write(filled_notebook(template, extra={"center": mistake.code}, lesson=lesson), str(subs / "bob.ipynb"))
    shutil.copy(template, subs / "carol.ipynb")
    assert _cli(Path(config), "grade", str(subs), "--out", str(out), "--quiet") == 0
    (tmp_path / "q3.csv").write_text("id,q3_why\nalice,3\nbob,2\ncarol,1\n")
    assert _cli(Path(config), "merge", str(out), str(tmp_path / "q3.csv")) == 0
    before, merged = _grades(out), (out / MERGED_FILE).read_bytes()
    assert float(before["bob"]["q1_center"]) < 5 and float(before["bob"]["q3_explain"]) == 2
    stored = {sid: (out / "results" / f"{sid}.json").read_bytes() for sid in ("alice", "bob", "carol")}
    capsys.readouterr()

    # bob fixes his code and sends it again; carol's notebook changes too, but only bob is named
    nbformat.write(filled_notebook(template, lesson=lesson), str(subs / "bob.ipynb"))
    nbformat.write(filled_notebook(template, lesson=lesson), str(subs / "carol.ipynb"))
    assert _cli(Path(config), "grade", str(subs), "--out", str(out), "--quiet", "--only", "bob") == 0
    printed = capsys.readouterr().out
    assert "graded 1 submission(s), reused 0 unchanged result(s), kept 2 other student(s)' results" in printed
    after = _grades(out)
    assert float(after["bob"]["q1_center"]) == 5 and float(after["bob"]["q3_explain"]) == 2  # merged score kept
    assert float(after["bob"]["total"]) == pytest.approx(float(after["alice"]["total"]) - 3 + 2)
    assert after["alice"] == before["alice"] and after["carol"] == before["carol"]  # carol: not graded again
    assert (out / "results" / "carol.json").read_bytes() == stored["carol"]
    assert (out / "results" / "alice.json").read_bytes() == stored["alice"]
    assert (out / MERGED_FILE).read_bytes() == merged
    summary = json.loads((out / "summary.json").read_text())
    assert summary["merged"]["students"] == 3 and [r["id"] for r in summary["rows"]] == ["alice", "bob", "carol"]

    # named students are graded even when nothing changed (say, after a fix to the grader), several at once
    assert _cli(Path(config), "grade", str(subs), "--out", str(out), "--quiet", "--only", "alice,carol") == 0
    assert "graded 2 submission(s), reused 0 unchanged result(s), kept 1 other" in capsys.readouterr().out
    final = _grades(out)
    assert float(final["carol"]["q1_center"]) == 5 and float(final["carol"]["q3_explain"]) == 1
    assert final["bob"] == after["bob"] and (out / MERGED_FILE).read_bytes() == merged
    assert json.loads((out / "results" / "alice.json").read_bytes())["status"] == Status.GRADED


def test_an_unknown_id_is_an_error_listing_the_nearest_and_nothing_is_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    subs, out = tmp_path / "submissions", tmp_path / "grades"
    subs.mkdir()
    for sid in ("alice", "alicia", "bob", "robert"):
        (subs / f"{sid}.ipynb").write_text("{}")
    assert _cli(DEMO_CONFIG, "grade", str(subs), "--out", str(out), "--quiet", "--only", "bob,alcie,zzz") == 2
    err = capsys.readouterr().err
    assert f"no submission 'alcie' in {subs}; nearest ids: alice, alicia" in err, err
    assert f"no submission 'zzz' in {subs} (ids are as in grades.csv: alice, alicia, bob, robert)" in err, err
    assert "'bob'" not in err
    assert not out.exists()
    with pytest.raises(UnknownSubmission, match="names no submission"):
        grade_batch(subs, out=out, only=[], course=Course.load(DEMO_CONFIG))
    # an entry's own name is accepted as well as its id
    from autograder.grading.batch import select
    from autograder.grading.submissions import find_submissions

    assert select(find_submissions(subs), ["bob.ipynb", "alice"], where=subs) == {"bob", "alice"}
