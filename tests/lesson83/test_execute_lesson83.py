"""The sandbox on what only Lesson 83 has: its own probes under attack (the engine's side of each attack is in
tests/engine/test_execute*.py, on probe modules of the tests' own and the demo lesson).

- `call` on sinusoidal_pe: Lesson 83's probe returns outputs through the runtime's as_array, so a tensor subclass or
  an object with __array__ earns nothing and is flagged;
- `lm_causal` on TinyCharLM: a returned tensor changed later does not change what the probe saw;
- Q3's `module_storage` on SinusoidalPE (issue #20): a patched JSON encoder that strips the tamper facts and rewrites
  answers, the guard found with gc and its record overwritten (or the guard switched off), a class that lies about
  its own storage, the classes the probe module uses (the kit's ModelCache, ModelState) patched;
- an operator's lower ulimits with Lesson 83's checkpoint reader, which loads a torch checkpoint (milestone.pt)
  under the lowered address space.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from autograder.authoring.questions import mc_answers
from autograder.authoring.suite import Suite
from autograder.config import ROOT
from autograder.course import course_of
from autograder.model import Status
from autograder.release.sample import filled_notebook
from autograder.sandbox import ExecResult, Limits, WorkerPool
from helpers.ulimits import grade_under_lower_ulimits  # the run under lowered ulimits, and its checks

LESSON = course_of().lesson
checks = LESSON.checks

LIMITS = Limits(wall_timeout_s=10, cpu_timeout_s=5, memory_mb=2048, max_processes=32, max_file_mb=8, max_output_kb=64,
                scratch_mb=64)
TEMPLATE = ROOT / "student_templates" / "lesson83" / "lesson83.ipynb"
CHECKPOINT = ROOT / "reference" / "lesson83_checkpoint"


def nb(*cells: str) -> bytes:
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_markdown_cell("# Lesson 83"), *map(nbformat.v4.new_code_cell, cells)]
    return nbformat.writes(notebook).encode()


def value(res: ExecResult, key: str) -> object:
    out = res.outputs[key]
    assert "value" in out, out
    return out["value"]


# --------------------------------------------------------------------------- the real probes

SINUSOIDAL = {
    "plain_tensor": "import torch\ndef sinusoidal_pe(n, d):\n    return torch.zeros(n, d)",
    "parameter": "import torch\ndef sinusoidal_pe(n, d):\n    return torch.nn.Parameter(torch.zeros(n, d))",
    "tensor_subclass": "import torch\nclass T(torch.Tensor):\n    def numpy(self):\n        return None\n"
                       "def sinusoidal_pe(n, d):\n    return torch.zeros(n, d).as_subclass(T)",
    "array_like": "import numpy as np\nclass A:\n    def __array__(self, dtype=None, copy=None):\n"
                  "        return np.zeros((6, 4))\ndef sinusoidal_pe(n, d):\n    return A()",
}


@pytest.fixture(scope="module")
def real_probes() -> dict[str, ExecResult]:
    probes = [("table", "call", {"fn": "sinusoidal_pe", "args": [6, 4]})]
    with WorkerPool(1, limits=LIMITS, probe_module=LESSON.checks_name,  # Lesson 83's probes
                    modules=LESSON.sandbox_modules) as pool:
        return dict(pool.run_many(((k, nb(src)) for k, src in SINUSOIDAL.items()), probes=probes))


@pytest.mark.parametrize("case", ["plain_tensor", "parameter"])
@pytest.mark.sandbox
def test_the_sinusoidal_pe_probe_takes_plain_tensors_and_parameters(real_probes, case):
    res = real_probes[case]
    assert res.status == Status.GRADED and res.tampering == [], (res.notes, res.tampering)
    assert value(res, "table").shape == (6, 4)


@pytest.mark.parametrize("case", ["tensor_subclass", "array_like"])
@pytest.mark.sandbox
def test_the_sinusoidal_pe_probe_flags_outputs_posing_as_arrays(real_probes, case):
    res = real_probes[case]
    assert res.status == Status.TAMPERING, res.notes
    assert any("suspicious probe output" in f for f in res.tampering), res.tampering
    assert "error" in res.outputs["table"]


ALIASING_LM = '''
import torch
from torch import nn

class TinyCharLM(nn.Module):
    """Not causal (every position sees the mean of all), and it rewrites its previous answer in place."""

    def __init__(self, vocab_size, pos, num_hiddens, num_heads, num_blks, max_len):
        super().__init__()
        self.token_emb = nn.Embedding(vocab_size, num_hiddens)
        self.head = nn.Linear(num_hiddens, vocab_size)
        self.last = None

    def forward(self, X):
        h = self.token_emb(X)
        out = self.head(h + h.mean(dim=1, keepdim=True))
        if self.last is not None and self.last.shape == out.shape:
            self.last.copy_(out)
        self.last = out
        return out
'''


def test_a_returned_tensor_changed_later_does_not_change_what_the_probe_saw():
    env: dict[str, object] = {}
    exec(ALIASING_LM, env)  # noqa: S102 - test code
    got = checks.run_probe(env, "lm_causal", {"pos": "rope", "T": 20, "t": 9, "seed": 6})
    case = {"id": "m1_tinycharlm/causal_rope", "check": "pair_equal", "atol": 1e-6, "rtol": 1e-6,
            "first": "logits after tokens 9.. change", "second": "logits of the original input"}
    assert "first" in got, got
    assert not checks.judge(case, got, {}).passed


# --------------------------------------------------------------------------- Q3's storage probes

STORAGE_LIMITS = Limits(wall_timeout_s=20, cpu_timeout_s=15, memory_mb=2048, max_processes=32, max_file_mb=8,
                        max_output_kb=64, scratch_mb=64)
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
GUARD = next(o for o in gc.get_objects() if type(o).__name__ == "TamperGuard")
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
# The probes' own classes patched (the kit's, which the probe module imports): the model cache told that any model
# is as built, the state-reading functions.
PROBE_CLASSES = NO_PATCH + '''
import lesson83_checks as c
import torch_kit

c.ModelCache.build = lambda self, env, pos: None
torch_kit.ModelState.same = lambda self, model: True
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


@pytest.fixture(scope="module")
def storage() -> dict[str, ExecResult]:
    cases = {"plain": nb(NO_PATCH, PLAIN_TABLE), "encoder": nb(ENCODER, PLAIN_TABLE),
             "gc_record": nb(GC_RECORD, PLAIN_TABLE), "gc_off": nb(GC_OFF, PLAIN_TABLE),
             "gc_empty": nb(GC_EMPTY, PLAIN_TABLE), "lying_class": nb(LYING_CLASS),
             "probe_classes": nb(PROBE_CLASSES, PLAIN_TABLE)}
    # the guard and the probes on their own, beneath the tripwire (which refuses these notebooks' gc first)
    with WorkerPool(1, limits=STORAGE_LIMITS, probe_module=LESSON.checks_name,
                    modules=LESSON.sandbox_modules, tripwire=False) as pool:
        return dict(pool.run_many(cases.items(), probes=STORAGE))


def q3_passed(res: ExecResult) -> list[str]:
    """The Q3 storage cases the output passes (a voided case, with no output, passes none)."""
    got = res.outputs.get("storage")
    if got is None:
        return []
    return [c["id"] for c in Q3 if checks.judge(c, got, {}).passed]


@pytest.mark.sandbox
def test_a_plain_attribute_fails_the_storage_cases(storage):
    res = storage["plain"]
    assert res.status == Status.GRADED and res.tampering == [], (res.notes, res.tampering)
    assert res.outputs["storage"]["pe_type"] == "Tensor"  # the probe ran
    assert q3_passed(res) == []


@pytest.mark.sandbox
def test_a_patched_json_encoder_neither_hides_tampering_nor_rewrites_answers(storage):
    res = storage["encoder"]
    assert res.status == Status.TAMPERING, res.notes
    assert any("numpy.allclose" in f for f in res.tampering), res.tampering
    assert any("JSONEncoder.iterencode" in f for f in res.tampering), res.tampering
    assert res.outputs["storage"]["buffers"] == [] and q3_passed(res) == []


@pytest.mark.sandbox
def test_a_patched_class_of_the_probe_module_is_flagged(storage):
    res = storage["probe_classes"]
    assert res.status == Status.TAMPERING, res.notes
    assert any("ModelCache was changed" in f for f in res.tampering), res.tampering
    assert any("ModelState was changed" in f for f in res.tampering), res.tampering


@pytest.mark.parametrize("case", ["gc_record", "lying_class"])
@pytest.mark.sandbox
def test_probes_read_module_state_from_nn_modules_own_tables(storage, case):
    res = storage[case]
    assert res.outputs["storage"]["pe_type"] == "Tensor", res.outputs
    assert q3_passed(res) == [], res.outputs


@pytest.mark.parametrize("case", ["gc_off", "gc_empty"])
@pytest.mark.sandbox
def test_a_guard_switched_off_voids_the_case_and_is_flagged(storage, case):
    res = storage[case]
    assert res.status == Status.TAMPERING, res.notes
    assert any("check mark" in f for f in res.tampering), res.tampering
    assert "storage" not in res.outputs and q3_passed(res) == []


# --------------------------------------------------------------------------- an operator's lower limits

@pytest.mark.sandbox
def test_grade_under_an_operators_lower_ulimits_gives_full_marks_and_says_so(tmp_path: Path, suite: Suite) -> None:
    subs, out = tmp_path / "subs", tmp_path / "out"
    nb = filled_notebook(TEMPLATE, answers=mc_answers(list(suite.questions)), lesson=suite.lesson)
    (subs / "honest").mkdir(parents=True)
    nbformat.write(nb, str(subs / "honest" / "lesson83.ipynb"))
    for f in ("milestone.pt", "milestone.json"):
        (subs / "honest" / f).write_bytes((CHECKPOINT / f).read_bytes())
    config = tmp_path / "grading_config.yaml"  # the checkpoint reader asks for more than the ulimit leaves too
    text = (ROOT / "grading_config.yaml").read_text()
    assert "checkpoint_memory_mb: 1024" in text
    config.write_text(text.replace("checkpoint_memory_mb: 1024", "checkpoint_memory_mb: 4096"))
    grade_under_lower_ulimits(config, subs, out, auto_points=suite.auto_points)
