"""Deployment end to end: the Gradescope bundle's setup.sh and run_autograder on each Python of the images.

One test per interpreter (`-m deploy` selects them). Each unpacks the bundle as Gradescope does, runs setup.sh
in bubblewrap with the network (apt skipped: LESSON83_SKIP_APT=1; torch from pip's own index:
LESSON83_TORCH_INDEX_URL=""), then runs run_autograder offline, as gradescope-sim does, on three submissions:
the reference with its milestone checkpoint, a catalogued mistake and a cheat. The virtual environment that
setup.sh builds is kept between runs in LESSON83_DEPLOY_CACHE (default ~/.cache/lesson83-deploy), because
outside Python 3.11 torch comes here only as PyPI's CUDA build (several GB); setup.sh still runs in full
each time and pip reconciles the kept environment with the pins. The 3.12 run puts a PEP 668
EXTERNALLY-MANAGED marker over that interpreter's stdlib folder (a hard-linked copy bound in its place), as on
Ubuntu 24.04. The time of each step is printed.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import nbformat
import pytest

from autograder.authoring.questions import mc_answers
from autograder.authoring.suite import Suite
from autograder.config import ROOT
from autograder.course import Course, course_of
from autograder.release.common import tool_env
from autograder.release.gradescope import gradescope_bundle, gradescope_venv
from autograder.release.sample import filled_notebook

TEMPLATE = ROOT / "student_templates" / "lesson83" / "lesson83.ipynb"
CHECKPOINT = ROOT / "reference" / "lesson83_checkpoint"
LESSON = course_of().lesson
checks = LESSON.checks
GRADESCOPE_VENV = gradescope_venv(LESSON.name)
CACHE = Path(os.environ.get("LESSON83_DEPLOY_CACHE", Path.home() / ".cache" / "lesson83-deploy"))
# The Pythons of Gradescope's Ubuntu images that this machine offers, and how to find each here.
PYTHONS = {"3.10": ["pyenv", "3.10.13"], "3.11": ["python3.11"], "3.12": ["pyenv", "3.12.1"]}
CHEAT = ("import numpy as np, torch\n"
         "np.allclose = lambda *a, **k: True\n"
         "np.testing.assert_allclose = lambda *a, **k: None\n"
         "torch.allclose = lambda *a, **k: True\n"
         "try:  # copy the solutions, if the reference can be reached from the notebook\n"
         "    from reference.lesson83 import *  # noqa\n"
         "except ImportError:\n"
         "    pass\n"
         "def sinusoidal_pe(max_len, d):  # hard-coded output, whatever the input\n"
         "    return np.zeros((max_len, d))\n")


def _interpreter(version: str) -> Path | None:
    """The real executable of that Python on this machine, or None."""
    how = PYTHONS[version]
    if how[0] == "pyenv":
        if not shutil.which("pyenv"):
            return None
        proc = subprocess.run(["pyenv", "which", "python"], capture_output=True, text=True,
                              env=dict(os.environ, PYENV_VERSION=how[1]))
        found = proc.stdout.strip() if proc.returncode == 0 else ""
    else:
        found = shutil.which(how[0]) or ""
    if not found:
        return None
    proc = subprocess.run([found, "-c", "import sys; print(sys.executable); print('%d.%d' % sys.version_info[:2])"],
                          capture_output=True, text=True)
    lines = proc.stdout.split()
    return Path(os.path.realpath(lines[0])) if proc.returncode == 0 and lines[1:] == [version] else None


def _stdlib(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('stdlib'))"],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def _say(capsys: pytest.CaptureFixture[str], text: str) -> None:
    with capsys.disabled():
        print(f"\n[deploy] {text}", flush=True)


class Image:
    """A Gradescope-like root: the bundle in /autograder/source, the kept venv at GRADESCOPE_VENV."""

    def __init__(self, bundle: Path, python: Path, work: Path, venv: Path, *, stdlib_over: Path | None = None):
        self.bundle, self.python, self.work, self.venv = bundle, python, work, venv
        self.stdlib_over = stdlib_over

    def _root(self, name: str) -> Path:
        ag = self.work / name
        for sub in ("source", "submission", "results", ".home", ".tmp"):
            (ag / sub).mkdir(parents=True)
        zipfile.ZipFile(self.bundle).extractall(ag / "source")
        for script in ("setup.sh", "run_autograder"):  # zipfile does not restore the execute bit
            (ag / "source" / script).chmod(0o755)
        shutil.copy(ag / "source" / "run_autograder", ag / "run_autograder")
        return ag

    def _bwrap(self, ag: Path, argv: list[str], env: dict[str, str], *, network: bool,
               timeout: int) -> subprocess.CompletedProcess[str]:
        cmd = ["bwrap", "--tmpfs", "/"]
        for d in sorted(Path("/").iterdir()):
            if str(d) not in ("/proc", "/dev", "/sys", "/autograder") and d.exists():
                cmd += ["--ro-bind", str(d), str(d)]
        cmd += ["--dev", "/dev", "--proc", "/proc", "--bind", str(ag), "/autograder",
                "--bind", str(self.venv), GRADESCOPE_VENV]
        if self.stdlib_over is not None:
            cmd += ["--ro-bind", str(self.stdlib_over), str(_stdlib(self.python))]
        cmd += ["--unshare-pid", "--die-with-parent", "--chdir", "/autograder"]
        cmd += [] if network else ["--unshare-net"]
        return subprocess.run(cmd + argv, capture_output=True, text=True, env=env, timeout=timeout)

    def _env(self, path: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYENV_VERSION", "PYTHONHOME")}
        return env | {"PATH": path, "HOME": "/autograder/.home", "TMPDIR": "/autograder/.tmp"}

    def setup(self) -> subprocess.CompletedProcess[str]:
        """setup.sh as Gradescope runs it, with this Python as the system python3 (first on PATH)."""
        ag = self._root("setup")
        env = self._env(f"{self.python.parent}:/usr/local/bin:/usr/bin:/bin") | {
            "LESSON83_SKIP_APT": "1", "LESSON83_TORCH_INDEX_URL": ""}
        return self._bwrap(ag, ["bash", "/autograder/source/setup.sh"], env, network=True, timeout=3600)

    def system_pip_refused(self) -> subprocess.CompletedProcess[str]:
        """A system-wide pip install in the same root (must be refused where the PEP 668 marker is)."""
        ag = self._root("system-pip")
        env = self._env(f"{self.python.parent}:/usr/bin:/bin")
        return self._bwrap(ag, ["python3", "-m", "pip", "install", "--no-index", "--dry-run", "six"], env,
                           network=False, timeout=300)

    def grade(self, name: str, submission: Path) -> tuple[dict, subprocess.CompletedProcess[str]]:
        """run_autograder offline on one submission folder; returns results.json and the run."""
        ag = self._root(f"grade-{name}")
        shutil.copytree(submission, ag / "submission", dirs_exist_ok=True)
        env = self._env("/usr/local/bin:/usr/bin:/bin")
        proc = self._bwrap(ag, ["bash", "/autograder/run_autograder"], env, network=False, timeout=900)
        results = ag / "results" / "results.json"
        assert results.exists(), f"{name}: no results.json (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
        return json.loads(results.read_text()), proc


def _submissions(dest: Path, suite: Suite) -> dict[str, Path]:
    from reference.lesson83_mistakes import MISTAKES

    answers = mc_answers(list(suite.questions))
    mistake = next(m for m in MISTAKES if m.id == "alibi_sign_flipped")
    cheat = nbformat.read(str(TEMPLATE), as_version=4)
    cheat.cells.insert(3, nbformat.v4.new_code_cell(CHEAT))
    notebooks = {"reference": filled_notebook(TEMPLATE, answers=answers, lesson=suite.lesson),
                 "wrong": filled_notebook(TEMPLATE, extra={"alibi_bias": mistake.code}, answers=answers,
                                          lesson=suite.lesson),
                 "cheat": cheat}
    out = {}
    for name, nb in notebooks.items():
        (dest / name).mkdir(parents=True)
        nbformat.write(nb, str(dest / name / "lesson83.ipynb"))
        out[name] = dest / name
    for f in ("milestone.pt", "milestone.json"):
        shutil.copy(CHECKPOINT / f, dest / "reference" / f)
    return out


@pytest.mark.deploy
@pytest.mark.parametrize("version", sorted(PYTHONS))
def test_gradescope_bundle_sets_up_and_grades(course: Course, version: str, tmp_path: Path, suite: Suite,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    if not shutil.which("bwrap"):
        pytest.skip("bubblewrap is not installed (apt-get install bubblewrap)")
    python = _interpreter(version)
    if python is None:
        how = " ".join(PYTHONS[version])
        pytest.skip(f"Python {version} is not on this machine ({how}); Gradescope's image for it is not tested")
    start = time.monotonic()
    bundle = gradescope_bundle(tmp_path / "autograder.zip", course=course)
    venv = CACHE / f"venv-{version}"
    cfg = venv / "pyvenv.cfg"
    if cfg.exists() and f"home = {python.parent}\n" not in cfg.read_text():
        shutil.rmtree(venv)  # made by another interpreter: start again
    _say(capsys, f"Python {version} ({python}): {'reusing' if cfg.exists() else 'building'} the kept venv "
                 f"{venv} (delete it to start afresh)")
    venv.mkdir(parents=True, exist_ok=True)
    stdlib_over = None
    if version == "3.12":  # Ubuntu 24.04: the system Python is marked externally managed (PEP 668)
        stdlib_over = tmp_path / "stdlib"
        subprocess.run(["cp", "-al", str(_stdlib(python)), str(stdlib_over)], check=True)
        (stdlib_over / "EXTERNALLY-MANAGED").write_text(
            "[externally-managed]\nError=Ubuntu 24.04: use a virtual environment (lesson83 deploy test)\n")
    image = Image(bundle, python, tmp_path / "image", venv, stdlib_over=stdlib_over)
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True).stdout.strip())
    system_before = sorted(p.name for p in site.iterdir())

    if stdlib_over is not None:
        refused = image.system_pip_refused()
        assert refused.returncode != 0 and "externally-managed-environment" in refused.stdout + refused.stderr, \
            refused.stdout + refused.stderr
    setup = image.setup()
    setup_s = time.monotonic() - start
    assert setup.returncode == 0, f"setup.sh failed:\n{setup.stdout[-3000:]}\n{setup.stderr[-5000:]}"
    assert "lesson83: installed in" in setup.stdout and "torch==2.13.0" in setup.stdout, setup.stdout[-3000:]
    assert sorted(p.name for p in site.iterdir()) == system_before, "setup.sh installed into the system Python"
    assert "include-system-site-packages = false" in cfg.read_text()
    leaked = subprocess.run([str(venv / "bin" / "python"), "-c", "import reference"], cwd="/",
                            capture_output=True, text=True)
    assert leaked.returncode != 0, "the venv (visible inside the sandbox) holds reference/"

    results, timings = {}, {}
    for name, folder in _submissions(tmp_path / "subs", suite).items():
        t0 = time.monotonic()
        results[name], proc = image.grade(name, folder)
        timings[name] = round(time.monotonic() - t0, 1)
        assert proc.returncode == 0, f"{name}: run_autograder exit {proc.returncode}:\n{proc.stderr[-3000:]}"
    _say(capsys, f"Python {version}: setup.sh {setup_s:.0f} s; grading (s) {timings}; "
                 f"scores { {n: r['score'] for n, r in results.items()} }")

    assert results["reference"]["score"] == pytest.approx(suite.auto_points)
    wrong = results["wrong"]
    assert 0 < wrong["score"] < suite.auto_points
    failed = [t for t in wrong["tests"] if t["score"] < t["max_score"]]
    assert failed and all(t["output"] and t["output"] != "passed" for t in failed)
    assert any(t["name"].startswith("q7_alibi") for t in failed)
    assert results["cheat"]["score"] == 0, [t["name"] for t in results["cheat"]["tests"] if t["score"]]
    assert "tampering detected" in results["cheat"]["output"]


# --------------------------------------------------------------------------- Otter zip


def test_otter_zip_installs_cpu_torch_and_numpy(fresh_build: dict[str, Path]) -> None:
    import yaml

    with zipfile.ZipFile(fresh_build["otter_zip"]) as zf:
        env = yaml.safe_load(zf.read("environment.yml"))
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert "torch==2.13.0" in pip and any(p.startswith("numpy==") for p in pip), pip
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in pip  # the CPU build, not CUDA


# --------------------------------------------------------------------------- the student's export


@pytest.mark.sandbox
def test_export_zip_carries_the_milestone_and_earns_its_points(fresh_build: dict[str, Path], suite: Suite,
                                                               tmp_path: Path) -> None:
    work = tmp_path / "laptop"
    shutil.copytree(fresh_build["student"], work)
    nb = filled_notebook(work / "lesson83.ipynb", answers=mc_answers(list(suite.questions)), lesson=suite.lesson)
    nbformat.write(nb, str(work / "lesson83.ipynb"))
    for f in ("milestone.pt", "milestone.json"):
        shutil.copy(CHECKPOINT / f, work / f)
    export = next(c.source for c in nb.cells if "grader.export(" in c.source)
    code = f"import otter\ngrader = otter.Notebook('lesson83.ipynb')\n{export}"
    proc = subprocess.run([sys.executable, "-c", code], cwd=work, capture_output=True, text=True, env=tool_env(),
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    zips = sorted(work.glob("*.zip"))
    assert len(zips) == 1
    names = set(zipfile.ZipFile(zips[0]).namelist())
    assert {"lesson83.ipynb", "milestone.pt", "milestone.json"} <= names, names
    assert all(n in proc.stdout for n in ("lesson83.ipynb", "milestone.pt", "milestone.json")), proc.stdout
    subs, out = tmp_path / "subs", tmp_path / "grades"
    subs.mkdir()
    shutil.copy(zips[0], subs / "alice.zip")
    cli = subprocess.run([str(Path(sys.executable).with_name("lesson83")), "grade", str(subs), "--out", str(out),
                          "--quiet"], capture_output=True, text=True, env=tool_env(), cwd=ROOT, timeout=900)
    assert cli.returncode == 0, cli.stdout + cli.stderr
    with open(out / "grades.csv") as f:
        row = next(csv.DictReader(f))
    assert float(row["m1_checkpoint"]) == suite.config.milestone.points
    assert float(row["total"]) == pytest.approx(suite.auto_points)


# --------------------------------------------------------------------------- a student's laptop

STUDENT_SETUP = """\
python3 -m venv lesson83-env
. lesson83-env/bin/activate
pip install torch==2.13.0 numpy matplotlib otter-grader jupyterlab --extra-index-url https://download.pytorch.org/whl/cpu
"""


def _readme_block(section: str) -> str:
    """The first bash block of a README section."""
    text = (ROOT / "README.md").read_text().split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return text.split("```bash\n", 1)[1].split("```", 1)[0]


def test_readme_commands_are_the_ones_the_tests_run() -> None:
    """The students' set-up is the one test_student_laptop_setup_runs_the_checks runs (the README's other
    commands, the nbgrader steps among them, run as written in test_docs_commands.py)."""
    assert _readme_block("For students") == STUDENT_SETUP


@pytest.mark.deploy
def test_student_laptop_setup_runs_the_checks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The README's commands for students, as written (the environment is kept in the cache between runs)."""
    python = _interpreter("3.11")
    if python is None:
        pytest.skip("Python 3.11 is not on this machine")
    home = CACHE / "student-3.11"
    home.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYENV_VERSION")}
    env["PATH"] = f"{python.parent}:/usr/local/bin:/usr/bin:/bin"
    # The command runs as written; where the CPU index cannot be reached (CI reaches PyPI alone), pip is told to give
    # up on it at once rather than retry each package for seconds (as the Makefile's --timeout 10 --retries 0).
    env |= {"PIP_RETRIES": "0", "PIP_TIMEOUT": "10"}
    proc = subprocess.run(["bash", "-euc", STUDENT_SETUP], cwd=home, capture_output=True, text=True, env=env,
                          timeout=3600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    work = tmp_path / "lesson83"
    shutil.copytree(TEMPLATE.parent, work)
    check = ("import otter, matplotlib, torch\n"
             "grader = otter.Notebook('lesson83.ipynb')\n"
             "from lesson83_checks import run_case\n"
             "print(torch.__version__, grader.check('q2_sinusoidal_pe'))\n")
    ran = subprocess.run([str(home / "lesson83-env" / "bin" / "python"), "-c", check], cwd=work,
                         capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-3000:]
    assert ran.stdout.startswith("2.13.0") and "q2_sinusoidal_pe" in ran.stdout  # the stub fails its checks
    _say(capsys, f"student set-up in {home}: {time.monotonic() - start:.0f} s")
