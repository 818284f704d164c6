"""The report's compare page (issue 32, Done-when 7): `report GRADES --compare OLD_GRADES` adds compare.html, what
moved between two gradings of a class. On the demo lesson with stored results written as the grader writes them:
a moved score shows both values and the case whose verdict changed, an unchanged student is not listed, a student
graded in only one run is listed apart, and a folder that is not a grades folder is a clear error."""

from __future__ import annotations

import html
import json
import re
import shutil
from pathlib import Path

import pytest

from autograder.cli import main as cli_main
from autograder.config import ROOT
from autograder.course import Course
from autograder.grading.gradebook import Gradebook
from autograder.grading.submissions import Submission
from autograder.grading.tables import write_tables
from autograder.model import CaseResult, Status, SubmissionResult
from autograder.report import write_report
from autograder.report.moved import NotGrades

FIXTURE = ROOT / "tests" / "fixtures" / "lesson_demo"


@pytest.fixture(scope="module")
def course(tmp_path_factory: pytest.TempPathFactory) -> Course:
    root = tmp_path_factory.mktemp("moved") / "course"
    shutil.copytree(FIXTURE, root, ignore=shutil.ignore_patterns("__pycache__"))
    return Course.load(root / "grading_config.yaml")


def _graded(course: Course, out: Path, fails: dict[str, set[str]]) -> Path:
    """A grades folder of the students in `fails`, each failing the cases of the questions named."""
    suite = course.suite
    (out / "results").mkdir(parents=True)
    subs = []
    for sid, failing in fails.items():
        cases = [CaseResult(c.id, c.question, 0.0 if c.question in failing else c.points, c.points,
                            c.question not in failing, c.hidden,
                            f"{c.id} is wrong for {sid}" if c.question in failing else "")
                 for c in suite.cases]
        (out / "results" / f"{sid}.json").write_text(json.dumps(SubmissionResult(sid, Status.GRADED, cases).to_dict()))
        subs.append(Submission(sid, Path(f"{sid}.ipynb"), None, result_name=f"{sid}.json"))
    write_tables(suite, subs, Gradebook(out))
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, course: Course) -> dict[str, Path]:
    q1 = course.suite.cases[0].question
    base = tmp_path_factory.mktemp("runs")
    old = _graded(course, base / "old", {"ann": {q1}, "bob": set(), "cy": set(), "gone": set()})
    new = _graded(course, base / "new", {"ann": set(), "bob": {q1}, "cy": set(), "late": set()})
    return {"old": old, "new": new, "q1": Path(q1)}


@pytest.fixture(scope="module")
def page(runs: dict[str, Path], course: Course) -> str:
    index = write_report(runs["new"], out=runs["new"].parent / "report", course=course, compare=runs["old"])
    assert 'href="compare.html"' in index.read_text()
    return html.unescape((index.parent / "compare.html").read_text())


def _total(course: Course, failing: set[str]) -> str:
    total = sum(c.points for c in course.suite.cases if c.question not in failing)
    return f"{total:g}"


def test_moved_scores_show_both_values_largest_drop_first(page: str, runs: dict[str, Path], course: Course) -> None:
    q1 = str(runs["q1"])
    full, less = _total(course, set()), _total(course, {q1})
    rows = re.findall(r'<tr id="moved-\d+">(.*?)</tr>', page, re.S)
    assert [re.search(r">(\w+)</a>", r).group(1) for r in rows] == ["bob", "ann"]  # the drop first
    assert f"{full} → {less}" in rows[0] and f"{less} → {full}" in rows[1]
    ids = [c.id for c in course.suite.cases if c.question == q1]  # the same message but for the id: one entry
    case, shown = ids[0], ", ".join(ids)
    assert f"{shown}</b>: passed → failed" in rows[0] and f"after: {case} is wrong for bob" in rows[0]
    assert f"{shown}</b>: failed → passed" in rows[1] and f"before: {case} is wrong for ann" in rows[1]
    assert len(ids) < 2 or f"({len(ids)} cases, the same message; {case}'s below)" in rows[0]
    assert re.search(rf"<td>{q1}</td><td[^>]*>[\d.]+ → [\d.]+</td><td[^>]*>1</td><td[^>]*>1</td>", page)


def test_unchanged_student_is_not_listed(page: str) -> None:
    students = page.split('id="students"')[1]
    assert "cy" not in re.findall(r"<a [^>]*>(\w+)</a>", students)


def test_a_student_in_one_run_only_is_listed_apart(page: str) -> None:
    apart = page.split('id="compare-apart"')[1]
    assert re.search(r"<td>gone</td><td>before only</td>", apart)
    assert re.search(r"<td>late</td><td>after only</td>", apart)
    assert "gone" not in page.split('id="compare-apart"')[0].split('id="students"')[1]


def test_a_folder_that_is_not_grades_is_a_clear_error(runs: dict[str, Path], course: Course, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    for bad in (tmp_path / "missing", empty):
        with pytest.raises(NotGrades, match=re.escape(str(bad))):
            write_report(runs["new"], out=tmp_path / "r", course=course, compare=bad)
        assert not (tmp_path / "r").exists()
        code = cli_main(["--config", str(course.path), "report", str(runs["new"]), "--out", str(tmp_path / "r"),
                         "--compare", str(bad)])
        err = capsys.readouterr().err
        assert code == 2 and str(bad) in err and "pass --compare the folder" in err
