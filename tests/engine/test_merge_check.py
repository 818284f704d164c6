"""`merge` checks the whole scores file (every file given) and reports every problem with its file and line in one
run, rejects two rows for one student (naming their lines), and writes nothing until the files are clean (issue 33,
finding 3), on the demo lesson (q1_center 5 points, q2_pick 2, q3_explain 3 by hand, its written part q3_why)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from autograder.cli import main as cli_main
from autograder.config import ROOT
from autograder.course import Course
from autograder.grading.gradebook import MERGED_FILE, Gradebook, Record
from autograder.grading.submissions import Submission
from autograder.grading.tables import write_tables
from autograder.model import CaseResult, Status, SubmissionResult

CONFIG = ROOT / "tests" / "fixtures" / "lesson_demo" / "grading_config.yaml"
CLASS = ("alice", "bob", "carol", "=dave")


@pytest.fixture(scope="module")
def demo() -> Course:
    return Course.load(CONFIG)


@pytest.fixture
def graded(tmp_path: Path, demo: Course) -> Path:
    """A graded batch of the demo lesson (stored results as `grade` writes them; full marks each)."""
    out = tmp_path / "grades"
    (out / "results").mkdir(parents=True)
    subs = []
    for sid in CLASS:
        name = f"{sid.strip('=')}.json"
        cases = [CaseResult(f"{q}/all", q, p, p, True, False) for q, p in demo.suite.question_points().items()]
        result = SubmissionResult(sid, Status.GRADED, cases)
        Gradebook(out).write_record(name, Record("key", "", result, result.gradescope(revisit={})))
        subs.append(Submission(sid, Path(f"{sid}.ipynb"), None, result_name=name))
    write_tables(demo.suite, subs, Gradebook(out))
    return out


def _merge(graded: Path, *files: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli_main(["--config", str(CONFIG), "merge", str(graded), *map(str, files)])
    got = capsys.readouterr()
    return code, got.out, got.err


def _tables(graded: Path) -> tuple[bytes, ...]:
    return tuple((graded / name).read_bytes() for name in ("grades.csv", "summary.json"))


def test_every_problem_of_the_file_is_reported_in_one_run_with_its_line(
        graded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scores = tmp_path / "q3.csv"
    scores.write_text("id,q3_why,comment,q3_bogus\n"   # line 1: an unknown score column
                      "alice,two,\"a comment\n over two lines\",\n"  # lines 2-3: not a number
                      "bobb,1,,\n"                     # line 4: no such student (bob is the nearest)
                      "carol,3.5,,\n"                  # line 5: over the part's 3 points
                      ",2,,\n"                         # line 6: a score with no id
                      "'=dave,-1,,\n"                  # line 7: below 0 (the id as grades.csv writes it)
                      ",,,\n"                          # line 8: blank: skipped
                      "bob,2,,\n")                     # line 9: fine
    before = _tables(graded)
    code, out, err = _merge(graded, scores, capsys=capsys)
    assert code == 2 and out == ""
    lines = err.splitlines()
    assert lines[0].startswith("error: 6 problems in the scores; nothing was merged"), err
    want = [f"{scores}, line 1: unknown score columns ['q3_bogus']",
            f"{scores}, line 2 (alice), q3_why: 'two' is not a number",
            f"{scores}, line 4: no student 'bobb' in this batch (nearest: bob",
            f"{scores}, line 5 (carol), q3_why: 3.5 is outside 0 to 3",
            f"{scores}, line 6: scores with no id",
            f"{scores}, line 7 (=dave), q3_why: -1 is outside 0 to 3"]
    assert len(lines) == 1 + len(want), err
    for line, words in zip(lines[1:], want):
        assert line.strip().startswith(words), (line, words)
    assert _tables(graded) == before and not (graded / MERGED_FILE).exists()


def test_two_rows_for_one_student_are_refused_naming_both_lines(
        graded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's case: the second row silently won (100 -> 97). Now neither does, and the lines are named."""
    scores = tmp_path / "q3.csv"
    scores.write_text("id,q3_why\nalice,3\nbob,2\ncarol,1\nalice,2.5\n'=dave,1\nalice,\n")
    code, _, err = _merge(graded, scores, capsys=capsys)
    assert code == 2
    assert f"{scores}, lines 2, 5, 7 (alice): 3 rows for one student; keep one" in err, err
    assert "bob" not in err and "carol" not in err
    assert not (graded / MERGED_FILE).exists()


def test_every_file_is_checked_before_anything_is_written(
        graded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good, bad, worse = tmp_path / "good.csv", tmp_path / "bad.csv", tmp_path / "worse.csv"
    good.write_text("id,q3_why\nalice,3\n")
    bad.write_text("id,q3_why\nbob,x\n")
    worse.write_text("name,q3_why\ncarol,1\n")
    before = _tables(graded)
    code, _, err = _merge(graded, good, bad, worse, capsys=capsys)
    assert code == 2 and "2 problems" in err
    assert f"{bad}, line 2 (bob), q3_why: 'x' is not a number" in err
    assert f"{worse}, line 1: the first row must name the columns, one of them `id`" in err
    assert str(good) not in err
    assert _tables(graded) == before and not (graded / MERGED_FILE).exists()
    # once clean, the same run merges all of them
    bad.write_text("id,q3_why\nbob,2\n")
    worse.write_text("id,q3_why\ncarol,1\n")
    code, out, err = _merge(graded, good, bad, worse, capsys=capsys)
    assert code == 0, err
    with open(graded / "grades.csv", newline="") as f:
        rows = {r["id"]: r for r in csv.DictReader(f)}
    assert {sid: float(rows[sid]["q3_explain"]) for sid in ("alice", "bob", "carol")} == {"alice": 3, "bob": 2,
                                                                                         "carol": 1}


def test_a_single_problem_reads_as_one(graded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scores = tmp_path / "q3.csv"
    scores.write_text("id,q3_why,q3_why\nalice,1,2\n")
    code, _, err = _merge(graded, scores, capsys=capsys)
    assert code == 2
    assert err.startswith("error: 1 problem in the scores; nothing was merged (fix it, then run merge again):\n")
    assert f"{scores}, line 1: columns named twice: q3_why; keep one of each" in err


def test_a_tas_comments_reach_grades_csv_and_the_feedback(
        graded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`comment` (the whole work) and `<column> comment` (a question or a written part) are kept with the scores,
    shown in grades.csv's comment column and on the student's feedback page, escaped; a later file adds to them."""
    assert "comment" not in (graded / "grades.csv").read_text().splitlines()[0]  # no column before a TA writes one
    scores = tmp_path / "q3.csv"
    scores.write_text("id,q3_why,comment,q3_why comment\n"
                      "alice,2,\"Clear, but see <b>q3</b>\",cite the slide\n"
                      "bob,3,,\n")
    code, out, _ = _merge(graded, scores, capsys=capsys)
    assert code == 0 and "ignored columns" not in out, out
    with open(graded / "grades.csv", newline="") as f:
        rows = {r["id"]: r for r in csv.DictReader(f)}
    assert rows["alice"]["comment"] == "Clear, but see <b>q3</b> | q3_why: cite the slide"
    assert rows["bob"]["comment"] == ""
    page = (graded / "feedback" / "alice.html").read_text()
    assert "Clear, but see &lt;b&gt;q3&lt;/b&gt;" in page and "on q3_why: cite the slide" in page
    more = tmp_path / "more.csv"
    more.write_text("id,q3_explain comment\nbob,see office hours\n")
    assert _merge(graded, more, capsys=capsys)[0] == 0
    with open(graded / "grades.csv", newline="") as f:
        rows = {r["id"]: r for r in csv.DictReader(f)}
    assert rows["bob"]["comment"] == "q3_explain: see office hours" and rows["alice"]["comment"].startswith("Clear")
    assert "see office hours" in (graded / "feedback" / "bob.html").read_text()


def test_a_comment_too_long_or_not_text_is_refused_with_its_line(
        graded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = _tables(graded)
    scores = tmp_path / "q3.csv"
    scores.write_text("id,q3_why,comment,q9_nope comment\n"
                      f"alice,1,{'x' * 2001},\n"
                      "bob,1,\"bell\x07\",\n")
    code, _, err = _merge(graded, scores, capsys=capsys)
    assert code == 2 and _tables(graded) == before and not (graded / MERGED_FILE).exists()
    assert f"{scores}, line 2 (alice), comment: 2001 characters" in err
    assert f"{scores}, line 3 (bob), comment: not plain text (control characters U+0007)" in err
    assert "unknown score columns ['q9_nope comment']" in err
