"""File jobs (a checkpoint's reader) run in the notebooks' sandbox: a hostile reader evaluation, standing for a
file that takes over the plug-in's loader, reads nothing of the grader's (the repository's reference/, another
student's submission, the plug-in's own staged files) and writes nowhere but its scratch folder; the plug-in's
start-up still reads the reference data it needs."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from autograder.lesson import ENGINE_ROOT
from autograder.sandbox.files import Verifier, reader_isolation
from autograder.sandbox.isolation import _choose_sandbox
from autograder.sandbox.protocol import WorkerError

pytestmark = pytest.mark.sandbox  # every test here starts a reader process

# A plug-in's reader part whose evaluation tries what a file that took over the loader could: read the paths the
# request names, write outside its scratch folder, list the course; reader_start reads its hidden data as the
# grader's plug-ins do.
HOSTILE = '''
import json, os
from pathlib import Path

SECRET = Path(__file__).resolve().parents[2] / "reference" / "hostile_points.json"


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
        sandbox, why = _choose_sandbox("auto")
    except WorkerError as err:
        return str(err)
    return "" if sandbox == "bwrap" else why


@pytest.fixture
def course(tmp_path: Path) -> Iterator[Path]:
    """A course with the hostile plug-in and its hidden data (reference/hostile_points.json)."""
    folder = tmp_path / "course" / "assignments" / "hostile"
    folder.mkdir(parents=True)
    (folder / "hostile_checkpoint.py").write_text(HOSTILE)
    (tmp_path / "course" / "reference").mkdir()
    (tmp_path / "course" / "reference" / "hostile_points.json").write_text(json.dumps({"points": [[1, 2]]}))
    yield tmp_path / "course"


def test_a_hostile_reader_sees_nothing_of_the_grader_under_bubblewrap(course: Path, tmp_path: Path) -> None:
    """Under bubblewrap the reader's child can read neither the repository's reference solution, nor another
    student's submission, nor the plug-in and reference data it was started from, nor the expected-values cache;
    it writes only into its scratch folder, which is gone after it. Fails on a reader with rlimits alone."""
    problem = _bwrap_problem()
    if problem:
        pytest.skip(f"bubblewrap is not usable here ({problem}): the sandboxed checkpoint reader is not tested")
    token = f"student-secret-{secrets.token_hex(8)}"
    other = tmp_path / "class" / "bob" / "notebook.ipynb"
    other.parent.mkdir(parents=True)
    other.write_text(token)
    reference = ENGINE_ROOT / "reference" / "lesson83.py"
    cache = Path.home() / ".cache" / "lesson83-file-jobs-test.json"
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(token)
    outside = tmp_path / "written-by-the-reader.txt"
    plugin = course / "assignments" / "hostile" / "hostile_checkpoint.py"
    try:
        with Verifier(plugin=plugin) as verifier:
            found = verifier.request(b"a checkpoint", {"read": [str(other), str(reference), str(cache)],
                                                       "write": [str(outside), str(plugin.with_name("new.py"))],
                                                       "memory_mb": 256}, timeout_s=30)
            assert (verifier.sandbox, verifier.isolation) == ("bwrap", "bubblewrap")
            scratch = found.get("cwd", "")
            again = verifier.request(b"the next one", {"read": [f"{scratch}/mine.txt"], "write": [],
                                                       "memory_mb": 256}, timeout_s=30)
    finally:
        cache.unlink(missing_ok=True)
    assert "error" not in found, found
    assert found["state"] == json.dumps({"points": [[1, 2]]}) and found["data"] == "a checkpoint"  # start-up read it
    assert {p: r[0] for p, r in found["read"].items()} == dict.fromkeys(found["read"], "refused"), found["read"]
    assert {p: r[0] for p, r in found["write"].items()} == dict.fromkeys(found["write"], "refused"), found["write"]
    assert not outside.exists() and not plugin.with_name("new.py").exists()
    assert found["scratch"] == ["ok", "scratch"]  # its own scratch folder is writable
    assert again["read"][f"{scratch}/mine.txt"][0] == "refused"  # and wiped before the next file
    assert reader_isolation() in ("bubblewrap", "unprivileged uid", "none")
