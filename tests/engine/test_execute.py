"""Execution stage under attack: each hostile notebook gets a clear status and none breaks the pool. Probe modules
of the tests' own (no lesson); the file the sandbox must hide is the demo lesson's reference, inside this checkout."""

from __future__ import annotations

import math
import os
import pickle
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import nbformat
import numpy as np
import pytest

from autograder import wire
from autograder.config import ROOT
from autograder.lesson import RUNTIME_NAME
from autograder.model import RUN_STATUSES, Status
from autograder.runtime import runtime_for
from autograder.sandbox import (
    ExecResult,
    Limits,
    WorkerError,
    WorkerPool,
    execute_batch,
    execute_submission,
    read_notebook,
)
from helpers.probes import CALL_CHECKS, importable

REPO = ROOT
REFERENCE = REPO / "tests" / "fixtures" / "lesson_demo" / "reference" / "lesson_demo.py"
# Another checkout beside this one (made by the batch fixture): the sandbox must hide it wherever REPO lives.
OTHER_CHECKOUT = REPO.parent / f".grader-other-checkout-{os.getpid()}"
LIMITS = Limits(wall_timeout_s=10, cpu_timeout_s=5, memory_mb=2048, max_processes=32, max_file_mb=8, max_output_kb=64,
                scratch_mb=64)
PROBES = [("add", "add", {"args": [2, 3]}), ("value", "value", {})]
ADD = "def add(a, b):\n    return a + b"


def nb(*cells: str, tags: dict[int, list[str]] | None = None) -> bytes:
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_markdown_cell("# A notebook")]
    for i, src in enumerate(cells):
        cell = nbformat.v4.new_code_cell(src)
        cell.metadata["tags"] = (tags or {}).get(i, [])
        notebook.cells.append(cell)
    return nbformat.writes(notebook).encode()


HONEST = nb("%time import torch\nimport numpy as np", ADD, "def value():\n    return np.arange(3.0)")
FORGED_FRAME = "import os, struct\nfrom autograder import wire\n" \
    "msg = wire.encode({'t': 'out', 'key': 'add', 'value': {'value': 999}})\n" \
    "os.write(1, struct.pack('>Q', len(msg)) + msg)\nprint(msg.decode())"
FRAME = "import os, struct\nfrom autograder import wire\n" \
    "def frame(msg):\n    data = wire.encode(msg)\n    os.write(3, struct.pack('>Q', len(data)) + data)"
OUT_999 = "frame({'t': 'out', 'key': 'add', 'value': {'value': 999}, 'oom': False, 'tamper': []})"
VALUE = "def value():\n    return 1"
ABSURD = b'{"t":"out","key":"add","oom":false,"tamper":[],' \
    b'"value":{"__ndarray__":"","dtype":"<f8","shape":[0,4611686018427387904,4611686018427387904]}}'
CASES = {
    "honest": HONEST,
    "syntax_error": nb("def broken(:\n    pass", ADD),
    "not_json": b"this is not { json",
    "empty": b"",
    "json_not_notebook": b'{"hello": [1, 2, 3]}',
    "pickle": pickle.dumps({"cells": []}),
    "missing_function": nb("x = 1"),
    "nan": nb("import numpy as np", "def add(a, b):\n    return float('nan')",
              "def value():\n    return np.array([np.nan, np.inf, -np.inf, 1.0])"),
    "infinite_loop": nb(ADD, "while True:\n    pass"),
    "sleep_forever": nb(ADD, "import time\ntime.sleep(10_000)"),
    "alloc_50gb_numpy": nb("import numpy as np\nbig = np.ones(50 * 2**30 // 8)", ADD),
    "alloc_50gb_torch": nb("import torch\nbig = torch.ones(50 * 2**30, dtype=torch.uint8)", ADD),
    "fork_bomb": nb("import os\nwhile True:\n    os.fork()", ADD),
    "fork_sleepers": nb("import os, time\nwhile True:\n    if not os.fork():\n        time.sleep(999)", ADD),
    "sys_exit": nb(ADD, "import sys\nsys.exit(0)", "def value():\n    return 1"),
    "os_exit": nb(ADD, "import os\nos._exit(0)", "def value():\n    return 1"),
    "exit_builtin": nb(ADD, "exit()", "def value():\n    return 1"),
    "print_100mb": nb("print('x' * 100_000_000)", ADD),
    "forged_frame": nb(FORGED_FRAME, ADD),
    "forged_out_in_cells": nb(FRAME, OUT_999, ADD, VALUE),
    "forged_second_answer": nb(FRAME, f"def add(a, b):\n    {OUT_999}\n    return a + b", VALUE),
    "note_in_probe_phase": nb(FRAME, "def add(a, b):\n    frame({'t': 'note', 'text': 'all good'})\n"
                              "    return a + b", VALUE),
    "cells_done_early": nb(FRAME, "frame({'t': 'cells_done'})", ADD, VALUE),
    "garbage_frame": nb("import os\nos.write(3, b'\\xff' * 64)", ADD, VALUE),
    "absurd_array_frame": nb(f"import os, struct\nDATA = {ABSURD!r}",
                             "def add(a, b):\n    os.write(3, struct.pack('>Q', len(DATA)) + DATA)\n"
                             "    return a + b", VALUE),
    "socket": nb("import socket\ndef value():\n    try:\n        socket.create_connection(('1.1.1.1', 80), "
                 "timeout=3)\n    except OSError as exc:\n        return 'blocked: ' + type(exc).__name__\n"
                 "    return 'connected'"),
    "write_outside": nb("import os\ndef value():\n    ok = []\n"
                        f"    for p in ['/etc/evil', '/usr/evil', '/tmp/evil', {str(REPO / 'evil')!r}, "
                        f"{str(Path.home() / 'evil')!r}]:\n"
                        "        try:\n            open(p, 'w').write('x')\n            ok.append(p)\n"
                        "        except OSError:\n            pass\n"
                        "    open('scratch.txt', 'w').write('x')\n"
                        "    return {'outside': ok, 'cwd': os.getcwd(),\n"
                        "            'scratch': os.path.exists('scratch.txt')}"),
    "read_reference": nb(f"import os\nREF = {str(REFERENCE)!r}\n"
                         "try:\n    print(open(REF).read())\nexcept OSError as exc:\n    print('no', exc)",
                         f"def value():\n    repo, other = {str(REPO)!r}, {str(OTHER_CHECKOUT)!r}\n"
                         "    ls = lambda p: os.listdir(p) if os.path.isdir(p) else []\n"
                         "    return [os.path.exists(REF), ls(repo), ls(os.path.dirname(repo)),\n"
                         "            os.path.exists(os.path.join(other, 'reference', 'lesson_demo.py')), ls(other)]"),
    "patch_np_allclose": nb("import numpy as np\nnp.allclose = lambda *a, **k: True", ADD),
    "patch_np_testing": nb("import numpy as np\nnp.testing.assert_allclose = lambda *a, **k: None", ADD),
    "patch_torch_allclose": nb("import torch\ntorch.allclose = lambda *a, **k: True", ADD),
    "patch_torch_testing": nb("import torch\ntorch.testing.assert_close = lambda *a, **k: None", ADD),
    "patch_math_isclose": nb("import math\nmath.isclose = lambda *a, **k: True", ADD),
    "patch_operator": nb("import operator\noperator.eq = lambda a, b: True", ADD),
    "patch_tensor_numpy": nb("import torch\ntorch.Tensor.numpy = lambda self: None", ADD),
    "patch_builtins": nb("import builtins\nbuiltins.isinstance = lambda *a: True", ADD),
    # the builtins the guard's own check could run with, rebound before a patch it must still see: in a cell, and
    # inside a probe (the student's function does it when called)
    "patch_guard_builtins": nb("import builtins, numpy as np\nbuiltins.all = lambda it: True\n"
                               "builtins.any = lambda it: False\nbuiltins.map = lambda f, *its: iter(())\n"
                               "np.allclose = lambda *a, **k: True", ADD),
    "patch_guard_helper": nb("import sys, numpy as np\nguard = sys.modules['autograder.sandbox.guard']\n"
                             "guard._unchanged = lambda *a, **k: True\nnp.allclose = lambda *a, **k: True", ADD),
    "patch_guard_builtins_in_probe": nb("import builtins, numpy as np\n"
                                        "def add(a, b):\n    builtins.all = lambda it: True\n"
                                        "    builtins.any = lambda it: False\n"
                                        "    np.allclose = lambda *a, **k: True\n    return a + b"),
    "patch_probe_module": nb("import fake_checks\nfake_checks.run_probe.__code__ = "
                             "(lambda env, name, args: {'value': 999}).__code__", ADD),
    "always_equal": nb("class Same:\n    def __eq__(self, other):\n        return True",
                       "class Int(int):\n    def __eq__(self, other):\n        return True",
                       "def add(a, b):\n    return Int(5)",
                       "def value():\n    return [Same(), {'x': Same()}]"),
    "skipped_cell": nb(ADD, "while True:\n    pass", tags={1: ["long-running"]}),
}


@pytest.fixture(scope="module")
def fake_checks(tmp_path_factory: pytest.TempPathFactory) -> str:
    with importable(tmp_path_factory, "fake_checks", CALL_CHECKS) as module:
        yield module


@pytest.fixture(scope="module")
def batch(fake_checks: str) -> Iterator[tuple[dict[str, ExecResult], ExecResult, str]]:
    """Every case through one two-worker pool at once, then an honest notebook on the same pool."""
    (OTHER_CHECKOUT / "reference").mkdir(parents=True, exist_ok=True)
    (OTHER_CHECKOUT / "reference" / "lesson_demo.py").write_text("# another checkout\n")
    try:
        with WorkerPool(2, limits=LIMITS, probe_module=fake_checks) as pool:
            cases = dict(CASES)
            if pool.sandbox != "bwrap" and not pool.drops_privileges:
                del cases["fork_bomb"], cases["fork_sleepers"]  # root without a uid to drop to: no RLIMIT_NPROC
            results = dict(pool.run_many(cases.items(), probes=PROBES))
            after = pool.run(HONEST, probes=PROBES)
    finally:
        shutil.rmtree(OTHER_CHECKOUT, ignore_errors=True)
    yield results, after, pool.sandbox


def result(batch: tuple[dict[str, ExecResult], ExecResult, str], case: str) -> ExecResult:
    results = batch[0]
    if case not in results:
        pytest.skip(f"{case} is not run without a process limit")
    return results[case]


def needs_bwrap(batch: tuple[dict[str, ExecResult], ExecResult, str]) -> None:
    if batch[2] != "bwrap":
        pytest.skip("network and file isolation need bubblewrap")


def value(res: ExecResult, key: str) -> object:
    out = res.outputs[key]
    assert "value" in out, out
    return out["value"]


@pytest.mark.sandbox
def test_every_case_gets_a_known_status(batch):
    results, _, _ = batch
    assert set(results) <= set(CASES)
    assert all(r.status in RUN_STATUSES for r in results.values())


@pytest.mark.sandbox
def test_honest_notebook_runs_and_pool_survives_the_rest(batch):
    results, after, _ = batch
    for res in (results["honest"], after):
        assert res.status == Status.GRADED, res.notes
        assert value(res, "add") == 5
        np.testing.assert_array_equal(value(res, "value"), np.arange(3.0))
        assert res.tampering == [] and res.skipped_cells == []
        assert "Wall time" in res.stdout  # the %time magic ran


@pytest.mark.sandbox
def test_syntax_error_is_a_note_and_later_cells_run(batch):
    res = result(batch, "syntax_error")
    assert res.status == Status.GRADED
    assert any("SyntaxError" in n for n in res.notes)
    assert value(res, "add") == 5


@pytest.mark.parametrize("case, words", [("not_json", "not valid JSON"), ("empty", "empty"),
                                         ("json_not_notebook", "without a list of cells"),
                                         ("pickle", "not UTF-8")])
@pytest.mark.sandbox
def test_unreadable_inputs(batch, case, words):
    res = result(batch, case)
    assert res.status == Status.UNREADABLE
    assert words in res.notes[0]
    assert res.outputs == {}


def test_read_notebook_reports_skipped_cells():
    cells, skipped = read_notebook(nb("a = 1", "b = 2", tags={1: ["milestone-train"]}))
    assert cells == [(1, "a = 1")] and skipped == [2]


@pytest.mark.sandbox
def test_missing_function_is_a_probe_error(batch):
    res = result(batch, "missing_function")
    assert res.status == Status.GRADED
    assert res.outputs["add"]["error"]["type"] == "NameError"


@pytest.mark.sandbox
def test_nan_output_round_trips(batch):
    res = result(batch, "nan")
    assert res.status == Status.GRADED
    assert math.isnan(value(res, "add"))
    arr = value(res, "value")
    assert arr.dtype == np.float64 and np.isnan(arr[0]) and arr[1] == np.inf and arr[2] == -np.inf


@pytest.mark.parametrize("case, limit", [("infinite_loop", "CPU-time"), ("sleep_forever", "wall-clock")])
@pytest.mark.sandbox
def test_endless_cells_time_out(batch, case, limit):
    res = result(batch, case)
    assert res.status == Status.TIMED_OUT
    assert any(limit in n and "cell 2" in n for n in res.notes), res.notes
    assert res.student_notes and "cell 2" in res.student_notes[0]
    # the probes still run on what the cells before it define
    assert value(res, "add") == 5 and "error" in res.outputs["value"] and res.stopped_cells == [2]


@pytest.mark.parametrize("case", ["alloc_50gb_numpy", "alloc_50gb_torch"])
@pytest.mark.sandbox
def test_allocating_50_gb_is_out_of_memory(batch, case):
    res = result(batch, case)
    assert res.status == Status.OUT_OF_MEMORY, res.notes
    assert value(res, "add") == 5


@pytest.mark.parametrize("case", ["fork_bomb", "fork_sleepers"])
@pytest.mark.sandbox
def test_fork_bombs_hit_the_process_limit(batch, case):
    res = result(batch, case)
    assert res.status == Status.GRADED, res.notes
    assert any("BlockingIOError" in n for n in res.notes), res.notes
    assert value(res, "add") == 5


@pytest.mark.parametrize("case, words", [("sys_exit", "sys.exit(0)"), ("os_exit", "exited with code 0"),
                                         ("exit_builtin", "exit()")])
@pytest.mark.sandbox
def test_exiting_cells_crash_and_earn_nothing(batch, case, words):
    res = result(batch, case)
    assert res.status == Status.CRASHED
    assert any(words in n and "cell 2" in n for n in res.notes), res.notes
    assert res.outputs == {}


@pytest.mark.sandbox
def test_printing_100_mb_is_capped(batch):
    res = result(batch, "print_100mb")
    assert res.status == Status.GRADED
    assert len(res.stdout.encode()) <= LIMITS.max_output_kb * 1024
    assert any("output truncated" in n for n in res.notes)
    assert value(res, "add") == 5


@pytest.mark.sandbox
def test_printed_frames_cannot_forge_results(batch):
    res = result(batch, "forged_frame")
    assert res.status == Status.GRADED
    assert value(res, "add") == 5


@pytest.mark.sandbox
def test_socket_has_no_network(batch):
    needs_bwrap(batch)
    res = result(batch, "socket")
    assert str(value(res, "value")).startswith("blocked")


@pytest.mark.sandbox
def test_writes_outside_scratch_fail(batch):
    needs_bwrap(batch)
    got = value(result(batch, "write_outside"), "value")
    assert got["outside"] == []
    assert got["scratch"] is True and got["cwd"].startswith("/tmp/scratch/")


@pytest.mark.sandbox
def test_reference_and_repository_are_not_visible(batch):
    needs_bwrap(batch)
    res = result(batch, "read_reference")
    exists, listing, around, other_exists, other_listing = value(res, "value")
    assert exists is False and not {"reference", "tests", "autograder"} & set(listing)
    # Nothing of the folder around this checkout (not its name, nor a checkout beside it) is visible,
    # wherever the checkout and its virtual environment live.
    assert REPO.name not in around and OTHER_CHECKOUT.name not in around
    assert other_exists is False and other_listing == []
    source = REFERENCE.read_text()
    assert source.splitlines()[0] not in res.stdout


@pytest.mark.parametrize("case, fact", [
    ("patch_np_allclose", "numpy.allclose"), ("patch_np_testing", "numpy.testing.assert_allclose"),
    ("patch_torch_allclose", "torch.allclose"), ("patch_torch_testing", "torch.testing.assert_close"),
    ("patch_builtins", "builtins.isinstance"),
    ("patch_math_isclose", "math.isclose"), ("patch_operator", "operator.eq"),
    ("patch_tensor_numpy", "torch.Tensor.numpy"), ("patch_guard_builtins", "builtins.all"),
    ("patch_guard_builtins", "numpy.allclose"), ("patch_guard_builtins_in_probe", "builtins.all"),
    ("patch_guard_builtins_in_probe", "numpy.allclose"), ("patch_guard_helper", "numpy.allclose"),
    ("patch_guard_helper", "guard._unchanged"),
])
@pytest.mark.sandbox
def test_monkeypatching_is_reported_and_undone(batch, case, fact):
    res = result(batch, case)
    assert res.status == Status.TAMPERING
    assert any(fact in f for f in res.tampering), res.tampering
    assert value(res, "add") == 5


@pytest.mark.sandbox
def test_a_code_write_to_the_probe_module_is_refused_by_the_tripwire(batch):
    """Before the guard could see it: the write raises in the cell and is recorded for the grader (its cell, line)."""
    res = result(batch, "patch_probe_module")
    assert value(res, "add") == 5 and not res.tampering
    assert [(r["event"], r["cell"], r["line"]) for r in res.tripwire] == [("object.__setattr__", 1, 2)], res.tripwire


@pytest.mark.sandbox
def test_objects_with_their_own_eq_arrive_as_strings(batch):
    res = result(batch, "always_equal")
    assert res.status == Status.GRADED
    assert type(value(res, "add")) is str
    same, nested = value(res, "value")
    assert type(same) is str and same.startswith("<not plain data") and type(nested["x"]) is str


@pytest.mark.sandbox
def test_skipped_cells_are_reported(batch):
    res = result(batch, "skipped_cell")
    assert res.status == Status.GRADED
    assert res.skipped_cells == [2]
    assert value(res, "add") == 5


@pytest.mark.sandbox
def test_one_off_and_batch_entry_points(fake_checks):
    def run(source: bytes) -> ExecResult:
        return execute_submission(source, probes=PROBES, limits=LIMITS, probe_module=fake_checks)

    res = run(HONEST)
    assert res.status == Status.GRADED and value(res, "add") == 5
    if res.sandbox == "bwrap":  # the same warm worker: nothing left behind reaches the next submission
        assert run(nb("import os\nopen('/dev/shm/leak', 'w').write('x')\nopen('leak', 'w').write('x')\n"
                      "os.mkdir('dir')\nos.chmod('dir', 0)")).status == Status.GRADED
        res = run(nb("import os\ndef value():\n"
                     "    return [os.listdir('/dev/shm'), os.listdir('..'), os.listdir()]"))
        shm, scratch_root, cwd = value(res, "value")
        assert shm == [] and len(scratch_root) == 1 and cwd == []
    items = [("a", HONEST), ("b", b"")]
    got = dict(execute_batch(items, probes=PROBES, limits=LIMITS, probe_module=fake_checks, workers=1))
    assert got["a"].status == Status.GRADED and got["b"].status == Status.UNREADABLE


@pytest.mark.sandbox
def test_fallback_without_sandbox_still_runs(fake_checks):
    with WorkerPool(1, limits=LIMITS, probe_module=fake_checks, sandbox="none", allow_unsandboxed=True) as pool:
        res = pool.run(HONEST, probes=PROBES)  # allowed: this checkout's Python may be closed to other users
        assert pool.sandbox == "none"
    assert res.status == Status.GRADED and value(res, "add") == 5


@pytest.mark.parametrize("obj, expected", [
    (None, None), (True, True), (-2**70, -2**70), (1.5, 1.5), ("naïve \udc80", "naïve \udc80"),
    ((1, [2, {"a": 3}]), [1, [2, {"a": 3}]]), ({"x": (1, 2)}, {"x": [1, 2]}),
])
def test_wire_round_trips_plain_data(obj, expected):
    back = wire.decode(wire.encode(obj))
    assert back == expected and type(back) is type(expected)


@pytest.mark.parametrize("arr", [
    np.arange(6, dtype=np.int32).reshape(2, 3), np.array([True, False]), np.zeros((0, 4)),
    np.array(2.5, dtype=np.float32), np.array([1 + 2j]), np.arange(4.0)[::2], np.arange(3, dtype=">u2"),
])
def test_wire_round_trips_arrays(arr):
    back = wire.decode(wire.encode(arr))
    shape = arr.shape or (1,)  # a 0-d array travels as one value, as the case JSON stores it (array_plain)
    assert back.dtype == arr.dtype and back.shape == shape and np.array_equal(back.reshape(arr.shape), arr)
    assert back.flags.writeable


def test_wire_keeps_non_finite_floats():
    back = wire.decode(wire.encode([math.nan, math.inf, -math.inf, np.array([np.nan])]))
    assert math.isnan(back[0]) and back[1:3] == [math.inf, -math.inf] and np.isnan(back[3][0])


@pytest.mark.parametrize("obj", [object(), np.array([object()]), {1: 2}, {"__x": 1}, b"x", np.float64(1.0)])
def test_wire_refuses_what_is_not_plain(obj):
    with pytest.raises(wire.WireError):
        wire.encode(obj)


@pytest.mark.parametrize("data", [
    b'{"__ndarray__": "AAAA", "dtype": "|O8", "shape": [1]}',
    b'{"__ndarray__": "AAAAAAAAAAA=", "dtype": "|V8", "shape": [1]}',
    b'{"__ndarray__": "AAAAAAAAAAA=", "dtype": "<f8", "shape": [2]}',
    b'{"__ndarray__": "AA==", "dtype": "|b1", "shape": [1], "extra": 1}',
    b'{"__ndarray__": "Ag==", "dtype": "|b1", "shape": [1]}',
    b'{"__pickle__": "gASVAAAAAAAAAAA="}',
    b'{"a": 1, "a": 2}',
    pickle.dumps([1, 2]),
    b"[" * 100_000,
])
def test_wire_decoding_is_strict(data):
    with pytest.raises(wire.WireError):
        wire.decode(data)


def test_wire_caps_size():
    with pytest.raises(wire.WireError):
        wire.encode("x" * 100, max_bytes=50)
    with pytest.raises(wire.WireError):
        wire.decode(wire.encode("x" * 100), max_bytes=50)


def test_sanitize_makes_student_values_safe():
    class Same:
        def __eq__(self, other):
            return True

    plain = wire.sanitize({"a": Same(), "b": (np.float64(1.5), np.bool_(True)), "c": np.array([1])})
    assert type(plain["a"]) is str and plain["b"] == [1.5, True] and type(plain["b"][0]) is float
    wire.encode(plain)


# --------------------------------------------------------------------------- protocol, isolation, limits

@pytest.mark.parametrize("case, silenced, kept", [
    ("forged_out_in_cells", ["add"], ["value"]),
    ("forged_second_answer", ["add"], []),
    ("note_in_probe_phase", ["add"], ["value"]),
    ("cells_done_early", [], []),
    ("garbage_frame", ["add", "value"], []),
    ("absurd_array_frame", ["add", "value"], []),
])
@pytest.mark.sandbox
def test_frames_out_of_protocol_earn_nothing_and_are_flagged(batch, case, silenced, kept):
    res = result(batch, case)
    assert res.status == Status.TAMPERING, res.notes
    assert any("forged or out-of-order result frame" in f for f in res.tampering), res.tampering
    assert not set(silenced) & set(res.outputs), res.outputs
    for key in kept:  # the channel still works: later probes run
        assert "value" in res.outputs[key]


@pytest.fixture(scope="module")
def one_worker(fake_checks: str) -> Iterator[WorkerPool]:
    # the layers beneath the tripwire, on their own: these notebooks reach with ctypes and gc (test_tripwire.py)
    with WorkerPool(1, limits=LIMITS, probe_module=fake_checks, tripwire=False) as pool:
        yield pool


# Marker halves: the marker itself is written only by submission A; B searches for the halves one after
# the other in its own memory (process_vm_readv on itself), so B never holds the marker.
MARK_1, MARK_2 = "grader-leak-", "7f3a9c51e2d4b608"
SCAN = f'''
import ctypes, os, re
H1, H2 = {MARK_1.encode()!r}, {MARK_2.encode()!r}
class IOV(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.process_vm_readv.restype = ctypes.c_ssize_t
def scan():
    buf, step, hits, pat = ctypes.create_string_buffer(1 << 20), 1 << 20, 0, re.compile(re.escape(H1))
    local, remote = IOV(ctypes.addressof(buf), 0), IOV(0, 0)
    for line in open("/proc/self/maps").read().splitlines():
        parts = line.split()
        if not parts[1].startswith("rw") or (len(parts) > 5 and parts[5].startswith("[v")):  # data lives in rw
            continue
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        addr = lo
        while addr < hi:
            n = min(step, hi - addr)
            local.len, remote.base, remote.len = n, addr, n
            got = LIBC.process_vm_readv(os.getpid(), ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
            view = memoryview(buf)[: max(got, 0)]
            for m in pat.finditer(view):
                if buf[m.end(): m.end() + len(H2)] == H2:
                    hits += 1
            addr += n - 64 if n == step else n
    return hits
'''


@pytest.mark.sandbox
def test_nothing_of_one_submission_is_in_the_memory_of_the_next(one_worker):
    secret = MARK_1 + MARK_2
    plant = nb(SCAN, f"SECRET = {secret!r}\nprint(SECRET)", "def add(a, b):\n    return scan()",
               "def value():\n    return SECRET")
    first = one_worker.run(plant, probes=PROBES)
    assert first.status == Status.GRADED, first.notes
    assert value(first, "add") > 0 and value(first, "value") == secret  # the scan finds what is there
    second = one_worker.run(nb(SCAN, "def value():\n    return scan()"), probes=PROBES)
    assert second.status == Status.GRADED, second.notes
    assert value(second, "value") == 0


SHM = '''
import ctypes
LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.shmat.restype = ctypes.c_void_p
KEY = 0x4C383353
'''


@pytest.mark.sandbox
def test_system_v_shared_memory_does_not_survive_a_submission(one_worker):
    write = nb(SHM, "def value():\n    sid = LIBC.shmget(KEY, 4096, 0o1666)\n"
                    "    addr = LIBC.shmat(sid, None, 0)\n    ctypes.memmove(addr, b'left for the next one', 21)\n"
                    "    return sid")
    read = nb(SHM, "def value():\n    sid = LIBC.shmget(KEY, 0, 0)\n    if sid < 0:\n        return ''\n"
                   "    addr = LIBC.shmat(sid, None, 0)\n    return ctypes.string_at(addr, 21).decode()")
    first = one_worker.run(write, probes=PROBES)
    assert value(first, "value") >= 0, first.outputs
    assert value(one_worker.run(read, probes=PROBES), "value") == ""


@pytest.mark.sandbox
def test_hidden_probes_reach_the_child_only_after_every_public_one(one_worker):
    source = nb("import select\nLOG = []",
                "def hidden():\n    LOG.append('hidden')\n    return list(LOG)",
                "def add(a, b):\n    LOG.append('add')\n    waiting = select.select([3], [], [], 0.3)[0]\n"
                "    return [list(LOG), bool(waiting)]",
                "def value():\n    LOG.append('value')\n    return list(LOG)")
    probes = [("secret", "hidden", {}, True), *PROBES]
    res = one_worker.run(source, probes=probes)
    assert res.status == Status.GRADED, res.notes
    assert value(res, "add") == [["add"], False]  # nothing else was sent while a probe ran
    assert value(res, "value") == ["add", "value"]
    assert value(res, "secret") == ["add", "value", "hidden"]


SEEN = ("import gc\nMARK = '-'.join(['hidden', 'argument', '4b1d'])\n"
        "def seen(*_):\n    return sum(1 for o in gc.get_objects() if type(o) in (list, tuple, dict)\n"
        "               for v in (o.values() if type(o) is dict else o)\n"
        "               if type(v) is str and v == MARK and v is not MARK)\n"
        "add = lambda a, b: seen()\nvalue = hidden = seen")


@pytest.mark.sandbox
def test_no_hidden_argument_is_in_the_child_while_public_outputs_are_computed(one_worker):
    res = one_worker.run(nb(SEEN), probes=[("secret", "hidden", {"args": ["hidden-argument-4b1d"]}, True), *PROBES])
    assert res.status == Status.GRADED, res.notes
    assert value(res, "secret") > 0  # the scan finds the hidden argument once it has been sent
    assert value(res, "add") == 0 and value(res, "value") == 0


@pytest.mark.sandbox
def test_a_zygote_killed_from_outside_is_restarted_and_the_submission_retried(one_worker):
    honest = nb("import time\ntime.sleep(1.5)", ADD, "import numpy as np\ndef value():\n    return np.arange(3.0)")
    got: list[ExecResult] = []
    thread = threading.Thread(target=lambda: got.append(one_worker.run(honest, probes=PROBES)))
    pid = one_worker.worker_pids()[0]
    thread.start()
    time.sleep(0.7)
    os.kill(pid, signal.SIGKILL)
    thread.join()
    assert got[0].status == Status.GRADED, got[0].notes
    assert value(got[0], "add") == 5
    assert one_worker.worker_pids()[0] != pid


@pytest.mark.sandbox
def test_a_worker_failing_twice_is_a_crash_and_none_at_all_is_an_error(one_worker):
    worker = one_worker._workers[0]

    def fail(*args: object) -> None:
        raise WorkerError("cannot send the job: too many open files")

    worker.run = fail
    try:
        res = one_worker.run(HONEST, probes=PROBES)
    finally:
        del worker.run
    assert res.status == Status.CRASHED and "failed twice" in res.notes[0], res.notes
    worker.kill()
    worker.start = lambda: "no sandbox can start here"
    try:
        with pytest.raises(WorkerError):
            one_worker.run(HONEST, probes=PROBES)
    finally:
        del worker.start
    assert one_worker.run(HONEST, probes=PROBES).status == Status.GRADED


FORK_THREE = nb("import os, time\nkids = []\nfor _ in range(3):\n    pid = os.fork()\n    if pid == 0:\n"
                "        block = b'x' * (250 * 2**20)\n        time.sleep(8)\n        os._exit(0)\n"
                "    kids.append(pid)\nfor pid in kids:\n    os.waitpid(pid, 0)", ADD)


@pytest.mark.parametrize("guard", ["cgroup", "watchdog"])
@pytest.mark.sandbox
def test_memory_is_limited_for_the_submission_as_a_whole(fake_checks, guard):
    limits = Limits(wall_timeout_s=15, cpu_timeout_s=10, memory_mb=400, max_processes=32, max_file_mb=8,
                    max_output_kb=64, scratch_mb=64)
    try:
        pool = WorkerPool(1, limits=limits, probe_module=fake_checks, memory_guard=guard)
    except WorkerError as exc:
        pytest.skip(f"no {guard} here: {exc}")
    with pool:
        res = pool.run(FORK_THREE, probes=PROBES)
        honest = pool.run(HONEST, probes=PROBES)
    assert res.memory_guard == guard
    assert res.status == Status.OUT_OF_MEMORY, res.notes
    assert any("as a whole" in n and guard in n for n in res.notes), res.notes
    assert honest.status == Status.GRADED and value(honest, "add") == 5


# The zygote lives in its worker's cgroups, so that every child is born there (a move per job cost ~10 ms).
COUNT_FORKS = nb("import os, time\nkids = []\nfor _ in range(40):\n    try:\n        pid = os.fork()\n"
                 "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(5)\n        os._exit(0)\n"
                 "    kids.append(pid)\nstarted = len(kids)\nfor pid in kids:\n    os.kill(pid, 9)\n"
                 "    os.waitpid(pid, 0)\ndef value():\n    return started", ADD)
# A submission that makes its processes look smaller than the zygote to the kernel's OOM killer: it undoes the
# child's oom_score_adj of 1000 (dumpable again, its /proc files are its own) and spreads its memory thinly.
SHRINK_AND_SPREAD = nb("import ctypes, os, time\nctypes.CDLL(None).prctl(4, 1, 0, 0, 0)\n"
                       "with open('/proc/self/oom_score_adj', 'w') as f:\n    f.write('0')\nkids = []\n"
                       "for _ in range(20):\n    pid = os.fork()\n    if pid == 0:\n"
                       "        block = b'x' * (25 * 2**20)\n        time.sleep(10)\n        os._exit(0)\n"
                       "    kids.append(pid)\nfor pid in kids:\n    os.waitpid(pid, 0)", ADD)


def cgroup_pool(fake_checks: str, limits: Limits) -> WorkerPool:
    try:
        return WorkerPool(1, limits=limits, probe_module=fake_checks, memory_guard="cgroup", tripwire=False)
    except WorkerError as exc:
        pytest.skip(f"no cgroup here: {exc}")


@pytest.mark.sandbox
def test_a_submission_is_born_in_its_workers_cgroups_with_its_whole_process_budget(fake_checks):
    limits = Limits(wall_timeout_s=15, cpu_timeout_s=10, memory_mb=2048, max_processes=8, max_file_mb=8,
                    max_output_kb=64, scratch_mb=64)
    with cgroup_pool(fake_checks, limits) as pool:
        groups = pool._workers[0].cgroups
        members = {name: (Path(folder) / "cgroup.procs").read_text().split() for name, folder in groups.items()}
        zygote = str(pool.worker_pids()[0])
        res = pool.run(COUNT_FORKS, probes=PROBES)
    assert all(members[name] == [zygote] for name in ("memory", "pids")), members
    assert res.status == Status.GRADED, res.notes
    assert value(res, "value") == limits.max_processes  # the zygote's own tasks do not count against the submission


@pytest.mark.sandbox
def test_a_zygote_the_kernel_kills_for_memory_is_the_submissions_memory_limit(fake_checks):
    limits = Limits(wall_timeout_s=20, cpu_timeout_s=10, memory_mb=400, max_processes=32, max_file_mb=8,
                    max_output_kb=64, scratch_mb=64)
    with cgroup_pool(fake_checks, limits) as pool:
        zygote = pool.worker_pids()[0]
        res = pool.run(SHRINK_AND_SPREAD, probes=PROBES)
        honest = pool.run(HONEST, probes=PROBES)
        restarted = pool.worker_pids()[0] != zygote
    # not a crash after a retry on a fresh worker (where the zygote is chosen again), but the memory limit
    assert res.status == Status.OUT_OF_MEMORY, res.notes
    assert any("as a whole" in n and "cgroup" in n for n in res.notes), res.notes
    assert restarted  # the kernel chose the zygote, as the submission meant it to (else this tests nothing)
    assert honest.status == Status.GRADED and value(honest, "add") == 5


# --------------------------------------------------------------------------- a probe on the engine's runtime

# A lesson's probe as a checks module writes one: it returns the student's output through the runtime's as_array,
# which refuses anything but plain arrays, tensors and numbers and records the rest in SUSPICIOUS for the child.
ARRAY_CHECKS = f"""
from {RUNTIME_NAME} import *  # noqa: F403
from {RUNTIME_NAME} import as_array, defined, probe


@probe
def call(env, fn, args):
    return {{"value": as_array(defined(env, fn)(*args), fn)}}
"""
TABLES = {
    "plain_tensor": "import torch\ndef table(n, d):\n    return torch.zeros(n, d)",
    "parameter": "import torch\ndef table(n, d):\n    return torch.nn.Parameter(torch.zeros(n, d))",
    "tensor_subclass": "import torch\nclass T(torch.Tensor):\n    def numpy(self):\n        return None\n"
                       "def table(n, d):\n    return torch.zeros(n, d).as_subclass(T)",
    "array_like": "import numpy as np\nclass A:\n    def __array__(self, dtype=None, copy=None):\n"
                  "        return np.zeros((6, 4))\ndef table(n, d):\n    return A()",
}


@pytest.fixture(scope="module")
def runtime_probes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ExecResult]:
    """Each table notebook probed by a checks module on the runtime, shipped as a lesson's modules are."""
    path = tmp_path_factory.mktemp("array_checks") / "array_checks.py"
    path.write_text(ARRAY_CHECKS)
    modules = {**runtime_for(path), "array_checks": path}
    probes = [("table", "call", {"fn": "table", "args": [6, 4]})]
    with WorkerPool(1, limits=LIMITS, probe_module="array_checks", modules=modules) as pool:
        return dict(pool.run_many(((k, nb(src)) for k, src in TABLES.items()), probes=probes))


@pytest.mark.parametrize("case", ["plain_tensor", "parameter"])
@pytest.mark.sandbox
def test_plain_tensors_and_parameters_are_honest(runtime_probes, case):
    res = runtime_probes[case]
    assert res.status == Status.GRADED and res.tampering == [], (res.notes, res.tampering)
    assert value(res, "table").shape == (6, 4)


@pytest.mark.parametrize("case", ["tensor_subclass", "array_like"])
@pytest.mark.sandbox
def test_outputs_posing_as_arrays_earn_nothing_and_are_flagged(runtime_probes, case):
    res = runtime_probes[case]
    assert res.status == Status.TAMPERING, res.notes
    assert any("suspicious probe output" in f for f in res.tampering), res.tampering
    assert "error" in res.outputs["table"]


@pytest.mark.parametrize("data", [
    b'{"__ndarray__": "", "dtype": "<f8", "shape": [0, 4611686018427387904, 4611686018427387904]}',
    b'{"__ndarray__": "", "dtype": "<f8", "shape": [0, 99999999999999999999999]}',
    b'{"__ndarray__": "AAAAAAAAAAA=", "dtype": "<f8", "shape": [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,'
    b' 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]}',
    b'{"__ndarray__": "AAAAAAAAAAA=", "dtype": "<f8", "shape": [-1]}',
])
def test_wire_refuses_absurd_array_shapes(data):
    with pytest.raises(wire.WireError):
        wire.decode(data)
