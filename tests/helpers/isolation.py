"""The isolation tests' limits, and a Python every user may read (a venv of it) for the uid fallback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from autograder.config import ROOT
from autograder.sandbox import Limits

LIMITS = Limits(wall_timeout_s=30, cpu_timeout_s=10, memory_mb=2048, max_processes=32, max_file_mb=8,
                max_output_kb=64, scratch_mb=64)


def make_venv(dest: Path, python: str) -> Path:
    """A venv of `python` at dest that imports this environment's packages; returns its python."""
    subprocess.run([python, "-m", "venv", "--without-pip", str(dest)], check=True)
    exe = dest / "bin" / "python"
    site = subprocess.run([str(exe), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    here = next(p for p in sys.path if p.endswith("site-packages") and (Path(p) / "torch").is_dir())
    (Path(site) / "grader-test.pth").write_text(here + "\n")
    return exe


@pytest.fixture(scope="module")
def readable_python() -> Iterator[Path]:
    """The stand-in venv's python, after checking that student code can be dropped to a uid with it."""
    if os.geteuid() != 0:
        pytest.skip("not root: student code cannot be dropped to an unprivileged uid, so the no-bubblewrap "
                    "isolation is not tested (it is skipped, not passed)")
    candidates = [os.path.realpath(getattr(sys, "_base_executable", sys.executable)), f"/usr/bin/python{VERSION}",
                  f"/usr/local/bin/python{VERSION}"]
    folder = Path(tempfile.mkdtemp(prefix="grader-venv-", dir="/tmp"))
    folder.chmod(0o755)
    problems = []
    try:
        for i, python in enumerate(dict.fromkeys(c for c in candidates if os.access(c, os.X_OK))):
            exe = make_venv(folder / str(i), python)
            check = subprocess.run([str(exe), "-c", "import sys, tempfile; sys.path.insert(0, sys.argv[1]); "
                                    "from autograder.sandbox import uid_drop_problem as p; "
                                    "print(p(scratch=tempfile.gettempdir()))", str(ROOT)],
                                   capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
            problem = check.stdout.strip() if check.returncode == 0 else check.stderr.strip()[-300:]
            if not problem:
                yield exe
                return
            problems.append(f"{python}: {problem}")
        pytest.skip(f"no Python {VERSION} here lets student code run as an unprivileged uid "
                    f"({'; '.join(problems) or 'none found'}): the no-bubblewrap isolation is not tested")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


VERSION = f"{sys.version_info[0]}.{sys.version_info[1]}"
