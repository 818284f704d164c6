"""Mutation suite: one submission per catalogued mistake and per correct variant, graded in the sandbox."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from autograder.authoring.questions import mc_answers
from autograder.authoring.suite import Suite
from autograder.config import ROOT
from autograder.course import Course
from autograder.grading.batch import grade_batch
from autograder.release.sample import defined_names, filled_notebook
from reference.lesson83_mistakes import MISTAKES
from reference.variants import CORRECT_VARIANTS

pytestmark = pytest.mark.sandbox  # every test here runs notebooks in the grader's sandbox

TEMPLATE = ROOT / "student_templates" / "lesson83" / "lesson83.ipynb"


@pytest.fixture(scope="module")
def graded_mutants(course: Course, tmp_path_factory: pytest.TempPathFactory, suite: Suite) -> Path:
    tmp = tmp_path_factory.mktemp("mutants")
    (tmp / "subs").mkdir()
    answers = mc_answers(list(suite.questions))
    for name, code in [*((f"mistake_{m.id}", m.code) for m in MISTAKES),
                       *((f"variant_{k}", v) for k, v in CORRECT_VARIANTS.items())]:
        nb = filled_notebook(TEMPLATE, extra={defined_names(code)[0]: code}, answers=answers, lesson=suite.lesson)
        nbformat.write(nb, str(tmp / "subs" / f"{name}.ipynb"))
    grade_batch(tmp / "subs", out=tmp / "out", progress=False, course=course)
    return tmp / "out" / "results"


def penalty_table(rows: list[tuple[str, str, dict[str, float], set[str]]]) -> str:
    """Markdown table: per catalogued mistake, the question it is made in and every question that lost points."""
    lines = ["| mistake | made in | points lost (question: points) |", "|---|---|---|"]
    for mistake_id, question, lost, named in rows:
        cells = [f"{q}: {p:g}" + (" (message names the earlier function)" if q in named else "")
                 for q, p in lost.items()]
        lines.append(f"| `{mistake_id}` | {question} | {'; '.join(cells)} |")
    return "\n".join(lines)


def test_mutation_score(graded_mutants: Path, suite: Suite, capsys: pytest.CaptureFixture) -> None:
    points = {q.id: q.points for q in suite.questions}
    notebook = {c.question for c in suite.cases}  # the checkpoint is graded from files these notebooks lack
    caught, missed, elsewhere, rows = 0, [], [], []
    for m in MISTAKES:
        record = json.loads((graded_mutants / f"mistake_{m.id}.json").read_text())
        diagnoses = {c["diagnosis"] for c in record["cases"] if c["question"] == m.question and not c["passed"]}
        if record["questions"][m.question] < points[m.question] and m.id in diagnoses:
            caught += 1
        else:
            missed.append(m.id)
        lost = {q: round(points[q] - s, 2) for q, s in record["questions"].items()
                if q in notebook and s < points[q] - 1e-9}
        # A later question may lose points for this mistake only if every failure there names the earlier one.
        named = {q for q in lost if q != m.question and all(
            "This comes from your" in c["message"] for c in record["cases"] if c["question"] == q and not c["passed"])}
        elsewhere += [f"{m.id} costs {q}" for q in lost if q not in (m.question, *named)]
        rows.append((m.id, m.question, lost, named))
    kept = [k for k in CORRECT_VARIANTS
            if json.loads((graded_mutants / f"variant_{k}.json").read_text())["total"] == suite.notebook_points]
    with capsys.disabled():
        print(f"\nmutation score: {caught}/{len(MISTAKES)} catalogued mistakes lose points on their question with "
              f"the expected diagnosis ({100 * caught / len(MISTAKES):.0f}%); {len(kept)}/{len(CORRECT_VARIANTS)} "
              "correct variants keep full marks")
        print("\npoints lost per catalogued mistake (a mistake costs points where it is made; a later question "
              "that cannot be isolated names the earlier function):\n" + penalty_table(rows))
    assert missed == [] and len(MISTAKES) >= 20
    assert elsewhere == []
    assert len(kept) == len(CORRECT_VARIANTS) >= 8
