"""Never root, never silent; and without bubblewrap, jobs separated as bubblewrap separates them.

- `grade` (and so the Gradescope bundle and nbgrader-autograde, which go through grade_batch) refuses before the
  first submission where neither bubblewrap nor the uid drop confines student code: here, forced off bubblewrap
  (LESSON83_SANDBOX=none) with an interpreter other users cannot read (a venv under a 0700 folder, as pyenv's
  Pythons under /root are). With --allow-unsandboxed it grades, and every row and the summary say so.
- The uid fallback (root, forced off bubblewrap, a Python every user may read: test_execute_isolation.py's
  stand-in venv): two workers, jobs side by side and one after another. No job reaches the network (a listener
  of this test on the loopback hears nothing), reads what another job leaves in /tmp, /var/tmp, /dev/shm,
  /run/lock or /var/lock (nor does it reach the host), leaves a process behind (a daemon that setsid()s and
  keeps changing its pid), or reads another submission, the results or the class folder, even open to others.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import nbformat
import pytest

from autograder.config import ROOT
from autograder.sandbox import ALLOW_UNSANDBOXED, SANDBOX_ENV
from helpers.isolation import LIMITS, make_venv, readable_python  # noqa: F401 - the fixture

pytestmark = pytest.mark.sandbox

DEMO = ROOT / "tests" / "fixtures" / "lesson_demo"
SECRET_NAMES = ("submission", "result", "course")
FAKE_CHECKS = '''
def run_probe(env, name, args):
    return {"value": env[name]()} if name in env else {"error": {"type": "NameError", "message": name}}
'''
# Two workers; round 1 runs `first` and `beside` side by side, round 2 runs `after` once both are done.
RUN_ROUNDS = '''
import json, sys
checkout, probes, limits, first, beside, after, hide, here = sys.argv[1:]
sys.path[:0] = [checkout, probes, here]  # here: the class folder, on sys.path as `python -m` run from it puts it
from autograder.sandbox import Limits
from autograder.sandbox import WorkerPool
read = lambda p: open(p, "rb").read()
with WorkerPool(2, limits=Limits(**json.loads(limits)), probe_module="isolation_checks",
                hide=json.loads(hide), tripwire=False) as pool:  # the isolation on its own: ctypes reaches libc
    out = dict(pool.run_many([("first", read(first)), ("beside", read(beside))], probes=[("report", "report", {})]))
    out["after"] = pool.run(read(after), probes=[("report", "report", {})])
print(json.dumps({k: v.as_dict() for k, v in out.items()}, default=str))
'''


def notebook(*cells: str) -> bytes:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    return nbformat.writes(nb).encode()


def leave_cell(name: str, port: int, marker: str) -> str:
    """Leaves a 0666 file in every folder anyone may write to and a daemon (a subreaper below which a process
    setsid()s and takes a new pid every 2 ms), tries the loopback listener, then waits while the job beside it
    looks."""
    return f"""
import os, socket, subprocess, sys, time
left, net = [], None
for folder in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/var/lock"):
    try:
        path = os.path.join(folder, {name!r})
        with open(path, "w") as f:
            f.write("left by the first job")
        os.chmod(path, 0o666)
        left.append(path)
    except OSError:
        pass
try:
    with socket.create_connection(("127.0.0.1", {port}), timeout=2) as s:
        s.sendall(b"hidden probe request")
    net = "connected"
except OSError as exc:
    net = type(exc).__name__
hop = ("import ctypes, os, time\\nctypes.CDLL(None).prctl(36, 1, 0, 0, 0)\\n"  # a subreaper: it reaps its hops
       "if os.fork() == 0:\\n    while True:\\n        time.sleep(0.002)\\n        if os.fork():\\n"
       "            os._exit(0)\\n        os.setsid()\\n"  # a new pid every 2 ms, each in a session of its own
       "while True:\\n    try:\\n        os.wait()\\n    except ChildProcessError:\\n        time.sleep(0.01)\\n")
subprocess.Popen([sys.executable, "-c", hop + "# {marker}"], start_new_session=True,
                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
time.sleep(1)
started = 0
for pid in os.listdir("/proc"):
    try:
        started += {marker!r}.encode() in open(f"/proc/{{pid}}/cmdline", "rb").read()
    except OSError:
        pass
time.sleep(3)
def report():
    return {{"uid": os.getuid(), "left": left, "net": net, "started": started}}
"""


def look_cell(name: str, port: int, marker: str, secrets_: dict[str, str], wait_s: float) -> str:
    """Waits, then reads what the other job left, looks for its daemon, tries the network and the secrets."""
    return f"""
import os, socket, time
time.sleep({wait_s})
found, daemons, secrets, net = {{}}, [], {{}}, None
for folder in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/var/lock"):
    try:
        found[folder] = open(os.path.join(folder, {name!r})).read()
    except OSError:
        pass
for pid in os.listdir("/proc"):
    try:
        if {marker!r}.encode() in open(f"/proc/{{pid}}/cmdline", "rb").read():
            daemons.append(pid)
    except OSError:
        pass
for what, path in {secrets_!r}.items():
    try:
        secrets[what] = open(path).read()
    except OSError:
        pass
try:
    with socket.create_connection(("127.0.0.1", {port}), timeout=2) as s:
        s.sendall(b"hidden probe request")
    net = "connected"
except OSError as exc:
    net = type(exc).__name__
def report():
    return {{"uid": os.getuid(), "found": found, "daemons": daemons, "secrets": secrets, "net": net}}
"""


@pytest.fixture
def listener() -> Iterator[tuple[int, list[bytes]]]:
    """A TCP listener on the host's loopback, answering in a thread while the test runs; what it hears."""
    heard: list[bytes] = []
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.2)
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(1)
                with contextlib.suppress(OSError):
                    heard.append(conn.recv(100))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield srv.getsockname()[1], heard
    done.set()
    thread.join()
    srv.close()


def _daemons(marker: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            pass
    return found


def test_fallback_separates_jobs_as_bubblewrap_does(readable_python: Path, tmp_path: Path,  # noqa: F811
                                                   listener: tuple[int, list[bytes]]) -> None:
    port, heard = listener
    token = secrets.token_hex(8)
    name, marker = f"grader-left-{token}", f"grader-daemon-{token}"
    # another submission, the results and the class folder, all open to any user
    open_root = Path(tempfile.mkdtemp(prefix="grader-open-", dir="/tmp"))
    class_dir = Path(tempfile.mkdtemp(prefix="grader-class-", dir="/srv" if os.path.isdir("/srv") else "/var/tmp"))
    files = {"submission": open_root / "submissions" / "bob.ipynb", "result": open_root / "grades" / "bob.json",
             "course": class_dir / "reference" / "answers.py"}
    try:
        for path in files.values():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"secret {token}")
        for path in [open_root, class_dir, *[p for f in files.values() for p in (f, f.parent)]]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        (tmp_path / "isolation_checks.py").write_text(FAKE_CHECKS)
        secret_paths = {k: str(v) for k, v in files.items()}
        nbs = {"first": leave_cell(name, port, marker), "beside": look_cell(name, port, marker, secret_paths, 1.5),
               "after": look_cell(name, port, marker, secret_paths, 0)}
        for key, cell in nbs.items():
            (tmp_path / f"{key}.ipynb").write_bytes(notebook(cell))
        hide = [str(open_root / "submissions"), str(open_root / "grades")]
        proc = subprocess.run([str(readable_python), "-c", RUN_ROUNDS, str(ROOT), str(tmp_path),
                               json.dumps(asdict(LIMITS)), *(str(tmp_path / f"{k}.ipynb") for k in nbs),
                               json.dumps(hide), str(class_dir)], capture_output=True, text=True, timeout=600,
                              env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", SANDBOX_ENV: "none"})
        assert proc.returncode == 0, proc.stderr[-3000:]
        res = json.loads(proc.stdout.splitlines()[-1])
        time.sleep(0.5)
        alive = _daemons(marker)
        left_on_host = [p for p in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/var/lock")
                        if os.path.exists(os.path.join(p, name))]
    finally:
        for pid in _daemons(marker):
            subprocess.run(["kill", "-9", str(pid)], check=False)
        for folder in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock"):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(folder, name))
        shutil.rmtree(open_root, ignore_errors=True)
        shutil.rmtree(class_dir, ignore_errors=True)
    assert {k: (r["sandbox"], r["isolation"]) for k, r in res.items()} == dict.fromkeys(
        res, ("none", "unprivileged uid")), res
    seen = {k: r["outputs"]["report"]["value"] for k, r in res.items()}
    assert all(s["uid"] != 0 for s in seen.values())
    assert seen["first"]["left"], seen["first"]  # it could leave something somewhere (its own /dev/shm) ...
    assert seen["beside"]["found"] == {} and seen["after"]["found"] == {}, seen  # ... that no other job found
    assert left_on_host == [], "a job's leftovers reached the host"
    assert heard == [] and "connected" not in {s["net"] for s in seen.values()}, (heard, seen)
    assert seen["first"]["started"] >= 1, seen["first"]  # its daemon was running ...
    assert seen["after"]["daemons"] == [], "the first job's daemon was still running during the next job"
    assert alive == [], "a job's daemon outlived the grading run"
    assert seen["beside"]["secrets"] == {} and seen["after"]["secrets"] == {}, seen


def _closed_python(root: Path) -> Path:
    """A venv of this environment's packages in a folder only root may enter (as pyenv's Pythons under /root)."""
    closed = root / "closed"
    closed.mkdir(mode=0o700)
    base = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    return make_venv(closed / "venv", base)


def _grade(python: Path, subs: Path, out: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(out.parent), SANDBOX_ENV: "none",
           "PYTHONPATH": str(ROOT), "LESSON83_CACHE": "off"}
    return subprocess.run([str(python), "-m", "autograder.cli", "--config", str(DEMO / "grading_config.yaml"),
                           "grade", str(subs), "--out", str(out), "--quiet", *flags],
                          capture_output=True, text=True, timeout=900, env=env, cwd=str(out.parent))


def test_grade_refuses_an_interpreter_the_job_uid_cannot_read(tmp_path: Path) -> None:
    """Forced off bubblewrap, with a Python other users cannot read, `grade` refuses before the first submission
    and says what to install or change; with --allow-unsandboxed it grades, and every row and the summary say
    so. Fails where grade runs the class as the grader's user without a word."""
    python = _closed_python(tmp_path)
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "alice.ipynb").write_bytes(notebook("x = 1"))
    (subs / "bob.ipynb").write_bytes(notebook("import os\nopen(os.path.expanduser('~/owned'), 'w').write('x')"))
    refused = _grade(python, subs, tmp_path / "grades")
    assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-3000:]
    assert ALLOW_UNSANDBOXED in refused.stderr and "bubblewrap" in refused.stderr, refused.stderr
    assert "not readable by other users" in refused.stderr, refused.stderr  # what to change: the interpreter
    assert not (tmp_path / "grades").exists() and not (tmp_path / "owned").exists()  # nothing ran or was written
    allowed = _grade(python, subs, tmp_path / "grades", ALLOW_UNSANDBOXED)
    assert allowed.returncode == 0, allowed.stdout[-2000:] + allowed.stderr[-3000:]
    rows = json.loads((tmp_path / "grades" / "summary.json").read_text())["rows"]
    assert len(rows) == 2 and all(r["message"].startswith("graded WITHOUT a sandbox") for r in rows), rows
    assert "sandbox: none, graded WITHOUT a sandbox" in allowed.stdout, allowed.stdout


def test_gradescope_and_the_checkpoint_reader_refuse_an_unreadable_interpreter(tmp_path: Path) -> None:
    """The Gradescope entry point writes a results.json that grades nothing (score 0, why in extra_data) and
    says what to change; the checkpoint reader does not start. Both with the interpreter of the test above."""
    python = _closed_python(tmp_path)
    sub = tmp_path / "submission"
    sub.mkdir()
    (sub / "alice.ipynb").write_bytes(notebook("x = 1"))
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(tmp_path), SANDBOX_ENV: "none",
           "PYTHONPATH": str(ROOT), "LESSON83_CACHE": "off"}
    proc = subprocess.run([str(python), "-m", "autograder.cli", "--config", str(DEMO / "grading_config.yaml"),
                           "gradescope", str(sub), str(tmp_path / "results.json")],
                          capture_output=True, text=True, timeout=600, env=env, cwd=str(tmp_path))
    assert proc.returncode == 1 and ALLOW_UNSANDBOXED in proc.stdout, proc.stdout + proc.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["score"] == 0 and results["tests"] == [] and "not readable" in results["extra_data"]["refused"]
    reader = ("import sys; from pathlib import Path; from autograder.checkpoint import Verifier, VerifierError\n"
              "try:\n    Verifier(plugin=Path(sys.argv[1]), sandbox='none').start()\n"
              "except VerifierError as exc:\n    print(exc)\nelse:\n    print('started')\n")
    out = subprocess.run([str(python), "-c", reader, str(tmp_path / "plugin.py")], capture_output=True, text=True,
                         timeout=300, env=env, cwd=str(tmp_path)).stdout
    assert "refusing to run student code" in out and ALLOW_UNSANDBOXED in out, out


def test_cluster_refuses_before_its_first_batch(tmp_path: Path) -> None:
    """A Dask worker whose Python other users cannot read, forced off bubblewrap: grading on the cluster stops
    before the first batch with the worker's address and what to change there."""
    pytest.importorskip("distributed", reason="the cluster extra is not installed: pip install '.[cluster]'")
    from autograder.config import Cluster
    from autograder.course import Course
    from autograder.grading.cluster import ClusterError, grade_on_cluster
    from autograder.grading.submissions import Submission
    from helpers.cluster import LocalCluster, dask_env

    python = _closed_python(tmp_path)

    class BareCluster(LocalCluster):
        def _start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
            with open(self.tmp / f"{name}.log", "wb") as log:
                proc = subprocess.Popen([str(python), "-m", "dask", *args, "--scheduler-file", str(self.file)],
                                        cwd=self.tmp, env=dask_env() | {SANDBOX_ENV: "none"}, stdout=log,
                                        stderr=subprocess.STDOUT)
            self.procs.append(proc)
            return proc

    cluster = BareCluster(tmp_path).start(1)
    try:
        sub = Submission("alice", tmp_path / "alice.ipynb", notebook("x = 1"), name="alice.ipynb")
        with pytest.raises(ClusterError, match=ALLOW_UNSANDBOXED) as err:
            list(grade_on_cluster(cluster.address, [(sub, "key")], course=Course.load(DEMO / "grading_config.yaml"),
                                  fingerprint="any", settings=Cluster(), hide=()))
        assert "Dask worker tcp://127.0.0.1" in str(err.value) and "not readable" in str(err.value)
    finally:
        cluster.stop()


NO_SYS_ADMIN = ["setpriv", "--bounding-set", "-sys_admin", "--inh-caps", "-sys_admin"]  # util-linux
UNSHARE = ("import ctypes, os, sys; libc = ctypes.CDLL(None, use_errno=True); "
           "sys.exit(0 if libc.unshare(0x40000000 | 0x00020000) == 0 else 1)")  # CLONE_NEWNET | CLONE_NEWNS


def test_grade_refuses_where_the_kernel_refuses_the_fallbacks_namespaces(readable_python: Path,  # noqa: F811
                                                                         tmp_path: Path) -> None:
    """As root without CAP_SYS_ADMIN (dropped from the bounding set, as in some containers) the kernel refuses the
    uid fallback a network and mount namespace of its own: jobs would reach the network and share /tmp. Forced off
    bubblewrap, `grade` then refuses before the first submission and says what to change; with --allow-unsandboxed
    it grades, and every row and the summary say unsandboxed. The real kernel, not a mock. Fails where the worker
    only warns and grades on with the network and shared folders."""
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed: CAP_SYS_ADMIN cannot be dropped for the test")
    python = [*NO_SYS_ADMIN, str(readable_python)]
    assert subprocess.run([str(readable_python), "-c", UNSHARE]).returncode == 0, "root here cannot unshare at all"
    assert subprocess.run([*python, "-c", UNSHARE]).returncode == 1, "setpriv did not take CAP_SYS_ADMIN away"
    subs, out = tmp_path / "subs", tmp_path / "grades"
    subs.mkdir()
    (subs / "alice.ipynb").write_bytes(notebook("x = 1"))
    (subs / "bob.ipynb").write_bytes(notebook("import os\nopen(os.path.expanduser('~/owned'), 'w').write('x')"))
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(tmp_path), SANDBOX_ENV: "none",
           "PYTHONPATH": str(ROOT), "LESSON83_CACHE": "off"}

    def grade(*flags: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*python, "-m", "autograder.cli", "--config", str(DEMO / "grading_config.yaml"),
                               "grade", str(subs), "--out", str(out), "--quiet", *flags],
                              capture_output=True, text=True, timeout=900, env=env, cwd=str(tmp_path))

    refused = grade()
    assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-3000:]
    assert ALLOW_UNSANDBOXED in refused.stderr and "CAP_SYS_ADMIN" in refused.stderr, refused.stderr
    assert not out.exists() and not (tmp_path / "owned").exists()  # nothing ran or was written
    allowed = grade(ALLOW_UNSANDBOXED)
    assert allowed.returncode == 0, allowed.stdout[-2000:] + allowed.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["rows"]) == 2, summary["rows"]
    assert all(r["message"].startswith("graded WITHOUT a sandbox") for r in summary["rows"]), summary["rows"]
    assert "sandbox: none, graded WITHOUT a sandbox" in allowed.stdout, allowed.stdout
    results = [json.loads((out / "results" / r["result"]).read_text()) for r in summary["rows"]]
    assert {(r["sandbox"], r["isolation"]) for r in results} == {("none", "none")}, results
