"""The child's run-time tripwire (autograder/sandbox/tripwire.py): reach raised from student code is refused and
recorded with its cell and line, whatever name led there; the harness, IPython, torch and the standard library
doing their own work record nothing. The judge is tried on every interpreter at hand (no IPython needed: cells are
run as IPython runs them, code named as its cells, from a trusted frame); the plumbing through the real sandbox."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import nbformat
import pytest

from autograder.config import ROOT
from autograder.sandbox import ExecResult, Limits, WorkerPool
from helpers.probes import CALL_CHECKS, importable

# A driver run by each interpreter: it installs the tripwire with its own folder trusted (as the harness's is), then
# runs each cell as IPython does (code named `<ipython-input-N-...>`, run by exec from a trusted frame).
DRIVER = '''
import json, os, sys
sys.path.insert(0, sys.argv[1])
from autograder.sandbox.tripwire import install, trusted_roots
records = []
roots = trusted_roots(exclude=(os.getcwd(),)) + (os.path.join(os.path.dirname(os.path.abspath(__file__)), ""),)
enter = install(report=records.append, roots=roots)
out = {}
ns = {"__name__": "__main__"}
for i, src in json.loads(sys.stdin.read()):
    enter(i)
    try:
        exec(compile(src, f"<ipython-input-{i}-0123456789ab>", "exec"), ns)
        out[i] = "ok"
    except BaseException as exc:
        out[i] = f"{type(exc).__name__}: {exc}"
print(json.dumps({"records": records, "cells": out, "printed": ns.get("printed", [])}))
'''

# Finding 6's reach, each in a cell of its own; the line (1-based, in the cell) that reaches
REACH = {
    1: ("import operator, os\ng = operator.attrgetter('__globals__')(os.path.join)\nf = g['sys']._getframe(0)", 3,
        "sys._getframe"),
    2: ("import sys\nlook = getattr\n\nf = look(sys, '_getframe')(0)", 4, "sys._getframe"),
    3: ("import functools\ntry:\n    1 / 0\nexcept ZeroDivisionError as e:\n"
        "    f = functools.reduce(getattr, ['__traceback__', 'tb_frame'], e)", 5, "object.__getattr__"),
    4: ("import ctypes\nbox = ctypes.c_long(7)\nwhere = ctypes.addressof(box)", 3, "ctypes.addressof"),
    5: ("import ctypes\nv = ctypes.c_long.from_address(id(5))", 2, "ctypes.cdata"),
    6: ("import gc\nkeep = [1]\nholders = gc.get_referrers(keep)", 3, "gc.get_referrers"),
    7: ("import gc\nall_of_it = gc.get_objects()", 2, "gc.get_objects"),
    8: ("import inspect\nf = inspect.currentframe()", 2, "sys._getframe"),
    9: ("import inspect\nst = inspect.stack()", 2, "sys._getframe"),
    10: ("import traceback\nfor f, _ in traceback.walk_stack(None):\n    break", 2, "sys._getframe"),
    11: ("import ctypes\nctypes.pythonapi.PyFrame_GetBack", 2, "ctypes.dlsym"),
    12: ("import logging\nsrc = 'x = 1'\ncode = compile(src, logging.__file__, 'exec')", 3, "compile"),
    13: ("def mine():\n    return 1\nother = (lambda: 2).__code__\nmine.__code__ = other", 4, "object.__setattr__"),
    14: ("def gen():\n    yield 1\ng = gen()\nnext(g)\nframe = g.gi_frame", 5, "object.__getattr__"),
    15: ("def gen():\n    yield 1\ng = gen()\nf = g.gi_frame", 4, "object.__getattr__"),
    16: ("import sys\nsys.settrace(lambda *a: None)", 2, "sys.settrace"),
    17: ("import sys\nsys.addaudithook(lambda *a: None)\nadded = True", 2, "sys.addaudithook"),
    18: ("import logging\nf = logging.currentframe()", 2, "sys._getframe"),
    19: ("import types\ndef mine():\n    return 1\nc = mine.__code__.replace(co_filename='x')", 4, "code.__new__"),
    # a trace function set for new threads: refused at the thread's start, where no cell's code is (line 0)
    20: ("import threading\nthreading.settrace(lambda *a: None)\nt = threading.Thread(target=len, args=((),))\n"
         "t.start()\nt.join()\nthreading.settrace(None)", 0, "sys.settrace"),
}

# Everyday code in many styles: nothing of it is the student's reach (the standard library only: every interpreter)
HONEST = [
    "import sys, os, math, json, inspect, logging, traceback, warnings, collections, functools, itertools\n"
    "print(sys.version)\nprinted = []",
    "from dataclasses import dataclass, field\n@dataclass\nclass Config:\n    d_model: int = 16\n"
    "    names: list = field(default_factory=list)\ncfg = Config()\nprinted.append(repr(cfg))",
    "import enum\nclass Kind(enum.Enum):\n    SIN = 1\n    ROPE = 2\nAlso = enum.Enum('Also', 'A B')\n"
    "printed.append(Kind.SIN.name + Also.A.name)",
    "def scaled(x, *, base=10000.0):\n    return x / base\nprinted.append(str(inspect.signature(scaled)))\n"
    "printed.append(str(scaled.__code__.co_argcount))",
    "logging.basicConfig(level=logging.INFO, stream=sys.stdout)\nlog = logging.getLogger('nb')\n"
    "log.info('training')\nlogging.warning('careful')",
    "try:\n    1 / 0\nexcept ZeroDivisionError:\n    printed.append(traceback.format_exc()[-20:])\n"
    "    traceback.print_exc(file=sys.stdout)\nwarnings.warn('just a warning')",
    "P = collections.namedtuple('P', 'a b')\nfrom typing import NamedTuple, TypeVar, Generic\nT = TypeVar('T')\n"
    "class Q(NamedTuple):\n    a: int\nclass Box(Generic[T]):\n    pass\nprinted.append(str(P(1, 2)) + str(Q(3)))",
    "exec('y = 2')\nprinted.append(str(eval('1 + 1')))\nimport ast\ntree = ast.parse('z = 3')\n"
    "printed.append(type(tree).__name__)",
    "def wrap(fn):\n    @functools.wraps(fn)\n    def inner(*a, **k):\n        return fn(*a, **k)\n    return inner\n"
    "@wrap\ndef double(x):\n    return 2 * x\nprinted.append(str(double(2)) + double.__name__)",
    "import copy, pickle\nd = copy.deepcopy({'a': [1, 2]})\nprinted.append(str(pickle.loads(pickle.dumps(d))))\n"
    "def g():\n    yield from range(3)\nprinted.append(str(sum(g())))\nimport colorsys\nimport textwrap",
    "import threading\nt = threading.Thread(target=lambda: None)\nt.start()\nt.join()\n"
    "printed.append(str(vars(cfg)) + type(cfg).__name__ + cfg.__class__.__name__)",
]


def _interpreters() -> list[str]:
    """This interpreter and the others at hand (pyenv's 3.10 and 3.12, as on Gradescope's images and newer)."""
    found = [sys.executable]
    pyenv = shutil.which("pyenv")
    for version in ("3.10", "3.12"):
        if pyenv is None:
            break
        try:
            listed = subprocess.run([pyenv, "versions", "--bare"], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired):
            break
        match = [v for v in listed.split() if v.startswith(version + ".")]
        if match:
            path = subprocess.run([pyenv, "which", "python"], capture_output=True, text=True, timeout=30,
                                  env={**os.environ, "PYENV_VERSION": match[-1]}).stdout.strip()
            if path:
                found.append(path)
    return found


INTERPRETERS = _interpreters()


def drive(python: str, cells: list[tuple[int, str]], tmp_path: Path) -> dict[str, Any]:
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    # the engine's folder, given as the driver's: only the tripwire (standard library) is imported from it
    done = subprocess.run([python, "-I", str(driver), str(ROOT)], input=json.dumps(cells), capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("python", INTERPRETERS)
def test_reach_is_refused_and_recorded_with_its_cell_and_line(python: str, tmp_path: Path) -> None:
    got = drive(python, [(i, src) for i, (src, _, _) in REACH.items()], tmp_path)
    seen = {(r["cell"], r["line"], r["event"]) for r in got["records"]}
    for i, (_, line, event) in REACH.items():
        assert (i, line, event) in seen, (i, got["records"])
        if event != "sys.addaudithook" and line:  # a second hook is not added, silently (PEP 578); a thread's
            assert "refused by the grader" in got["cells"][str(i)], got["cells"][str(i)]
    assert len(got["records"]) == len(REACH), got["records"]


@pytest.mark.parametrize("python", INTERPRETERS)
def test_everyday_code_records_nothing(python: str, tmp_path: Path) -> None:
    got = drive(python, list(enumerate(HONEST)), tmp_path)
    assert got["records"] == []
    assert set(got["cells"].values()) == {"ok"}, got["cells"]
    assert len(got["printed"]) == 12, got["printed"]


def test_torch_compile_records_nothing(tmp_path: Path) -> None:
    """torch's compiler reads library functions' code from C while the student's frame is the current one: no code
    read is judged, and nothing it does is refused."""
    cells = [(0, "import torch, torch.nn.functional as F\ndef attn(q):\n    return F.softmax(q @ q.T, dim=-1)\n"
                 "scale = 2.0\ndef outer(x):\n    def inner(y):\n        return y * scale\n    return inner(attn(x))\n"
                 "printed = [str(torch.compile(outer, backend='eager')(torch.ones(3, 4)).shape)]")]
    got = drive(sys.executable, cells, tmp_path)
    assert got["records"] == [] and got["printed"] == ["torch.Size([3, 3])"], got


def test_a_library_asking_for_a_frame_beyond_the_notebook_is_refused(tmp_path: Path) -> None:
    """A library call that asks for a frame outside the student's code (the harness that runs it) trips, whatever
    the library; the same library asking for its caller's frame does not (typing's helper, 3.11's spelling)."""
    cells = [(0, "import typing\nnear = typing._caller(0)"), (1, "import typing\n\nfar = typing._caller(1)")]
    got = drive(sys.executable, cells, tmp_path)
    assert [(r["cell"], r["line"], r["event"]) for r in got["records"]] == [(1, 3, "sys._getframe")], got
    assert got["cells"]["0"] == "ok"


def test_a_hook_installed_once_cannot_be_joined_by_another(tmp_path: Path) -> None:
    cells = [(0, "import sys\nseen = []\nsys.addaudithook(lambda e, a: seen.append(e))\nimport gc\n"
                 "try:\n    gc.get_objects()\nexcept RuntimeError:\n    pass\nprinted = [str(len(seen))]")]
    got = drive(sys.executable, cells, tmp_path)
    assert got["printed"] == ["0"]  # the student's hook was never added
    assert [r["event"] for r in got["records"]] == ["sys.addaudithook", "gc.get_objects"]


# ------------------------------------------------------------------------------------------------ in the sandbox

LIMITS = Limits(wall_timeout_s=60, cpu_timeout_s=60, memory_mb=4096, max_processes=32, max_file_mb=8,
                max_output_kb=64, scratch_mb=64)
PROBES = [("add", "add", {"args": [2, 3]}), ("peek", "peek", {})]


def nb(*cells: str) -> bytes:
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_markdown_cell("# A notebook")]
    notebook.cells += [nbformat.v4.new_code_cell(src) for src in cells]
    return nbformat.writes(notebook).encode()


# Finding 6: the harness's run_probe reached through a frame and rebound (cell 2), and the probe-time reach of a
# student function the probes call (cell 3, line 3)
ATTACK = nb("def add(a, b):\n    return a + b",
            "import operator, os\nsys_ = operator.attrgetter('__globals__')(os.path.join)['sys']\ntry:\n"
            "    frame = sys_._getframe(0)\n    while frame.f_back is not None:\n        frame = frame.f_back\n"
            "except RuntimeError:\n    frame = None",
            "import ctypes\ndef peek():\n    return ctypes.addressof(ctypes.c_long(1))")
HONEST_NB = nb("import torch, logging, inspect, enum, sys\nfrom dataclasses import dataclass\nprint(sys.version)",
               "@dataclass\nclass Cfg:\n    d: int = 4\nclass K(enum.Enum):\n    A = 1\n"
               "@torch.no_grad()\ndef twice(t):\n    return 2 * t\nlogging.getLogger('nb').warning('hi')\n"
               "print(inspect.signature(twice), twice(torch.ones(2)))",
               "from tqdm import tqdm\nfor _ in tqdm(range(3)):\n    pass\nimport matplotlib\nmatplotlib.use('Agg')\n"
               "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.close('all')",
               # issue 40's everyday idioms
               "from torch import nn\nfrom IPython.display import display\ncfg = {'act': 'ReLU'}\n"
               "act = getattr(nn, cfg['act'])()\nw = torch.empty(3, 3)\nfor name in ('xavier_uniform_',):\n"
               "    getattr(nn.init, name)(w)\nclass M(nn.Module):\n    def __init__(self):\n"
               "        super().__init__()\n        self.fused = torch.cuda.is_available()\n    def __repr__(self):\n"
               "        return self.__class__.__name__\ndisplay(M())\nprint(vars(Cfg()), type(act).__name__)",
               "def add(a, b):\n    return a + b\ndef peek():\n    return sum(torch.arange(3.0).tolist())",
               "raise ValueError('a traceback IPython prints')")


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ExecResult]:
    with importable(tmp_path_factory, "trip_checks", CALL_CHECKS) as module, \
            WorkerPool(1, limits=LIMITS, probe_module=module) as pool:
        return {"attack": pool.run(ATTACK, probes=PROBES), "honest": pool.run(HONEST_NB, probes=PROBES)}


@pytest.mark.sandbox
def test_finding_6_reach_is_recorded_for_the_grader_and_grading_goes_on(ran: dict[str, ExecResult]) -> None:
    res = ran["attack"]
    assert res.outputs["add"] == {"value": 5}  # grading went on
    assert "refused by the grader" in res.outputs["peek"]["error"]["message"]
    got = {(r["event"], r["cell"], r["line"]) for r in res.tripwire}
    assert ("sys._getframe", 2, 4) in got and ("ctypes.addressof", 3, 3) in got, res.tripwire
    assert not res.tampering, res.tampering  # trip frames are no protocol violation


@pytest.mark.sandbox
def test_honest_notebook_and_the_harness_record_nothing(ran: dict[str, ExecResult]) -> None:
    res = ran["honest"]
    assert res.tripwire == [] and res.outputs == {"add": {"value": 5}, "peek": {"value": 3.0}}, res
    assert "a traceback IPython prints" in res.stdout
    assert [n for n in res.notes if n.startswith("cell ")] == ["cell 6: ValueError: a traceback IPython prints"]
