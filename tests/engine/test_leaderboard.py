"""The leaderboard of verified figures and the similarity report (autograder/report/leaderboard.py, similarity.py)
on the demo lesson with a milestone: stored results whose checkpoint parts carry the reader's figures and weight
sketches. Nothing here knows Lesson 83; the sandboxed run on its sample class is tests/lesson83/test_class_pages.py."""

from __future__ import annotations

import json
import math
import random
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from autograder.course import Course
from autograder.grading.figures import gradescope_entries
from autograder.grading.gradebook import OLD_SIMILARITY_DECISIONS_FILE, SIMILARITY_DECISIONS_FILE, Gradebook
from autograder.report.leaderboard import RosterError, ranked, read_roster
from autograder.report.model import Student
from autograder.report.similarity import (
    LOSS_TOLERANCE,
    checkpoint_pairs,
    code_pairs,
    output_pairs,
    pair_decisions,
    weight_pairs,
)
from autograder.report.write import write_report
from helpers.demo import FIXTURE, MILESTONE


@pytest.fixture()
def course(tmp_path: Path) -> Course:
    root = tmp_path / "course"
    shutil.copytree(FIXTURE, root)
    (root / "assignments" / "lesson_demo" / "q4_line.md").write_text(MILESTONE)
    config = (root / "grading_config.yaml").read_text().replace("total_points: 10", "total_points: 13")
    config = config.replace("questions:\n", "questions:\n  q4_line: {points: 1}\n") + "\nmilestone: {points: 2}\n"
    (root / "grading_config.yaml").write_text(config)
    return Course.load(root / "grading_config.yaml")


def record(course: Course, sid: str, figures: dict[str, dict[str, float]] | None,
           sketch: list[float] | None = None, *, passed: bool = True,
           losses: list[float] | None = None) -> dict[str, Any]:
    """A stored result whose checkpoint parts hold these verified figures (None: claims that did not verify), weight
    sketch and held-out losses per segment."""
    cases = []
    for c in course.suite.checkpoint_cases:
        received: dict[str, Any] = {"ppl": {"1": 2.0}}
        if figures is not None and c.part in figures:
            received["leaderboard"] = figures[c.part]
        if sketch is not None:
            received["sketch"] = sketch
        if losses is not None:
            received["heldout_losses"] = losses
        cases.append({"id": c.id, "question": c.question, "points": c.points if passed else 0.0,
                      "max_points": c.points, "passed": passed, "hidden": False, "message": "", "diagnosis": None,
                      "received": received, "expected": None})
    return {"submission": sid, "status": "graded", "cases": cases, "notes": [], "student_notes": [],
            "fingerprint": "", "total": 0.0, "questions": {}, "path": None, "stdout": ""}


def students(course: Course) -> list[Student]:
    part = course.suite.checkpoint_cases[0].part
    rows = {"ann": {part: {"8": 3.0, "16": 2.5}}, "bob": {part: {"8": 3.5, "16": 2.2}},
            "cat": {part: {"8": 3.0, "16": 2.5}},  # ties ann exactly: the id decides, in every run
            "dan": None,  # a checkpoint whose claims did not verify: no figure
            "eve": {part: {"8": float("nan"), "16": 2.1}}}  # a non-finite figure is never shown
    return [Student(sid, record(course, sid, fig, passed=fig is not None), f"{sid}.html") for sid, fig in rows.items()]


def test_ranked_by_verified_figures_with_a_stable_order(course: Course) -> None:
    part = course.suite.checkpoint_cases[0].part
    board = ranked(course.suite, students(course))
    assert [(e.rank, e.sid) for e in board[part]] == [(1, "eve"), (2, "bob"), (3, "ann"), (4, "cat")]
    assert board[part][0].figures == {"16": 2.1}
    again = ranked(course.suite, list(reversed(students(course))))
    assert [e.sid for e in again[part]] == [e.sid for e in board[part]]  # input order never reorders the class


def test_gradescope_entries_are_the_verified_figures_only(course: Course) -> None:
    part = course.suite.checkpoint_cases[0].part
    entries = gradescope_entries(course.suite, record(course, "bob", {part: {"8": 3.5, "16": 2.2}}))
    assert entries == [{"name": f"{part} figure", "value": 3.5, "order": "asc"},
                       {"name": f"{part} figure", "value": 2.2, "order": "asc"}]
    assert gradescope_entries(course.suite, record(course, "dan", None, passed=False)) == []


def test_the_report_pages_and_the_page_to_post(course: Course, tmp_path: Path) -> None:
    grades = tmp_path / "grades"
    (grades / "results").mkdir(parents=True)
    rows = []
    for s in students(course):
        (grades / "results" / f"{s.id}.json").write_text(json.dumps(s.record))
        rows.append({"id": s.id, "result": f"{s.id}.json", "status": "graded", "message": ""})
    (grades / "summary.json").write_text(json.dumps({"rows": rows}))
    (grades / "leaderboard_roster.csv").write_text("id,pseudonym,opt_out\nann,Ada,\nbob,Bo,yes\neve,Eve L.,\n")
    index = write_report(grades, out=tmp_path / "report", course=course).read_text()
    assert 'href="leaderboard.html"' in index and 'href="public_leaderboard.html"' in index
    board = (tmp_path / "report" / "leaderboard.html").read_text()
    assert "<svg" in board and board.count("<polyline") == 5  # four students and the median
    assert re.search(r'students/dan\.html">dan</a>', board)  # named among those without a verified figure
    public = (tmp_path / "report" / "public_leaderboard.html").read_text()
    public = public[public.index("<main>"):public.index("</main>")]
    assert "<td>Ada</td>" in public and "<td>Eve L.</td>" in public
    assert "<td>Bo</td>" not in public  # bob opted out, cat has no pseudonym
    for sid in ("ann", "bob", "cat", "dan", "eve", "students/", "href"):
        assert sid not in public  # no ids, no links to a student's page (their code)
    assert public.index("Eve L.") < public.index("Ada")


def test_a_bad_roster_names_the_file_and_row(tmp_path: Path) -> None:
    roster = tmp_path / "roster.csv"
    roster.write_text("id,pseudonym\nann,Ada\nbob,ada\n")
    with pytest.raises(RosterError, match=r"roster\.csv: row 3: pseudonym 'ada' is also on row 2"):
        read_roster(roster)
    roster.write_text("student,name\n")
    with pytest.raises(RosterError, match="must name the columns id and pseudonym"):
        read_roster(roster)


HONEST = {
    "ann": "def center(x):\n    m = x.mean(axis=0)\n    out = x - m\n    return out\n\n"
           "def scale(x, f):\n    for i in range(len(x)):\n        x[i] = x[i] * f\n    return x\n",
    "bob": "def center(x):\n    n = len(x)\n    total = sum(x) / n\n    return [v - total for v in x]\n\n"
           "def scale(x, f):\n    return [f * v for v in x]\n",
}


def test_a_disguised_copy_is_listed_and_honest_code_is_not() -> None:
    copy = ("def scale(arr, factor):\n    # my own loop\n    for k in range(len(arr)):\n"
            "        arr[k] = arr[k] * factor\n    return arr\n\n"
            "def center(data):\n    mu = data.mean(axis=0)  # the mean\n    res = data - mu\n    return res\n")
    pairs = code_pairs(HONEST | {"cat": copy}, "def center(x):\n    raise NotImplementedError\n", min_shared=3).pairs
    assert [(p.first, p.second) for p in pairs] == [("ann", "cat")]
    assert "<mark>" in pairs[0].left and "&lt;" not in HONEST["ann"]


def test_checkpoint_pairs_from_sketches() -> None:
    base = [float(i % 7) - 3 for i in range(64)]
    other = [float((i * 5) % 11) - 5 for i in range(64)]
    near = [v + 0.01 for v in base]
    pairs = weight_pairs({"ann": {"p": base}, "bob": {"p": list(base)}, "cat": {"p": near}, "dan": {"p": other}})
    assert [(p.first, p.second) for p in pairs] == [("ann", "bob"), ("ann", "cat"), ("bob", "cat")]
    assert pairs[0].distances == {"p": 0.0} and 0 < pairs[1].distances["p"] < 0.05


def _losses(seed: int, n: int = 128) -> list[float]:
    """Held-out losses per segment of one independently trained model: the windows' own difficulty (the same text
    for everyone) plus the model's own errors, about 0.1 nats."""
    rng = random.Random(seed)
    return [round(1.8 + 0.4 * math.sin(k) + rng.gauss(0, 0.1), 4) for k in range(n)]


def test_checkpoint_pairs_by_what_they_compute() -> None:
    """A part whose held-out losses agree within LOSS_TOLERANCE everywhere pairs two students whatever their weights;
    models trained apart, or a copy moved by more than the tolerance in one segment, do not pair. The pairs found by
    a sweep over the losses' means are every pair a full comparison finds."""
    base = _losses(0)
    copy = [round(v + random.Random(k).uniform(-2e-6, 2e-6), 4) for k, v in enumerate(base)]  # float rounding
    moved = list(base)
    moved[40] += 0.01
    found = output_pairs({"ann": {"p": base, "q": _losses(9)}, "bob": {"p": copy, "q": _losses(10)},
                          "cat": {"p": _losses(1)}, "dan": {"p": moved}, "eve": {"p": base[:64]}})
    assert list(found) == [("ann", "bob")] and set(found[("ann", "bob")]) == {"p"}
    assert found[("ann", "bob")]["p"] <= 2e-4
    sketches = {"ann": {"p": [1.0, 0.0]}, "bob": {"p": [0.0, 1.0]}, "cat": {"p": [1.0, 0.0]}}
    pairs = checkpoint_pairs(sketches, {"ann": {"p": base}, "bob": {"p": copy}})
    assert [(p.first, p.second, p.distances, set(p.gaps)) for p in pairs] == [
        ("ann", "cat", {"p": 0.0}, set()), ("ann", "bob", {}, {"p"})]  # identical weights first
    rng = random.Random(3)
    klass = {f"s{i:03d}": {"p": [round(v + rng.gauss(0, 2.5e-4), 4) for v in _losses(i % 40)]} for i in range(120)}
    brute = {(x, y) for x in klass for y in klass if x < y and max(
        abs(a - b) for a, b in zip(klass[x]["p"], klass[y]["p"], strict=True)) <= LOSS_TOLERANCE}
    assert set(output_pairs(klass)) == brute and 20 < len(brute) < 100  # some within, some beyond


def test_decisions_are_read_and_a_bad_file_says_so(tmp_path: Path) -> None:
    book, decided = Gradebook(tmp_path), ({("ann", "bob"): {"decision": "not a copy", "note": "pair work"}}, "")
    assert pair_decisions(book) == ({}, "")
    old = tmp_path / OLD_SIMILARITY_DECISIONS_FILE  # the JSON file of earlier releases is still read
    old.write_text(json.dumps({"decisions": [{"pair": ["bob", "ann"], "decision": "not a copy", "note": "pair work"}]}))
    assert pair_decisions(book) == decided
    path = tmp_path / SIMILARITY_DECISIONS_FILE  # YAML, as a TA writes it; it wins over the old file
    path.write_text("decisions:\n- pair: [bob, ann]\n  decision: not a copy\n  note: pair work\n")
    assert book.similarity_decisions_path == path and pair_decisions(book) == decided
    path.write_text("decisions: [")
    assert pair_decisions(book)[1].startswith(f"{path}: cannot be read")


def test_a_decision_is_shown_and_kept_across_runs(course: Course, tmp_path: Path) -> None:
    grades = tmp_path / "grades"
    (grades / "results").mkdir(parents=True)
    base = [float(i % 7) - 3 for i in range(64)]
    other = [float((i * 5) % 11) - 5 for i in range(64)]

    def write(sketches: dict[str, list[float]]) -> None:
        rows = []
        for sid, sketch in sketches.items():
            (grades / "results" / f"{sid}.json").write_text(json.dumps(record(course, sid, None, sketch)))
            rows.append({"id": sid, "result": f"{sid}.json", "status": "graded", "message": ""})
        (grades / "summary.json").write_text(json.dumps({"rows": rows}))

    write({"ann": base, "bob": list(base), "cat": other})
    report = tmp_path / "report"
    write_report(grades, out=report, course=course)
    listed = yaml.safe_load((report / SIMILARITY_DECISIONS_FILE).read_text())["decisions"]
    assert [(d["pair"], d["kind"], d["decision"]) for d in listed] == [(["ann", "bob"], "checkpoint", "")]
    listed[0] |= {"decision": "copy confirmed", "note": "same file, TA Kim"}
    (grades / SIMILARITY_DECISIONS_FILE).write_text(yaml.safe_dump({"decisions": listed}))  # the TA's copy
    write_report(grades, out=report, course=course)
    page = (report / "similarity.html").read_text()
    assert "copy confirmed" in page and "same file, TA Kim" in page and "identical" in page
    write({"ann": base, "bob": other, "cat": [v + 1 for v in other]})  # bob resubmitted: the pair is gone
    write_report(grades, out=report, course=course)
    kept = yaml.safe_load((report / SIMILARITY_DECISIONS_FILE).read_text())["decisions"]
    assert {"pair": ["ann", "bob"], "kind": "no longer listed", "decision": "copy confirmed",
            "note": "same file, TA Kim"} in kept
    assert yaml.safe_load((grades / SIMILARITY_DECISIONS_FILE).read_text())["decisions"] == listed  # never written


def test_a_checkpoint_that_computes_the_same_is_listed_on_the_page(course: Course, tmp_path: Path) -> None:
    """bob's weights are ann's under another parametrisation: their sketches lie far apart, their held-out losses
    agree to float rounding; cat trained her own. The page lists ann and bob, says their weights are apart and
    shows the loss gap; the decisions file lists the pair as a checkpoint pair."""
    grades = tmp_path / "grades"
    (grades / "results").mkdir(parents=True)
    rows = []
    base = _losses(0)
    for sid, sketch, losses in (("ann", [1.0] * 8, base), ("bob", [-1.0, 2.0] * 4, [v + 1e-4 for v in base]),
                                ("cat", [3.0] * 8, _losses(1))):
        (grades / "results" / f"{sid}.json").write_text(json.dumps(record(course, sid, None, sketch, losses=losses)))
        rows.append({"id": sid, "result": f"{sid}.json", "status": "graded", "message": ""})
    (grades / "summary.json").write_text(json.dumps({"rows": rows}))
    report = tmp_path / "report"
    write_report(grades, out=report, course=course)
    page = (report / "similarity.html").read_text()
    pairs = re.findall(r'<tr><td><a href="students/[^"]+">([^<]+)</a> and <a href="students/[^"]+">([^<]+)</a></td>'
                       r'\s*<td>([^<]*)</td>\s*<td>([^<]*)</td>', page)
    assert [(a, b) for a, b, _, _ in pairs] == [("ann", "bob")]
    assert pairs[0][2] == "more than 5% apart" and "0.00010" in pairs[0][3]
    listed = yaml.safe_load((report / SIMILARITY_DECISIONS_FILE).read_text())["decisions"]
    assert [(d["pair"], d["kind"], "distance" in d, d.get("loss_gap")) for d in listed] == [
        (["ann", "bob"], "checkpoint", False, pytest.approx(1e-4))]
