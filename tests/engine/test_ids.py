"""Ids map back to exactly one student everywhere a TA or a tool reads them (issue 41, finding 7): grades.csv writes a
formula-looking id reversibly (students `=1+1` and `'=1+1` were both `'=1+1`, so `merge` scored the wrong one),
merge's map, nbgrader's student folders and the feedback file names keep them apart, and `grade --only` names any
id, one holding a comma included (the flag repeats; a value is split on commas only when it is no student's id).
A browser's name for a second download ("Kim Lee (1).ipynb") is a note in the summary (issue 42, finding 7).
On the demo lesson (q1_center 5 points, q2_pick 2, q3_explain 3 by hand, its written part q3_why)."""

from __future__ import annotations

import csv
import inspect
import json
from pathlib import Path
from typing import Any

import pytest

from autograder.cli import main as cli_main
from autograder.config import ROOT
from autograder.course import Course
from autograder.grading import batch
from autograder.grading.batch import BatchSummary
from autograder.grading.feedback import feedback_name
from autograder.grading.gradebook import FEEDBACK_DIR, MERGED_FILE, Gradebook
from autograder.grading.nbgrader import course_submissions
from autograder.grading.submissions import Submission, class_ids, find_submissions, named_ids, result_file_name
from autograder.grading.summaries import grade_summary
from autograder.grading.tables import write_tables
from autograder.model import CaseResult, Status, SubmissionResult, csv_text, from_spreadsheet_text, spreadsheet_text

CONFIG = ROOT / "tests" / "fixtures" / "lesson_demo" / "grading_config.yaml"
FORMULAS = ("=1+1", "'=1+1", "''=1+1", "+1", "'+1", "-x", "@x", "'", "''", "'plain")


@pytest.fixture(scope="module")
def demo() -> Course:
    return Course.load(CONFIG)


def _grades(out: Path) -> list[dict[str, str]]:
    with open(out / "grades.csv", newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _store(demo: Course, out: Path, ids: list[str], *, score: float = 0.0) -> list[Submission]:
    """A graded batch of these ids as `grade` stores it (one stored result each, q1_center at `score`)."""
    (out / "results").mkdir(parents=True, exist_ok=True)
    subs = []
    for sid in ids:
        sub = Submission(sid, Path(f"{sid}.ipynb"), None, name=f"{sid}.ipynb")
        sub.result_name = result_file_name(sid, sub.raw_name)
        cases = [CaseResult(f"{q}/all", q, p if q != "q1_center" else score, p, True, False)
                 for q, p in demo.suite.question_points().items()]
        result = SubmissionResult(sid, Status.GRADED, cases).to_dict() | {"gradescope": {"tests": [], "output": ""}}
        (out / "results" / sub.result_name).write_text(json.dumps(result))
        subs.append(sub)
    write_tables(demo.suite, subs, Gradebook(out))
    return subs


def test_spreadsheet_cells_are_safe_and_reversible() -> None:
    cells = [spreadsheet_text(t) for t in FORMULAS]
    assert len(set(cells)) == len(FORMULAS), cells  # today: `=1+1` and `'=1+1` are both `'=1+1`
    assert [from_spreadsheet_text(c) for c in cells] == list(FORMULAS)
    assert not [c for c in cells if c[:1] in "=+-@"]
    assert spreadsheet_text("=1+1") == "'=1+1" and spreadsheet_text("'=1+1") == "''=1+1"
    assert spreadsheet_text("alice") == from_spreadsheet_text("alice") == "alice"
    assert csv_text([["id"], ["'=1+1"]]) == "id\n''=1+1\n"


def test_formula_ids_stay_apart_in_grades_csv_merge_and_feedback(tmp_path: Path, demo: Course,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "grades"
    ids = ["=1+1", "'=1+1", "alice"]
    subs = _store(demo, out, ids)
    cells = [r["id"] for r in _grades(out)]
    assert len(set(cells)) == 3 and [from_spreadsheet_text(c) for c in cells] == ids, cells
    # the TA copies the ids as grades.csv shows them and scores each student differently
    scores = tmp_path / "q3.csv"
    scores.write_text(csv_text([["id", "q3_why"], ["=1+1", 1.0], ["'=1+1", 2.0], ["alice", 3.0]]))
    assert cli_main(["--config", str(CONFIG), "merge", str(out), str(scores)]) == 0, capsys.readouterr().err
    merged = json.loads((out / MERGED_FILE).read_text())["scores"]
    assert {sid: merged[sid]["q3_why"] for sid in ids} == {"=1+1": 1.0, "'=1+1": 2.0, "alice": 3.0}
    rows = {from_spreadsheet_text(r["id"]): r for r in _grades(out)}
    assert {sid: float(rows[sid]["q3_explain"]) for sid in ids} == {"=1+1": 1.0, "'=1+1": 2.0, "alice": 3.0}
    # a cell typed as the id itself (not as grades.csv writes it) still names that student when no other
    scores.write_text("id,q3_why\n=1+1,0.5\n")
    assert cli_main(["--config", str(CONFIG), "merge", str(out), str(scores)]) == 0
    assert json.loads((out / MERGED_FILE).read_text())["scores"]["=1+1"]["q3_why"] == 0.5
    pages = sorted(p.name for p in (out / FEEDBACK_DIR).glob("*.html"))
    assert pages == sorted(feedback_name(s.result_name) for s in subs) and len(set(pages)) == 3


def test_nbgrader_student_ids_stay_apart(tmp_path: Path, demo: Course) -> None:
    course = tmp_path / "course"
    for student in ("=1+1", "'=1+1", "a,b"):
        folder = course / "submitted" / student / demo.config.assignment
        folder.mkdir(parents=True)
        (folder / f"{demo.config.assignment}.ipynb").write_text("{}")
    subs = course_submissions(course, demo.config.assignment, course=demo)
    assert sorted(s.id for s in subs) == sorted(["=1+1", "'=1+1", "a,b"])
    assert len({s.result_name.lower() for s in subs}) == 3
    out = tmp_path / "grades"
    write_tables(demo.suite, subs, Gradebook(out), failed={s.id: "not graded yet" for s in subs})
    assert sorted(from_spreadsheet_text(r["id"]) for r in _grades(out)) == sorted(s.id for s in subs)


@pytest.fixture
def klass(tmp_path: Path) -> Path:
    subs = tmp_path / "class"
    subs.mkdir()
    for name in ("a,b.ipynb", "a.ipynb", "b.ipynb", "c.ipynb", "=1+1.ipynb", "'=1+1.ipynb"):
        (subs / name).write_text("{}")
    return subs


@pytest.mark.parametrize(("given", "named"), [
    (["a,b"], ["a,b"]),                    # an id holding a comma is named whole (today: split into a and b)
    (["a", "b"], ["a", "b"]),              # --only once per student
    (["c,a"], ["c", "a"]),                 # no student is called "c,a": split on commas
    (["c, a,"], ["c", "a"]),
    (["'=1+1"], ["=1+1"]),                 # as grades.csv writes the id
    (["''=1+1"], ["'=1+1"]),
    (["=1+1", "b.ipynb"], ["=1+1", "b"]),  # the id itself, or the entry's name
    (["zz,a"], ["zz", "a"]),               # unknown parts are kept: grading names them as unknown
])
def test_only_names_any_id(klass: Path, given: list[str], named: list[str]) -> None:
    assert named_ids(given, class_ids(klass)) == named
    assert {sid for sid, _ in class_ids(klass)} == {s.id for s in find_submissions(klass)}


def test_grade_only_passes_the_named_ids_and_its_help_says_the_rule(
        klass: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[Any] = []

    def fake(submissions: Path, **kwargs: Any) -> BatchSummary:
        seen.append(kwargs["only"])
        raise FileNotFoundError("stopped here by the test")

    fake.__signature__ = inspect.signature(batch.grade_batch)  # type: ignore[attr-defined]  # the CLI's defaults
    monkeypatch.setattr(batch, "grade_batch", fake)
    out = str(tmp_path / "grades")
    assert cli_main(["--config", str(CONFIG), "grade", str(klass), "--out", out, "--only", "a,b"]) == 2
    assert cli_main(["--config", str(CONFIG), "grade", str(klass), "--out", out, "--only", "a", "--only",
                     "'=1+1"]) == 2
    assert seen == [["a,b"], ["a", "=1+1"]]
    capsys.readouterr()
    with pytest.raises(SystemExit):
        cli_main(["grade", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "give --only once per student" in text and "an id holding a comma is named as it is" in text, text


def test_a_browser_renamed_second_download_is_noted_in_the_summary(tmp_path: Path, demo: Course) -> None:
    subs = tmp_path / "class"
    subs.mkdir()
    for name in ("Kim Lee.ipynb", "Kim Lee (1).ipynb", "Ann Bo (2).ipynb", "lee (1)x.ipynb"):
        (subs / name).write_text("{}")
    found = {s.id: s.notes for s in find_submissions(subs)}
    assert found["Kim Lee (1)"] == ["Kim Lee (1).ipynb: is this a second upload of Kim Lee?"]
    assert found["Ann Bo (2)"] and "Ann Bo" in found["Ann Bo (2)"][0]  # no "Ann Bo" here: still noted
    assert found["Kim Lee"] == [] and found["lee (1)x"] == []
    out = tmp_path / "grades"
    tables = write_tables(demo.suite, find_submissions(subs), Gradebook(out), failed={})
    summary = BatchSummary(out, tables, 0, 4, "fake", list(demo.suite.question_points()))
    text = grade_summary(summary, points=demo.suite.question_points())
    assert "Kim Lee (1).ipynb: is this a second upload of Kim Lee?" in text, text
    kept = json.loads((out / "summary.json").read_text())["rows"]
    assert next(r for r in kept if r["id"] == "Kim Lee (1)")["notes"] == found["Kim Lee (1)"]
