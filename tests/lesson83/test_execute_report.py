"""What the child reports cannot be rewritten from inside it, and nothing of one job reaches the next.

Each attack here gained points or went unflagged before the fix (issue #20): a patched JSON encoder that strips the
tamper facts and rewrites answers, the guard found with gc and its record overwritten (or the guard switched off),
a module class that lies about its own storage, a torch mode left active after the last cell, a POSIX message
queue left for the next job, and a re-run after the per-cell limit that finds what the killed attempt left.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import nbformat
import pytest
from conftest import importable
from test_execute_celltime import FAKE_CHECKS  # a checks module whose probe calls a function by name

from autograder.lesson import default_lesson
from autograder.model import Status
from autograder.sandbox.limits import Limits
from autograder.sandbox.pool import WorkerPool
from autograder.sandbox.protocol import ExecResult

pytestmark = pytest.mark.sandbox  # the tiers are in pyproject.toml

checks = default_lesson().checks

LIMITS = Limits(wall_s=20, cpu_s=15, memory_mb=2048, processes=32, file_mb=8, output_kb=64, scratch_mb=64)
STORAGE = [("storage", "module_storage", {"cls": "SinusoidalPE", "args": [16, 8]})]
Q3 = [{"id": "q3_sinusoidal_module/pe_is_buffer", "check": "buffer_not_parameter"},
      {"id": "q3_sinusoidal_module/follows_to", "check": "follows_to"}]
PLAIN_TABLE = '''
import torch
from torch import nn

class SinusoidalPE(nn.Module):
    """The table kept as a plain attribute (not a buffer): Q3's storage cases must fail."""

    def __init__(self, d_model, max_len=512):
        super().__init__()
        self.pe = torch.zeros(max_len, d_model)
        PATCH()

    def forward(self, x):
        return x + self.pe[: x.shape[1]]
'''
NO_PATCH = "PATCH = lambda: None"
# (a) every frame passes through json.JSONEncoder.iterencode: strip the tamper facts, claim a buffer.
ENCODER = '''
import json
import numpy as np

_iterencode = json.JSONEncoder.iterencode

def lie(self, o, _one_shot=False):
    if type(o) is dict and "tamper" in o:
        o = dict(o, tamper=[])
        if type(o.get("value")) is dict and "buffers" in o["value"]:
            o["value"] = dict(o["value"], buffers=["pe"], state_dict=["pe"], pe_dtype_after_to="float64")
    return _iterencode(self, o, _one_shot)

def PATCH():
    json.JSONEncoder.iterencode = lie

PATCH()
np.allclose = lambda *a, **k: True
'''
# (b) the guard found with gc: its record of nn.Module's methods overwritten, then the methods patched.
NN_LIES = '''
import gc
from torch import nn


def named_buffers(self, prefix="", recurse=True, remove_duplicate=True):
    yield from ((k, v) for k, v in vars(self).items() if k == "pe")

def state_dict(self, *args, **kwargs):
    return {k: v for k, v in vars(self).items() if k == "pe"}

_apply0 = nn.Module._apply

def _apply(self, fn, recurse=True):
    _apply0(self, fn, recurse)
    if "pe" in vars(self):
        self.__dict__["pe"] = fn(self.__dict__["pe"])
    return self

FAKES = {"named_buffers": named_buffers, "state_dict": state_dict, "_apply": _apply}
GUARD = next(o for o in gc.get_objects() if type(o).__name__ == "_Guard")
'''
GC_RECORD = NN_LIES + '''
def PATCH():
    GUARD.attrs = [(o, a, n, FAKES[a] if o is nn.Module and a in FAKES else v) for o, a, n, v in GUARD.attrs]
    for k, f in FAKES.items():
        setattr(nn.Module, k, f)

PATCH()
'''
GC_OFF = NN_LIES + '''
import numpy as np

def PATCH():
    GUARD.sweep = lambda: []
    for k, f in FAKES.items():
        setattr(nn.Module, k, f)

PATCH()
np.allclose = lambda *a, **k: True
'''
GC_EMPTY = NN_LIES + '''
def PATCH():
    GUARD.attrs = []
    for k, f in FAKES.items():
        setattr(nn.Module, k, f)

PATCH()
'''
# The probes' own classes patched: the model cache told that any model is as built, the state-reading functions.
PROBE_CLASSES = NO_PATCH + '''
import lesson83_checks as c

c.ModelCache.build = lambda self, env, pos: None
c._State.same = lambda self, model: True
'''
# (c) a class that keeps its table as a plain attribute and says otherwise.
LYING_CLASS = '''
import torch
from torch import nn

class SinusoidalPE(nn.Module):
    def __init__(self, d_model, max_len=512):
        super().__init__()
        self.pe = torch.zeros(max_len, d_model)

    def named_buffers(self, prefix="", recurse=True, remove_duplicate=True):
        yield "pe", self.pe

    def buffers(self, recurse=True):
        yield self.pe

    def state_dict(self, *args, **kwargs):
        return {"pe": self.pe}

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        self.pe = fn(self.pe)
        return self

    def forward(self, x):
        return x + self.pe[: x.shape[1]]
'''


def nb(*cells: str) -> bytes:
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_markdown_cell("# Lesson 83"), *map(nbformat.v4.new_code_cell, cells)]
    return nbformat.writes(notebook).encode()


@pytest.fixture(scope="module")
def storage() -> dict[str, ExecResult]:
    cases = {"plain": nb(NO_PATCH, PLAIN_TABLE), "encoder": nb(ENCODER, PLAIN_TABLE),
             "gc_record": nb(GC_RECORD, PLAIN_TABLE), "gc_off": nb(GC_OFF, PLAIN_TABLE),
             "gc_empty": nb(GC_EMPTY, PLAIN_TABLE), "lying_class": nb(LYING_CLASS),
             "probe_classes": nb(PROBE_CLASSES, PLAIN_TABLE)}
    with WorkerPool(1, limits=LIMITS) as pool:
        return dict(pool.run_many(cases.items(), probes=STORAGE))


def q3_passed(res: ExecResult) -> list[str]:
    """The Q3 storage cases the output passes (a voided case, with no output, passes none)."""
    got = res.outputs.get("storage")
    if got is None:
        return []
    return [c["id"] for c in Q3 if checks.judge(c, got, {}).passed]


def test_a_plain_attribute_fails_the_storage_cases(storage):
    res = storage["plain"]
    assert res.status == Status.GRADED and res.tampering == [], (res.notes, res.tampering)
    assert res.outputs["storage"]["pe_type"] == "Tensor"  # the probe ran
    assert q3_passed(res) == []


def test_a_patched_json_encoder_neither_hides_tampering_nor_rewrites_answers(storage):
    res = storage["encoder"]
    assert res.status == Status.TAMPERING, res.notes
    assert any("numpy.allclose" in f for f in res.tampering), res.tampering
    assert any("JSONEncoder.iterencode" in f for f in res.tampering), res.tampering
    assert res.outputs["storage"]["buffers"] == [] and q3_passed(res) == []


def test_a_patched_class_of_the_probe_module_is_flagged(storage):
    res = storage["probe_classes"]
    assert res.status == Status.TAMPERING, res.notes
    assert any("ModelCache was changed" in f for f in res.tampering), res.tampering
    assert any("_State was changed" in f for f in res.tampering), res.tampering


@pytest.mark.parametrize("case", ["gc_record", "lying_class"])
def test_probes_read_module_state_from_nn_modules_own_tables(storage, case):
    res = storage[case]
    assert res.outputs["storage"]["pe_type"] == "Tensor", res.outputs
    assert q3_passed(res) == [], res.outputs


@pytest.mark.parametrize("case", ["gc_off", "gc_empty"])
def test_a_guard_switched_off_voids_the_case_and_is_flagged(storage, case):
    res = storage[case]
    assert res.status == Status.TAMPERING, res.notes
    assert any("check mark" in f for f in res.tampering), res.tampering
    assert "storage" not in res.outputs and q3_passed(res) == []


PROBES = [("value", "value", {})]
STACKS = "import torch\ndef value():\n    return [torch._C._len_torch_function_stack(), " \
         "torch._C._len_torch_dispatch_stack(), torch._C._is_torch_function_enabled()]"
MODES = {
    "function_mode": ("from torch.overrides import TorchFunctionMode\nclass Quiet(TorchFunctionMode):\n"
                      "    def __torch_function__(self, func, types, args=(), kwargs=None):\n"
                      "        return func(*args, **(kwargs or {}))\nQuiet().__enter__()", "TorchFunctionMode"),
    "dispatch_mode": ("from torch.utils._python_dispatch import TorchDispatchMode\nclass Quiet(TorchDispatchMode):\n"
                      "    def __torch_dispatch__(self, func, types, args=(), kwargs=None):\n"
                      "        return func(*args, **(kwargs or {}))\nQuiet().__enter__()", "TorchDispatchMode"),
    "disabled": ("import torch\ntorch._C.DisableTorchFunction().__enter__()", "DisableTorchFunction"),
}
MQ = '''
import ctypes, ctypes.util, os
RT = ctypes.CDLL(ctypes.util.find_library("rt") or None, use_errno=True)
NAME = b"/lesson83-q8-answers"

def mq_read():
    fd = RT.mq_open(NAME, os.O_RDONLY | os.O_NONBLOCK)
    if fd < 0:
        return ""
    buf = ctypes.create_string_buffer(1 << 16)
    n = RT.mq_receive(fd, buf, len(buf), None)
    return buf.raw[: max(n, 0)].decode() or "an empty queue"

def mq_write():
    fd = RT.mq_open(NAME, os.O_CREAT | os.O_RDWR | os.O_NONBLOCK, 0o666, None)
    if fd < 0:
        return -ctypes.get_errno()
    return RT.mq_send(fd, b"q8 answers C A C B D", 20, 0)
'''
LEFT = "/dev/shm/lesson83-left-by-a-killed-run"


@pytest.fixture(scope="module")
def fake_checks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with importable(tmp_path_factory, "fake_checks_report", FAKE_CHECKS) as module:
        yield module


@pytest.fixture(scope="module")
def one_worker(fake_checks: str) -> Iterator[WorkerPool]:
    with WorkerPool(1, limits=dataclasses.replace(LIMITS, cell_s=3), probe_module=fake_checks) as pool:
        yield pool


def value(res: ExecResult) -> object:
    assert "value" in res.outputs.get("value", {}), (res.status, res.notes, res.outputs)
    return res.outputs["value"]["value"]


@pytest.mark.parametrize("case", MODES)
def test_a_torch_mode_left_active_is_flagged_and_undone(one_worker, case):
    code, words = MODES[case]
    res = one_worker.run(nb(STACKS, code), probes=PROBES)
    assert res.status == Status.TAMPERING, res.notes
    assert any(words in f for f in res.tampering), res.tampering
    assert value(res) == [0, 0, True]  # the probes ran with torch as the zygote left it


def test_an_honest_notebook_reports_no_tampering(one_worker):
    res = one_worker.run(nb(STACKS, "import json, numpy as np\nx = json.dumps({'a': np.arange(3).tolist()})"),
                         probes=PROBES)
    assert res.status == Status.GRADED and res.tampering == [], (res.notes, res.tampering)
    assert value(res) == [0, 0, True]


def test_a_message_queue_does_not_reach_the_next_job(one_worker):
    first = one_worker.run(nb(MQ, "def value():\n    return [mq_write(), mq_read()]"), probes=PROBES)
    assert value(first) == [0, "q8 answers C A C B D"]  # the queue works within a job
    second = one_worker.run(nb(MQ, "def value():\n    return mq_read()"), probes=PROBES)
    assert value(second) == ""


def test_a_rerun_after_the_cell_limit_sees_nothing_of_the_killed_attempt(one_worker):
    look = (f"import os\nSEEN = [w for w, there in (('queue', mq_read()), ('file', os.path.exists({LEFT!r})),\n"
            "                                     ('environment', 'LESSON83_LEFT' in os.environ)) if there]")
    leave = f"mq_write()\nopen({LEFT!r}, 'w').write('x')\nos.environ['LESSON83_LEFT'] = '1'"
    res = one_worker.run(nb(MQ, look, leave, "while True:\n    pass", "def value():\n    return SEEN"),
                         probes=PROBES)
    assert res.stopped_cells == [4], res.notes  # the endless cell was stopped, the notebook run again without it
    # With no isolation at all (no bubblewrap, no uid to drop to) student code writes files as the grader's user,
    # which are not removed (they cannot be told from the grader's own): only the queue and environment are fresh.
    assert value(res) == ([] if res.isolation != "none" else [w for w in value(res) if w == "file"])
