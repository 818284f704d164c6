"""Isolation without bubblewrap: with it forced off (LESSON83_SANDBOX=none) and the grader running as root, student
code runs as an unprivileged uid that gets nothing from the source (reference/, the hidden cases) or the results
folder of a Gradescope-like /autograder, closed to others as run_autograder closes it, and leaves nothing behind.

The grader runs from a stand-in for setup.sh's venv: a venv of a Python that every user may read (this machine's
pyenv Pythons live under /root, which others cannot enter; on Gradescope the system Python is in /usr), whose
packages are this environment's (a .pth line; its editable install of this checkout is not carried over). Both
tests skip (never pass) where student code cannot be dropped to an unprivileged uid: not root, or no such Python.
The secrets are the demo lesson's (tests/fixtures/lesson_demo): its reference, the question file with its hidden case,
and the bundle and student notebook of its release (the session's demo_course, tests/conftest.py).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest

from autograder.config import ROOT
from autograder.course import Course
from autograder.model import Status
from autograder.release.gradescope import gradescope_bundle, gradescope_venv, run_autograder
from autograder.sandbox import SANDBOX_ENV
from helpers.isolation import LIMITS, make_venv

pytestmark = pytest.mark.sandbox  # every test here runs notebooks in the grader's sandbox

LESSON = "lesson_demo"
RUN_AUTOGRADER, GRADESCOPE_VENV = run_autograder(LESSON), gradescope_venv(LESSON)
FAKE_CHECKS = '''
def run_probe(env, name, args):
    return {"value": env[name]()} if name in env else {"error": {"type": "NameError", "message": name}}
'''
# Runs one notebook on a one-worker pool, with the sandbox chosen as LESSON83_SANDBOX says; prints the result.
RUN_ONE = '''
import json, sys
checkout, probes, limits, notebook = sys.argv[1:]
sys.path[:0] = [checkout, probes]
from autograder.sandbox import Limits
from autograder.sandbox import WorkerPool
with WorkerPool(1, limits=Limits(**json.loads(limits)), probe_module="isolation_checks") as pool:
    res = pool.run(open(notebook, "rb").read(), probes=[("report", "report", {})])
print(json.dumps(res.as_dict(), default=str))
'''
NOBODY = 65534  # any uid other than root's: the test's own check that the layout is open before the chmod



@pytest.fixture
def token() -> Iterator[str]:
    token = f"grader-secret-{secrets.token_hex(8)}"
    yield token
    for folder in ("/tmp", "/var/tmp", "/dev/shm"):  # what a failed run left behind
        for path in Path(folder).glob(f"{leftover(token)}*"):
            if path.is_dir() and not path.is_symlink():
                subprocess.run(["chmod", "-R", "u+rwx", str(path)], check=False)
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)


def leftover(token: str) -> str:
    """The name of what the notebook leaves behind (its paths may be in its outputs; the token may not)."""
    return token.replace("secret", "left")


@pytest.fixture
def autograder_root() -> Iterator[Path]:
    """A folder laid out like Gradescope's /autograder, where every user may enter (as /autograder is)."""
    root = Path(tempfile.mkdtemp(prefix="grader-ag-", dir="/tmp"))
    root.chmod(0o755)
    for sub in ("source", "submission", "results"):
        (root / sub).mkdir(mode=0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def secret_files(root: Path, token: str) -> dict[str, Path]:
    """reference/, a hidden-cases file and a results.json of a former run, each holding the token."""
    files = {"reference": root / f"source/{LESSON}/reference/{LESSON}.py",
             "hidden": root / f"source/{LESSON}/assignments/{LESSON}/q1_center.md",
             "results": root / "results/results.json"}
    for path in files.values():
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            path.write_text(json.dumps({"score": 0, "output": token}) if path.suffix == ".json" else "")
        text = path.read_text()
        path.write_text(text.replace("\n", f"\n# {token}\n", 1) if text.startswith("---\n") else
                        text if token in text else text + f"\n# {token}\n")
        assert token in path.read_text()
    return files


def close_as_run_autograder(root: Path) -> None:
    """The permission lines of the bundle's run_autograder, run on `root` instead of /autograder."""
    lines = [line for line in RUN_AUTOGRADER.splitlines() if line.startswith(("chmod ", "mkdir "))]
    assert any(line.startswith("chmod o= ") for line in lines), RUN_AUTOGRADER
    subprocess.run(["bash", "-euc", "\n".join(lines).replace("/autograder", str(root))], check=True)


def readable_by(uid: int, path: Path) -> bool:
    """Whether a process of that uid (and no group) can read the file."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            path.read_bytes()
            os._exit(0)
        except BaseException:  # noqa: BLE001 - only the exit status leaves this process
            os._exit(1)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


def hostile_cell(files: dict[str, Path], token: str, shared: Path) -> str:
    """Reads the secrets, writes results.json, and leaves files where any user may write."""
    paths = {k: str(v) for k, v in files.items()}
    results_dir = str(files["results"].parent)
    name = leftover(token)
    left = [f"/tmp/{name}.txt", f"/tmp/{name}-dir/inner/file", f"/var/tmp/{name}", f"/dev/shm/{name}",
            f"{shared}/{name}"]
    return f"""
import os, sys

PATHS, RESULTS_DIR, LEFT = {paths!r}, {results_dir!r}, {left!r}
got, wrote, listed, left = {{}}, [], {{}}, []
for name, path in PATHS.items():
    try:
        got[name] = open(path).read()
    except OSError:
        got[name] = None
print('read:', got)
for folder in {str(files['reference'].parent)!r}, RESULTS_DIR, os.path.dirname(PATHS['hidden']):
    try:
        listed[folder] = os.listdir(folder)
    except OSError:
        listed[folder] = None
print('listed:', listed)
for how, act in [('w', lambda: open(PATHS['results'], 'w').write('{{"score": 100}}')),
                 ('a', lambda: open(PATHS['results'], 'a').write(' ')),
                 ('new', lambda: open(os.path.join(RESULTS_DIR, 'extra.json'), 'w').write('{{}}')),
                 ('symlink', lambda: os.symlink('/etc/passwd', os.path.join(RESULTS_DIR, 'link.json'))),
                 ('chmod', lambda: os.chmod(PATHS['results'], 0o666))]:
    try:
        act()
        wrote.append(how)
    except OSError:
        pass
for path in LEFT:
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, 'w').write(str(got))
        left.append(path)
    except OSError as exc:
        print('could not leave', path, exc)
try:
    os.chmod(os.path.dirname(LEFT[1]), 0)
except OSError:
    pass
sys.path.insert(0, {str(files['reference'].parent.parent)!r})
try:
    exec(open(PATHS['reference']).read())  # the solutions, if the source can be read
except OSError:
    pass
def report():
    return {{'uid': os.getuid(), 'got': got, 'listed': listed, 'wrote': wrote, 'left': left}}
"""


def notebook(*cells: str) -> bytes:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    return nbformat.writes(nb).encode()


@pytest.fixture
def shared_dir(token: str) -> Iterator[Path]:
    """A folder below /tmp that anyone may write to, owned by root (leftovers there are swept too)."""
    path = Path(tempfile.mkdtemp(prefix=f"{leftover(token)}-shared-", dir="/tmp"))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_fallback_uid_gets_nothing_from_source_or_results(readable_python: Path, autograder_root: Path,
                                                          token: str, shared_dir: Path, tmp_path: Path) -> None:
    files = secret_files(autograder_root, token)
    assert all(readable_by(NOBODY, f) for f in files.values()), "the layout is closed before run_autograder's chmod"
    before = files["results"].read_bytes()
    close_as_run_autograder(autograder_root)
    (tmp_path / "isolation_checks.py").write_text(FAKE_CHECKS)
    (tmp_path / "hostile.ipynb").write_bytes(notebook(hostile_cell(files, token, shared_dir)))
    proc = subprocess.run([str(readable_python), "-c", RUN_ONE, str(ROOT), str(tmp_path), json.dumps(asdict(LIMITS)),
                           str(tmp_path / "hostile.ipynb")], capture_output=True, text=True, timeout=600,
                          env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", SANDBOX_ENV: "none"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = SimpleNamespace(**json.loads(proc.stdout.splitlines()[-1]))
    assert (res.sandbox, res.isolation) == ("none", "unprivileged uid")
    assert res.status == Status.GRADED, res.notes
    seen = res.outputs["report"]["value"]
    assert seen["uid"] != 0
    assert seen["got"] == {"reference": None, "hidden": None, "results": None}, "the student read a secret file"
    assert all(v is None for v in seen["listed"].values()), seen["listed"]
    assert seen["wrote"] == [], "the student wrote into the results folder"
    # the worker's own namespaces: /tmp an empty read-only tmpfs, /var a hidden one, /dev/shm its own ...
    assert seen["left"] == [f"/dev/shm/{leftover(token)}"], (seen["left"], res.stdout)
    for text in (res.stdout, json.dumps(res.outputs), " ".join(res.notes)):
        assert token not in text
    assert files["results"].read_bytes() == before and not files["results"].is_symlink()
    assert sorted(p.name for p in files["results"].parent.iterdir()) == ["results.json"]
    left = [p for p in [*map(Path, seen["left"]), Path(f"/tmp/{leftover(token)}-dir")] if p.exists()]
    assert left == [], f"... and removed after the job: {left}"
    assert shared_dir.is_dir() and list(shared_dir.iterdir()) == []


@pytest.mark.build
def test_run_autograder_without_bubblewrap_gives_a_cheat_nothing(readable_python: Path, autograder_root: Path,
                                                                  token: str, shared_dir: Path, tmp_path: Path,
                                                                  demo_course: Course) -> None:
    """The Gradescope bundle, unpacked into the root, graded by its own run_autograder (paths moved to the root)."""
    bundle = gradescope_bundle(tmp_path / "autograder.zip", course=demo_course)
    zipfile.ZipFile(bundle).extractall(autograder_root / "source")
    files = secret_files(autograder_root, token)
    assert readable_by(NOBODY, files["reference"]), "the unpacked bundle is closed before run_autograder's chmod"
    cheat = nbformat.read(str(demo_course.lesson.notebook), as_version=4)
    cheat.cells.append(nbformat.v4.new_code_cell(hostile_cell(files, token, shared_dir)))
    nbformat.write(cheat, str(autograder_root / "submission" / f"{LESSON}.ipynb"))
    script = autograder_root / "run_autograder"
    script.write_text(RUN_AUTOGRADER.replace("/autograder", str(autograder_root)))
    base = subprocess.run([str(readable_python), "-c", "import sys, os; print(os.path.realpath(sys._base_executable))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    make_venv(Path(GRADESCOPE_VENV.replace("/autograder", str(autograder_root))), base)  # setup.sh's, standing in
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(tmp_path), SANDBOX_ENV: "none"}
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    text = files["results"].read_text()
    results = json.loads(text)
    assert results["extra_data"]["isolation"] == "unprivileged uid", results.get("extra_data")
    assert "isolation: unprivileged uid" in proc.stdout
    assert results["score"] == 0, [t["name"] for t in results["tests"] if t["score"]]
    assert token not in text + proc.stdout + proc.stderr
    assert not files["results"].is_symlink()
    assert sorted(p.name for p in files["results"].parent.iterdir()) == ["results.json"]
    assert not list(Path("/tmp").glob(f"{leftover(token)}*.txt")) and not Path(f"/tmp/{leftover(token)}-dir").exists()
    assert list(shared_dir.iterdir()) == []
