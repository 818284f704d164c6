"""The report's code analysis (autograder/report/code.py) and expected-versus-received blocks (compare.py), on
the demo lesson's questions (tests/fixtures/lesson_demo), without grading anything."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from autograder import report as report_module
from autograder.authoring.suite import Suite
from autograder.course import Course
from autograder.report import checkpoint_table


@pytest.fixture(scope="module")
def suite() -> Suite:
    return Course.load(Path(__file__).resolve().parents[1] / "fixtures" / "lesson_demo" / "grading_config.yaml").suite


@pytest.mark.parametrize(("code", "shown", "warning"), [
    ("center = np.zeros", "<mark>center = np.zeros</mark>", "is bound 2 times"),
    ("def center(max_len, d):\n    return 0", "<mark>def center(max_len, d):</mark>", "is bound 2"),
    ("from numpy import zeros as center", "<mark>from numpy import zeros as center</mark>", "import"),
    ("for center in [len]:\n    pass", "<mark>for center in [len]:</mark>", "for loop"),
    ("if (center := len):\n    pass", "<mark>if (center := len):</mark>", "assignment expression"),
    ("globals()['center'] = len", "<mark>globals()[&#x27;center&#x27;] = len</mark>", "globals()"),
    ("def f():\n    global center\n    center = len\nf()", "<mark>    center = len</mark>",
     "bound when it runs"),
    ("%time x = 1\ncenter = len", "<mark>center = len</mark>", "is bound 2 times"),
    ("exec('center = len')", "<mark>exec(&#x27;center = len&#x27;)</mark>", "may rebind"),
])
def test_question_code_follows_every_kind_of_rebinding(suite: Suite, code: str, shown: str, warning: str) -> None:
    q1 = next(q for q in suite.questions if q.id == "q1_center")
    clean = "def center(max_len, d):\n    return clean_table(max_len, d)"
    html_text = report_module.question_code([(10, clean), (11, "grader.check('q1')"), (40, code)], q1)
    graded = html_text.split("<details open>")[1].split("</details>")[0]
    assert shown in graded and warning in html_text, html_text
    assert ("clean_table" in graded) == (warning == "may rebind")  # exec: the def stays, the exec is marked too


def test_question_code_says_when_a_name_is_gone(suite: Suite) -> None:
    q1 = next(q for q in suite.questions if q.id == "q1_center")
    html_text = report_module.question_code([(3, "def center(m, d):\n    pass"), (4, "del center")], q1)
    assert "binds center (deleted in cell 4, line 1)" in html_text
    training = [(3, "def center(m, d):\n    pass")]
    assert report_module.stub_state(training, {"center"}) == {"center": True}
    cells = report_module.code_cells([{"cell_type": "code", "source": "center = len"},
                                      {"cell_type": "code", "source": "center = max",
                                       "metadata": {"tags": ["milestone-train"]}}])
    assert cells == [(0, "center = len")]  # the grader skips that cell: it binds nothing



def test_checkpoint_table_marks_disagreement_and_bounds() -> None:
    received = {"ppl": {"128": 5.0, "256": 7.0, "512": 9.0}, "claimed": {"128": 5.01, "256": 6.0, "512": 9.0},
                "thresholds": {"128": 4.5}}
    html_text = checkpoint_table(received, rel_tol=0.02)
    rows = re.findall(r"<tr( class=bad)?><td>(\d+)</td>", html_text)
    assert [(bad != "", c) for bad, c in rows] == [(True, "128"), (True, "256"), (False, "512")]
    assert checkpoint_table(None, rel_tol=0.02) == ""


# --------------------------------------------------------------------------- any stored result, any value


def test_compare_marks_the_wrong_value_and_a_shape_that_differs(suite: Suite) -> None:
    from autograder.report.render import blocks_html

    codec = suite.lesson.checks  # the lesson's copy of the runtime: the same codec the report reads with
    want = np.arange(12.0).reshape(3, 4)
    got = want.copy()
    got[1, 2] += 1
    blocks = report_module.compare(None, {"value": want}, codec.to_plain({"value": got}), atol=1e-6, rtol=0)
    note, grids = blocks
    assert "1 of 12 values differ" in note["text"] and "first at index [1, 2]" in note["text"]
    marked = [[(i, j) for i, row in enumerate(g["rows"]) for j, (_, bad) in enumerate(row) if bad]
              for g in grids["grids"]]
    assert marked == [[(1, 2)], [(1, 2)]]
    html_text = str(blocks_html(report_module.compare(None, {"value": want}, codec.to_plain({"value": want.T}),
                                                  atol=1e-6, rtol=0)))
    assert "<tr class=bad><td>shape</td><td>[3, 4]</td><td>[4, 3]</td></tr>" in html_text
    assert html_text.count('<table class="grid">') == 2
