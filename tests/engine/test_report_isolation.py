"""No single notebook stops the report or the feedback pages (issue 41 item 2): a class on the demo lesson with a
milestone, faked as stored results that name notebooks, among them a 240 KB attribute chain, twenty thousand nested
lambdas, 10,000 nested parentheses, a sum 1,500 levels deep (it parses) and a recursion bomb (a 50,000-deep tree); each
hostile student gets a page saying what could not be read, and every other student is reported as usual (student
pages, similarity, leaderboard, compare)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import nbformat
import pytest

from autograder.course import Course
from autograder.report.write import write_report
from helpers.demo import FIXTURE, MILESTONE

CHAIN = "x = a" + ".b" * 120_000  # 240 KB: ast construction recurses once per attribute
NESTED = "f = " + "lambda: " * 20_000 + "0"  # 20,000 nested functions: the parser's own stack overflows
BOMB = "def f(n):\n    return f(n + 1)\n\n\nf(0)\n" + "w = " + "-" * 50_000 + "1\n"  # a 50,000-deep tree
HONEST = {
    "ann": "def center(x):\n    m = x.mean(axis=0)\n    out = x - m\n    return out\n\n\n"
           "def scale(x, f):\n    for i in range(len(x)):\n        x[i] = x[i] * f\n    return x\n\n\n"
           "def spread(x):\n    lo, hi = x.min(axis=0), x.max(axis=0)\n    width = hi - lo\n"
           "    if (width == 0).any():\n        width = width + 1e-9\n    return (x - lo) / width\n",
    "bob": "def center(x):\n    n = len(x)\n    total = sum(x) / n\n    return [v - total for v in x]\n\n\n"
           "def scale(x, f):\n    return [f * v for v in x]\n",
}
PARENS = "y = " + "(" * 10_000 + "1" + ")" * 10_000  # 10,000 nested parentheses: the parser refuses them
DEEP = "z = " + " + ".join(["1"] * 1_500) + "\n"  # parses, but 1,500 levels deep: a recursive walk of it overflows
HOSTILE = {"chain": CHAIN, "nested": NESTED, "bomb": BOMB, "parens": PARENS, "deep": DEEP}


@pytest.fixture()
def course(tmp_path: Path) -> Course:
    root = tmp_path / "course"
    shutil.copytree(FIXTURE, root)
    (root / "assignments" / "lesson_demo" / "q4_line.md").write_text(MILESTONE)
    config = (root / "grading_config.yaml").read_text().replace("total_points: 10", "total_points: 13")
    config = config.replace("questions:\n", "questions:\n  q4_line: {points: 1}\n") + "\nmilestone: {points: 2}\n"
    (root / "grading_config.yaml").write_text(config)
    return Course.load(root / "grading_config.yaml")


def _record(course: Course, sid: str, path: Path, slope: float) -> dict[str, Any]:
    """A stored result naming the notebook at `path`, its checkpoint part carrying a verified figure and a
    sketch (so the leaderboard and the similarity page both have every student)."""
    cases = [{"id": c.id, "question": c.question, "points": c.points, "max_points": c.points, "passed": True,
              "hidden": False, "message": "", "diagnosis": None, "expected": None,
              "received": {"leaderboard": {"8": slope, "16": slope / 2},
                           "sketch": [float((i * (3 + len(sid))) % 7) for i in range(32)]}}
             for c in course.suite.checkpoint_cases]
    return {"submission": sid, "status": "graded", "cases": cases, "notes": [], "student_notes": [],
            "fingerprint": "", "total": 0.0, "questions": {}, "path": str(path), "stdout": ""}


def _class(course: Course, tmp_path: Path, codes: dict[str, str]) -> Path:
    grades, subs = tmp_path / "grades", tmp_path / "subs"
    (grades / "results").mkdir(parents=True)
    subs.mkdir()
    rows = []
    for n, (sid, code) in enumerate(codes.items()):
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
        path = subs / f"{sid}.ipynb"
        path.write_text(nbformat.writes(nb))
        (grades / "results" / f"{sid}.json").write_text(json.dumps(_record(course, sid, path, 3.0 - n / 10)))
        rows.append({"id": sid, "result": f"{sid}.json", "status": "graded", "message": ""})
    (grades / "summary.json").write_text(json.dumps({"rows": rows}))
    return grades


@pytest.mark.parametrize("hostile", sorted(HOSTILE))
def test_one_hostile_notebook_never_stops_the_report(course: Course, tmp_path: Path, hostile: str) -> None:
    copy = re.sub(r"\b(x|m)\b", lambda n: {"x": "arr", "m": "mu"}[n.group(1)], HONEST["ann"])  # renamed: a pair
    grades = _class(course, tmp_path, {**HONEST, "cat": copy, hostile: HOSTILE[hostile]})
    earlier = tmp_path / "earlier"
    shutil.copytree(grades, earlier)
    out = tmp_path / "report"
    index = write_report(grades, out=out, course=course, compare=earlier).read_text()
    for sid in [*HONEST, "cat", hostile]:
        assert f"{sid}.html" in index and (out / "students" / f"{sid}.html").is_file()
    similar = (out / "similarity.html").read_text()
    assert "<b>ann</b> and <b>cat</b>" in similar  # the rest of the class is compared
    assert "4 students compared: 4 with code" in similar  # the hostile one too, as its plain text
    assert "leaderboard.html" in index and all(sid in (out / "leaderboard.html").read_text()
                                                for sid in [*HONEST, "cat", hostile])
    assert (out / "compare.html").is_file()


def test_a_record_that_breaks_the_leaderboard_costs_only_its_own_row(course: Course, tmp_path: Path) -> None:
    grades = _class(course, tmp_path, dict(HONEST))
    bad = json.loads((grades / "results" / "bob.json").read_text())
    bad["cases"][0]["received"]["leaderboard"]["8"] = 10 ** 400  # a number no float holds
    (grades / "results" / "bob.json").write_text(json.dumps(bad))
    out = tmp_path / "report"
    write_report(grades, out=out, course=course)
    board = (out / "leaderboard.html").read_text()
    assert "ann.html" in board and "bob</a>: its figures could not be read (OverflowError" in board


def test_a_code_comparison_that_dies_costs_only_the_code_pairs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The child that compares the code dies (the C stack, memory): the checkpoint pairs are still listed and the
    page says why no code was compared."""
    from autograder.report import similarity

    monkeypatch.setattr(similarity.sys, "executable", "/bin/false")
    sketch = [float(i % 5) for i in range(32)]
    found = similarity.find_similar(dict(HONEST), "", {"ann": {"p": sketch}, "bob": {"p": list(sketch)}})
    assert found.problem.startswith("the code could not be compared (exit status 1")
    assert [(p.first, p.second) for p in found.weights] == [("ann", "bob")] and found.code == []


def test_a_class_page_that_fails_says_so_and_the_report_is_written(course: Course, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from autograder.report import similarity_page

    def bomb(*args: object, **kwargs: object) -> dict[str, str]:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(similarity_page, "similarity_pages", bomb)
    grades = _class(course, tmp_path, dict(HONEST))
    out = tmp_path / "report"
    index = write_report(grades, out=out, course=course).read_text()
    assert "similarity.html" in index and "leaderboard.html" in index
    page = (out / "similarity.html").read_text()
    assert "This page could not be built (RecursionError: maximum recursion depth exceeded)" in page
    assert "ann.html" in (out / "leaderboard.html").read_text()
