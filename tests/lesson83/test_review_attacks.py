"""Issue #31 findings 1a-1c and 2, as notebooks graded end to end (sandbox, judge, review): each forges a fact the
student's process reports (storage, device placement) or dodges the device trace, and gains nothing over its honest
baseline, the same code without the attack (a catalogued mistake); each is flagged with its lines, and a TA's
decision clears the flags on the next run."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from autograder.authoring.questions import mc_answers
from autograder.authoring.suite import Suite
from autograder.config import ROOT
from autograder.course import Course, course_of
from autograder.grading.batch import grade_batch
from autograder.grading.review import DECISIONS_FILE
from autograder.release.sample import defined_names, filled_notebook
from reference.lesson83_mistakes import MISTAKES

pytestmark = pytest.mark.sandbox

TEMPLATE = ROOT / "student_templates" / "lesson83" / "lesson83.ipynb"

# 1a: the guard found with gc; its sweep replaced on the instance by one that reports the grader's mark; then the
# probe registry rewritten to claim a buffer that moves with .to() and devices that match.
GC_MARK = '''
import gc
from autograder.sandbox.frames import CANARY
import lesson83_checks as _c

G = next(o for o in gc.get_objects() if type(o).__name__ == "TamperGuard")

def _forged_sweep():
    nonce = G.mark.__dict__.pop("nonce", None)
    return [f"{CANARY} {nonce}"] if nonce is not None else []

G.sweep = _forged_sweep
_storage, _device = _c.PROBES["module_storage"], _c.PROBES["lm_device"]
_c.PROBES["module_storage"] = lambda env, **a: dict(_storage(env, **a), buffers=["pe"], state_dict=["pe"],
                                                    pe_is_parameter=False, pe_dtype_after_to="float64")
_c.PROBES["lm_device"] = lambda env, **a: dict(_device(env, **a), finding=None)
'''
# 1b and 1c: without touching the guard: at the first probe, the harness frame's local run_probe rebound through
# ctypes and the frame's locals to a wrapper that rewrites the storage facts (1b) and the device findings (1c).
FRAME_LOCALS = '''
import ctypes
import sys

_done = []

def _hijack():
    f = sys._getframe(1)
    while f is not None and not _done:
        if "run_probe" in f.f_locals and "guard" in f.f_locals:
            real = f.f_locals["run_probe"]

            def run_probe(env, name, args):
                out = real(env, name, args)
                if name == "module_storage" and isinstance(out, dict) and "buffers" in out:
                    out = dict(out, buffers=["pe"], state_dict=["pe"], pe_is_parameter=False,
                               pe_dtype_after_to="float64")
                if name in ("fn_device", "lm_device") and isinstance(out, dict):
                    out = dict(out, finding=None)
                return out

            f.f_locals["run_probe"] = run_probe
            ctypes.pythonapi.PyFrame_LocalsToFast(ctypes.py_object(f), ctypes.c_int(0))
            _done.append(1)
        f = f.f_back

_self_attention = self_attention

def self_attention(*args, **kwargs):
    _hijack()
    return _self_attention(*args, **kwargs)
'''
# 1a on the milestone's structure facts: the same forged mark, then lm_structure's report rewritten to the
# reference's (pe a buffer, no separate head) and lm_tied_head's logits to those of a tied head (token 0 moved).
GC_STRUCTURE = GC_MARK.split("_storage, _device")[0] + '''
_structure, _tied = _c.PROBES["lm_structure"], _c.PROBES["lm_tied_head"]

def _reference_facts(out):
    for facts in out.values():
        for table in (facts["state_dict"], facts["parameters"]):
            for k in [k for k in table if k.startswith("head.")]:
                del table[k]
        facts["parameters"].pop("pe", None)
        if "pe" in facts["state_dict"] and "pe" not in facts["buffers"]:
            facts["buffers"] = sorted([*facts["buffers"], "pe"])
    return out

def _tied_logits(out):
    if "before" not in out:  # the facts the probe reported before issue 31
        return dict(out, own_column=1.0, other_columns=0.0)
    after = out["before"].copy()
    after[..., 0] += 1.0
    return dict(out, after=after)

_c.PROBES["lm_structure"] = lambda env, **a: _reference_facts(_structure(env, **a))
_c.PROBES["lm_tied_head"] = lambda env, **a: _tied_logits(_tied(env, **a))
'''
# 2: the tables moved to the inputs' device only where a GPU is missing (always, under the CPU trace): on a real
# GPU the same code leaves them on the CPU and crashes at the first step.
CUDA_DODGE = '''
_rope_attention = rope_attention

def rope_attention(q, k, v, causal=True):
    if not torch.cuda.is_available():
        return _rope_attention(q, k, v, causal)
    return _cpu_tables(q, k, v, causal)
'''


def _mistake(mistake_id: str) -> str:
    return next(m.code for m in MISTAKES if m.id == mistake_id)


BASELINES = {"base_q3": _mistake("pe_plain_attribute"), "base_m1": _mistake("lm_tables_on_cpu"),
             "base_q6": _mistake("rope_attention_tables_on_cpu"), "base_m1_pe": _mistake("lm_pe_parameter"),
             "base_m1_head": _mistake("lm_untied_head")}


def _notebook(code: str, answers: dict[str, str], extra_cell: str = "") -> nbformat.NotebookNode:
    nb = filled_notebook(TEMPLATE, extra={defined_names(code)[0]: code}, answers=answers, lesson=course_of().lesson)
    if extra_cell:
        nb.cells.append(nbformat.v4.new_code_cell(extra_cell))
    return nb


@pytest.fixture(scope="module")
def graded(course: Course, tmp_path_factory: pytest.TempPathFactory, suite: Suite) -> Path:
    tmp = tmp_path_factory.mktemp("attacks")
    (tmp / "subs").mkdir()
    answers = mc_answers(list(suite.questions))
    cpu_tables = _mistake("rope_attention_tables_on_cpu").replace("def rope_attention(", "def _cpu_tables(", 1)
    assert "def _cpu_tables(" in cpu_tables
    notebooks = {
        **{name: _notebook(code, answers) for name, code in BASELINES.items()},
        "1a_gc_mark": _notebook(BASELINES["base_q3"], answers, GC_MARK),
        "1b_frame_locals": _notebook(BASELINES["base_q3"], answers, FRAME_LOCALS),
        "1c_frame_locals_devices": _notebook(BASELINES["base_m1"], answers, FRAME_LOCALS),
        "1a_structure_pe": _notebook(BASELINES["base_m1_pe"], answers, GC_STRUCTURE),
        "1a_structure_head": _notebook(BASELINES["base_m1_head"], answers, GC_STRUCTURE),
        "2_cuda_dodge": filled_notebook(TEMPLATE, extra={"rope_attention": cpu_tables + CUDA_DODGE}, answers=answers,
                                        lesson=suite.lesson),
    }
    for name, nb in notebooks.items():
        nbformat.write(nb, str(tmp / "subs" / f"{name}.ipynb"))
    grade_batch(tmp / "subs", out=tmp / "out", progress=False, course=course)
    return tmp


def _record(graded: Path, name: str) -> dict:
    return json.loads((graded / "out" / "results" / f"{name}.json").read_text())


COMPARED = {"1a_gc_mark": ("base_q3", "q3_sinusoidal_module"), "1b_frame_locals": ("base_q3", "q3_sinusoidal_module"),
            "1c_frame_locals_devices": ("base_m1", "m1_tinycharlm"),
            "1a_structure_pe": ("base_m1_pe", "m1_tinycharlm"), "1a_structure_head": ("base_m1_head", "m1_tinycharlm")}


@pytest.mark.parametrize("name", sorted(COMPARED))
def test_an_attack_gains_nothing_over_its_honest_baseline_and_is_flagged(graded: Path, name: str) -> None:
    base, question = COMPARED[name]
    attack, honest = _record(graded, name), _record(graded, base)
    assert attack["questions"][question] <= honest["questions"][question] + 1e-9, (attack["questions"],
                                                                                   honest["questions"])
    assert attack["review"]["flags"] and not attack["review"]["cleared"]
    assert honest["review"]["flags"] == []


def test_a_device_query_is_no_static_flag(graded: Path) -> None:
    """Issue 40 item 1: `torch.cuda.is_available()` in a graded function is no flag (device cases are decided at
    run time: issue 41 item 3), so the dodge's device cases are not held by the review."""
    assert _record(graded, "2_cuda_dodge")["review"]["flags"] == []


def test_a_tas_decision_clears_the_flags_on_the_next_run(course: Course, graded: Path, suite: Suite) -> None:
    name = "1c_frame_locals_devices"
    record = _record(graded, name)
    (graded / "out" / DECISIONS_FILE).write_text(f"{name}: {record['review']['digest']}\n")
    grade_batch(graded / "subs", out=graded / "out", progress=False,
                course=course)  # only the decided one is judged again
    cleared = _record(graded, name)
    assert cleared["review"]["cleared"] and cleared["total"] >= record["total"]
    grade_batch(graded / "subs", out=graded / "out", progress=False, course=course)  # and the decision stays
    assert _record(graded, name)["review"]["cleared"]


CONSEQUENCE_CASES = ("pe_is_buffer", "follows_to", "hidden_pe_is_buffer", "hidden_follows_to")


def test_a_forged_storage_fact_earns_nothing_even_once_a_ta_clears_the_flag(course: Course, graded: Path) -> None:
    """Evidence, not trust: the storage cases pay only where the output after a grader-chosen load_state_dict (and
    .to(torch.float64)) is the one the grader predicts, which a plain attribute cannot give, whatever it reports."""
    out = graded / "out"
    decisions = out / DECISIONS_FILE
    kept = decisions.read_text() if decisions.exists() else ""
    decisions.write_text(kept + "".join(f"{name}: {_record(graded, name)['review']['digest']}\n"
                                        for name in ("1a_gc_mark", "1b_frame_locals")))
    grade_batch(graded / "subs", out=out, progress=False, course=course)
    honest = _record(graded, "base_q3")
    for name in ("1a_gc_mark", "1b_frame_locals"):
        record = _record(graded, name)
        assert record["review"]["cleared"], record["review"]
        assert record["questions"]["q3_sinusoidal_module"] <= honest["questions"]["q3_sinusoidal_module"] + 1e-9
        paid = {c["id"]: c["points"] for c in record["cases"] if c["id"].split("/")[-1].split(".")[-1]
                in CONSEQUENCE_CASES}
        assert len(paid) == len(CONSEQUENCE_CASES) and not any(paid.values()), paid


def test_forged_structure_facts_earn_nothing_even_once_a_ta_clears_the_flag(course: Course, graded: Path) -> None:
    """Evidence, not trust, for the milestone: a state-dict case pays only where its scheme's logits after a load
    the grader chose (and a nudge of every trainable parameter) are the reference's, and the tied-head case only
    where the logits after a new embedding row 0 are; a trainable `pe` or a separate head cannot give them,
    whatever lm_structure and lm_tied_head report."""
    out = graded / "out"
    attacks = {"1a_structure_pe": "base_m1_pe", "1a_structure_head": "base_m1_head"}
    decisions = out / DECISIONS_FILE
    kept = decisions.read_text() if decisions.exists() else ""
    decisions.write_text(kept + "".join(f"{name}: {_record(graded, name)['review']['digest']}\n" for name in attacks))
    grade_batch(graded / "subs", out=out, progress=False, course=course)
    for name, base in attacks.items():
        record, honest = _record(graded, name), _record(graded, base)
        assert record["review"]["cleared"], record["review"]
        assert record["questions"]["m1_tinycharlm"] <= honest["questions"]["m1_tinycharlm"] + 1e-9
        lost = {c["id"] for c in honest["cases"] if c["points"] < c["max_points"]}
        gained = {c["id"] for c in record["cases"] if c["id"] in lost and c["points"] > 0}
        assert lost and not gained, gained
