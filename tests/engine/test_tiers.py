"""The contributors' commands: `make check` leaves out every tier that pyproject.toml registers, a quick test that
starts a tier's machinery is told which marker to add, and set-up asks pip for PyTorch's CPU build."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable

import pytest

from autograder.config import ROOT
from autograder.course import course_of
from autograder.release.common import TORCH_INDEX_URL, TORCH_VERSION
from autograder.release.gradescope import setup_sh
from autograder.sandbox import WorkerPool

TIERS = {"sandbox", "build", "browser", "training", "deploy"}


def _make_n(*args: str, env: dict[str, str] | None = None) -> str:
    """What `make -n` would run (nothing runs): the commands of a target, with the Makefile's variables filled in."""
    proc = subprocess.run(["make", "-n", "-B", *args], cwd=ROOT, capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_make_check_leaves_out_every_registered_tier() -> None:
    block = (ROOT / "pyproject.toml").read_text().split("\nmarkers = [", 1)[1].split("\n]", 1)[0]
    assert set(re.findall(r'^\s+"(\w+):', block, re.M)) == TIERS  # the markers pyproject.toml registers
    check = next(line for line in _make_n("check").splitlines() if "pytest" in line)
    expression = re.search(r'-m "([^"]+)"', check).group(1)
    assert expression.startswith("not (") and set(re.findall(r"\w+", expression)) - {"not", "or"} == TIERS
    full = next(line for line in _make_n("test").splitlines() if "pytest" in line)
    assert " -m " not in full and "--durations=25" in full


@pytest.mark.parametrize("start, marker", [
    (lambda: WorkerPool(1, probe_module="any_checks"), "sandbox"),
    (lambda: course_of().lesson.plugin.Verifier().start(), "sandbox"),
    (lambda: course_of().lesson.trainer.train(None, "rope", steps=1), "training"),
])
def test_a_quick_test_that_starts_a_tier_is_told_its_marker(start: Callable[[], object], marker: str) -> None:
    with pytest.raises(pytest.fail.Exception, match=rf"is not marked {marker}: add @pytest.mark.{marker}"):
        start()


def test_setup_installs_the_cpu_build_from_the_index_of_setup_sh() -> None:
    pip = [line for line in _make_n("setup").splitlines() if "pip install" in line and "torch==" in line]
    assert len(pip) == 1, pip
    words = pip[0].split()
    assert f"torch=={TORCH_VERSION}" in words
    assert words[words.index("--extra-index-url") + 1] == TORCH_INDEX_URL  # the one setup.sh names
    assert TORCH_INDEX_URL in setup_sh("lesson83")
    assert int(words[words.index("--timeout") + 1]) <= 15  # an index out of reach does not stall set-up
    own = [line for line in _make_n("setup", env={"PATH": "/usr/bin:/bin", "LESSON83_TORCH_INDEX_URL": ""})
           .splitlines() if "pip install" in line and "torch==" in line]
    assert "--extra-index-url" not in own[0]  # set empty: pip's own index
