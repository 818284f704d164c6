"""The grade command end to end: an adversarial class, resumability, and parity with Gradescope and Otter."""

from __future__ import annotations

import csv
import functools
import io
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest

from autograder.authoring.questions import mc_answers
from autograder.authoring.suite import Suite
from autograder.cli import main as cli_main
from autograder.config import ROOT
from autograder.course import Course, course_of
from autograder.grading import batch, gradebook, runner
from autograder.grading.batch import grade_batch
from autograder.grading.gradebook import MERGED_FILE, Gradebook
from autograder.grading.judge import notebook_env
from autograder.grading.submissions import Submission, submission_ids
from autograder.grading.tables import write_tables
from autograder.model import CaseResult, Status, SubmissionResult, row_name, spreadsheet_text
from autograder.release.common import tool_env
from autograder.release.gradescope import gradescope_bundle
from autograder.release.sample import filled_notebook
from autograder.sandbox import ExecResult, WorkerError

checks = course_of().lesson.checks
CHECKPOINT_FILES = ("milestone.pt", "milestone.json")  # the files Lesson 83's milestone question declares

TEMPLATE = ROOT / "student_templates" / "lesson83" / "lesson83.ipynb"
SIM = ROOT.parent / "shared" / "tools" / "gradescope-sim"

# Code added as a new cell to the *blank* template (so every point would be unearned) ...
BLANK_PLUS = {
    "cheat_allclose": "import numpy as np\nnp.allclose = lambda *a, **k: True",
    "cheat_testing": "import numpy as np, torch\nnp.testing.assert_allclose = lambda *a, **k: None\n"
                     "torch.testing.assert_close = lambda *a, **k: None\ntorch.allclose = lambda *a, **k: True",
    "cheat_builtins": "import builtins\nbuiltins.isinstance = lambda *a: True\nbuiltins.len = lambda x: 0",
    "cheat_grader": "import lesson83_checks as c\nc.judge = lambda *a, **k: c.Verdict(True)\n"
                    "c.run_probe = lambda *a, **k: {}",
    "eq_always_true": "class Yes:\n    def __eq__(self, other):\n        return True\n    __hash__ = None\n"
                      "def sinusoidal_pe(max_len, d):\n    return Yes()\nq8_equivariance = Yes()",
    "nan_output": "import numpy as np\ndef sinusoidal_pe(max_len, d):\n    return np.full((max_len, d), np.nan)",
    "wrong_shape": "import numpy as np\ndef sinusoidal_pe(max_len, d):\n    return np.zeros((d, max_len))",
    "wrong_type": "def sinusoidal_pe(max_len, d):\n    return 'a table'",
    "infinite_loop": "while True:\n    pass",
    "allocate_50gb": "import numpy as np\nx = np.ones(50 * 2**30 // 8)",
    "fork_bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
    "sys_exit": "import sys\nsys.exit(0)",
    "os_exit": "import os\nos._exit(0)",
    "print_100mb": "import sys\nfor _ in range(100):\n    sys.stdout.write('x' * 2**20)",
    "socket": "import socket\nsocket.create_connection(('pypi.org', 443), timeout=3)",
    "write_outside": "open('/usr/lib/pwned.txt', 'w').write('x')",
    "read_hidden": "import glob\nfor p in glob.glob('/work/**/reference/*.py', recursive=True) + "
                   "glob.glob('/work/**/tests/*.py', recursive=True):\n    print(open(p).read())",
}
# ... and their expected status (every one earns 0 points).
STATUS = {"cheat_allclose": "tampering detected", "cheat_testing": "tampering detected",
          "cheat_builtins": "tampering detected", "cheat_grader": "tampering detected",
          "infinite_loop": "graded", "allocate_50gb": "out of memory", "sys_exit": "crashed",
          "os_exit": "crashed"}


def _save(nb: nbformat.NotebookNode, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))


def _config(tmp: Path) -> Path:
    text = (ROOT / "grading_config.yaml").read_text()
    text = text.replace("wall_timeout_s: 30", "wall_timeout_s: 20").replace("cpu_timeout_s: 30", "cpu_timeout_s: 20")
    text = text.replace("cell_timeout_s: 10", "cell_timeout_s: 15")  # memory_tree needs ~10 s to go over
    text = text.replace("memory_mb: 4096", "memory_mb: 3072")
    path = tmp / "grading_config.yaml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def adversarial_class(tmp_path_factory: pytest.TempPathFactory, suite: Suite) -> tuple[Path, dict]:
    tmp = tmp_path_factory.mktemp("class")
    subs = tmp / "submissions"
    answers = mc_answers(list(suite.questions))
    blank = nbformat.read(str(TEMPLATE), as_version=4)
    for name, code in BLANK_PLUS.items():
        nb = nbformat.read(str(TEMPLATE), as_version=4)
        nb.cells.insert(len(nb.cells) - 3, nbformat.v4.new_code_cell(code))
        _save(nb, subs / f"{name}.ipynb")
    _save(blank, subs / "blank.ipynb")
    _save(filled_notebook(TEMPLATE, answers=answers, lesson=suite.lesson), subs / "reference.ipynb")
    missing = filled_notebook(TEMPLATE, answers=answers, lesson=suite.lesson)
    missing.cells = [c for c in missing.cells if "def rope_attention" not in c.source]
    _save(missing, subs / "missing_function.ipynb")
    syntax = filled_notebook(TEMPLATE, answers=answers, lesson=suite.lesson)
    syntax.cells.insert(4, nbformat.v4.new_code_cell("def broken(:\n    pass"))
    _save(syntax, subs / "syntax_error.ipynb")
    (subs / "not_json.ipynb").write_text("{ this is not json")
    (subs / "empty.ipynb").write_bytes(b"")
    (subs / "notes.txt").write_text("not a notebook")
    # Gradescope-style inputs: a per-student folder, and a zip with a crafted .OTTER_LOG pickle.
    _save(filled_notebook(TEMPLATE, answers=answers, lesson=suite.lesson), subs / "student_folder" / "lesson83.ipynb")

    class Boom:
        def __reduce__(self):
            return (os.system, ("touch /tmp/otter_log_was_unpickled",))

    with zipfile.ZipFile(subs / "otter_log_zip.zip", "w") as zf:
        zf.writestr("lesson83.ipynb", nbformat.writes(blank))
        zf.writestr(".OTTER_LOG", pickle.dumps(Boom()))
    out = tmp / "out"
    summary = grade_batch(subs, out=out, course=Course.load(_config(tmp)), progress=False)
    rows = {r["id"]: r for r in summary.rows}
    return out, rows


@pytest.mark.sandbox
def test_every_input_gets_exactly_one_row(adversarial_class: tuple[Path, dict]) -> None:
    out, rows = adversarial_class
    with open(out / "grades.csv") as f:
        ids = [r["id"] for r in csv.DictReader(f)]
    expected = set(BLANK_PLUS) | {"blank", "reference", "missing_function", "syntax_error", "not_json", "empty",
                                  "notes", "student_folder", "otter_log_zip"}
    assert sorted(ids) == sorted(expected)
    assert len(list((out / "results").glob("*.json"))) == len(expected)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["submissions"] == len(expected)


@pytest.mark.sandbox
def test_no_adversarial_submission_earns_a_point(adversarial_class: tuple[Path, dict], suite: Suite) -> None:
    _, rows = adversarial_class
    for name in [*BLANK_PLUS, "blank", "not_json", "empty", "notes", "otter_log_zip"]:
        assert rows[name]["total"] == 0, (name, rows[name])
    assert not Path("/tmp/otter_log_was_unpickled").exists()


@pytest.mark.parametrize("name", sorted(STATUS))
@pytest.mark.sandbox
def test_status_names_what_happened(adversarial_class: tuple[Path, dict], name: str) -> None:
    _, rows = adversarial_class
    assert rows[name]["status"] == STATUS[name]


@pytest.mark.sandbox
def test_unreadable_inputs_say_why(adversarial_class: tuple[Path, dict]) -> None:
    out, rows = adversarial_class
    for name in ("not_json", "empty", "notes"):
        assert rows[name]["status"] == "could not be read"
        record = json.loads((out / "results" / f"{name}.json").read_text())
        assert record["notes"] and record["gradescope"]["score"] == 0


@pytest.mark.sandbox
def test_honest_work_around_the_cheats_keeps_its_points(adversarial_class: tuple[Path, dict], suite: Suite) -> None:
    _, rows = adversarial_class
    assert rows["reference"]["total"] == suite.notebook_points and rows["reference"]["status"] == "graded"
    assert rows["student_folder"]["total"] == suite.notebook_points
    assert rows["syntax_error"]["total"] == suite.notebook_points  # one broken cell, the rest still counts
    assert rows["missing_function"]["q6_rope_attention"] == 0
    q6 = suite.config.questions["q6_rope_attention"].points
    assert rows["missing_function"]["total"] == suite.notebook_points - q6


@pytest.mark.sandbox
def test_hidden_files_are_not_visible_and_output_is_capped(adversarial_class: tuple[Path, dict]) -> None:
    out, _ = adversarial_class
    record = json.loads((out / "results" / "read_hidden.json").read_text())
    assert "BEGIN SOLUTION" not in record["stdout"] and "hidden_" not in record["stdout"]
    big = json.loads((out / "results" / "print_100mb.json").read_text())
    assert len(big["stdout"]) < 1_000_000


CHECKPOINT = ROOT / "reference" / "lesson83_checkpoint"


@pytest.mark.sandbox
def test_milestone_checkpoint_is_graded_from_folders_and_zips(course: Course, tmp_path: Path, suite: Suite) -> None:
    answers = mc_answers(list(suite.questions))
    nb = filled_notebook(TEMPLATE, answers=answers, lesson=suite.lesson)
    pt, claims = (CHECKPOINT / "milestone.pt").read_bytes(), (CHECKPOINT / "milestone.json").read_bytes()
    subs = tmp_path / "subs"
    for name, files in (("folder", {"milestone.pt": pt, "milestone.json": claims}), ("notebook_only", {}),
                        ("corrupt", {"milestone.pt": b"not a checkpoint", "milestone.json": claims}),
                        ("nested", {"run/milestone.pt": pt, "run/milestone.json": claims})):
        _save(nb, subs / name / "lesson83.ipynb")
        for rel, data in files.items():
            (subs / name / rel).parent.mkdir(parents=True, exist_ok=True)
            (subs / name / rel).write_bytes(data)
    with zipfile.ZipFile(subs / "zipped.zip", "w") as zf:  # an Otter export zip with the files added
        zf.writestr("lesson83.ipynb", nbformat.writes(nb))
        zf.writestr("milestone.pt", pt)
        zf.writestr("milestone.json", claims)
    out = tmp_path / "out"
    rows = {r["id"]: r for r in grade_batch(subs, out=out, progress=False, course=course).rows}
    full = suite.config.milestone.points
    for name in ("folder", "nested", "zipped"):
        assert rows[name]["m1_checkpoint"] == full and rows[name]["total"] == suite.auto_points, name
    record = {name: json.loads((out / "results" / f"{name}.json").read_text()) for name in rows}
    for name, words, problem in (
            ("notebook_only", "milestone.pt was not found. Upload milestone.pt and milestone.json",
             "checkpoint_missing"),
            ("corrupt", "could not be read as plain weights", "checkpoint_unreadable")):
        assert rows[name]["m1_checkpoint"] == 0 and rows[name]["total"] == suite.notebook_points
        failed = [c for c in record[name]["cases"] if c["question"] == "m1_checkpoint"]
        assert len(failed) == 5 and all(words in c["message"] and not c["passed"] for c in failed), failed
        assert {c["diagnosis"] for c in failed} == {problem}
    shown = {t["name"]: t["output"] for t in record["zipped"]["gradescope"]["tests"]}
    lines = shown.get("m1_checkpoint: visible tests", "") + shown.get("m1_checkpoint: hidden tests", "")
    assert all(f"{pos}: " in lines for pos in ("learned", "sinusoidal", "rope", "alibi", "none")), lines


def _grade_cli(subs: Path, out: Path, config: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "autograder.cli", "--config", str(config), "grade", str(subs),
                             "--out", str(out), "--quiet", *extra], cwd=ROOT, env=tool_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.sandbox
def test_batch_killed_with_sigkill_resumes_without_loss_or_duplicates(tmp_path: Path, suite: Suite) -> None:
    subs, out = tmp_path / "subs", tmp_path / "out"
    answers = mc_answers(list(suite.questions))
    for i in range(8):
        _save(filled_notebook(TEMPLATE, answers=answers, lesson=suite.lesson) if i % 2
              else nbformat.read(str(TEMPLATE), as_version=4), subs / f"s{i}.ipynb")
    config = _config(tmp_path)
    proc = _grade_cli(subs, out, config, "--workers", "1")
    deadline = time.monotonic() + 600  # a guard, not a timing: worker start-up is slow on a loaded machine
    while time.monotonic() < deadline and len(list((out / "results").glob("*.json"))) < 2:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done_before = len(list((out / "results").glob("*.json")))
    assert 2 <= done_before < 8
    rerun = _grade_cli(subs, out, config)
    text, _ = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, text
    assert f"reused {done_before} unchanged" in text
    with open(out / "grades.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted(r["id"] for r in rows) == [f"s{i}" for i in range(8)]
    assert all(float(r["total"]) == (suite.notebook_points if int(r["id"][1]) % 2 else 0) for r in rows)
    again = _grade_cli(subs, out, config)
    text, _ = again.communicate(timeout=300)
    assert "graded 0 submission(s), reused 8" in text


@pytest.mark.skipif(not SIM.exists(), reason="gradescope-sim is not beside the repository")
@pytest.mark.sandbox
@pytest.mark.build
def test_gradescope_bundle_gives_the_same_scores_as_grade(course: Course, tmp_path: Path, suite: Suite) -> None:
    from reference.lesson83_mistakes import MISTAKES

    bundle = gradescope_bundle(tmp_path / "autograder.zip", course=course)
    answers = mc_answers(list(suite.questions))
    mistake = next(m for m in MISTAKES if m.id == "alibi_sign_flipped")
    notebooks = {"reference": filled_notebook(TEMPLATE, answers=answers, lesson=suite.lesson),
                 "blank": nbformat.read(str(TEMPLATE), as_version=4),
                 "mistake": filled_notebook(TEMPLATE, extra={"alibi_bias": mistake.code}, answers=answers,
                                            lesson=suite.lesson)}
    subs = tmp_path / "subs"
    for name, nb in notebooks.items():
        _save(nb, subs / name / "lesson83.ipynb")
    for f in ("milestone.pt", "milestone.json"):  # the reference also uploads its checkpoint
        (subs / "reference" / f).write_bytes((CHECKPOINT / f).read_bytes())
    local = {r["id"]: r["total"] for r in grade_batch(subs, out=tmp_path / "out", progress=False, course=course).rows}
    local_cases: dict[str, dict[str, float]] = {name: {} for name in notebooks}
    for name, rows in local_cases.items():  # each question's visible and hidden rows: the sums of their cases
        for c in json.loads((tmp_path / "out" / "results" / f"{name}.json").read_text())["cases"]:
            if c["max_points"] > 0:
                row = row_name(c["question"], hidden=c["hidden"])
                rows[row] = rows.get(row, 0.0) + c["points"]
    for name in notebooks:
        proc = subprocess.run(["bash", str(SIM), str(bundle), str(subs / name), str(tmp_path / f"gs-{name}")],
                              capture_output=True, text=True, env=tool_env(), timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        results = json.loads((tmp_path / f"gs-{name}" / "results.json").read_text())
        assert results["score"] == pytest.approx(local[name], abs=0.005), name  # shown with two decimals
        per_test = {t["name"]: t["score"] for t in results["tests"]}
        assert per_test == pytest.approx(local_cases[name], abs=0.005)  # the same score on every row


@pytest.mark.build
def test_otter_run_agrees_on_reference_and_blank(tmp_path: Path, suite: Suite,
                                                 fresh_build: dict[str, Path]) -> None:
    otter_zip = fresh_build["otter_zip"]
    answers = mc_answers(list(suite.questions))
    reference = filled_notebook(TEMPLATE, answers=answers, lesson=suite.lesson)
    for name, nb, want in (("reference", reference, suite.notebook_points),
                           ("blank", nbformat.read(str(TEMPLATE), as_version=4), 0.0)):
        _save(nb, tmp_path / name / "lesson83.ipynb")
        out = tmp_path / f"otter-{name}"
        out.mkdir()
        otter = str(Path(sys.executable).with_name("otter"))
        proc = subprocess.run([otter, "run", "-a", str(otter_zip), "-o", str(out), "--no-logo",
                               str(tmp_path / name / "lesson83.ipynb")], capture_output=True, text=True,
                              env=tool_env(), timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        results = json.loads((out / "results.json").read_text())
        auto = sum(t["score"] for t in results["tests"] if "score" in t and not t["name"].startswith("q9_"))
        assert auto == pytest.approx(want), name
        # #20.7: its output says it grades the notebook's points only, and how to add the checkpoint's
        note = next(t for t in results["tests"] if t["name"].startswith("m1_checkpoint"))
        assert note["max_score"] == 0 and "not graded here" in note["output"], note
        assert "not graded by this zip" in proc.stdout, proc.stdout[-2000:]


# --------------------------------------------------------------------------- isolation, reading, ids (no sandbox)


class FakePool:
    """Stands in for the sandbox: runs the probes in order in this process on the notebook's code (trusted test
    notebooks only); a source holding INFRA makes `run` raise WorkerError, as a sandbox that failed twice does."""

    sandbox = "fake"
    isolation = "fake"  # the pool's isolation: neither bubblewrap nor none
    limits_lowered: list[str] = []  # the pool's: none lowered
    broken = True
    lock = threading.Lock()  # one at a time: the probes seed torch's global generator

    def __init__(self, size: int = 1, **_: object) -> None:
        pass

    def run(self, source: bytes, *, probes: list) -> ExecResult:
        if b"INFRA" in source and FakePool.broken:
            raise WorkerError("the worker stopped answering, twice")
        path = Path(tempfile.mkdtemp()) / "nb.ipynb"
        path.write_bytes(source)
        with FakePool.lock:
            try:
                env, _ = notebook_env(path)
            except Exception as exc:  # noqa: BLE001 - not a notebook: nothing runs, as in the sandbox
                return ExecResult(Status.UNREADABLE, notes=[str(exc)], sandbox="fake")
            outputs = {k: checks.run_probe(env, name, args) for k, name, args, *_ in probes}
            return ExecResult(Status.GRADED, outputs=outputs, sandbox="fake")

    def __enter__(self) -> FakePool:
        return self

    def __exit__(self, *_: object) -> None:
        pass


@pytest.fixture()
def fake_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "WorkerPool", FakePool)  # the one place a pool is built (grading/runner.py)
    FakePool.broken = True


@pytest.fixture(scope="module")
def notebooks(suite: Suite) -> dict[str, bytes]:
    answers = mc_answers(list(suite.questions))
    return {"honest": nbformat.writes(filled_notebook(TEMPLATE, answers=answers, lesson=suite.lesson)).encode(),
            "blank": TEMPLATE.read_bytes()}


def _mkfile(folder: Path, name: str | bytes, data: bytes) -> None:
    with open(os.path.join(os.fsencode(folder), os.fsencode(name)), "wb") as f:
        f.write(data)


def _rows(out: Path) -> list[dict[str, str]]:
    with open(out / "grades.csv", newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _deep_json(depth: int) -> bytes:
    return b'{"preset": "quick", "ppl": ' + b"[" * depth + b"]" * depth + b"}"


@pytest.mark.sandbox
def test_no_single_input_stops_the_batch(course: Course, tmp_path: Path, suite: Suite, notebooks: dict[str, bytes],
                                         fake_sandbox: None, monkeypatch: pytest.MonkeyPatch) -> None:
    subs, out = tmp_path / "subs", tmp_path / "out"
    subs.mkdir()
    _mkfile(subs, "honest.ipynb", notebooks["honest"])
    _mkfile(subs, "l" * 238 + ".ipynb", notebooks["honest"])  # 244 characters
    _mkfile(subs, b"caf\xe9.ipynb", notebooks["honest"])  # not UTF-8
    os.mkfifo(subs / "fifo.ipynb")
    (subs / "zero.ipynb").symlink_to("/dev/zero")
    _mkfile(subs, "infra.ipynb", notebooks["honest"].replace(b'"cells"', b'"INFRA": 1, "cells"', 1))
    _mkfile(subs, "unstored.ipynb", notebooks["honest"] + b" ")
    for name, claims in (("deep", _deep_json(200_000)), ("preset_list", b'{"preset": ["quick"], "ppl": {}}')):
        (subs / name).mkdir()
        _mkfile(subs / name, "lesson83.ipynb", notebooks["honest"])
        shutil.copy(CHECKPOINT / "milestone.pt", subs / name / "milestone.pt")
        _mkfile(subs / name, "milestone.json", claims)
    write = gradebook.write_atomic

    def full_disk(path: Path, text: str) -> None:  # storing one result fails
        if path.name.startswith("unstored"):
            raise OSError(28, "No space left on device")
        write(path, text)

    monkeypatch.setattr(gradebook, "write_atomic", full_disk)
    done = threading.Event()
    worker = threading.Thread(target=lambda: (grade_batch(subs, out=out, progress=False, course=course), done.set()),
                              daemon=True)
    worker.start()
    worker.join(300)
    assert done.is_set(), "the batch hung or raised (see the thread's traceback above)"
    rows = {r["id"]: r for r in _rows(out)}
    assert sorted(rows) == sorted(["honest", "l" * 238, "caf\\xe9", "fifo", "zero", "infra", "unstored", "deep",
                                   "preset_list"])
    full = suite.notebook_points
    for sid in ("honest", "l" * 238, "caf\\xe9", "deep", "preset_list"):
        assert rows[sid]["status"] == "graded" and float(rows[sid]["total"]) == full, rows[sid]
    for sid, words in (("fifo", "FIFO"), ("zero", "symbolic link")):
        assert rows[sid]["status"] == "could not be read" and words in rows[sid]["message"]
        assert float(rows[sid]["total"]) == 0
    for sid, words in (("infra", "WorkerError"), ("unstored", "No space left")):
        assert rows[sid]["status"] == "not graded" and words in rows[sid]["message"] and rows[sid]["total"] == ""
    summary = json.loads((out / "summary.json").read_text())
    stored = {r["id"]: r["result"] for r in summary["rows"]}
    assert stored["infra"] is None and stored["unstored"] is None  # never stored as the student's result
    assert len(list((out / "results").glob("*.json"))) == len(rows) - 2
    deep = json.loads((out / "results" / stored["deep"]).read_text())
    checkpoint = [c for c in deep["cases"] if c["question"] == "m1_checkpoint"]
    assert checkpoint and all(c["points"] == 0 and "milestone.json" in c["message"] for c in checkpoint), checkpoint
    from autograder.report import write_report

    assert write_report(out, out=tmp_path / "report", course=course).exists()
    FakePool.broken = False  # the sandbox is back: a re-run grades exactly what was left
    monkeypatch.setattr(gradebook, "write_atomic", write)
    again = grade_batch(subs, out=out, progress=False, course=course)
    assert again.graded_now == 2 and again.reused == len(rows) - 2
    assert {r["id"]: r["status"] for r in again.rows}["infra"] == "graded"


def test_only_regular_files_inside_the_class_are_read(course: Course, tmp_path: Path, notebooks: dict[str, bytes],
                                                      fake_sandbox: None) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    _mkfile(outside, "full_marks.ipynb", notebooks["honest"])
    subs, out = tmp_path / "subs", tmp_path / "out"
    subs.mkdir()
    (subs / "linked.ipynb").symlink_to(outside / "full_marks.ipynb")
    (subs / "linked_folder").symlink_to(outside, target_is_directory=True)
    (subs / "ckpt").mkdir()
    _mkfile(subs / "ckpt", "lesson83.ipynb", notebooks["blank"])
    for name in ("milestone.pt", "milestone.json"):  # the grader's own reference checkpoint
        (subs / "ckpt" / name).symlink_to(CHECKPOINT / name)
    (subs / "inner").mkdir()
    (subs / "inner" / "lesson83.ipynb").symlink_to(outside / "full_marks.ipynb")
    with open(subs / "huge.ipynb", "wb") as f:  # 300 MB, sparse: refused from its size, never read
        f.truncate(300 * 2**20)
    with zipfile.ZipFile(subs / "bomb.zip", "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("lesson83.ipynb", b" " * (21 * 2**20))
    with zipfile.ZipFile(subs / "big_checkpoint.zip", "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("lesson83.ipynb", notebooks["blank"])
        zf.writestr("milestone.pt", b"\0" * (65 * 2**20))
    summary = grade_batch(subs, out=out, progress=False, course=course)
    rows = {r["id"]: r for r in summary.rows}
    assert all(r["total"] == 0 for r in rows.values()), rows
    for sid, words in (("linked", "linked.ipynb is a symbolic link"),
                       ("linked_folder", "linked_folder is a symbolic link"),
                       ("inner", "inner/ holds 0 notebooks (.ipynb); submit exactly one; not read: "
                                 "inner/lesson83.ipynb (a symbolic link)"),
                       ("huge", "huge.ipynb is 300.0 MiB, over the 20 MiB limit"),
                       ("bomb", "bomb.zip: lesson83.ipynb is 21.0 MiB, over the 20 MiB limit")):
        assert rows[sid]["status"] == "could not be read" and words in rows[sid]["message"], rows[sid]
    record = json.loads((out / "results" / "ckpt.json").read_text())
    messages = {c["message"] for c in record["cases"] if c["question"] == "m1_checkpoint"}
    assert rows["ckpt"]["m1_checkpoint"] == 0 and any("milestone.pt is a symbolic link" in m for m in messages)
    big = json.loads((out / "results" / "big_checkpoint.json").read_text())
    assert any("milestone.pt is 65.0 MiB, over the 64 MiB limit" in c["message"] for c in big["cases"])


def test_ids_are_unique_readable_and_spreadsheet_safe(course: Course, tmp_path: Path, suite: Suite,
                                                      notebooks: dict[str, bytes], fake_sandbox: None) -> None:
    subs, out = tmp_path / "subs", tmp_path / "out"
    subs.mkdir()
    honest = ["alice.ipynb", "e.ipynb", "E.ipynb", "x" * 250 + ".zip"]
    blank = ["alice.zip", "e.ipynb.ipynb", "e.zip", "=HYPERLINK(1).ipynb", "+1.ipynb", "-1.ipynb", "@x.ipynb",
             "\tx.ipynb", "\rx.ipynb", b"\xff\xfe.ipynb"]
    for name in honest + blank:
        data = notebooks["honest" if name in honest else "blank"]
        if os.fsencode(name).endswith(b".zip"):
            buf = io.BytesIO()
            with zipfile.ZipFile(buf, "w") as zf:
                zf.writestr("lesson83.ipynb", data)
            data = buf.getvalue()
        _mkfile(subs, name, data)
    (subs / "alice").mkdir()
    _mkfile(subs / "alice", "lesson83.ipynb", notebooks["honest"])
    summary = grade_batch(subs, out=out, progress=False, course=course)
    rows = {r["id"]: r for r in summary.rows}
    assert len(rows) == len(honest) + len(blank) + 1  # one row each, no two alike
    assert {"alice.ipynb", "alice/", "alice.zip", "e.ipynb", "e.ipynb.ipynb", "e.zip", "E", "\\xff\\xfe"} <= set(rows)
    for sid in ("alice.ipynb", "alice/", "e.ipynb", "E", "x" * 250):
        assert rows[sid]["total"] == suite.notebook_points, sid
    for sid in ("alice.zip", "e.ipynb.ipynb", "e.zip"):
        assert rows[sid]["total"] == 0, sid
    files = [r["result"] for r in json.loads((out / "summary.json").read_text())["rows"]]
    assert len(set(f.lower() for f in files)) == len(files) and all(len(f) <= 100 for f in files)
    ids = [r["id"] for r in _rows(out)]
    assert not [i for i in ids if i[:1] in "=+-@\t\r"]  # as text in a spreadsheet
    assert {"'=HYPERLINK(1)", "'+1", "'-1", "'@x", "\\tx", "\\rx"} <= set(ids)  # control characters escaped


def test_an_upload_with_a_scratch_notebook_is_graded_on_the_release_one(
        tmp_path: Path, suite: Suite, notebooks: dict[str, bytes], fake_sandbox: None) -> None:
    """Issue 42, finding 6: a Jupyter folder zipped (or uploaded to Gradescope) with a scratch notebook beside
    lesson83.ipynb was "could not be read: holds 2 notebooks"; now the release's notebook is graded and both the
    student and the TA are told which was left; without it, every notebook is named."""
    from autograder.grading.gradescope import grade_gradescope
    from autograder.grading.summaries import grade_summary

    upload = tmp_path / "upload"
    upload.mkdir()
    _mkfile(upload, "lesson83.ipynb", notebooks["honest"])
    _mkfile(upload, "executed.ipynb", notebooks["blank"])
    run = grade_gradescope(upload, tmp_path / "results.json", course=course_of())
    results = json.loads((tmp_path / "results.json").read_text())
    assert run.graded and results["score"] == suite.notebook_points, results["output"]
    assert "graded lesson83.ipynb, the notebook the assignment names; left executed.ipynb" in results["output"]
    subs = tmp_path / "subs"
    subs.mkdir()
    for name, members in (("alice.zip", {"lesson83.ipynb": "honest", "executed.ipynb": "blank"}),
                          ("bob.zip", {"work.ipynb": "honest", "executed.ipynb": "blank"})):
        with zipfile.ZipFile(subs / name, "w") as zf:
            for member, kind in members.items():
                zf.writestr(member, notebooks[kind])
    summary = grade_batch(subs, out=tmp_path / "out", progress=False, course=course_of())
    rows = {r["id"]: r for r in summary.rows}
    assert rows["alice"]["total"] == suite.notebook_points and rows["alice"]["notes"], rows["alice"]
    assert rows["bob"]["status"] == Status.UNREADABLE
    assert "bob.zip holds 2 notebooks (.ipynb): work.ipynb, executed.ipynb; none is named lesson83.ipynb" in \
        rows["bob"]["message"], rows["bob"]
    printed = grade_summary(summary, points=suite.question_points())
    assert "note: alice: alice.zip holds 2 notebooks: graded lesson83.ipynb" in printed, printed

LEAKY = """import functools
SEEN = []
def _leaky(f):
    @functools.wraps(f)
    def g(*a, **k):
        SEEN.insert(0, "<" + ",".join(map(str, a)) + ">")
        print("LEAK", SEEN[0])
        raise ValueError("LEAK " + " ".join(SEEN))
    return g
sinusoidal_pe = _leaky(sinusoidal_pe)
alibi_slopes = _leaky(alibi_slopes)
"""


def test_students_never_see_hidden_inputs(course: Course, tmp_path: Path, suite: Suite, fake_sandbox: None) -> None:
    """A function that raises (and prints) its arguments: the TA sees the hidden ones, the student never."""
    nb = filled_notebook(TEMPLATE, answers=mc_answers(list(suite.questions)), lesson=suite.lesson)
    nb.cells.append(nbformat.v4.new_code_cell(LEAKY))
    _save(nb, tmp_path / "subs" / "leaky.ipynb")
    grade_batch(tmp_path / "subs", out=tmp_path / "out", progress=False, course=course)
    record = json.loads((tmp_path / "out" / "results" / "leaky.json").read_text())

    def marks(hidden: bool) -> set[str]:
        return {"<" + ",".join(map(str, c.args["args"])) + ">" for c in suite.cases if c.probe == "call"
                and c.args["fn"] in ("sinusoidal_pe", "alibi_slopes") and c.hidden == hidden}

    secret = marks(True) - marks(False)
    assert secret
    ta = json.dumps({k: v for k, v in record.items() if k != "gradescope"})
    assert all(m in ta for m in secret)  # results/ keeps everything for the TA
    student = json.dumps(record["gradescope"], ensure_ascii=False)
    assert [m for m in secret if m in student] == [] and "LEAK" not in json.dumps(record["gradescope"]["output"])
    assert "failed; revisit:" in student and "q2_sinusoidal_pe: hidden tests" in student
    assert "q2_sinusoidal_pe: a hidden case failed. Revisit:" in record["gradescope"]["output"]


# --------------------------------------------------------------------------- the hostile class (in the sandbox)


@dataclass(frozen=True)
class Hostile:
    """One hostile input of the class: `make(path, kit)` creates the class-folder entry `entry` at `path`
    (kit: notebook bytes "honest" and "blank", and the folder "outside" the class). It must get exactly one row
    and earn no point; `status` pins the row's status when given."""

    entry: str | bytes
    make: Callable[[Path, dict], None]
    status: str | None = None

    @staticmethod
    def code(entry: str, code: str, status: str | None = None) -> Hostile:
        """The blank template with one more code cell (for attacks from inside the notebook)."""
        def make(path: Path, kit: dict) -> None:
            nb = nbformat.reads(kit["blank"].decode(), as_version=4)
            nb.cells.insert(len(nb.cells) - 3, nbformat.v4.new_code_cell(code))
            path.write_text(nbformat.writes(nb))
        return Hostile(entry, make, status)


def _blank(path: Path, kit: dict) -> None:
    path.write_bytes(kit["blank"])


def _zip(member: str, size: int | None = None) -> Callable[[Path, dict], None]:
    def make(path: Path, kit: dict) -> None:
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
            zf.writestr(member, kit["blank"] if size is None else b" " * size)
    return make


def _checkpoint(claims: Callable[[dict], bytes] | None, *, links: bool = False) -> Callable[[Path, dict], None]:
    """A folder: the blank notebook and the reference's milestone.pt, with hostile claims (or links to both)."""
    def make(path: Path, kit: dict) -> None:
        path.mkdir()
        (path / "lesson83.ipynb").write_bytes(kit["blank"])
        for name in CHECKPOINT_FILES:
            if links:
                (path / name).symlink_to(CHECKPOINT / name)
        if not links:
            shutil.copy(CHECKPOINT / "milestone.pt", path / "milestone.pt")
            (path / "milestone.json").write_bytes(claims(json.loads((CHECKPOINT / "milestone.json").read_text())))
    return make


def _sparse(size: int) -> Callable[[Path, dict], None]:
    def make(path: Path, kit: dict) -> None:
        with open(path, "wb") as f:
            f.truncate(size)
    return make


HOSTILE: list[Hostile] = [  # the coordinator adds sandbox-level attacks here (Hostile.code)
    Hostile("l" * 238 + ".ipynb", _blank, "graded"),  # a 244-character name
    Hostile(b"caf\xe9.ipynb", _blank, "graded"),  # not UTF-8
    Hostile("fifo.ipynb", lambda p, kit: os.mkfifo(p), "could not be read"),
    Hostile("zero.ipynb", lambda p, kit: p.symlink_to("/dev/zero"), "could not be read"),
    Hostile("linked.ipynb", lambda p, kit: p.symlink_to(kit["outside"] / "full_marks.ipynb"), "could not be read"),
    Hostile("linked_folder", lambda p, kit: p.symlink_to(kit["outside"], target_is_directory=True),
            "could not be read"),
    Hostile("huge.ipynb", _sparse(300 * 2**20), "could not be read"),  # 300 MB
    Hostile("zip_over_cap.zip", _zip("lesson83.ipynb", 21 * 2**20), "could not be read"),
    Hostile("claims_ppl_zero", _checkpoint(lambda c: json.dumps(
        c | {"ppl": {pos: dict.fromkeys(row, 0) for pos, row in c["ppl"].items()}}).encode()), "graded"),
    Hostile("claims_deep", _checkpoint(lambda c: _deep_json(200_000)), "graded"),
    Hostile("claims_preset_list", _checkpoint(lambda c: json.dumps(c | {"preset": [c["preset"]]}).encode()), "graded"),
    Hostile("linked_checkpoint", _checkpoint(None, links=True), "graded"),  # the grader's own reference files
    Hostile("e.ipynb.ipynb", _blank, "graded"),  # beside the honest e.ipynb
    Hostile("e.zip", _zip("lesson83.ipynb"), "graded"),
    Hostile("alice.zip", _zip("lesson83.ipynb"), "graded"),  # beside the honest alice.ipynb and alice/
    Hostile("=SUM(1,2).ipynb", _blank, "graded"),  # a formula id
    # Inside the sandbox: each would earn points (or stop the class) if the grader believed the child.
    Hostile("forged_frames.ipynb", lambda p, kit: Hostile.code("", kit["forge"]).make(p, kit), "tampering detected"),
    Hostile.code("patched_isclose.ipynb", "import math, numpy as np, torch\nmath.isclose = lambda *a, **k: True\n"
                 "np.allclose = lambda *a, **k: True\ntorch.allclose = lambda *a, **k: True", "tampering detected"),
    Hostile.code("memory_tree.ipynb", "import os, time\nfor _ in range(3):\n    if os.fork() == 0:\n"
                 "        b = bytearray(1200 * 2**20)\n        b[::4096] = b'x' * len(b[::4096])\n"
                 "        time.sleep(30)\ntime.sleep(30)", "out of memory"),
    Hostile.code("sysv_ipc.ipynb", "import ctypes\nlibc = ctypes.CDLL(None)\n"
                 "shm = libc.shmget(0x5EED, 4096, 0o1666)\nlibc.shmat.restype = ctypes.c_void_p\n"
                 "ctypes.memmove(libc.shmat(shm, None, 0), b'left for the next student', 25)", "graded"),
    Hostile("do_nothing.ipynb", lambda p, kit: Hostile.code("", kit["do_nothing"]).make(p, kit), "graded"),
    Hostile("checkpoint_bomb", lambda p, kit: _bomb_folder(p, kit), "graded"),
    Hostile("claims_negative", _checkpoint(lambda c: json.dumps(
        c | {"ppl": {pos: {k: -v for k, v in row.items()} for pos, row in c["ppl"].items()}}).encode()), "graded"),
]


def _bomb_folder(path: Path, kit: dict) -> None:
    """The blank notebook with a milestone.pt that inflates past the checkpoint reader's memory limit."""
    from helpers.milestone import zip_bomb

    path.mkdir()
    (path / "lesson83.ipynb").write_bytes(kit["blank"])
    zip_bomb(path / "milestone.pt", mib=384)
    shutil.copy(CHECKPOINT / "milestone.json", path / "milestone.json")


def _forged_frames(suite: Suite) -> str:
    """A cell that writes the reference's own answers for every public case to the child's channel."""
    from autograder import wire
    from autograder.sandbox.frames import JOB_FD, LEN

    frames = b"".join(LEN.pack(len(d)) + d for d in (
        wire.encode({"t": "out", "key": c.id, "value": suite.expected[c.id]["value"], "oom": False,
                     "tamper": []}) for c in suite.cases if not c.hidden))
    return f"import os\nos.write({JOB_FD}, {frames!r})"


@pytest.mark.sandbox
def test_hostile_class_grades_to_completion(tmp_path: Path, suite: Suite, notebooks: dict[str, bytes]) -> None:
    subs, out = tmp_path / "class", tmp_path / "out"
    subs.mkdir()
    from helpers.attempts import DO_NOTHING

    kit = {**notebooks, "outside": tmp_path / "outside", "forge": _forged_frames(suite),
           "do_nothing": DO_NOTHING["zeros"]}
    kit["outside"].mkdir()
    (kit["outside"] / "full_marks.ipynb").write_bytes(notebooks["honest"])
    honest = [f"h{i}.ipynb" for i in range(7)] + ["e.ipynb", "alice.ipynb"]
    for name in honest:
        (subs / name).write_bytes(notebooks["honest"])
    (subs / "alice").mkdir()
    (subs / "alice" / "lesson83.ipynb").write_bytes(notebooks["honest"])
    for h in HOSTILE:
        h.make(Path(os.fsdecode(os.path.join(os.fsencode(subs), os.fsencode(h.entry)))), kit)
    entries = sorted(os.listdir(subs), key=os.fsencode)
    ids = dict(zip(entries, submission_ids([(n, (subs / n).is_dir() and not (subs / n).is_symlink())
                                                  for n in entries])))
    config = _config(tmp_path)
    config.write_text(config.read_text().replace("checkpoint_memory_mb: 1024", "checkpoint_memory_mb: 256"))
    summary = grade_batch(subs, out=out, course=Course.load(config), progress=False)
    rows = {r["id"]: r for r in _rows(out)}
    assert len(rows) == len(entries) == len(honest) + 1 + len(HOSTILE)  # one row each, all ids distinct
    assert summary.counts().get("not graded", 0) == 0
    for name in [*honest, "alice"]:
        row = rows[ids[name]]
        assert row["status"] == "graded" and float(row["total"]) == suite.notebook_points, row
    for h in HOSTILE:
        row = rows[spreadsheet_text(ids[os.fsdecode(h.entry)])]
        assert float(row["total"] or 0) == 0, (h.entry, row)
        assert h.status is None or row["status"] == h.status, (h.entry, row)
        assert row["status"] == "graded" or row["message"], (h.entry, row)
    assert "'=SUM(1,2)" in rows and (out / "summary.json").exists()
    assert cli_main(["report", str(out), "--out", str(tmp_path / "report")]) == 0


# --------------------------------------------------------------------------- summary: full marks, merged scores


def _fake_batch(out: Path, suite: Suite, scores: dict[str, dict[str, float]]) -> list[Submission]:
    """A graded batch written from made-up results (no sandbox): one result file per student."""
    (out / "results").mkdir(parents=True)
    subs = []
    points = suite.question_points()
    for sid, questions in scores.items():  # one case per question, worth its points
        cases = [CaseResult(f"{q}/all", q, s, points[q], s >= points[q], False) for q, s in questions.items()]
        record = SubmissionResult(sid, Status.GRADED, cases).to_dict()
        (out / "results" / f"{sid}.json").write_text(json.dumps(record))
        subs.append(Submission(sid, Path(f"{sid}.ipynb"), None, result_name=f"{sid}.json"))
    write_tables(suite, subs, Gradebook(out))
    return subs


def _grades(out: Path) -> dict[str, dict[str, str]]:
    with open(out / "grades.csv", newline="") as f:
        return {r["id"]: r for r in csv.DictReader(f)}


def test_full_marks_means_the_questions_points(tmp_path: Path, suite: Suite, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Two students with half of q1 each are not "full" because they tie for the batch's best score."""
    points = suite.question_points()
    half = {q: p / 2 for q, p in points.items()} | {"q2_sinusoidal_pe": points["q2_sinusoidal_pe"]}
    subs = _fake_batch(tmp_path / "out", suite, {"ann": half, "bob": half})
    tables = write_tables(suite, subs, Gradebook(tmp_path / "out"))
    summary = batch.BatchSummary(tmp_path / "out", tables, 2, 0, "fake", list(points))
    # The command line reads its option defaults from grade_batch's signature: the stand-in keeps it.
    monkeypatch.setattr(batch, "grade_batch", functools.wraps(grade_batch)(lambda *a, **k: summary))
    (tmp_path / "class").mkdir()  # the class folder beside the grades (grade refuses one that holds them)
    assert cli_main(["grade", str(tmp_path / "class"), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    table = {line.split()[0]: line.split()[-1] for line in capsys.readouterr().out.splitlines() if line[:1] in "qm"}
    assert table["q1_equivariance"] == "0/2" and table["q2_sinusoidal_pe"] == "2/2", table
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["full_marks_per_question"]["q1_equivariance"] == 0
    assert summary["full_marks_per_question"]["q2_sinusoidal_pe"] == 2


def test_merge_brings_manual_and_platform_scores_into_the_tables(tmp_path: Path, suite: Suite,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    points = suite.question_points()
    out = tmp_path / "grades"
    _fake_batch(out, suite, {"ann": dict(points), "=bob": {q: 0.0 for q in points}, "cy": dict(points)})
    auto = suite.auto_points
    assert _grades(out)["ann"]["q9_written"] == ""  # a column from the start, empty until merged
    scores = tmp_path / "q9.csv"
    scores.write_text("id,q9_buffer,q9_rope_v,q9_alibi,comment,q9_buffer answer\n"
                      "ann,2,1.5,2,good,\"=an answer, with a comma\"\n"
                      "'=bob,0,0,1,,\n"
                      "cy,2,,,not finished,\n")
    assert cli_main(["merge", str(out), str(scores)]) == 0
    assert "ignored columns: q9_buffer answer" in capsys.readouterr().out  # comment is merged, not ignored
    rows = _grades(out)
    assert float(rows["ann"]["q9_written"]) == 5.5 and float(rows["ann"]["total"]) == pytest.approx(auto + 5.5)
    assert float(rows["'=bob"]["q9_written"]) == 1 and float(rows["'=bob"]["total"]) == 1  # id as written
    assert rows["cy"]["q9_written"] == "" and float(rows["cy"]["total"]) == pytest.approx(auto)  # parts missing
    # a second file (another TA, or nbgrader's own checkpoint points) adds to what was merged before
    more = tmp_path / "more.csv"
    more.write_text("id,q9_rope_v,q9_alibi,m1_checkpoint\ncy,2,2,4\n")
    assert cli_main(["merge", str(out), str(more)]) == 0
    rows = _grades(out)
    assert float(rows["cy"]["q9_written"]) == 6 and float(rows["cy"]["m1_checkpoint"]) == 4
    assert float(rows["cy"]["total"]) == pytest.approx(auto - points["m1_checkpoint"] + 4 + 6)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["max_per_question"]["q9_written"] == 6 and summary["full_marks_per_question"]["q9_written"] == 1
    assert summary["mean_total"] == pytest.approx(round((auto + 5.5 + 1 + auto - points["m1_checkpoint"] + 10) / 3, 3))
    # re-writing the tables (as `grade` does) keeps the merged scores
    write_tables(suite, [Submission(s, Path(), None, result_name=f"{s}.json") for s in ("ann", "=bob", "cy")],
                 Gradebook(out))
    assert float(_grades(out)["ann"]["q9_written"]) == 5.5


@pytest.mark.parametrize("text, words", [
    ("id,q9_buffer\nann,3\n", "outside 0 to 2"),
    ("id,q9_buffer\nann,two\n", "not a number"),
    ("id,q9_buffer\nzed,1\n", "no student 'zed'"),
    ("id,q9_bufer\nann,1\n", "unknown score columns ['q9_bufer']"),
    ("name,q9_buffer\nann,1\n", "`id`"),
])
def test_merge_refuses_a_bad_scores_file_and_changes_nothing(tmp_path: Path, suite: Suite, text: str, words: str,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "grades"
    _fake_batch(out, suite, {"ann": suite.question_points()})
    before = (out / "grades.csv").read_text(), (out / "summary.json").read_text()
    (tmp_path / "bad.csv").write_text(text)
    assert cli_main(["merge", str(out), str(tmp_path / "bad.csv")]) == 2
    assert words in capsys.readouterr().err
    assert ((out / "grades.csv").read_text(), (out / "summary.json").read_text()) == before
    assert not (out / MERGED_FILE).exists()
