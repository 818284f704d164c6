"""Grading under an operator's lower hard limits (ulimit -v, ulimit -n): the demo lesson's test and Lesson 83's."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

from autograder import MIB
from autograder.config import ROOT
from autograder.release.common import tool_env

VM_KB = 3_000_000  # a shared server's address-space cap: enough for torch, below what the grader asks for


OPEN_FILES = 256


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
