"""Smoke tests of the benchmarks: grading_throughput.py (a tiny run on the sample class prints its figures and
ratio) and check_speed.py (one timed grader.check per question prints a row per question)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from autograder.build import tool_env
from autograder.config import ROOT
from autograder.judge import Suite


def test_grading_throughput_smoke(fresh_build: dict[str, Path]) -> None:
    """Two submissions with this engine, one with `otter run`, on the sample class a fresh release writes."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "grading_throughput.py"), "--n", "2", "--otter-n", "1",
           "--allow-small", "--samples", str(fresh_build["samples"]), "--autograder", str(fresh_build["otter_zip"])]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env=tool_env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert re.search(r"^ours \(grade_batch\)\s+\|\s+2 \|(\s+[\d.]+ \|){3}\s+[\d.]+$", out, re.M), out
    assert re.search(r"^otter run\s+\|\s+1 \|(\s+[\d.]+ \|){3}\s+[\d.]+$", out, re.M), out
    assert re.search(r"^ours, statuses: graded 2$", out, re.M), out
    assert re.search(r"^ratio otter median / our median: [\d.]+x \(same subset only: [\d.]+x\)", out, re.M), out
    assert re.search(r"^our median per submission: [\d.]+ s", out, re.M), out
    assert "0 disagreement(s) on auto-graded totals among 1 submission(s)" in out, out


def test_check_speed_smoke(fresh_build: dict[str, Path], suite: Suite) -> None:
    """Every question's grader.check on a fresh student release, under one load process: a timing per question."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "check_speed.py"), "--smoke",
           "--student", str(fresh_build["student"])]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env=tool_env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert re.search(r"^load: 1 busy-loop process\(es\) during the timing", out, re.M), out
    checked = [q for q in suite.questions if q.cases]
    for q in checked:
        public = sum(not c["hidden"] for c in q.cases)
        row = rf"^{q.id}\s+\|\s+{public} \|\s+[\d.]+ \|\s+[\d.]+ \|\s+0\.30 \| (yes|NO)$"
        assert re.search(row, out, re.M), out
    assert re.search(rf"^\d+ of {len(checked)} within the goal of 0.3 s", out, re.M), out


def test_checkpoint_verify_smoke(tmp_path: Path) -> None:
    """Two schemes, one mistake, 20 windows: old, spawn and new CPU side by side, the move, the verdicts and the
    class-scale projection."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "checkpoint_verify.py"), "--smoke", "--work", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    number = r"\s+[\d.]+"
    assert re.search(r"^checkpoint\s+old s\s+new s\s+old cpu\s+spawn cpu\s+new cpu\s+ratio\s+moved\s+margin\s+"
                     r"verdicts$", out, re.M), out
    for name in ("reference", "inflated_claims", "mistake_lm_rotates_v"):
        assert re.search(rf"^{name}{number * 5}\s+(\S+x|-)\s+[\d.]+%", out, re.M), out
    assert re.search(r"^reference .* rope pass, alibi pass$", out, re.M), out
    assert re.search(r"^inflated_claims .* rope checkpoint_claims_disagree", out, re.M), out
    assert re.search(r"^all" + number * 5, out, re.M) and "flipped: none" in out, out
    assert re.search(r"^class scale: 2 distinct checkpoints verified as grade_batch does .* [\d.]+ CPU-s per "
                     r"checkpoint; projected for 300 on 2 cores: [\d.]+ min", out, re.M), out
