"""The source review's scope, names and run-time tripwire records (issue 40 item 1; issue 41 item 6's records):
which computed attribute names resolve, which question's graded code a line is, how a tripwire record becomes a
flag on its line and reaches the TA's page, and that a TA's decision keeps its meaning (the digest covers the
flagged lines' kind and code, not their scope). Pure review on small sources (questions `qa`, `qb`, `qc`)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest

from autograder.config import ROOT
from autograder.course import Course
from autograder.grading.gradebook import Gradebook, Record, RunFacts
from autograder.grading.review import ALL, MAX_EVENTS, digest, hold_claims, review_cells, reviewed
from autograder.grading.submissions import Submission, result_file_name
from autograder.grading.tables import write_tables
from autograder.model import CaseResult, Status, SubmissionResult
from autograder.report import write_report

GRADED = {"qa": ["alpha"], "qb": ["Beta"], "qc": ["gamma"]}


def flags(*cells: str, events: list[dict] | tuple = ()) -> list:
    return review_cells(list(enumerate(cells)), graded=GRADED, events=events)


# --------------------------------------------------------------------------- names that resolve

RESOLVES = {
    "literal": 'import torch\nx = getattr(torch, "zeros")\n',
    "name_bound_to_literals": 'import torch\nact = "relu"\nif True:\n    act = "gelu"\ny = getattr(torch, act)\n',
    "loop_over_tuple": 'import torch\nfor n in ("zeros", "ones"):\n    getattr(torch, n)(2)\n',
    "loop_over_pairs": 'import torch\nfor n, kw in (("zeros", {}), ("ones", {"dtype": None})):\n'
                       '    getattr(torch, n)(2, **kw)\n',
    "comprehension": 'import torch\nfs = [getattr(torch, n) for n in ["zeros", "ones"]]\n',
    "loop_over_top_level_list": 'import torch\nNAMES = ["zeros", "ones"]\n\n\ndef make():\n'
                                '    return [getattr(torch, n) for n in NAMES]\n',
    "dict_items": 'import torch\nINITS = {"zeros": 1, "ones": 2}\nfor n, k in INITS.items():\n'
                  '    getattr(torch, n)(k)\n',
    "enumerate": 'import torch\nfor i, n in enumerate(("zeros", "ones")):\n    getattr(torch, n)(i)\n',
    "dict_literal_subscript": 'import torch\ncfg = {"fn": "zeros", "n": 3}\nprint(cfg, len(cfg))\n'
                              'def f(**kw):\n    return kw\nf(**cfg)\nx = getattr(torch, cfg["fn"])(cfg["n"])\n',
    "dict_shown_by_libraries": 'import json\nimport torch\nfrom pprint import pprint\ncfg = {"fn": "zeros"}\n'
                               'pprint(cfg)\nprint(json.dumps(cfg), sorted(cfg))\ngetattr(torch, cfg["fn"])\n',
    "setattr_self_fstring": 'class M:\n    def __init__(self):\n        for i in range(2):\n'
                            '            setattr(self, f"block{i}", i)\n',
    # one's own attributes under a computed name: what they lead to is judged where it is used
    "fstring_on_self": 'class M:\n    def f(self, x):\n        return getattr(self, f"f_{x}")\n',
    "setattr_self_over_kwargs": 'class M:\n    def __init__(self, **kw):\n        for k, v in kw.items():\n'
                                '            setattr(self, k, v)\n',
    "getattr_self_over_names": 'class M:\n    def show(self, names):\n'
                               '        return {n: getattr(self, n) for n in names if hasattr(self, n)}\n',
    "frozen_dataclass": 'class C:\n    def __post_init__(self):\n        object.__setattr__(self, "a", 1)\n',
}
UNRESOLVED = {
    "concatenated": 'import torch\nname = "_" + "C"\ngetattr(torch, name)\n',
    "parameter": 'import torch\ndef f(name):\n    return getattr(torch, name)\n',
    "dict_assigned_into": 'import torch\ncfg = {"fn": "zeros"}\ncfg["fn"] = "_C"\ngetattr(torch, cfg["fn"])\n',
    "dict_updated": 'import torch\ncfg = {"fn": "zeros"}\ncfg.update(fn="_C")\ngetattr(torch, cfg["fn"])\n',
    "dict_handed_on": 'import torch\ncfg = {"fn": "zeros"}\nalias = cfg\nalias["fn"] = "_C"\n'
                      'getattr(torch, cfg["fn"])\n',
    "dict_handed_to_own_function": 'import torch\ndef f(c):\n    c["fn"] = "_C"\ncfg = {"fn": "zeros"}\nf(cfg)\n'
                                   'getattr(torch, cfg["fn"])\n',
    "dict_to_a_builtin_redefined": 'import torch\ndef print(c):\n    c["fn"] = "_C"\ncfg = {"fn": "zeros"}\n'
                                   'print(cfg)\ngetattr(torch, cfg["fn"])\n',
    "dict_bound_twice": 'import torch\ncfg = {"fn": "zeros"}\ncfg = {"fn": "_C"}\ngetattr(torch, cfg["fn"])\n',
    "list_appended": 'import torch\nNAMES = ["zeros"]\nNAMES.append("_C")\nfor n in NAMES:\n'
                     '    getattr(torch, n)\n',
    "name_made_global": 'import torch\nact = "zeros"\ndef f():\n    global act\n    act = input()\n'
                        'getattr(torch, act)\n',
    "globals_written": 'import torch\nact = "zeros"\nglobals()["act"] = "_C"\ngetattr(torch, act)\n',
    "fstring_not_on_self": 'import torch\ni = 1\ngetattr(torch, f"zeros{i}")\n',
    "setattr_computed_on_object": 'class M:\n    def f(self, o, x):\n        setattr(o, x, 1)\n',
    "getattribute_computed": 'def f(o, x):\n    return object.__getattribute__(o, x)\n',
}


@pytest.mark.parametrize("name", sorted(RESOLVES))
def test_a_name_that_resolves_is_no_flag(name: str) -> None:
    assert [f.text() for f in flags(RESOLVES[name])] == []


@pytest.mark.parametrize("name", sorted(UNRESOLVED))
def test_a_name_that_does_not_resolve_is_flagged(name: str) -> None:
    got = flags(UNRESOLVED[name])
    assert any(f.kind == "dynamic" and "does not resolve" in f.why for f in got), [f.text() for f in got]


def test_a_resolved_name_is_judged_as_the_attribute_it_names() -> None:
    got = flags('import numpy as np\nfor n in ("allclose",):\n    setattr(np, n, print)\n',
                'import os\nname = "__globals__"\ng = getattr(os.path.join, name)\n')
    assert {(f.cell, f.kind) for f in got} >= {(0, "rebinding"), (1, "dunder")}, [f.text() for f in got]


# --------------------------------------------------------------------------- scope

NOTEBOOK = (
    "import sys\n\n\ndef helper():\n    return sys._getframe(1)\n\n\ndef shared():\n    return sys._getframe(2)\n",
    "def alpha(x):\n    helper()\n    shared()\n    return x\n\n\nclass Beta:\n    frame = sys._getframe(0)\n\n"
    "    def run(self):\n        return shared()\n",
    "def elsewhere():\n    return sys._getframe(3)\n\n\ntop = sys._getframe(4)\n",
)


def test_each_flag_is_scoped_to_the_graded_code_around_it() -> None:
    scope = {f.code: f.scope for f in flags(*NOTEBOOK)}
    assert scope == {"return sys._getframe(1)": ("qa",),  # helper: alpha calls it by name
                     "return sys._getframe(2)": ("qa", "qb"),  # shared: called from alpha and from Beta.run
                     "frame = sys._getframe(0)": ("qb",),  # in Beta's class body
                     "return sys._getframe(3)": ALL,  # a function no graded code calls
                     "top = sys._getframe(4)": ALL}  # a top-level statement


def _result() -> SubmissionResult:
    cases = [CaseResult(f"{q}/claim", q, 1.0, 1.0, True, False) for q in GRADED] + \
        [CaseResult(f"{q}/value", q, 1.0, 1.0, True, False) for q in GRADED]
    return SubmissionResult("s", Status.GRADED, cases)


CLAIMS = {f"{q}/claim" for q in GRADED}


def test_a_scoped_flag_holds_only_its_questions_claim_cases() -> None:
    only_alpha = [f for f in flags(*NOTEBOOK) if f.scope == ("qa",)]
    result = _result()
    record = hold_claims(result, CLAIMS, only_alpha, cleared=None)
    assert {c.id for c in result.cases if not c.passed} == {"qa/claim"} and record["scope"] == ["qa"]
    shared = [f for f in flags(*NOTEBOOK) if f.scope == ("qa", "qb")]
    result = _result()
    hold_claims(result, CLAIMS, shared, cleared=None)
    assert {c.id for c in result.cases if not c.passed} == {"qa/claim", "qb/claim"}
    result = _result()
    record = hold_claims(result, CLAIMS, flags(*NOTEBOOK), cleared=None)  # a top-level flag among them: all
    assert {c.id for c in result.cases if not c.passed} == CLAIMS and record["scope"] == ALL


# --------------------------------------------------------------------------- the run-time tripwire's records

def test_tripwire_records_become_flags_on_their_lines_scoped_like_static_flags() -> None:
    cells = ("import math\n", "def alpha(x):\n    y = x + 1\n    return y\n\n\nz = alpha(1)\n")
    events = [{"event": "sys._getframe", "cell": 1, "line": 2, "detail": "depth 1"},
              {"event": "gc.get_objects", "cell": 1, "line": 6, "detail": ""},
              {"event": "ctypes.dlsym", "cell": 9, "line": 1, "detail": "PyFrame_LocalsToFast"},
              "not a record"]
    got = flags(*cells, events=events)
    assert [(f.kind, f.cell, f.line, f.code, f.scope) for f in got] == [
        ("tripwire", 1, 2, "y = x + 1", ("qa",)), ("tripwire", 1, 6, "z = alpha(1)", ALL),
        ("tripwire", 9, 1, "", ALL), ("tripwire", -1, 0, "", ALL)]
    assert "sys._getframe" in got[0].why and "depth 1" in got[0].why and "PyFrame_LocalsToFast" in got[2].why
    assert flags(*cells) == []  # the same notebook without records: clean


def test_a_run_with_many_records_names_the_first_and_counts_the_rest() -> None:
    events = [{"event": "sys._getframe", "cell": 0, "line": 1, "detail": str(i)} for i in range(MAX_EVENTS + 7)]
    got = flags("x = 1\n", events=events)
    assert len(got) == 2 and got[0].code == "x = 1" and "7 more" in got[1].why and got[1].scope == ALL


def test_a_cell_nested_past_the_recursion_limit_is_unreviewable_not_a_failure() -> None:
    got = flags("import math\n", "x = a" + ".b" * 2000 + "\n", "def alpha():\n    return " + " + ".join(["y"] * 2000))
    assert [(f.cell, f.kind, f.scope) for f in got] == [(1, "unreviewable", ALL), (2, "unreviewable", ALL)]


def test_reviewed_takes_the_runs_records_and_holds_by_their_scope() -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("def alpha(x):\n    y = x + 1\n    return y\n")]
    suite = SimpleNamespace(questions=[SimpleNamespace(id=q, solution=n) for q, n in GRADED.items()],
                            cases=[SimpleNamespace(id=i, claim=True) for i in CLAIMS])
    result = _result()
    review = reviewed(suite, nbformat.writes(nb).encode(), result, cleared=None,
                      events=[{"event": "sys._getframe", "cell": 0, "line": 2, "detail": ""}])
    assert [f["kind"] for f in review["flags"]] == ["tripwire"] and review["held"] == 1
    assert {c.id for c in result.cases if not c.passed} == {"qa/claim"}


def test_the_sandboxs_records_travel_with_the_runs_facts() -> None:
    """What batch.Storer passes to reviewed(events=...): RunFacts.of keeps ExecResult.tripwire (absent: none), on
    the local pool and on a cluster's workers alike."""
    run = SimpleNamespace(stdout="", wall_s=1.0, sandbox="bwrap", memory_guard="cgroup", isolation="bubblewrap")
    assert RunFacts.of(run).tripwire == []
    run.tripwire = [{"event": "sys._getframe", "cell": 0, "line": 1, "detail": ""}]
    assert RunFacts.of(run).tripwire == run.tripwire


# --------------------------------------------------------------------------- a TA's decision keeps its meaning

def test_the_digest_is_the_flagged_lines_kind_and_code_whatever_their_scope() -> None:
    """A decision in review_decisions.yaml is sha256 of the sorted `kind\\0code` lines (16 hex digits): for a line
    the earlier review flagged with the same kind (an import of ctypes, a library attribute rebound, a __code__
    write) the digest is unchanged, so an earlier decision still clears it; a scope is no part of it."""
    lines = ("import ctypes", "np.allclose = lambda *a, **k: True", "f.__code__ = g.__code__")
    got = flags("import ctypes\nimport numpy as np\nnp.allclose = lambda *a, **k: True\n"
                "def f():\n    pass\n\n\ndef g():\n    pass\n\n\nf.__code__ = g.__code__\n")
    assert sorted(f.code for f in got) == sorted(lines)
    earlier = [("import", lines[0]), ("rebinding", lines[1]), ("dunder", lines[2])]  # the kinds it had
    before = hashlib.sha256("\n".join(sorted(f"{k}\0{c}" for k, c in earlier)).encode()).hexdigest()[:16]
    assert digest(got) == before
    moved = [type(f)(f.kind, f.cell + 1, f.line + 5, f.code, f.why, ("qa",)) for f in got]
    assert digest(moved) == before
    result = _result()
    assert hold_claims(result, CLAIMS, got, cleared=before)["cleared"] and all(c.passed for c in result.cases)


# --------------------------------------------------------------------------- the TA's page

CONFIG = ROOT / "tests" / "fixtures" / "lesson_demo" / "grading_config.yaml"


def test_a_tripwire_flag_is_on_the_tas_page(tmp_path: Path) -> None:
    course = Course.load(CONFIG)
    out = tmp_path / "grades"
    cases = [CaseResult(c.id, c.question, c.points, c.points, True, c.hidden) for c in course.suite.cases]
    result = SubmissionResult("ann", Status.GRADED, cases)
    tripped = review_cells([(0, "x = 1\n")], graded={},
                           events=[{"event": "gc.get_referrers", "cell": 0, "line": 1, "detail": "guard"}])
    review = hold_claims(result, {cases[0].id}, tripped, cleared=None)
    sub = Submission("ann", Path("ann.ipynb"), None, name="ann.ipynb")
    sub.result_name = result_file_name("ann", sub.raw_name)
    Gradebook(out).write_record(sub.result_name, Record("k", "", result, {"tests": []}, review=review))
    write_tables(course.suite, [sub], Gradebook(out))
    index = write_report(out, out=tmp_path / "report", course=course)
    page = next((index.parent / "students").glob("*.html")).read_text()
    assert "Held for review" in page and "tripwire" in page and "gc.get_referrers" in page
