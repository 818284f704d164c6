"""An operator's lower hard limits (a shared server's `ulimit -v`, a container's `ulimit -n`): the grader gives each
submission the lower value, says so, and grades honest work normally (on the demo lesson with its milestone plug-in;
Lesson 83's torch checkpoint reader under the same limits: tests/lesson83/test_execute_lesson83.py)."""

from __future__ import annotations

import json
import resource
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from test_demo_milestone import MILESTONE, _line  # the demo's milestone question, a fitted line

from autograder.authoring.questions import mc_answers
from autograder.config import ROOT
from autograder.course import Course
from autograder.release.common import tool_env
from autograder.release.sample import filled_notebook
from autograder.sandbox import MIB, fit_hard, lowered_limits

FIXTURE = ROOT / "tests" / "fixtures" / "lesson_demo"
VM_KB = 3_000_000  # a shared server's address-space cap: enough for torch, below what the grader asks for
OPEN_FILES = 256


def test_limits_above_the_hard_limit_are_lowered_to_it() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert fit_hard(resource.RLIMIT_NOFILE, soft) == (soft, soft)
    if hard != resource.RLIM_INFINITY:
        assert fit_hard(resource.RLIMIT_NOFILE, hard + 10) == (hard, hard)
        assert fit_hard(resource.RLIMIT_NOFILE, hard - 1, hard + 10) == (hard - 1, hard)
        notes = lowered_limits([(resource.RLIMIT_NOFILE, hard + 10)], who="the sandbox")
        assert notes == [f"the sandbox: open files lowered to {hard} (the grader's hard limit, ulimit -n) "
                         f"from the configured {hard + 10}"]
    assert lowered_limits([(resource.RLIMIT_NOFILE, soft)], who="the sandbox") == []


@pytest.fixture
def course(tmp_path: Path) -> Path:
    """A copy of the demo course whose lesson grades a checkpoint (its milestone plug-in, in the engine's reader
    child), the reader asking for more memory than the ulimit leaves: its grading config."""
    root = tmp_path / "lesson_demo"
    shutil.copytree(FIXTURE, root, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "assignments" / "lesson_demo" / "q4_line.md").write_text(MILESTONE)
    config = (root / "grading_config.yaml").read_text().replace("total_points: 10", "total_points: 13")
    config = config.replace("questions:\n", "questions:\n  q4_line: {points: 1}\n")
    (root / "grading_config.yaml").write_text(config + "\nmilestone: {points: 2}\n"
                                              "submissions: {checkpoint_memory_mb: 4096}\n")
    return root / "grading_config.yaml"


@pytest.mark.build
@pytest.mark.sandbox
def test_grade_under_an_operators_lower_ulimits_gives_full_marks_and_says_so(tmp_path: Path, course: Path,
                                                                            demo_course: Course) -> None:
    subs, out = tmp_path / "subs", tmp_path / "out"
    suite = Course.load(course).suite
    assert suite.checkpoint_files == ("fit.json",)  # the reader starts
    nb = filled_notebook(demo_course.lesson.notebook, answers=mc_answers(list(suite.questions)),
                         lesson=demo_course.lesson)
    (subs / "honest").mkdir(parents=True)
    nbformat.write(nb, str(subs / "honest" / "lesson_demo.ipynb"))
    points = json.loads((FIXTURE / "reference" / "lesson_demo_points.json").read_text())["points"]
    slope, intercept, mse = _line(points)
    (subs / "honest" / "fit.json").write_text(json.dumps({"slope": slope, "intercept": intercept, "mse": mse}))
    grade_under_lower_ulimits(course, subs, out, auto_points=suite.auto_points)


def grade_under_lower_ulimits(config: Path, subs: Path, out: Path, *, auto_points: float) -> None:
    """Grade the class folder `subs` (one submission, `honest`) under `ulimit -v VM_KB` and `ulimit -n OPEN_FILES`:
    full marks, and the sandbox's and the checkpoint reader's lowered limits said in the summary, the record and
    the command's output (also Lesson 83's test, tests/lesson83/test_execute_lesson83.py)."""
    grade = [sys.executable, "-m", "autograder.cli", "--config", str(config), "grade", str(subs), "--out", str(out),
             "--quiet", "--workers", "1"]
    script = f"ulimit -v {VM_KB} && ulimit -n {OPEN_FILES} && exec {shlex.join(grade)}"
    proc = subprocess.run(["bash", "-c", script], cwd=ROOT, env=tool_env(), capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    record = json.loads((out / "results" / "honest.json").read_text())
    assert record["status"] == "graded", record["notes"]
    assert record["total"] == auto_points, [c["message"] for c in record["cases"] if not c["passed"]]
    vm_mb = VM_KB * 1024 // MIB
    address = f"the sandbox: address space lowered to {vm_mb} MB (the grader's hard limit, ulimit -v)"
    files = f"the sandbox: open files lowered to {OPEN_FILES} (the grader's hard limit, ulimit -n)"
    reader = f"the checkpoint reader: address space lowered to {vm_mb} MB (the grader's hard limit, ulimit -v)"
    for notes in (summary["limits_lowered"], record["notes"]):
        for words in (address, files, reader):
            assert any(n.startswith(words) for n in notes), (words, notes)
    assert f"limits lowered: {address}" in proc.stdout
