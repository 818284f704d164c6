"""Smoke test of benchmarks/grading_throughput.py: a tiny run on the sample class prints its figures and ratio."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from autograder.build import tool_env
from autograder.config import ROOT


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
