"""The similarity benchmark's smoke run (benchmarks/similarity.py --smoke): a small class of honest notebooks with a
planted copy per disguise, at least 90% of them listed and no honest pair; the full run (300 students) prints the
figures of docs/similarity.md."""

from __future__ import annotations

import re
import subprocess
import sys

from autograder.config import ROOT


def test_similarity_benchmark_smoke() -> None:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "similarity.py"), "--students", "80", "--copies", "21", "--smoke"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr  # exit 1 below 90% recall or with a false pair
    assert re.search(r"recall: (19|20|21)/21 copies listed \(\d+%\); false pairs: 0;", done.stdout), done.stdout
    assert ("checkpoint pairs listed: 3; copies found: 3/3 (1 by what they compute alone); honest pairs listed: 0"
            in done.stdout)


def test_pairs_do_not_depend_on_the_hash_salt() -> None:
    """The fingerprints are keyed hashes (blake2b), not Python's salted hash(): two processes with different salts
    list the same pairs with the same scores."""
    import os

    runs = []
    for seed in ("1", "2"):
        cmd = [sys.executable, str(ROOT / "benchmarks" / "similarity.py"), "--students", "50", "--copies", "8",
               "--smoke"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT,
                              env={**os.environ, "PYTHONHASHSEED": seed})
        runs.append([line for line in done.stdout.splitlines() if not line.startswith("time:")])
    assert runs[0] == runs[1] and any("lowest score" in line for line in runs[0])
