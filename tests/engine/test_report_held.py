"""A held review flag's way out is on the TA's pages (issue 42, item 2): the flagged student's page and the index
give the exact line for the grades folder's review_decisions.yaml (a line that reads back as that student's
decision, whatever the id) and the regrade commands; the student is told only that a person will look. On the demo
lesson."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

from autograder.config import ROOT
from autograder.course import Course
from autograder.grading.gradebook import REVIEW_DECISIONS_FILE, Gradebook, Record
from autograder.grading.review import review_decisions
from autograder.grading.submissions import Submission, result_file_name
from autograder.grading.tables import write_tables
from autograder.model import CaseResult, Status, SubmissionResult
from autograder.report import write_report

CONFIG = ROOT / "tests" / "fixtures" / "lesson_demo" / "grading_config.yaml"
FLAGGED = {"ann": "0123456789abcdef", "=x: y # z": "fedcba9876543210"}  # an id YAML must quote


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    course = Course.load(CONFIG)
    out = tmp_path_factory.mktemp("held") / "grades"
    subs = []
    for sid in ("ann", "bob", "=x: y # z"):
        cases = [CaseResult(c.id, c.question, c.points, c.points, True, c.hidden) for c in course.suite.cases]
        result = SubmissionResult(sid, Status.GRADED, cases)
        review = {"flags": [], "digest": "0" * 16, "cleared": False, "decision": None}
        if sid in FLAGGED:
            review = {"flags": [{"kind": "gc", "code": "import gc"}], "digest": FLAGGED[sid], "cleared": False,
                      "decision": None, "held": 2}
        sub = Submission(sid, Path(f"{sid}.ipynb"), None, name=f"{sid}.ipynb")
        sub.result_name = result_file_name(sid, sub.raw_name)
        Gradebook(out).write_record(sub.result_name, Record("k", "", result, {"tests": []}, review=review))
        subs.append(sub)
    write_tables(course.suite, subs, Gradebook(out))
    index = write_report(out, out=out.parent / "report", course=course)
    return out, index.parent


def _pre_lines(page: str) -> list[str]:
    return [html.unescape(line) for block in re.findall(r"<pre>(.*?)</pre>", page, re.S) for line in block.splitlines()]


def test_each_flagged_page_and_the_index_say_how_to_clear_the_flag(report: tuple[Path, Path]) -> None:
    grades, folder = report
    index = (folder / "index.html").read_text()
    assert str(grades / REVIEW_DECISIONS_FILE) in html.unescape(index) and "Held for review: 2 students" in index
    pages = {p.read_text() for p in (folder / "students").glob("*.html")}
    flagged = [p for p in pages if "Held for review" in p]
    assert len(flagged) == 2 and all("regrade" in p and "report" in p for p in flagged)
    lines = [line for p in flagged for line in _pre_lines(p) if ":" in line and "lesson" not in line]
    assert sorted(_pre_lines(index)) != [] and set(lines) <= set(_pre_lines(index))
    # pasted as given, the lines are the TAs' decisions for exactly those students
    (grades / REVIEW_DECISIONS_FILE).write_text("\n".join(lines) + "\n")
    assert review_decisions(Gradebook(grades)) == FLAGGED


def test_a_page_without_held_cases_says_nothing_of_it(report: tuple[Path, Path]) -> None:
    _, folder = report
    pages = [p.read_text() for p in (folder / "students").glob("*.html")]
    assert sum("Held for review" not in p for p in pages) == 1
