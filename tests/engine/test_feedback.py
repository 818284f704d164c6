"""Each student's feedback file from `grade` (autograder/grading/feedback.py): one page per student, rendered from
the student-safe view of the stored result, with the merged manual scores; never a hidden case's arguments,
expected or received values, nor a multiple-choice key. On the demo lesson (no Lesson 83 word here)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from autograder.config import ROOT
from autograder.course import Course, course_of
from autograder.grading.feedback import write_feedback
from autograder.grading.gradebook import FEEDBACK_DIR, Gradebook, Record
from autograder.grading.merge import merge_scores
from autograder.grading.submissions import Submission
from autograder.grading.tables import write_tables
from autograder.model import CaseResult, Status, SubmissionResult

DEMO = ROOT / "tests" / "fixtures" / "lesson_demo" / "grading_config.yaml"
SECRET_ARG = "SECRET-ARGUMENT-31337"
SECRET_EXPECTED = [[271828.5, -314159.25]]


def _graded(out: Path) -> tuple[list[Submission], dict[str, str]]:
    """Two stored results of the demo lesson: alice fails a visible and a hidden case (whose TA copy names its
    argument and expected value), bob passes everything; a third submission was not graded."""
    suite = course_of(DEMO).suite
    subs = [Submission(sid, Path(f"{sid}.ipynb"), b"{}", result_name=f"{sid}.json") for sid in ("alice", "bob")]
    subs.append(Submission("carol", Path("carol.ipynb"), b"{}", result_name="carol.json"))
    for sub in subs[:2]:
        bad = sub.id == "alice"
        cases = [CaseResult("q1_center/small", "q1_center", 0.0 if bad else 2.5, 2.5, not bad, False,
                            "center([[1, 2], [3, 6]]): expected [[-1, -2], [1, 2]], received [[0, 0], [0, 0]]"
                            if bad else ""),
                 CaseResult("q1_center/hidden_tall", "q1_center", 0.0 if bad else 2.5, 2.5, not bad, True,
                            f"center({SECRET_ARG}) returned the wrong value" if bad else "", "center_rows",
                            received=[[0.0, 0.0]], expected=SECRET_EXPECTED if bad else None),
                 CaseResult("q2_pick/answers_valid", "q2_pick", 1.0, 1.0, True, False),
                 CaseResult("q2_pick/correct_column_sum", "q2_pick", 0.0 if bad else 1.0, 1.0, not bad, True,
                            "expected 'A' (Zero.)" if bad else "")]
        result = SubmissionResult(sub.id, Status.GRADED, cases)
        view = result.gradescope(revisit=suite.revisit())
        Gradebook(out).write_record(sub.result_name, Record("key", str(sub.path), result, view))
    book = Gradebook(out)
    tables = write_tables(suite, subs, book,
                          failed={"carol": "not graded: the sandbox failed; run the grade command again"})
    write_feedback(suite, book, tables)
    pages = {p.name: p.read_text() for p in (out / FEEDBACK_DIR).iterdir() if p.suffix == ".html"}
    return subs, pages


def test_one_safe_page_per_student(tmp_path: Path) -> None:
    _, pages = _graded(tmp_path)
    assert sorted(pages) == ["alice.html", "bob.html", "carol.html"]
    alice = pages["alice.html"]
    # the visible case in full, the hidden one's verdict and what to revisit, per-question scores
    assert "expected [[-1, -2], [1, 2]], received [[0, 0], [0, 0]]" in alice
    assert re.search(r"q1_center: hidden tests</td>\s*<td class=\"fail\">failed", alice)
    assert "revisit: subtract the mean of each column (axis=0) from that column." in alice
    assert "Likely cause: the mean is taken over each row (axis=1) instead of over each column (axis=0)." in alice
    assert re.search(r"q1_center</a>[^<]*</td>\s*<td>0</td>\s*<td>5</td>", alice)
    # never the hidden case's argument, expected value, nor the choice's key
    for page in pages.values():
        assert SECRET_ARG not in page and "271828" not in page and "314159" not in page
        assert "expected &#39;A&#39;" not in page and "'A' (Zero.)" not in page and "Zero." not in page
    assert "Score: <b>7</b> of 10" in pages["bob.html"] and "q3_explain not graded yet" in pages["bob.html"]
    assert "Not graded yet: the grader could not grade it" in pages["carol.html"]
    assert "sandbox" not in pages["carol.html"]  # the grader's own reason is for TAs (grades.csv)


def test_merge_writes_the_manual_scores_into_the_feedback(tmp_path: Path) -> None:
    _graded(tmp_path)
    scores = tmp_path / "q3.csv"
    scores.write_text("id,q3_why\nbob,2.5\n")
    merge_scores(tmp_path, [scores], course=Course.load(DEMO))
    bob = (tmp_path / FEEDBACK_DIR / "bob.html").read_text()
    assert re.search(r"q3_why: [^<]*</td><td>2.5 of 3</td>", bob)
    assert "Score: <b>9.5</b> of 10" in bob and "not graded yet" not in bob


def test_a_folder_it_did_not_write_is_not_replaced(tmp_path: Path) -> None:
    (tmp_path / FEEDBACK_DIR).mkdir()
    (tmp_path / FEEDBACK_DIR / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="was not written by the grader"):
        _graded(tmp_path)
    assert (tmp_path / FEEDBACK_DIR / "notes.txt").read_text() == "mine"
    assert json.loads((tmp_path / "summary.json").read_text())["submissions"] == 3


@pytest.mark.sandbox
@pytest.mark.build  # the demo release's sample class (demo_course)
def test_the_demo_sample_class_gets_one_safe_file_each(demo_course: Course, tmp_path: Path) -> None:
    from autograder.grading.batch import grade_batch

    samples = demo_course.lesson.root / "dist" / "samples"
    out = tmp_path / "grades"
    summary = grade_batch(samples, out=out, course=demo_course, progress=False)
    pages = {p.stem: p.read_text() for p in (out / FEEDBACK_DIR).glob("*.html")}
    assert sorted(pages) == sorted(r["id"] for r in summary.rows) and len(pages) >= 5
    suite = demo_course.suite
    hidden = [c for c in suite.cases if c.hidden]
    whys = [ch.why for q in suite.questions for ch in q.choices]
    for sid, page in pages.items():
        record_file = out / "results" / f"{sid}.json"
        record = json.loads(record_file.read_text()) if record_file.exists() else {"cases": []}
        for c in record["cases"]:
            if c["hidden"] and c["message"]:
                assert c["message"] not in page, f"{sid}: the TA message of {c['id']} is in its feedback"
        assert not [c.what for c in hidden if c.what and c.what in page], sid
        assert not [w for w in whys if w in page], f"{sid}: the explanation of a multiple-choice answer"
    assert "Score: <b>7</b> of 10" in pages["reference"] and "q3_explain not graded yet" in pages["reference"]


BROKEN_VIEWS = {
    "dave": [{"name": "q1_center/small", "max_score": 2.5, "output": ""}],  # no score: the template cannot show it
    "erin": [{"name": "q1_center/small", "score": 10 ** 400, "max_score": 2.5, "output": ""}],  # no float holds it
    "finn": [{"name": "q1_center/small", "score": 0, "max_score": 2.5, "output": "x"}] * 3,
}


@pytest.mark.parametrize("depth", [0, 2_000])
def test_a_page_that_breaks_says_so_and_the_rest_are_written(tmp_path: Path, depth: int) -> None:
    """Each student's page is isolated: a stored view the page cannot show (a missing field, a number no float
    holds, a recursion too deep for the renderer: finn's output is 2,000 nested lists), and the others get theirs."""
    suite = course_of(DEMO).suite
    subs = [Submission(sid, Path(f"{sid}.ipynb"), b"{}", result_name=f"{sid}.json")
            for sid in ("alice", *BROKEN_VIEWS)]
    for sub in subs:
        result = SubmissionResult(sub.id, Status.GRADED, [CaseResult("q1_center/small", "q1_center", 2.5, 2.5, True,
                                                                      False)])
        view = result.gradescope(revisit=suite.revisit())
        if sub.id in BROKEN_VIEWS:
            view = {**view, "tests": [dict(t) for t in BROKEN_VIEWS[sub.id]]}
        Gradebook(tmp_path).write_record(sub.result_name, Record("key", str(sub.path), result, view))
    book = Gradebook(tmp_path)
    tables = write_tables(suite, subs, book)
    if depth:  # the stored output is read back as nested lists no renderer can walk
        nested: object = "x"
        for _ in range(depth):
            nested = [nested]
        tables.records["finn"].gradescope["tests"][0]["output"] = nested
    write_feedback(suite, book, tables)
    pages = {p.stem: p.read_text() for p in (tmp_path / FEEDBACK_DIR).glob("*.html")}
    assert sorted(pages) == ["alice", *sorted(BROKEN_VIEWS)]
    assert "Score: <b>2.5</b>" in pages["alice"]
    for sid in ("dave", "erin", *(["finn"] if depth else [])):
        assert "Not graded yet: its stored result could not be shown" in pages[sid], sid


def test_the_page_shows_scores_with_at_most_two_decimals(tmp_path: Path) -> None:
    """Issue 42, item 7: a share of 17 points over 36 cases reads "0.47 / 0.47" and the total "36 of 100" style,
    never "0.4706"; the stored record keeps every digit."""
    suite = course_of(DEMO).suite
    sub = Submission("dana", Path("dana.ipynb"), b"{}", result_name="dana.json")
    cases = [CaseResult("q1_center/small", "q1_center", 2.4706, 2.5, False, False, "close, not equal"),
             CaseResult("q1_center/hidden_tall", "q1_center", 2.5, 2.5, True, True),
             CaseResult("q2_pick/answers_valid", "q2_pick", 1.0, 1.0, True, False),
             CaseResult("q2_pick/correct_column_sum", "q2_pick", 0.9999, 1.0, False, True, "", "x")]
    result = SubmissionResult(sub.id, Status.GRADED, cases)
    book = Gradebook(tmp_path)
    book.write_record(sub.result_name, Record("key", str(sub.path), result, result.gradescope(revisit=suite.revisit())))
    write_feedback(suite, book, write_tables(suite, [sub], book, failed={}))
    page = (tmp_path / FEEDBACK_DIR / "dana.html").read_text()
    assert "2.4706" not in page and "0.9999" not in page and "6.9705" not in page, page
    assert "Score: <b>6.97</b> of 10" in page and re.search(r"q1_center</a>[^<]*</td>\s*<td>4.97</td>", page), page
    assert json.loads((tmp_path / "results" / "dana.json").read_text())["total"] == 6.9705
