"""The similarity benchmark's smoke run (benchmarks/similarity.py --smoke): a small synthetic class with planted
copies, every copy found and no honest pair listed; the full run (300 students) prints the figures of
docs/similarity.md."""

from __future__ import annotations

import subprocess
import sys

from autograder.config import ROOT


def test_similarity_benchmark_smoke() -> None:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "similarity.py"), "--students", "80", "--copies", "6", "--smoke"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "copies found: 6/6; honest pairs listed: 0" in done.stdout
    assert "checkpoint pairs listed: 2; copies found: 2/2; honest pairs listed: 0" in done.stdout


def test_pairs_do_not_depend_on_the_hash_salt() -> None:
    """copydetect hashes with Python's salted hash(): the fingerprints are made and compared in one process, so two
    processes with different salts list the same pairs with the same scores."""
    import os

    runs = []
    for seed in ("1", "2"):
        cmd = [sys.executable, str(ROOT / "benchmarks" / "similarity.py"), "--students", "60", "--copies", "4",
               "--smoke"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT,
                              env={**os.environ, "PYTHONHASHSEED": seed})
        runs.append([line for line in done.stdout.splitlines() if not line.startswith("time:")])
    assert runs[0] == runs[1] and any("lowest score" in line for line in runs[0])
