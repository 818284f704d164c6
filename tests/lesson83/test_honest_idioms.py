"""Issue 40 item 1: the source review flags reach, not style, and a flag holds only the claim cases in its scope.

The honest-idioms zoo: each idiom of finding 1 (and the others honest notebooks use: inspect.signature, logging,
@dataclass, @torch.no_grad(), Enum, configuration writes, gc.collect(), a loop of setattr on self), alone in an
otherwise reference notebook, raises no flag; a few of them, graded for real, keep the reference's marks. Reach is
still flagged in the same notebook (frames, gc, ctypes, __globals__, another module's attribute written, a computed
getattr), and the scope rule holds: a flag in Q4's LearnedPE holds Q4's claim cases only, a top-level one every
question's. Pure review unless marked sandbox (one grade run)."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from autograder.authoring.questions import mc_answers
from autograder.authoring.suite import Suite
from autograder.config import ROOT
from autograder.course import Course
from autograder.grading.batch import grade_batch
from autograder.grading.review import ALL, hold_claims, review_notebook
from autograder.model import CaseResult, Status, SubmissionResult
from autograder.release.sample import filled_notebook

TEMPLATE = ROOT / "student_templates" / "lesson83" / "lesson83.ipynb"

# Top-level code appended to the cell that defines self_attention (an honest student's own cell of checks).
TOP_LEVEL = {
    "getattr_cfg_act": 'cfg = {"act": "GELU", "d_model": 16}\nact = getattr(nn, cfg["act"])()\nprint(cfg, act)\n',
    "getattr_init_loop": ('w = torch.empty(4, 4)\n'
                          'for init_name, kw in (("xavier_uniform_", {"gain": 1.0}), ("normal_", {"std": 0.02})):\n'
                          '    getattr(nn.init, init_name)(w, **kw)\n'),
    "inspect_signature": "import inspect\nprint(inspect.signature(self_attention))\n",
    "sys_version": "import sys\nprint(sys.version)\n",
    "logging": 'import logging\nlogging.basicConfig(level=logging.INFO)\nlogging.getLogger(__name__).info("ready")\n',
    "ipython_display": "from IPython.display import display\ndisplay(torch.zeros(2))\n",
    "vars_settings": ("class Settings:\n    def __init__(self):\n        self.d_model, self.seed = 16, 0\n\n\n"
                      "settings = Settings()\nprint(vars(settings))\n"),
    "dataclass": ("from dataclasses import dataclass, field\n\n\n@dataclass(frozen=True)\nclass Config:\n"
                  "    d_model: int = 16\n    heads: list = field(default_factory=list)\n\n"
                  "    def __post_init__(self):\n        object.__setattr__(self, 'd_model', int(self.d_model))\n\n\n"
                  "print(Config())\n"),
    "no_grad": "@torch.no_grad()\ndef peek(x):\n    return x.mean()\n\n\nprint(peek(torch.ones(3)))\n",
    "enum": ("from enum import Enum\n\n\nclass Scheme(Enum):\n    LEARNED = 'learned'\n    ROPE = 'rope'\n\n\n"
             "print(Scheme['ROPE'], list(Scheme.__members__), Scheme.ROPE.value)\n"),
    "type_name": "print(type(torch.zeros(1)).__name__, self_attention.__name__, self_attention.__doc__)\n",
    "device_top_level": 'device = "cuda" if torch.cuda.is_available() else "cpu"\nx = torch.zeros(2, device=device)\n'
                        "print(x.device, x.is_cuda, torch.cuda.device_count())\n",
    "configuration": ('import os\nimport gc\nimport matplotlib.pyplot as plt\n'
                      'os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"\ntorch.backends.cudnn.deterministic = True\n'
                      'plt.rcParams["figure.figsize"] = (8, 4)\ngc.collect()\n'),
    "sys_modules_membership": 'import sys\nprint("torch" in sys.modules)\n',
    "everyday_settings": ('import random\nimport warnings\nimport types\nimport traceback\n'
                          'random.seed(0)\nnp.random.seed(0)\ntorch.manual_seed(0)\nwarnings.filterwarnings("ignore")\n'
                          'np.set_printoptions(precision=3)\ntorch.set_printoptions(precision=3)\n'
                          'print(torch.__version__, np.__version__)\n'
                          'if hasattr(torch, "compile") and getattr(torch.backends, "mps", None) is not None:\n'
                          '    print(torch.backends.mps.is_available())\n'
                          'ns = types.SimpleNamespace(d_model=16)\nprint(vars(ns), ns.__dict__)\n'
                          'try:\n    import google.colab\nexcept ImportError:\n    traceback.print_exc()\n'
                          'if __name__ == "__main__":\n    torch.cuda.empty_cache()\n'),
}
# Lines changed inside graded classes: (class, the reference's line, the honest student's).
IN_CLASS = {
    "tinycharlm_fused": ("TinyCharLM", "        self.head_dim = num_hiddens // num_heads\n",
                         "        self.head_dim = num_hiddens // num_heads\n"
                         "        self.fused = torch.cuda.is_available()\n"),
    "class_name_repr": ("LearnedPE", "    def forward(self, x):\n",
                        "    def __repr__(self):\n"
                        "        return f\"{self.__class__.__name__}(max_len={self.max_len})\"\n\n"
                        "    def forward(self, x):\n"),
    "class_name_in_error": ("LearnedPE", 'raise ValueError(f"sequence length',
                            'raise ValueError(f"{type(self).__name__}: sequence length'),
    "setattr_self_loop": ("LearnedPE", "        self.max_len = max_len\n",
                          "        self.max_len = max_len\n        for i, name in enumerate(('first', 'second')):\n"
                          "            setattr(self, f\"note{i}\", name)\n            getattr(self, f\"note{i}\")\n"),
}
# Reach that stays flagged: (kind, code), the code alone in the notebook like an idiom.
REACH = {
    "frames": ("interpreter", "import sys\nframe = sys._getframe(1)\n"),
    "frames_inspect": ("interpreter", "import inspect\ncaller = inspect.currentframe().f_back\n"),
    "gc_objects": ("interpreter", "import gc\nguards = [o for o in gc.get_objects() if hasattr(o, 'sweep')]\n"),
    "ctypes": ("import", "import ctypes\n"),
    "globals_of_a_function": ("dunder", "import os\nsys_module = os.path.join.__globals__['sys']\n"),
    "attrgetter_globals": ("dunder", "import operator, os\ng = operator.attrgetter('__globals__')(os.path.join)\n"),
    "setattr_other_module": ("rebinding", "import numpy as np\nsetattr(np, 'allclose', lambda *a, **k: True)\n"),
    "write_other_module": ("rebinding", "import numpy as np\nnp.allclose = lambda *a, **k: True\n"),
    "getattr_computed": ("dynamic", "name = '_' + 'C'\nC = getattr(torch, name)\n"),
    "getattr_under_another_name": ("dynamic", "fetch = getattr\nC = fetch(torch, 'zeros')\n"),
    "cfg_assigned_into": ("dynamic", 'cfg = {"act": "GELU"}\ncfg["act"] = input()\nact = getattr(nn, cfg["act"])\n'),
    "reduce_getattr": ("dynamic", "import functools\nM = functools.reduce(getattr, ['nn', 'Module'], torch)\n"),
    "shell_under_another_name": ("dynamic", "shell = get_ipython\nshell().ex('1')\n"),
    "os_system": ("interpreter", "import os\nos.system('true')\n"),
    "probe_registry_written": ("rebinding", "import checks_runtime\nchecks_runtime.PROBES.update({})\n"),
    "harness": ("harness", "from autograder.sandbox.frames import CANARY\n"),
    "torch_mode": ("torch internals", "from torch.overrides import TorchFunctionMode\n"),
}


@pytest.fixture(scope="module")
def graded(suite: Suite) -> dict[str, list[str]]:
    return {q.id: list(q.solution) for q in suite.questions}


@pytest.fixture(scope="module")
def reference(suite: Suite) -> nbformat.NotebookNode:
    return filled_notebook(TEMPLATE, answers=mc_answers(list(suite.questions)), lesson=suite.lesson)


def _top_level(suite: Suite, code: str) -> nbformat.NotebookNode:
    return filled_notebook(TEMPLATE, extra={"self_attention": code}, answers=mc_answers(list(suite.questions)),
                           lesson=suite.lesson)


def _in_class(reference: nbformat.NotebookNode, cls: str, old: str, new: str) -> nbformat.NotebookNode:
    nb = nbformat.from_dict(json.loads(json.dumps(reference)))
    cell = next(c for c in nb.cells if c.cell_type == "code" and f"class {cls}(" in c.source)
    head, body = cell.source.split(f"class {cls}(", 1)
    assert old in body, (cls, old)
    cell.source = f"{head}class {cls}(" + body.replace(old, new, 1)
    return nb


def _notebook(suite: Suite, reference: nbformat.NotebookNode, name: str) -> nbformat.NotebookNode:
    return _top_level(suite, TOP_LEVEL[name]) if name in TOP_LEVEL else _in_class(reference, *IN_CLASS[name])


def _flags(nb: nbformat.NotebookNode, graded: dict[str, list[str]]) -> list[str]:
    return [f.text() for f in review_notebook(nbformat.writes(nb).encode(), graded=graded)]


@pytest.mark.parametrize("name", sorted(TOP_LEVEL) + sorted(IN_CLASS))
def test_an_honest_idiom_raises_no_flag(name: str, suite: Suite, reference: nbformat.NotebookNode,
                                        graded: dict[str, list[str]]) -> None:
    assert _flags(reference, graded) == []
    assert _flags(_notebook(suite, reference, name), graded) == []


@pytest.mark.parametrize("name", sorted(REACH))
def test_reach_is_still_flagged_with_its_line(name: str, suite: Suite, graded: dict[str, list[str]]) -> None:
    kind, code = REACH[name]
    flags = review_notebook(nbformat.writes(_top_level(suite, code)).encode(), graded=graded)
    assert any(f.kind == kind for f in flags), [f.text() for f in flags]
    assert all(f.code and f.code in code and f.scope == ALL for f in flags), [f.text() for f in flags]


# --------------------------------------------------------------------------- the scope rule

def _all_passed(suite: Suite) -> SubmissionResult:
    return SubmissionResult("s", Status.GRADED, [CaseResult(c.id, c.question, c.points, c.points, True, c.hidden)
                                                  for c in suite.cases])


def _held(suite: Suite, nb: nbformat.NotebookNode, graded: dict[str, list[str]]) -> tuple[set[str], SubmissionResult]:
    result = _all_passed(suite)
    flags = review_notebook(nbformat.writes(nb).encode(), graded=graded)
    assert flags
    hold_claims(result, {c.id for c in suite.cases if c.claim}, flags, cleared=None)
    return {c.id for c in result.cases if c.reason == "held for review"}, result


def test_a_flag_in_learnedpe_holds_only_q4s_claim_cases(suite: Suite, reference: nbformat.NotebookNode,
                                                          graded: dict[str, list[str]]) -> None:
    q4 = next(q.id for q in suite.questions if "LearnedPE" in q.solution)
    nb = _in_class(reference, "LearnedPE", "        T = x.shape[1]\n",
                   "        T = x.shape[1]\n        import sys\n        sys._getframe(0)\n")
    held, result = _held(suite, nb, graded)
    claims = {c.id for c in suite.cases if c.claim}
    assert held == {c.id for c in suite.cases if c.claim and c.question == q4} and held
    assert claims - held, "the other questions' claim cases are paid"
    assert f"of {q4} only" in result.notes[-1]


def test_a_flag_in_a_helper_the_graded_code_calls_is_in_that_questions_scope(
        suite: Suite, reference: nbformat.NotebookNode, graded: dict[str, list[str]]) -> None:
    """rope_cache (Q5) is called by name from rope_attention (Q6) and TinyCharLM (M1): a flag in a helper that
    rope_cache calls holds the claim cases of Q5, Q6 and M1, and none of Q3's, Q4's or Q7's."""
    owners = {q.id for q in suite.questions if {"rope_cache", "rope_attention", "TinyCharLM"} & set(q.solution)}
    nb = nbformat.from_dict(json.loads(json.dumps(reference)))
    cell = next(c for c in nb.cells if c.cell_type == "code" and "def rope_cache(" in c.source)
    helper = "def _frame():\n    import sys\n    return sys._getframe(1)\n\n\n"
    cell.source = cell.source.replace("def rope_cache(", helper + "def rope_cache(", 1).replace(
        '    """Return (cos, sin)', '    _frame()\n    """Return (cos, sin)', 1)
    assert "    _frame()\n" in cell.source
    held, _ = _held(suite, nb, graded)
    assert held == {c.id for c in suite.cases if c.claim and c.question in owners} and len(owners) == 3
    assert {c.question for c in suite.cases if c.claim} - owners, "other questions' claims exist and are paid"


def test_a_top_level_flag_holds_every_questions_claim_cases(suite: Suite, graded: dict[str, list[str]]) -> None:
    held, _ = _held(suite, _top_level(suite, REACH["frames"][1]), graded)
    assert held == {c.id for c in suite.cases if c.claim}


# --------------------------------------------------------------------------- a real grade run

# the refusal is caught, so the code goes on and its claim cases pass: held, not paid
TRIPPED = "import logging\ntry:\n    caller = logging.currentframe()\nexcept RuntimeError:\n    caller = None\n"
GRADED_IDIOMS = ("tinycharlm_fused", "class_name_repr", "getattr_init_loop", "vars_settings")


@pytest.mark.sandbox
def test_honest_idioms_keep_the_references_marks_in_a_grade_run(course: Course, suite: Suite,
                                                                reference: nbformat.NotebookNode,
                                                                graded: dict[str, list[str]],
                                                                tmp_path: Path) -> None:
    """Finding 1: each idiom alone cost 86 -> 77.43 until a TA cleared it; now each keeps every mark the reference
    earns in the same run, with no flag."""
    (tmp_path / "subs").mkdir()
    top = "\n".join(TOP_LEVEL[n] for n in ("getattr_cfg_act", "inspect_signature", "sys_version", "logging",
                                           "ipython_display", "dataclass", "enum"))
    notebooks = {"reference": reference, "top_level_idioms": _top_level(suite, top),
                 **{name: _notebook(suite, reference, name) for name in GRADED_IDIOMS}}
    # Reach no static reading sees (a frame from logging's own helper): the run-time tripwire records it, and the
    # review turns the record into a flag scoped like a static one (issue 41 item 6 with issue 40 item 1).
    tripped = {"tripped_top_level": _top_level(suite, TRIPPED),
               "tripped_in_learnedpe": _in_class(reference, "LearnedPE", "        T = x.shape[1]\n",
                                                 "        T = x.shape[1]\n" + "".join(
                                                     f"        {line}\n" for line in TRIPPED.splitlines()))}
    for nb in tripped.values():
        assert _flags(nb, graded) == [], "the static review must not see it: the tripwire's test"
    notebooks.update(tripped)
    for name, nb in notebooks.items():
        nbformat.write(nb, str(tmp_path / "subs" / f"{name}.ipynb"))
    grade_batch(tmp_path / "subs", out=tmp_path / "out", progress=False, course=course)
    records = {n: json.loads((tmp_path / "out" / "results" / f"{n}.json").read_text()) for n in notebooks}
    best = records["reference"]
    assert best["total"] > 0 and best["review"]["flags"] == []
    for name, record in records.items():
        if name in tripped:
            continue
        assert record["review"]["flags"] == [], (name, record["review"])
        assert record["questions"] == best["questions"], name
    q4 = next(q.id for q in suite.questions if "LearnedPE" in q.solution)
    claims = {c.id: c.question for c in suite.cases if c.claim}
    for name, scope in (("tripped_top_level", set(claims.values())), ("tripped_in_learnedpe", {q4})):
        record = records[name]
        flags = record["review"]["flags"]
        assert flags and all(f["kind"] == "tripwire" and "currentframe" in f["code"] for f in flags), (name, flags)
        held = {c["id"] for c in record["cases"] if c.get("reason") == "held for review"}
        assert held == {c for c, q in claims.items() if q in scope}, (name, held)
