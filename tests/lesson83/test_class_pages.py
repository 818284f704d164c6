"""Lesson 83's sample class graded for real, then its feedback files, leaderboard and similarity pages: no feedback
file holds a hidden case's arguments, expected values or messages, nor the multiple-choice key; the leaderboard
shows the reference checkpoint's held-out perplexity, recomputed here, and never the checkpoint whose claims were
inflated; the two sample checkpoints that share their weights are listed as identical."""

from __future__ import annotations

import html
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from autograder.authoring.questions import mc_answers
from autograder.authoring.suite import Suite
from autograder.config import ROOT
from autograder.course import Course, course_of
from autograder.grading.batch import grade_batch
from autograder.grading.figures import gradescope_entries
from autograder.grading.gradebook import FEEDBACK_DIR, SIMILARITY_DECISIONS_FILE
from autograder.release import write_samples
from autograder.report.write import write_report

TEMPLATE = ROOT / "student_templates" / "lesson83" / "lesson83.ipynb"


@pytest.fixture(scope="module")
def suite() -> Suite:
    return course_of().suite


@pytest.fixture(scope="module")
def graded(course: Course, tmp_path_factory: pytest.TempPathFactory, suite: Suite) -> dict[str, Path]:
    """The whole sample class (the reference and its inflated twin with their checkpoints, the blank template, one
    notebook per catalogued mistake and the cheats) graded and reported, with a roster for the page to post."""
    tmp = tmp_path_factory.mktemp("class")
    subs = tmp / "subs"
    write_samples(TEMPLATE, subs, answers=mc_answers(list(suite.questions)), lesson=suite.lesson,
                  checkpoint_files=suite.checkpoint_files)
    grades = tmp / "grades"
    grade_batch(subs, out=grades, progress=False, course=course)
    (grades / "leaderboard_roster.csv").write_text("id,pseudonym,opt_out\nreference,Positional Pioneer,\n"
                                                   "checkpoint_inflated_claims,Tall Tale,\n")
    write_report(grades, out=tmp / "report", course=course)
    return {"grades": grades, "report": tmp / "report", "subs": subs}


def _numbers(value: Any) -> set[str]:
    """The numbers of a value, as 3-decimal text (a prefix of how a message prints them), 0 and 1 left out."""
    out: set[str] = set()
    if hasattr(value, "tolist"):  # numpy arrays and tensors
        value = value.tolist()
    if isinstance(value, dict):
        for v in value.values():
            out |= _numbers(v)
    elif isinstance(value, list | tuple):
        for v in value:
            out |= _numbers(v)
    elif isinstance(value, float) and math.isfinite(value) and abs(value) not in (0.0, 1.0):
        out.add(f"{value:.3f}")
    return out


@pytest.mark.sandbox
def test_no_feedback_file_holds_a_hidden_case_or_the_key(graded: dict[str, Path], suite: Suite) -> None:
    pages = {p.stem: p.read_text() for p in (graded["grades"] / FEEDBACK_DIR).glob("*.html")}
    rows = json.loads((graded["grades"] / "summary.json").read_text())["rows"]
    assert sorted(pages) == sorted(r["id"] for r in rows) and len(pages) > 40  # every student of the sample class
    visible = set().union(*(_numbers(suite.expected[c.id]["value"]) | _numbers(c.args)
                            for c in suite.cases if not c.hidden))
    secret = set()
    for c in suite.cases:
        if c.hidden:
            secret |= (_numbers(suite.expected[c.id]["value"]) | _numbers(c.args)) - visible
    whats = {c.what for c in suite.cases if c.hidden and c.what} - {c.what for c in suite.cases if not c.hidden}
    key = mc_answers(list(suite.questions))
    whys = [ch.why for q in suite.questions for ch in q.choices]
    assert len(secret) > 20 and whats and key and whys  # there is something to leak
    failed_hidden = 0
    for sid, page in pages.items():
        text = html.unescape(page)
        record = json.loads((graded["grades"] / "results" / f"{sid}.json").read_text())
        for c in record["cases"]:
            if c["hidden"] and not c["passed"] and c["message"]:
                failed_hidden += 1
                assert c["message"] not in text, f"{sid}: the TA message of {c['id']} is in its feedback"
        # what it says of hidden cases: their rows and the summary on top (a public case's message shows its own
        # values and the student's output, which may equal a hidden case's numbers by chance)
        rows_said = re.findall(r": hidden tests</td>.*?<pre>(.*?)</pre>", page, re.S)  # one row per question
        said = html.unescape("\n".join([*rows_said, *re.findall(r"</p>\s*<pre>(.*?)</pre>", page, re.S)]))
        hidden_questions = {c.question for c in suite.cases if c.hidden and c.points > 0}
        assert len(rows_said) == len(hidden_questions) and said.count("hidden case ") > 20
        assert not [n for n in secret if n in said], f"{sid}: a hidden expected value or argument in its feedback"
        assert not [w for w in whats if w in text], f"{sid}: a hidden case's call in its feedback"
        assert not [w for w in whys if w in text], f"{sid}: the explanation of a multiple-choice answer"
        assert not [v for v, letter in key.items() if re.search(rf"{v}\W+{letter}\b", text)], sid
    assert failed_hidden > 10  # the blank and the mistakes fail hidden cases: the check above had work to do
    assert "Positional" not in pages["reference"]  # a pseudonym is the public page's, never the feedback's


def _heldout(suite: Suite) -> dict[str, dict[str, float]]:
    """The reference checkpoint's held-out perplexity per scheme and context, computed here from its weights."""
    plugin = suite.lesson.plugin
    config, states = plugin.load_checkpoint((suite.lesson.checkpoint_dir / "milestone.pt").read_bytes())
    tokens = plugin.heldout_tokens()
    out = {}
    for pos, state in states.items():
        model = plugin.build_model(pos, state)
        out[pos] = {str(c): v for c, v in plugin.heldout_ppl(model, tokens).items()}
    return out


@pytest.mark.sandbox
def test_the_leaderboard_shows_verified_held_out_figures_only(course: Course, graded: dict[str, Path],
                                                               suite: Suite) -> None:
    expected = _heldout(suite)
    record = json.loads((graded["grades"] / "results" / "reference.json").read_text())
    entries = gradescope_entries(suite, record)
    assert len(entries) == len(expected) * 3 and {e["order"] for e in entries} == {"asc"}
    got = {e["name"]: e["value"] for e in entries}
    for pos, row in expected.items():
        for c, v in row.items():
            assert got[f"{pos} held-out perplexity (context {c})"] == pytest.approx(v, rel=1e-4)
    # the claims of the inflated twin were 10% too low: verification failed, so it has no figure anywhere
    inflated = json.loads((graded["grades"] / "results" / "checkpoint_inflated_claims.json").read_text())
    assert gradescope_entries(suite, inflated) == []
    board = (graded["report"] / "leaderboard.html").read_text()
    main = board[board.index("<main>"):]
    assert main.count(">reference</a></td>") == len(expected)  # ranked once per scheme
    assert ">checkpoint_inflated_claims</a></td>" not in main
    assert f"{expected['rope']['512']:.3f}" in main and main.count("<svg") == len(expected)
    public = (graded["report"] / "public_leaderboard.html").read_text()
    assert "Positional Pioneer" in public and "Tall Tale" not in public and "reference" not in public
    again = write_report(graded["grades"], out=graded["report"], course=course).parent / "leaderboard.html"
    assert again.read_text() == board  # a re-run ranks the class the same way


@pytest.mark.sandbox
def test_the_shared_checkpoint_is_listed_as_identical(graded: dict[str, Path]) -> None:
    page = (graded["report"] / "similarity.html").read_text()
    pairs = re.findall(r'<tr><td><a href="students/[^"]+">([^<]+)</a> and <a href="students/[^"]+">([^<]+)</a></td>'
                       r'\s*<td>([^<]*)</td>', page)
    assert [(a, b) for a, b, _ in pairs] == [("checkpoint_inflated_claims", "reference")]
    assert pairs[0][2].count("identical") == 5
    decisions = yaml.safe_load((graded["report"] / SIMILARITY_DECISIONS_FILE).read_text())["decisions"]
    assert {tuple(d["pair"]) for d in decisions if d["kind"] == "checkpoint"} == {("checkpoint_inflated_claims",
                                                                                  "reference")}


@pytest.mark.sandbox
def test_gradescope_results_carry_the_verified_figures(course: Course, graded: dict[str, Path], suite: Suite,
                                                       tmp_path: Path) -> None:
    from autograder.grading.gradescope import grade_gradescope

    stored = json.loads((graded["grades"] / "results" / "reference.json").read_text())
    for name, board in (("reference", gradescope_entries(suite, stored)), ("checkpoint_inflated_claims", None)):
        run = grade_gradescope(graded["subs"] / name, tmp_path / name / "results.json", course=course)
        assert run.graded
        out = json.loads((tmp_path / name / "results.json").read_text())
        assert out.get("leaderboard") == board  # the inflated claims: no leaderboard entry at all


@pytest.mark.sandbox
def test_no_student_facing_output_of_the_sample_class_names_the_graders_internals(graded: dict[str, Path],
                                                                                suite: Suite) -> None:
    """Every student of the sample class: the Gradescope view and the feedback page name no case id, no probe and
    not "computes something" (issue 42, item 7); the TA's results keep the ids."""
    from autograder.grading.gradebook import RESULTS_DIR

    banned = [*(c.id for c in suite.cases), "probe `", "computes something"]
    records = [json.loads(p.read_text()) for p in (graded["grades"] / RESULTS_DIR).glob("*.json")]
    said = {f"gradescope {r['submission']}": json.dumps(r["gradescope"]) for r in records}
    said |= {f"feedback {p.name}": p.read_text() for p in (graded["grades"] / FEEDBACK_DIR).glob("*.html")}
    assert len(records) >= 40 and len(said) == 2 * len(records)
    found = {key: [b for b in banned if b in text] for key, text in said.items()}
    assert not {k: v for k, v in found.items() if v}, {k: v for k, v in found.items() if v}
    assert any(c["id"] in c["message"] for r in records for c in r["cases"] if not c["passed"])
