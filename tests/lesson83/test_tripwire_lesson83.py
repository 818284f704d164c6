"""Finding 6 of issue 41 on Lesson 83: a notebook that reaches the harness's frame through names the review does not
list (`operator.attrgetter("__globals__")(os.path.join)["sys"]`, `getattr` under another name) to rebind its
run_probe with ctypes is refused by the child's tripwire at run time: every probe output is its honest baseline's,
and the grader holds the record of the cell and line that reached."""

from __future__ import annotations

import json

import nbformat
import pytest

from autograder.authoring.questions import mc_answers
from autograder.config import ROOT
from autograder.course import Course
from autograder.grading.runner import make_pool, probe_order
from autograder.model import Status
from autograder.release.sample import defined_names, filled_notebook
from autograder.runtime.plain_codec import to_plain
from reference.lesson83_mistakes import MISTAKES

pytestmark = pytest.mark.sandbox

TEMPLATE = ROOT / "student_templates" / "lesson83" / "lesson83.ipynb"
BASE = next(m.code for m in MISTAKES if m.id == "pe_plain_attribute")  # Q3's storage facts fail honestly
REACH_LINE = 8  # the line of the cell below that asks for the frame
ATTACK = '''import ctypes
import operator
import os

_sys = operator.attrgetter("__globals__")(os.path.join)["sys"]
_look = getattr
def _hijack():
    f = _look(_sys, "_getframe")(1)
    while f is not None:
        if "run_probe" in f.f_locals and "guard" in f.f_locals:
            real = f.f_locals["run_probe"]

            def run_probe(env, name, args):
                out = real(env, name, args)
                if name == "module_storage" and isinstance(out, dict) and "buffers" in out:
                    out = dict(out, buffers=["pe"], state_dict=["pe"], pe_is_parameter=False,
                               pe_dtype_after_to="float64")
                return out

            f.f_locals["run_probe"] = run_probe
            ctypes.pythonapi.PyFrame_LocalsToFast(ctypes.py_object(f), ctypes.c_int(0))
            return
        f = f.f_back

_self_attention = self_attention

def self_attention(*args, **kwargs):
    try:
        _hijack()
    except RuntimeError:
        pass
    return _self_attention(*args, **kwargs)
'''


def test_reach_by_another_name_is_refused_recorded_and_gains_nothing(course: Course) -> None:
    answers = mc_answers(list(course.suite.questions))
    honest = filled_notebook(TEMPLATE, extra={defined_names(BASE)[0]: BASE}, answers=answers, lesson=course.lesson)
    attack = nbformat.from_dict(json.loads(nbformat.writes(honest)))
    attack.cells.append(nbformat.v4.new_code_cell(ATTACK))
    probes = probe_order(course.suite)
    with make_pool(course, size=1) as pool:
        base = pool.run(nbformat.writes(honest).encode(), probes=probes)
        got = pool.run(nbformat.writes(attack).encode(), probes=probes)
    assert base.tripwire == [] and base.status == got.status == Status.GRADED, (base.status, got.status, got.notes)
    storage = [k for k in base.outputs if k.startswith("q3_sinusoidal_module/")]
    assert storage and all(json.dumps(to_plain(got.outputs[k]), sort_keys=True)
                           == json.dumps(to_plain(base.outputs[k]), sort_keys=True) for k in storage)
    cell = len(attack.cells) - 1
    assert got.tripwire and {(r["event"], r["cell"], r["line"]) for r in got.tripwire} == {
        ("sys._getframe", cell, REACH_LINE)}, got.tripwire
