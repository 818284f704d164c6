"""No internal names in what a student reads (issue 42, item 7): a handful of Lesson 83 notebooks graded in the
sandbox (the reference, the blank template, a gated do-nothing answer and two catalogued mistakes), and every
student-facing output scanned (the Gradescope view, each feedback page, each nbgrader grade cell) for the grader's
probe names, its case ids ("q5_rope/cache_values") and "computes something". The TA's copy keeps them all."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import nbformat
import pytest

from autograder.authoring.questions import mc_answers
from autograder.authoring.suite import Suite
from autograder.config import ROOT
from autograder.course import Course
from autograder.grading.batch import grade_batch
from autograder.grading.gradebook import FEEDBACK_DIR
from autograder.grading.nbgrader import cell_text
from autograder.release.sample import filled_notebook

TEMPLATE = ROOT / "student_templates" / "lesson83" / "lesson83.ipynb"
MISTAKE_IDS = ("rope_cache_sin_cos_swapped", "learned_transposed")
ZEROS_PE = "\n\n\ndef sinusoidal_pe(max_len, d):\n    import numpy as np\n    return np.zeros((max_len, d))\n"


def _defines(code: str) -> str:
    """The first function or class a catalogued mistake's code defines (the cell it goes in)."""
    return next(n.name for n in ast.parse(code).body if isinstance(n, ast.FunctionDef | ast.ClassDef))


@pytest.fixture(scope="module")
def graded(course: Course, suite: Suite, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict]]:
    from reference.lesson83_mistakes import MISTAKES

    tmp = tmp_path_factory.mktemp("words")
    subs = tmp / "subs"
    subs.mkdir()
    answers = mc_answers(list(suite.questions))
    notebooks = {"reference": filled_notebook(TEMPLATE, answers=answers, lesson=suite.lesson),
                 "blank": nbformat.read(str(TEMPLATE), as_version=4),
                 "zeros_pe": filled_notebook(TEMPLATE, extra={"sinusoidal_pe": ZEROS_PE}, answers=answers,
                                             lesson=suite.lesson)}
    for m in (m for m in MISTAKES if m.id in MISTAKE_IDS):
        notebooks[m.id] = filled_notebook(TEMPLATE, extra={_defines(m.code): m.code}, answers=answers,
                                          lesson=suite.lesson)
    assert len(notebooks) == 3 + len(MISTAKE_IDS)
    for name, nb in notebooks.items():
        nbformat.write(nb, str(subs / f"{name}.ipynb"))
    out = tmp / "out"
    grade_batch(subs, out=out, progress=False, workers=2, course=course)
    return out, {p.stem: json.loads(p.read_text()) for p in (out / "results").glob("*.json")}


def _internal_names(suite: Suite) -> list[str]:
    """What a student must never read: the case ids, the probe names the notebook never shows, the gate's old words."""
    shown = TEMPLATE.read_text()
    probes = {c.probe for c in suite.cases} - {p for p in {c.probe for c in suite.cases} if f"{p}(" in shown}
    return [*sorted(c.id for c in suite.cases), *(f"`{p}`" for p in sorted(probes)), "probe `", "computes something"]


@pytest.mark.sandbox
def test_no_student_facing_output_names_the_graders_internals(graded: tuple[Path, dict[str, dict]],
                                                              suite: Suite) -> None:
    out, records = graded
    assert set(records) == {"reference", "blank", "zeros_pe", *MISTAKE_IDS}
    points = suite.question_points()
    said: dict[str, str] = {}
    for name, record in records.items():
        said[f"gradescope {name}"] = json.dumps(record["gradescope"]["tests"]) + record["gradescope"]["output"]
        for q in suite.questions:
            if q.graded and not q.manual:
                said[f"nbgrader {name} {q.id}"] = cell_text(record, q.id, points.get(q.id, q.points))[0]
    said |= {f"feedback {p.name}": p.read_text() for p in (out / FEEDBACK_DIR).glob("*.html")}
    assert len([k for k in said if k.startswith("feedback ")]) == len(records)
    banned = _internal_names(suite)
    found = {key: [b for b in banned if b in text] for key, text in said.items()}
    assert not {k: v for k, v in found.items() if v}, {k: v for k, v in found.items() if v}
    # the students were told something (the scan is not of empty pages), and the TA's copy keeps the ids
    assert any("gives a real answer" in text or "give a real answer" in text for text in said.values())
    assert any(c["id"] in c["message"] for r in records.values() for c in r["cases"] if not c["passed"])
    assert "revisit" in said["gradescope rope_cache_sin_cos_swapped"]
