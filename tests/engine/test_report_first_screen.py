"""The report's first screen answers "what did most students get wrong, and who" (issue 33, finding 6): per question
its most common mistakes with their counts and names come before the students table, and a checkpoint that was
never uploaded is counted apart, not as a diagnosis beside the code mistakes. On a copy of the demo lesson that
grades a checkpoint (test_demo_milestone.MILESTONE), with stored results written as the grader writes them, so the
quick tier checks the page; tests/lesson83/test_report.py checks a class graded for real in headless Chromium."""

from __future__ import annotations

import csv
import html
import json
import re
import shutil
from pathlib import Path

import pytest

from autograder.checkpoint import MISSING
from autograder.config import ROOT
from autograder.course import Course
from autograder.grading.gradebook import Gradebook
from autograder.grading.submissions import Submission
from autograder.grading.tables import write_tables
from autograder.model import CaseResult, Status, SubmissionResult
from autograder.report import write_report
from helpers.demo import MILESTONE

FIXTURE = ROOT / "tests" / "fixtures" / "lesson_demo"
# who failed what: the catalogued mistake on q1 (five students), a failure no mistake explains (one), and the
# checkpoint: uploaded and right (fay), uploaded and wrong (gus), never uploaded (everyone else)
ROWS_MISTAKE = ("ann", "bob", "cy", "dan", "eve")
CLASS = (*ROWS_MISTAKE, "fay", "gus", "hal")


@pytest.fixture(scope="module")
def course(tmp_path_factory: pytest.TempPathFactory) -> Course:
    root = tmp_path_factory.mktemp("first-screen") / "course"
    shutil.copytree(FIXTURE, root, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "assignments" / "lesson_demo" / "q4_line.md").write_text(MILESTONE)
    config = (root / "grading_config.yaml").read_text().replace("total_points: 10", "total_points: 13")
    config = config.replace("questions:\n", "questions:\n  q4_line: {points: 1}\n") + "\nmilestone: {points: 2}\n"
    (root / "grading_config.yaml").write_text(config)
    return Course.load(root / "grading_config.yaml")


def _verdict(sid: str, case_id: str, question: str) -> tuple[bool, str | None]:
    if question == "q1_center" and sid in ROWS_MISTAKE:
        return False, "center_rows"
    if question == "q1_center" and sid == "hal":
        return False, None  # no catalogued mistake matches: "unrecognised"
    if question == "q4_checkpoint":
        return (True, None) if sid == "fay" else (False, "fit_too_far" if sid == "gus" else MISSING)
    return True, None


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory, course: Course) -> str:
    suite = course.suite
    assert suite.checkpoint_question == "q4_checkpoint"
    out = tmp_path_factory.mktemp("first-screen-graded") / "grades"
    (out / "results").mkdir(parents=True)
    subs = []
    for sid in CLASS:
        cases = []
        for c in [*suite.cases, *suite.checkpoint_cases]:
            passed, diagnosis = _verdict(sid, c.id, c.question)
            cases.append(CaseResult(c.id, c.question, c.points if passed else 0.0, c.points, passed, c.hidden,
                                    "" if passed else f"{c.id} failed", diagnosis))
        record = SubmissionResult(sid, Status.GRADED, cases).to_dict()
        (out / "results" / f"{sid}.json").write_text(json.dumps(record))
        subs.append(Submission(sid, Path(f"{sid}.ipynb"), None, result_name=f"{sid}.json"))
    write_tables(suite, subs, Gradebook(out))
    return write_report(out, out=out.parent / "report", course=course).read_text()


def _table(page: str, tid: str) -> str:
    found = re.search(f'<table class="sortable[^"]*" id="{tid}">.*?</table>', page, re.S)
    assert found, f"no table {tid}"
    return found.group(0)


def _cells(table: str, cls: str) -> dict[str, str]:
    """Per row of the questions table (keyed by its question id): the text of its cell of class `cls`."""
    out = {}
    for row in re.findall(r"<tr>.*?</tr>", table, re.S)[1:]:
        qid = re.search(r'data-v="([^"]+)"', row).group(1)
        cell = re.search(f'<td class="{cls}"[^>]*>(.*?)</td>', row, re.S)
        out[qid] = html.unescape(re.sub(r"<[^>]+>", " ", cell.group(1))) if cell else ""
    return out


def test_the_top_mistakes_and_who_come_before_the_students_table(index: str) -> None:
    assert index.index('id="questions"') < index.index('id="students"')
    top = _table(index, "questions")
    mistakes = _cells(top, "mistakes")
    words = mistakes["q1_center"].replace(",", " ").split()
    assert words == ["5", "center_rows", *ROWS_MISTAKE], mistakes["q1_center"]  # the count, the mistake, who
    assert "1 fit_too_far gus" in " ".join(mistakes["q4_checkpoint"].split())


def test_a_missing_checkpoint_is_counted_apart_from_the_mistakes(index: str) -> None:
    top = _table(index, "questions")
    mistakes, apart = _cells(top, "mistakes"), _cells(top, "apart")
    assert not [q for q, text in mistakes.items() if MISSING in text or "not uploaded" in text], mistakes
    missing = len(CLASS) - 2  # all but fay and gus
    assert " ".join(apart["q4_checkpoint"].split()) == f"{missing} not uploaded", apart
    assert " ".join(apart["q1_center"].split()) == "1 unrecognised", apart
    roster = _table(index, "students")
    assert MISSING not in roster  # not a diagnosis in the students table: a badge in the checkpoint's cell
    assert len(re.findall(r'<td class="num lost" data-v="0.0"><span class="badge">not uploaded</span> 0</td>',
                          roster)) == missing, roster
    # the diagnoses column still names every code mistake
    assert roster.count("<td>center_rows</td>") == len(ROWS_MISTAKE) and roster.count("<td>fit_too_far</td>") == 1


def test_the_sections_put_the_missing_checkpoint_after_the_mistakes(index: str) -> None:
    section = index[index.index('id="q4_checkpoint"'):]
    assert section.index('id="q4_checkpoint--fit_too_far"') < section.index(f'id="q4_checkpoint--{MISSING}"')


def test_report_csv_still_lists_every_diagnosis_id(index: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """report.csv is the gradebook's data: the missing checkpoint stays an id there (as the grader stored it)."""
    report = next(Path(p) for p in tmp_path_factory.getbasetemp().glob("first-screen-graded*/report/report.csv"))
    with report.open(newline="") as f:
        rows = {r["id"]: r["diagnoses"].split() for r in csv.DictReader(f)}
    assert MISSING in rows["ann"] and MISSING not in rows["fay"]
