"""A slow function costs only the questions whose checks call it: each probe has its own limit and each question a
share of the probes' time; a stopped probe earns nothing and the probes not yet answered run in a fresh child (a
probe module of the tests' own, then the grade command on the demo lesson's student notebook)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest

from autograder.authoring.questions import mc_answers
from autograder.course import Course
from autograder.grading.batch import grade_batch
from autograder.model import NOT_RUN, Status
from autograder.release.sample import filled_notebook
from autograder.sandbox import MAX_PROBE_RUNS, ExecResult, Limits, WorkerPool
from helpers.celltime import FAKE_CHECKS, demo_copy, nb

PROBE_S, SHARE_S = 1, 2  # short, so that the tests stay quick
LIMITS = Limits(wall_timeout_s=6, cell_timeout_s=2, cpu_timeout_s=6, memory_mb=2048, max_processes=32, max_file_mb=8,
                max_output_kb=64, scratch_mb=64, probe_timeout_s=PROBE_S, question_timeout_s=SHARE_S)
DEFS = ("import time, ctypes\ndef fast():\n    return 1\ndef slow():\n    time.sleep(600)\n"
        "def slow_c():\n    ctypes.CDLL(None).sleep(600)  # one C call: only a killed process stops it\n"
        "def medium():\n    end = time.thread_time() + 0.8  # CPU time: what a question's share counts\n"
        "    while time.thread_time() < end:\n        pass\n    return 2\n")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ExecResult]]:
    folder = tmp_path_factory.mktemp("probes")
    (folder / "fake_checks_probetime.py").write_text(FAKE_CHECKS)
    sys.path.insert(0, str(folder))
    jobs = {
        # a probe past its own limit (in Python, then in a C call), a question that spends its share, and hidden
        # probes after them all
        "slow": [("qa/one", "fast", {}), ("qb/slow", "slow", {}), ("qb/after", "fast", {}),
                 ("qc/m1", "medium", {}), ("qc/m2", "medium", {}), ("qc/m3", "medium", {}), ("qc/m4", "medium", {}),
                 ("qd/c_call", "slow_c", {}), ("qd/after", "fast", {}), ("qa/hidden", "fast", {}, True),
                 ("qc/hidden", "medium", {}, True)],
        # every probe under its limit and every share, but together past the notebook's CPU time (6 s): the run
        # stopped by the whole-notebook limit goes on in a fresh child and every probe is answered
        "wall": [(f"q{n}/m{k}", "medium", {}) for n in range(5) for k in range(2)],
        # more slow probes than fresh runs: the grader stops, the rest are not run
        "many": [(f"q{n}/slow", "slow", {}) for n in range(MAX_PROBE_RUNS + 3)] + [("qz/fast", "fast", {})],
    }
    try:
        with WorkerPool(2, limits=LIMITS, probe_module="fake_checks_probetime", tripwire=False) as pool:
            yield {name: pool.run(nb(DEFS), probes=probes) for name, probes in jobs.items()}
    finally:
        sys.path.remove(str(folder))


@pytest.mark.sandbox
def test_a_slow_probe_costs_only_itself(runs: dict[str, ExecResult]) -> None:
    res = runs["slow"]
    assert res.status == Status.GRADED, res.notes
    for key in ("qa/one", "qb/after", "qc/m1", "qc/m2", "qd/after", "qa/hidden"):
        assert res.outputs[key] == {"value": 1 if "m" not in key else 2}, (key, res.outputs, res.notes)
    for key in ("qb/slow", "qd/c_call"):
        assert key not in res.outputs and f"after {PROBE_S:g} s, the time limit of one check" in res.not_run[key]
        # the check is named (the student's view shows it by its name), never the grader's probe
        assert any(key in n and "probe `" not in n for n in res.student_notes), res.student_notes


@pytest.mark.sandbox
def test_a_question_that_spends_its_share_loses_only_its_own_checks(runs: dict[str, ExecResult]) -> None:
    res = runs["slow"]
    assert {k for k in res.not_run if k.startswith("qc/")} == {"qc/m3", "qc/m4", "qc/hidden"}, res.not_run
    assert f"share of {SHARE_S:g} s" in res.not_run["qc/hidden"] and "qc/m" in res.not_run["qc/hidden"]
    said = [n for n in res.student_notes if "qc" in n]
    assert len(said) == 1 and NOT_RUN in said[0], res.student_notes
    assert sum(v for k, v in res.probe_cpu.items() if k.startswith("qc/")) < SHARE_S + 0.5


@pytest.mark.sandbox
def test_a_whole_notebook_limit_among_the_probes_goes_on_in_a_fresh_child(runs: dict[str, ExecResult]) -> None:
    res = runs["wall"]
    assert res.status == Status.GRADED and not res.not_run, (res.not_run, res.notes)
    assert all(v == {"value": 2} for v in res.outputs.values()) and len(res.outputs) == 10


@pytest.mark.sandbox
def test_fresh_runs_are_capped(runs: dict[str, ExecResult]) -> None:
    res = runs["many"]
    stopped = [k for k, why in res.not_run.items() if "time limit of one check" in why]
    assert len(stopped) == MAX_PROBE_RUNS + 1, res.not_run
    assert len(res.not_run) == MAX_PROBE_RUNS + 4 and "qz/fast" in res.not_run
    assert any(f"{MAX_PROBE_RUNS + 1} times" in n for n in res.student_notes), res.student_notes


# --------------------------------------------------------------------------- the grade command, a real notebook


@pytest.mark.build
@pytest.mark.sandbox
def test_a_slow_function_loses_only_the_questions_that_call_it(tmp_path: Path, demo_course: Course) -> None:
    course = Course.load(demo_copy(tmp_path, probe_timeout_s=PROBE_S, question_timeout_s=SHARE_S))
    suite = course.suite
    notebook = filled_notebook(demo_course.lesson.notebook, answers=mc_answers(list(suite.questions)),
                               lesson=course.lesson)
    slow = next(c for c in suite.cases if isinstance(c.args.get("fn"), str))  # its function, made slow
    name = slow.args["fn"]
    cell = next(c for c in notebook.cells if c.cell_type == "code" and f"def {name}(" in c.source)
    cell.source += f"\n\n_{name} = {name}\n\ndef {name}(*a, **k):\n    import time\n    time.sleep(600)\n"
    subs = tmp_path / "subs"
    subs.mkdir()
    nbformat.write(notebook, str(subs / "slow.ipynb"))
    grade_batch(subs, out=tmp_path / "out", course=course, progress=False, workers=1)
    record = json.loads((tmp_path / "out" / "results" / "slow.json").read_text())
    scores, points = record["questions"], suite.question_points()
    assert scores[slow.question] < points[slow.question]
    for q, p in points.items():
        if q != slow.question and not any(c.question == q and name in json.dumps(c.args) for c in suite.cases):
            assert scores.get(q) == p, (q, scores, record["student_notes"])
    said = record["gradescope"]["output"]
    assert "Look for an endless loop" not in said and f"`{name}`" in said and f"{PROBE_S:g} s" in said, said
    row = next(r for r in (tmp_path / "out" / "grades.csv").read_text().splitlines() if r.startswith("slow"))
    assert name in row, row


def test_nbgrader_feedback_says_the_time_limit_a_question_ran_into() -> None:
    """nbgrader's grade cell of a question shows the note on the check that was slow, beside its not-run cases."""
    from autograder.grading.nbgrader import cell_text

    note = "The checks of qa (they call `f`) used up the question's share of 15 s of checking time"
    record = {"status": "graded", "questions": {"qa": 1.0}, "student_notes": [note, "The check qb/x was slow"],
              "gradescope": {"tests": [{"name": "qa/one", "score": 0, "max_score": 1,
                                        "output": f"{NOT_RUN} (the notes above say which check was slow)"}]}}
    text, _ = cell_text(record, "qa", 2.0)
    assert note in text and NOT_RUN in text and "qb/x" not in text, text
