"""The notebook review (autograder/grading/review.py): a reading of a notebook's AST in the grader process that
flags reach, not style. Honest notebooks raise no flag (the reference, every correct variant and catalogued mistake,
the released notebooks, device queries anywhere: issue 40 item 1); each reach of issue #31 findings 1a-1c and 2 is
flagged with its line, and a flagged notebook's claim cases are held (not zeroed) until a TA's decision clears
exactly those flags. The honest-idioms zoo and the scope rule: test_honest_idioms.py."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from autograder.authoring.suite import Suite
from autograder.config import ROOT
from autograder.grading.gradebook import Gradebook, Record
from autograder.grading.review import (
    DECISIONS_FILE,
    digest,
    hold_claims,
    review_cells,
    review_decisions,
    review_notebook,
)
from autograder.model import CaseResult, Status, SubmissionResult
from reference.lesson83_mistakes import MISTAKES
from reference.variants import CORRECT_VARIANTS

TEMPLATE = ROOT / "student_templates" / "lesson83" / "lesson83.ipynb"


@pytest.fixture(scope="module")
def names(suite: Suite) -> dict[str, dict[str, list[str]]]:
    return {"graded": {q.id: list(q.solution) for q in suite.questions}}


def flags_of(source: str, names: dict[str, dict[str, list[str]]]) -> list[str]:
    return [f.text() for f in review_cells([(0, source)], **names)]


# --------------------------------------------------------------------------- no flag on honest notebooks

def test_the_reference_and_the_release_raise_no_flag(suite: Suite, names: dict[str, dict[str, list[str]]]) -> None:
    assert flags_of(suite.lesson.reference_file.read_text(), names) == []
    assert [f.text() for f in review_notebook(TEMPLATE.read_bytes(), **names)] == []


@pytest.mark.parametrize("name", sorted(CORRECT_VARIANTS))
def test_correct_variants_raise_no_flag(name: str, names: dict[str, dict[str, list[str]]]) -> None:
    assert flags_of(CORRECT_VARIANTS[name], names) == []


def test_catalogued_mistakes_raise_no_flag(names: dict[str, dict[str, list[str]]]) -> None:
    assert {m.id: flags_of(m.code, names) for m in MISTAKES if flags_of(m.code, names)} == {}


HONEST_IDIOMS = [
    'import torch\ndevice = "cuda" if torch.cuda.is_available() else "cpu"\n',
    "import torch\nfrom torch import nn\nclass M(nn.Module):\n    def __init__(self):\n        super().__init__()\n",
    "%matplotlib inline\n!pip list\nimport numpy as np\nx = np.arange(3).__len__()\n",
    "import json as _json\nfrom checks_runtime import check_case as _check_case\n"
    "_check_case(globals(), _json.dumps({}))\n",
]


@pytest.mark.parametrize("source", HONEST_IDIOMS)
def test_honest_idioms_raise_no_flag(source: str, names: dict[str, dict[str, list[str]]]) -> None:
    assert flags_of(source, names) == []


# --------------------------------------------------------------------------- the attacks of issue #31

ATTACKS = {
    # 1a: the guard found with gc, its sweep replaced on the instance.
    "1a_gc_guard": ("import gc\nG = next(o for o in gc.get_objects() if type(o).__name__ == 'TamperGuard')\n"
                    "G.sweep = lambda: G.mark\n", "interpreter"),
    # 1b: the harness frame's run_probe rebound through ctypes and the frame's locals.
    "1b_ctypes_frame": ("import ctypes, sys\nf = sys._getframe(1)\nf.f_locals['run_probe'] = print\n"
                        "ctypes.pythonapi.PyFrame_LocalsToFast(ctypes.py_object(f), ctypes.c_int(0))\n", "import"),
    # 1c: the same reach without an import statement: a module's own sys, a computed getattr.
    "1c_reach_by_attribute": ("import os\nframe = os.sys._getframe(0)\n", "interpreter"),
    "1c_computed_getattr": ("import torch\nname = '_' + 'C'\nC = getattr(torch, name)\n", "dynamic"),
    "1c_code_rebinding": ("def f():\n    return 1\ndef g():\n    return 2\nf.__code__ = g.__code__\n", "dunder"),
    "1c_library_rebinding": ("import numpy as np\nnp.allclose = lambda *a, **k: True\n", "rebinding"),
    # The same reach hidden where plain Python cannot parse it: IPython runs it all the same.
    "hidden_in_cell_magic": ("%%time\nimport gc\nobjects = gc.get_objects()\n", "interpreter"),
    "hidden_in_line_magic": ("%time import ctypes\n", "import"),
    "hidden_after_shell_assignment": ("files = !ls\nimport ctypes\n", "import"),
    "shell_kept": ("ip = get_ipython()\nip.run_cell('import gc')\n", "dynamic"),
    "shell_magic": ("%%bash\ncat /proc/1/maps\n", "magic"),
    # 2: the trace told apart inside graded functions by an active mode or the call stack (a device query is no
    # flag: device cases are decided at run time).
    "2_active_mode": ("import torch\nfrom torch.overrides import TorchFunctionMode\n"
                      "def alibi_bias(h, n):\n    return torch.zeros(h, n, n)\n", "import"),
    "2_mode_stack": ("import torch\ndef alibi_bias(h, n):\n"
                     "    if torch._C._len_torch_function_stack():\n        return torch.zeros(h, n, n)\n"
                     "    return torch.ones(h, n, n)\n", "torch internals"),
    "2_call_stack": ("import inspect\ndef apply_rope(x, cos, sin):\n"
                     "    if any(f.function == 'fn_device' for f in inspect.stack()):\n        return x\n"
                     "    return x * cos\n", "interpreter"),
}


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_each_attack_is_flagged_with_its_line(name: str, names: dict[str, dict[str, list[str]]]) -> None:
    source, kind = ATTACKS[name]
    flags = review_cells([(3, source)], **names)
    assert any(f.kind == kind for f in flags), [f.text() for f in flags]
    assert all(f.cell == 3 and f.code and f.code in source for f in flags)


DEVICE_QUERIES = {
    "cuda_available": ("import torch\ndef rope_attention(q, k, v, causal=True):\n"
                       "    if not torch.cuda.is_available():\n        q = q.to(q.device)\n    return q\n"),
    "meta_branch": ("import torch\nclass TinyCharLM(torch.nn.Module):\n    def attend(self, q, k, v):\n"
                    "        if q.device.type == 'meta' or q.is_meta or not q.is_cuda:\n            return v\n"
                    "        return q\n"),
}


@pytest.mark.parametrize("name", sorted(DEVICE_QUERIES))
def test_device_queries_are_never_flagged_statically(name: str, names: dict[str, dict[str, list[str]]]) -> None:
    """Issue 40 item 1: device cases are decided at run time, so a device query is no flag, in graded code or out."""
    assert flags_of(DEVICE_QUERIES[name], names) == []
    assert flags_of(DEVICE_QUERIES[name].replace("rope_attention", "my_helper"), names) == []


# --------------------------------------------------------------------------- held, not zeroed; cleared by a TA

def _result() -> SubmissionResult:
    cases = [CaseResult("q/storage", "q", 1.0, 1.0, True, False), CaseResult("q/value", "q", 2.0, 2.0, True, False)]
    return SubmissionResult("alice", Status.GRADED, cases)


def test_flags_hold_claim_cases_and_a_decision_releases_them(names: dict[str, dict[str, list[str]]]) -> None:
    flags = review_cells([(0, ATTACKS["1a_gc_guard"][0])], **names)
    held = _result()
    record = hold_claims(held, {"q/storage"}, flags, cleared=None)
    assert held.total == 2.0 and record["held"] == 1 and not record["cleared"]
    said = held.cases[0].message  # the student sees that a person will look, not how a flag is cleared
    assert "held for review" in said and "a person" in said and "digest" not in said and "TA" not in said
    assert "held for TA review" in held.csv_row(["q"])["message"] and "cell 0 line 2" in held.notes[-1]
    cleared = _result()
    record = hold_claims(cleared, {"q/storage"}, flags, cleared=digest(flags))
    assert cleared.total == 3.0 and record["cleared"]
    other = _result()  # a decision for other lines (the notebook changed) clears nothing
    hold_claims(other, {"q/storage"}, flags, cleared="0" * 16)
    assert other.total == 2.0
    clean = _result()
    assert hold_claims(clean, {"q/storage"}, [], cleared=None)["flags"] == [] and clean.total == 3.0


def test_the_decisions_file_is_read_and_kept_across_runs(tmp_path: Path) -> None:
    book = Gradebook(tmp_path)
    assert review_decisions(book) == {}
    (tmp_path / DECISIONS_FILE).write_text("alice: abcdef0123456789\n")
    assert review_decisions(book) == {"alice": "abcdef0123456789"}
    stored = Record("k", "", SubmissionResult("alice", Status.GRADED), {}, review={"decision": "abcdef0123456789"})
    assert stored.judged_under("abcdef0123456789") and not stored.judged_under(None)
    (tmp_path / DECISIONS_FILE).write_text("- not a mapping\n")
    with pytest.raises(ValueError, match=DECISIONS_FILE):
        review_decisions(book)


def test_a_notebook_is_reviewed_from_its_cells_without_running_them(tmp_path: Path,
                                                                    names: dict[str, dict[str, list[str]]]) -> None:
    marker = tmp_path / "ran"
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(f"import ctypes\nopen({str(marker)!r}, 'w')\n"),
                nbformat.v4.new_code_cell("def broken(:\n")]  # a cell that does not parse never ran: no flag
    flags = review_notebook(nbformat.writes(nb).encode(), **names)
    assert [f.kind for f in flags] == ["import"] and not marker.exists()


# Probes whose output is a fact the student's process reports about itself (storage, structure, device trace).
FACT_PROBES = {"module_storage", "learned_facts", "lm_structure", "lm_tied_head", "fn_device", "lm_device"}


def test_every_case_resting_on_a_reported_fact_is_a_claim(suite: Suite) -> None:
    unmarked = [c.id for c in suite.cases if c.probe in FACT_PROBES and not c.claim]
    assert unmarked == [] and any(c.claim for c in suite.cases)
    assert not [c.id for c in suite.cases if c.claim and c.probe not in FACT_PROBES]
