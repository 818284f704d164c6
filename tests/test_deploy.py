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

from autograder.build import _case_json, filled_notebook, gradescope_bundle, gradescope_venv, tool_env
from autograder.config import ROOT
from autograder.content import mc_answers
from autograder.lesson import default_lesson
from autograder.suite import Suite

TEMPLATE = ROOT / "student_templates" / "lesson83" / "lesson83.ipynb"
CHECKPOINT = ROOT / "reference" / "lesson83_checkpoint"
LESSON = default_lesson()
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
    notebooks = {"reference": filled_notebook(TEMPLATE, answers=answers),
                 "wrong": filled_notebook(TEMPLATE, extra={"alibi_bias": mistake.code}, answers=answers),
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
def test_gradescope_bundle_sets_up_and_grades(version: str, tmp_path: Path, suite: Suite,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    if not shutil.which("bwrap"):
        pytest.skip("bubblewrap is not installed (apt-get install bubblewrap)")
    python = _interpreter(version)
    if python is None:
        how = " ".join(PYTHONS[version])
        pytest.skip(f"Python {version} is not on this machine ({how}); Gradescope's image for it is not tested")
    start = time.monotonic()
    bundle = gradescope_bundle(tmp_path / "autograder.zip")
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


# --------------------------------------------------------------------------- nbgrader


def _nbgrader(course: Path, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(Path(sys.executable).with_name("nbgrader")), *args], cwd=course,
                          capture_output=True, text=True, env=tool_env())
    assert proc.returncode == 0, f"nbgrader {' '.join(args)}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc


def _submit(course: Path, student: str, nb: nbformat.NotebookNode, *, checkpoint: bool) -> None:
    dest = course / "submitted" / student / "lesson83"
    dest.mkdir(parents=True)
    nbformat.write(nb, str(dest / "lesson83.ipynb"))
    for f in (course / "release" / "lesson83").iterdir():
        if f.suffix != ".ipynb":
            shutil.copy(f, dest / f.name)
    for f in ("milestone.pt", "milestone.json") if checkpoint else ():
        shutil.copy(CHECKPOINT / f, dest / f)


def _wrong_source(course: Path, suite: Suite) -> nbformat.NotebookNode:
    """The instructor's source notebook with two catalogued mistakes and every multiple-choice answer wrong."""
    from reference.lesson83_mistakes import MISTAKES

    nb = nbformat.read(str(course / "source" / "lesson83" / "lesson83.ipynb"), as_version=4)
    mistakes = {"q2_sinusoidal_pe-solution": "pe_sin_cos_swapped", "q7_alibi-solution": "alibi_sign_flipped"}
    answers = mc_answers(list(suite.questions))
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id", "")
        if grade_id in mistakes:
            cell.source += "\n\n\n" + next(m.code for m in MISTAKES if m.id == mistakes[grade_id])
        elif grade_id == "q8_checks-answers":
            cell.source = "\n".join(f'{var} = "{"B" if right == "A" else "A"}"' for var, right in answers.items())
    return nb


def _secret_forms(case_json: str) -> set[str]:
    """How a hidden case's expected values could show: its JSON, its encoded arrays, its numbers printed with
    4 or 8 decimals or in full, and for a multiple-choice case the answer written as Python or JSON."""
    import re

    import numpy as np

    forms = {case_json[case_json.index('"expected"'):][:60]}
    forms |= {m[:40] for m in re.findall(r'"__ndarray__":"([^"]+)"', case_json) if len(m) >= 40}
    value = checks.loads(case_json)["expected"].get("value", {})
    for item in value.values() if isinstance(value, dict) else [value]:
        if isinstance(item, str) and len(item) == 1:  # a multiple-choice answer
            var = next(iter(value))
            forms |= {f'"{var}":"{item}"', f'"{var}": "{item}"', f"'{var}': '{item}'", f'{var} = "{item}"',
                      f"{var} = '{item}'", f'{var} == "{item}"'}
        elif isinstance(item, np.ndarray) and item.dtype.kind == "f":
            xs = [float(x) for x in item.ravel()[:200] if abs(x) > 1e-3 and abs(abs(x) - 1) > 1e-3
                  and abs(x - round(x)) > 1e-3][:6]
            forms |= {f for x in xs for f in (f"{x:.4f}", f"{x:.8f}", repr(x))}
    return forms


def _visible_text(path: Path) -> str:
    """A page's text as a reader sees it (tags removed, entities decoded) and its raw markup."""
    import html
    import re

    raw = path.read_text(errors="replace")
    return raw + "\n" + html.unescape(re.sub(r"<[^>]+>", "", raw))


def test_nbgrader_feedback_shows_no_hidden_test_or_answer(fresh_build: dict[str, Path], suite: Suite,
                                                          tmp_path: Path) -> None:
    course = tmp_path / "course"
    shutil.copytree(fresh_build["nbgrader"], course)
    _submit(course, "alice", _wrong_source(course, suite), checkpoint=False)
    for line in NBGRADER_STEPS.splitlines():  # the README's commands, as written
        _nbgrader(course, *line.split()[1:])
    pages = sorted((course / "feedback").rglob("*.html"))
    assert pages, "no feedback was written"
    assert not list((course / "feedback").rglob("lesson83_hidden_cases.json"))
    assert not list((course / "release").rglob("lesson83_hidden_cases.json"))
    hidden = {c["id"] for c in suite.cases if c["hidden"]}
    cases = json.loads((course / "lesson83_hidden_cases.json").read_text())
    assert set(cases) == hidden
    # Forms that the student sees anyway (the notebook's text, the public checks' values) are no secret.
    release = nbformat.read(str(course / "release" / "lesson83" / "lesson83.ipynb"), as_version=4)
    public = "\n".join(c.source for c in release.cells)
    by_id = {c["id"]: c for c in suite.cases}
    seen = set().union(*(_secret_forms(_case_json(c, suite.expected, by_id, lesson=LESSON)) for c in suite.cases
                         if not c["hidden"]))
    secrets = {cid: {f for f in _secret_forms(text) if f not in public and f not in seen}
               for cid, text in cases.items()}
    valued = [cid for cid, text in cases.items() if "value" in checks.loads(text)["expected"]]
    assert all(secrets[cid] for cid in valued), [cid for cid in valued if not secrets[cid]]
    text = "\n".join(_visible_text(p) for p in pages)
    leaks = {cid: sorted(f for f in forms if f in text) for cid, forms in secrets.items()}
    assert not any(leaks.values()), {cid: f for cid, f in leaks.items() if f}
    for marker in ("BEGIN HIDDEN TESTS", "lesson83_hidden_cases", "_l83_"):
        assert marker not in text, f"hidden test source in the feedback: {marker}"
    # The failures still show, by name only.
    for cid in ("q7_alibi/hidden_attention_heads", "q2_sinusoidal_pe/hidden_table_d6", "q8_checks/correct_pe_value"):
        assert f"hidden test {cid} failed" in text, cid


def test_nbgrader_course_totals_100_points_and_its_release_fits_nbgrader(fresh_build: dict[str, Path],
                                                                        suite: Suite, tmp_path: Path) -> None:
    import sqlite3

    course_total = sum(q.points for q in suite.questions if q.graded)
    assert course_total == 100
    course = tmp_path / "course"
    shutil.copytree(fresh_build["nbgrader"], course)
    source = nbformat.read(str(course / "source" / "lesson83" / "lesson83.ipynb"), as_version=4)
    _submit(course, "reference", source, checkpoint=True)
    _submit(course, "no_checkpoint", source, checkpoint=False)
    for student in ("reference", "no_checkpoint"):
        _nbgrader(course, "db", "student", "add", student)
    _nbgrader(course, "autograde", "lesson83", "--force")
    db = sqlite3.connect(course / "gradebook.db")
    assert db.execute("select sum(max_score) from grade_cells").fetchone()[0] == pytest.approx(course_total)
    manual = db.execute("select sum(max_score) from grade_cells where cell_type = 'markdown'").fetchone()[0]
    assert manual == pytest.approx(suite.config.questions["q9_written"].points)
    auto = dict(db.execute(
        "select s.student_id, sum(g.auto_score) from grade g join grade_cells gc on g.cell_id = gc.id "
        "join submitted_notebook n on g.notebook_id = n.id join submitted_assignment s on n.assignment_id = s.id "
        "where gc.cell_type = 'code' group by s.student_id").fetchall())
    assert auto["reference"] == pytest.approx(suite.auto_points)
    assert auto["no_checkpoint"] == pytest.approx(suite.notebook_points)

    release = nbformat.read(str(course / "release" / "lesson83" / "lesson83.ipynb"), as_version=4)
    text = "\n".join(c.source for c in release.cells)
    assert "grader.check" not in text and "otter" not in text.lower() and "Validate" in text
    answers = next(c for c in release.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "q8_checks-answers")
    assert "NotImplementedError" not in answers.source
    for var in mc_answers(list(suite.questions)):
        assert f"{var} = ..." in answers.source, var
    student = nbformat.read(str(fresh_build["student"] / "lesson83.ipynb"), as_version=4)
    assert any('grader.check("q2_sinusoidal_pe")' in c.source for c in student.cells if c.cell_type == "markdown")


# --------------------------------------------------------------------------- the student's export


@pytest.mark.sandbox
def test_export_zip_carries_the_milestone_and_earns_its_points(fresh_build: dict[str, Path], suite: Suite,
                                                               tmp_path: Path) -> None:
    work = tmp_path / "laptop"
    shutil.copytree(fresh_build["student"], work)
    nb = filled_notebook(work / "lesson83.ipynb", answers=mc_answers(list(suite.questions)))
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
pip install torch==2.13.0 numpy matplotlib otter-grader jupyterlab
"""
NBGRADER_STEPS = """\
nbgrader db student add alice
nbgrader autograde lesson83 --force
nbgrader generate_feedback lesson83 --force
"""


def _readme_block(section: str) -> str:
    """The first bash block of a README section."""
    text = (ROOT / "README.md").read_text().split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return text.split("```bash\n", 1)[1].split("```", 1)[0]


def test_readme_commands_are_the_ones_the_tests_run() -> None:
    assert _readme_block("For students") == STUDENT_SETUP
    assert _readme_block("Deploying") == NBGRADER_STEPS


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
