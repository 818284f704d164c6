"""Issue 41 items 4 and 5 and issue 40 item 3, as notebooks graded end to end in the sandbox: the storage and structure
consequences are written by the grader straight into the tensors of the module's own tables (no load_state_dict,
_load_from_state_dict, load hook, _apply or .to of the student's runs), and tying is checked by a backward pass.
Ordinary module code that forges a consequence (a decoy buffer, a re-syncing override, a detached head) earns
nothing; honest modules that keep their table in another shape keep full marks."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from autograder.authoring.questions import mc_answers
from autograder.authoring.suite import Suite
from autograder.config import ROOT
from autograder.course import course_of
from autograder.grading.batch import grade_batch
from autograder.release.sample import defined_names, filled_notebook
from reference.lesson83_mistakes import MISTAKES
from reference.variants import CORRECT_VARIANTS

pytestmark = pytest.mark.sandbox

TEMPLATE = ROOT / "student_templates" / "lesson83" / "lesson83.ipynb"

# A registered buffer `pe` kept as a decoy; forward adds a plain attribute that an overridden load_state_dict
# re-copies from `pe`, so a load of the grader's table shows in the output.
DECOY_BUFFER = '''
class SinusoidalPE(nn.Module):
    def __init__(self, d_model, max_len=512):
        super().__init__()
        self.max_len = max_len
        self.table = torch.tensor(sinusoidal_pe(max_len, d_model), dtype=torch.float32)
        self.register_buffer("pe", self.table.clone())

    def load_state_dict(self, state_dict, strict=True, assign=False):
        result = super().load_state_dict(state_dict, strict, assign)
        self.table = self.pe.clone()
        return result

    def forward(self, x):
        if x.shape[1] > self.max_len:
            raise ValueError(f"sequence length {x.shape[1]} is longer than max_len={self.max_len}")
        return x + self.table[: x.shape[1]].to(x.dtype)
'''
# The same decoy, re-synced by a load hook, and moved by an overridden _apply (so .to() moves the copy too).
DECOY_HOOK = '''
class SinusoidalPE(nn.Module):
    def __init__(self, d_model, max_len=512):
        super().__init__()
        self.max_len = max_len
        self.table = torch.tensor(sinusoidal_pe(max_len, d_model), dtype=torch.float32)
        self.register_buffer("pe", self.table.clone())
        self.register_load_state_dict_post_hook(lambda module, keys: module.resync())

    def resync(self):
        self.table = self.pe.clone()

    def _apply(self, fn, recurse=True):
        result = super()._apply(fn, recurse)
        self.table = fn(self.table)
        return result

    def forward(self, x):
        if x.shape[1] > self.max_len:
            raise ValueError(f"sequence length {x.shape[1]} is longer than max_len={self.max_len}")
        return x + self.table[: x.shape[1]].to(x.dtype)
'''
# A float64 plain attribute, with state_dict and load_state_dict overridden to save and load it.
FLOAT64_PLAIN = '''
class SinusoidalPE(nn.Module):
    def __init__(self, d_model, max_len=512):
        super().__init__()
        self.max_len = max_len
        self.pe = torch.tensor(sinusoidal_pe(max_len, d_model), dtype=torch.float64)

    def state_dict(self, *args, **kwargs):
        return {"pe": self.pe}

    def load_state_dict(self, state_dict, strict=True, assign=False):
        self.pe = state_dict["pe"].double().clone()

    def forward(self, x):
        if x.shape[1] > self.max_len:
            raise ValueError(f"sequence length {x.shape[1]} is longer than max_len={self.max_len}")
        return x + self.pe[: x.shape[1]].to(x.dtype)
'''
# A head that copies the embedding, detached, in every forward: the logits follow a new row, but training never
# reaches the embedding through the head (untied while training).
DETACHED_HEAD = '''
class TinyCharLM(TinyCharLM):
    def forward(self, X):
        self.head_weight = self.token_emb.weight.detach().clone()
        return F.linear(self.hidden(X), self.head_weight)
'''
# Issue 41 finding 5: a LearnedPE that never reads its table, adding the public ramp the visible case fills the
# table with, or a ramp of its own (x + t / T) that lies within the case's declared closeness.
PUBLIC_RAMP = '''
class LearnedPE(nn.Module):
    def __init__(self, max_len, d_model):
        super().__init__()
        self.max_len = max_len
        self.table = nn.Embedding(max_len, d_model)

    def forward(self, x):
        T, d = x.shape[1], x.shape[2]
        if T > self.max_len:
            raise ValueError(f"sequence length {T} is longer than max_len={self.max_len}")
        ramp = torch.arange(self.max_len * d, dtype=x.dtype, device=x.device).reshape(self.max_len, d)
        return x + ramp[:T] / (self.max_len * d)
'''
OWN_RAMP = '''
class LearnedPE(nn.Module):
    def __init__(self, max_len, d_model):
        super().__init__()
        self.max_len = max_len
        self.table = nn.Embedding(max_len, d_model)

    def forward(self, x):
        T = x.shape[1]
        if T > self.max_len:
            raise ValueError(f"sequence length {T} is longer than max_len={self.max_len}")
        return x + (torch.arange(T, dtype=x.dtype, device=x.device) / T)[:, None]
'''


def _mistake(mistake_id: str) -> str:
    return next(m.code for m in MISTAKES if m.id == mistake_id)


NOTEBOOKS = {
    "base_q3": _mistake("pe_plain_attribute"),
    "base_m1_head": _mistake("lm_untied_head"),
    "decoy_buffer": DECOY_BUFFER,
    "decoy_hook": DECOY_HOOK,
    "float64_plain": FLOAT64_PLAIN,
    "detached_head": DETACHED_HEAD,
    "public_ramp": PUBLIC_RAMP,
    "own_ramp": OWN_RAMP,
    "batch_axis_buffer": CORRECT_VARIANTS["batch_axis_buffer_module"],
    "seq_first_buffer": CORRECT_VARIANTS["seq_first_buffer_module"],
}


@pytest.fixture(scope="module")
def graded(tmp_path_factory: pytest.TempPathFactory, suite: Suite) -> Path:
    tmp = tmp_path_factory.mktemp("consequences")
    (tmp / "subs").mkdir()
    answers = mc_answers(list(suite.questions))
    for name, code in NOTEBOOKS.items():
        nb = filled_notebook(TEMPLATE, extra={defined_names(code)[0]: code}, answers=answers, lesson=suite.lesson)
        nbformat.write(nb, str(tmp / "subs" / f"{name}.ipynb"))
    grade_batch(tmp / "subs", out=tmp / "out", progress=False, course=course_of())
    return tmp / "out" / "results"


def _record(results: Path, name: str) -> dict:
    return json.loads((results / f"{name}.json").read_text())


def _points(record: dict, names: tuple[str, ...]) -> dict[str, float]:
    return {c["id"]: c["points"] for c in record["cases"] if c["id"].split("/")[-1] in names}


STORAGE = ("pe_is_buffer", "follows_to", "hidden_pe_is_buffer", "hidden_follows_to")


@pytest.mark.parametrize("name, paid_nothing", [
    ("decoy_buffer", STORAGE),
    ("decoy_hook", STORAGE),
    ("float64_plain", ("follows_to", "hidden_follows_to")),
])
def test_a_forged_storage_consequence_earns_nothing(graded: Path, name: str, paid_nothing: tuple[str, ...]) -> None:
    """Ordinary module code, not flagged by the review: the grader's table is written into the module's buffer
    `pe` itself, so a forward that reads a copy of it (re-synced by an overridden load_state_dict) or a plain
    attribute shows none of it, and Q3 gets no more than the honest plain attribute (pe_plain_attribute)."""
    record, honest = _record(graded, name), _record(graded, "base_q3")
    assert record["review"]["flags"] == [], record["review"]
    paid = _points(record, paid_nothing)
    assert len(paid) == len(paid_nothing) and not any(paid.values()), paid
    q3 = "q3_sinusoidal_module"
    assert record["questions"][q3] <= honest["questions"][q3] + 1e-9, (record["questions"], honest["questions"])


def test_a_detached_copy_of_the_embedding_as_head_earns_nothing_for_tying(graded: Path) -> None:
    """The logits follow a new embedding row (the copy is refreshed in every forward), but a backward pass puts no
    gradient on token_emb.weight's row 0 through the head: tied_head pays nothing, as for a separate head."""
    record, honest = _record(graded, "detached_head"), _record(graded, "base_m1_head")
    assert record["review"]["flags"] == [], record["review"]
    for r in (record, honest):
        paid = _points(r, ("tied_head",))
        assert len(paid) == 1 and not any(paid.values()), paid
    case = next(c for c in record["cases"] if c["id"].endswith("/tied_head"))
    assert "gradient" in case["message"] and case["diagnosis"] == "lm_untied_head"


@pytest.mark.parametrize("name", ["batch_axis_buffer", "seq_first_buffer"])
def test_a_buffer_of_another_shape_keeps_full_marks(graded: Path, suite: Suite, name: str) -> None:
    """Issue 40 finding 3: a (1, max_len, d_model) or (max_len, 1, d_model) buffer with a matching forward gets the
    grader's table in its own shape, and keeps every point."""
    record = _record(graded, name)
    lost = [(c["id"], c["message"]) for c in record["cases"] if c["points"] < c["max_points"] - 1e-9]
    assert record["total"] == suite.notebook_points, lost
    assert record["review"]["flags"] == []


@pytest.mark.parametrize("name", ["public_ramp", "own_ramp"])
def test_a_learned_pe_that_ignores_its_table_earns_nothing(graded: Path, name: str) -> None:
    """Issue 41 finding 5: the hidden value case fills the table from a seed only the grader holds, and a value case
    opens its properties only when the output moves with the module's own weights; the public ramp (6.22 of 8
    before) and x + t / T (3.56 before, through `within: 0.2`) earn nothing on Q4."""
    record = _record(graded, name)
    paid = {c["id"]: c["points"] for c in record["cases"] if c["question"] == "q4_learned_pe" and c["points"]}
    assert record["questions"]["q4_learned_pe"] == 0, paid
