"""File jobs (a checkpoint's reader) run in the notebooks' sandbox: a hostile reader evaluation in the demo lesson's
assignment folder (a copy of tests/fixtures/lesson_demo), standing for a file that takes over the plug-in's loader,
reads nothing of the grader's (the lesson's reference/ in the repository and in the course, another student's
submission, the plug-in's own staged files) and writes nowhere but its scratch folder; the plug-in's start-up still
reads the reference data it needs (the demo lesson's hidden points)."""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from autograder.checkpoint import Verifier
from autograder.config import ROOT
from autograder.lesson import ENGINE_ROOT
from autograder.sandbox import WorkerError, choose_sandbox, reader_isolation
from helpers.isolation import readable_python  # noqa: F401 - the fixture: a Python every user may read

pytestmark = pytest.mark.sandbox  # every test here starts a reader process

FIXTURE = ROOT / "tests" / "fixtures" / "lesson_demo"

# A plug-in's reader part whose evaluation tries what a file that took over the loader could: read the paths the
# request names, write outside its scratch folder, list the course; reader_start reads its hidden data as the
# grader's plug-ins do.
HOSTILE = '''
import json, os
from pathlib import Path

SECRET = Path(__file__).resolve().parents[2] / "reference" / "lesson_demo_points.json"


def reader_start():
    return SECRET.read_text()


def _try(action):
    try:
        return ["ok", action()]
    except Exception as err:
        return ["refused", type(err).__name__]


def reader_evaluate(request, data, state):
    out = {"state": state, "cwd": os.getcwd(), "data": data.decode()}
    out["read"] = {p: _try(lambda p=p: Path(p).read_text()[:100]) for p in request["read"] + [__file__, str(SECRET)]}
    out["write"] = {p: _try(lambda p=p: Path(p).write_text("written")) for p in request["write"]}
    out["scratch"] = _try(lambda: Path("mine.txt").write_text("scratch") and Path("mine.txt").read_text())
    return out
'''


def _bwrap_problem() -> str:
    try:
        sandbox, why = choose_sandbox("auto")
    except WorkerError as err:
        return str(err)
    return "" if sandbox == "bwrap" else why


@pytest.fixture
def course(tmp_path: Path) -> Iterator[Path]:
    """A copy of the demo course with the hostile plug-in beside its own (assignments/lesson_demo/) and the
    lesson's hidden data (reference/lesson_demo_points.json) and reference solution."""
    shutil.copytree(FIXTURE, tmp_path / "course", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "course" / "assignments" / "lesson_demo" / "hostile_checkpoint.py").write_text(HOSTILE)
    yield tmp_path / "course"


def _plugin(course: Path) -> Path:
    return course / "assignments" / "lesson_demo" / "hostile_checkpoint.py"


def test_a_hostile_reader_sees_nothing_of_the_grader_under_bubblewrap(course: Path, tmp_path: Path) -> None:
    """Under bubblewrap the reader's child can read neither the lesson's reference solution (in the repository or
    in the course), nor another student's submission, nor the plug-in and reference data it was started from, nor
    the expected-values cache;
    it writes only into its scratch folder, which is gone after it. Fails on a reader with rlimits alone."""
    problem = _bwrap_problem()
    if problem:
        pytest.skip(f"bubblewrap is not usable here ({problem}): the sandboxed checkpoint reader is not tested")
    token = f"student-secret-{secrets.token_hex(8)}"
    other = tmp_path / "class" / "bob" / "notebook.ipynb"
    other.parent.mkdir(parents=True)
    other.write_text(token)
    references = [str(FIXTURE / "reference" / "lesson_demo.py"), str(course / "reference" / "lesson_demo.py")]
    cache = Path.home() / ".cache" / "lesson_demo-file-jobs-test.json"
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(token)
    outside = tmp_path / "written-by-the-reader.txt"
    plugin = _plugin(course)
    try:
        with Verifier(plugin=plugin) as verifier:
            found = verifier.request(b"a checkpoint", {"read": [str(other), *references, str(cache)],
                                                       "write": [str(outside), str(plugin.with_name("new.py"))],
                                                       "memory_mb": 256}, timeout_s=30)
            assert (verifier.sandbox, verifier.isolation) == ("bwrap", "bubblewrap")
            scratch = found.get("cwd", "")
            again = verifier.request(b"the next one", {"read": [f"{scratch}/mine.txt"], "write": [],
                                                       "memory_mb": 256}, timeout_s=30)
    finally:
        cache.unlink(missing_ok=True)
    assert "error" not in found, found
    points = (FIXTURE / "reference" / "lesson_demo_points.json").read_text()
    assert found["state"] == points and found["data"] == "a checkpoint"  # its start-up read it
    assert {p: r[0] for p, r in found["read"].items()} == dict.fromkeys(found["read"], "refused"), found["read"]
    assert {p: r[0] for p, r in found["write"].items()} == dict.fromkeys(found["write"], "refused"), found["write"]
    assert not outside.exists() and not plugin.with_name("new.py").exists()
    assert found["scratch"] == ["ok", "scratch"]  # its own scratch folder is writable
    assert again["read"][f"{scratch}/mine.txt"][0] == "refused"  # and wiped before the next file
    assert reader_isolation() in ("bubblewrap", "unprivileged uid", "none")


# Without bubblewrap: one request to a reader of `plugin` forced to sandbox="none", run by the stand-in venv's python
# (test_execute_isolation.py: a Python every user may read); prints its isolation and answer.
RUN_READER = '''
import json, sys
checkout, plugin, request = sys.argv[1:]
sys.path[:0] = [checkout]
from autograder.checkpoint import Verifier
with Verifier(plugin=plugin, sandbox="none") as verifier:
    found = verifier.request(b"a checkpoint", json.loads(request), timeout_s=30)
    print(json.dumps({"isolation": verifier.isolation, "found": found}))
'''


def test_without_bubblewrap_a_root_grader_reads_files_as_an_unprivileged_uid(
        course: Path, readable_python: Path) -> None:  # noqa: F811 - the fixture imported above
    """As root without bubblewrap, the reader's child runs as an unprivileged uid in the reader's namespaces: it
    reads the system's files and nothing else, open to others or not (another student's files, as bubblewrap
    hides them), writes nowhere but its scratch and a /dev/shm of the reader's own, and what it leaves there is
    removed after it and never reaches the host. Fails on a reader that runs the child as root, or that shows it
    the host's /tmp."""
    folder = Path(tempfile.mkdtemp(prefix="file-jobs-", dir="/tmp"))
    token = secrets.token_hex(8)
    left, shm = Path("/tmp") / f"file-jobs-left-{token}", Path("/dev/shm") / f"file-jobs-left-{token}"
    try:
        folder.chmod(0o755)
        closed, open_ = folder / "bob.ipynb", folder / "open.txt"
        closed.write_text("student secret")
        closed.chmod(0o600)
        open_.write_text("anyone may read this")
        open_.chmod(0o644)
        course.chmod(0o755)
        request = {"read": [str(closed), str(open_), "/etc/passwd"],
                   "write": [str(folder / "new.txt"), str(left), str(shm)], "memory_mb": 256}
        proc = subprocess.run([str(readable_python), "-c", RUN_READER, str(ENGINE_ROOT),
                               str(_plugin(course)), json.dumps(request)],
                              capture_output=True, text=True, timeout=300, env={"PATH": "/usr/bin:/bin"})
        assert proc.returncode == 0, proc.stderr[-3000:]
        out = json.loads(proc.stdout.splitlines()[-1])
        found = out["found"]
        assert out["isolation"] == "unprivileged uid" and "error" not in found, out
        assert found["read"][str(closed)][0] == found["read"][str(open_)][0] == "refused", found["read"]
        assert found["read"]["/etc/passwd"][0] == "ok", found["read"]
        assert found["write"][str(folder / "new.txt")][0] == "refused" and not (folder / "new.txt").exists()
        assert found["write"][str(left)][0] == "refused" and not left.exists()  # /tmp: an empty read-only tmpfs
        assert found["write"][str(shm)][0] == "ok" and not shm.exists()  # the reader's own /dev/shm, wiped
        assert found["scratch"] == ["ok", "scratch"]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        left.unlink(missing_ok=True)
        shm.unlink(missing_ok=True)
