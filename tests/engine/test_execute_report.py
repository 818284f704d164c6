"""What the child reports cannot be rewritten from inside it, and nothing of one job reaches the next.

Each attack here gained points or went unflagged before the fix (issue #20): a torch mode left active after the last
cell, a POSIX message queue left for the next job, and a re-run after the per-cell limit that finds what the killed
attempt left. A probe module of the tests' own (no lesson); the attacks on Lesson 83's storage probes (a patched JSON
encoder, the guard found with gc, a class that lies about its storage) are in tests/lesson83/test_execute_lesson83.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import nbformat
import pytest

from autograder.model import Status
from autograder.sandbox import ExecResult, Limits, WorkerPool
from helpers.celltime import FAKE_CHECKS  # a checks module whose probe calls a function by name
from helpers.probes import importable

pytestmark = pytest.mark.sandbox  # the tiers are in pyproject.toml

LIMITS = Limits(wall_timeout_s=20, cpu_timeout_s=15, memory_mb=2048, max_processes=32, max_file_mb=8,
                max_output_kb=64, scratch_mb=64)


def nb(*cells: str) -> bytes:
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_markdown_cell("# A notebook"), *map(nbformat.v4.new_code_cell, cells)]
    return nbformat.writes(notebook).encode()


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
NAME = b"/grader-q8-answers"

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
LEFT = "/dev/shm/grader-left-by-a-killed-run"


@pytest.fixture(scope="module")
def fake_checks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with importable(tmp_path_factory, "fake_checks_report", FAKE_CHECKS) as module:
        yield module


@pytest.fixture(scope="module")
def one_worker(fake_checks: str) -> Iterator[WorkerPool]:
    with WorkerPool(1, limits=dataclasses.replace(LIMITS, cell_timeout_s=3), probe_module=fake_checks,
                    tripwire=False) as pool:  # its notebooks call libc through ctypes
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
            "                                     ('environment', 'GRADER_LEFT' in os.environ)) if there]")
    leave = f"mq_write()\nopen({LEFT!r}, 'w').write('x')\nos.environ['GRADER_LEFT'] = '1'"
    res = one_worker.run(nb(MQ, look, leave, "while True:\n    pass", "def value():\n    return SEEN"),
                         probes=PROBES)
    assert res.stopped_cells == [4], res.notes  # the endless cell was stopped, the notebook run again without it
    # With no isolation at all (no bubblewrap, no uid to drop to) student code writes files as the grader's user,
    # which are not removed (they cannot be told from the grader's own): only the queue and environment are fresh.
    assert value(res) == ([] if res.isolation != "none" else [w for w in value(res) if w == "file"])
