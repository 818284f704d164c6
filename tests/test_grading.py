"""Grading the reference, the blank template, every catalogued mistake and correct alternatives."""

from __future__ import annotations

import math
from functools import cache

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from autograder import lesson83_checks as checks
from autograder.config import ROOT
from autograder.judge import Suite, grade_namespace, notebook_env, reference_env
from reference.mistakes import MISTAKES, reference_namespace
from reference.variants import CORRECT_VARIANTS

TEMPLATE = ROOT / "student_templates" / "lesson83" / "lesson83.ipynb"


def _scores(suite: Suite, env: dict) -> dict[str, float]:
    return grade_namespace(suite, env, name="t").question_scores()


def test_reference_earns_full_marks_on_every_question(suite: Suite) -> None:
    result = grade_namespace(suite, reference_env(suite), name="reference")
    failed = [c.message for c in result.cases if not c.passed]
    assert failed == []
    for q in suite.questions:
        if q.graded and not q.manual and q.cases:  # the milestone checkpoint is graded from files
            assert result.question_scores()[q.id] == pytest.approx(q.points), q.id


def test_blank_template_earns_zero_without_crashing(suite: Suite) -> None:
    env, _ = notebook_env(TEMPLATE)
    result = grade_namespace(suite, env, name="blank")
    assert result.total == 0
    assert all(c.message for c in result.cases if c.max_points > 0)


@pytest.mark.parametrize("mistake", MISTAKES, ids=lambda m: m.id)
def test_every_catalogued_mistake_loses_points_and_is_diagnosed(suite: Suite, mistake) -> None:
    env = {**reference_env(suite), **reference_namespace(mistake)}
    result = grade_namespace(suite, env, name=mistake.id)
    question_points = {q.id: q.points for q in suite.questions}
    assert result.question_scores()[mistake.question] < question_points[mistake.question]
    diagnosed = {c.diagnosis for c in result.cases if c.question == mistake.question and not c.passed}
    assert mistake.id in diagnosed, [c.message for c in result.cases if not c.passed]
    messages = "\n".join(c.message for c in result.cases if c.diagnosis == mistake.id)
    # Property checks that recognise a mistake by its symptom write their own message instead.
    by_symptom = ("pe_as_parameter", "pe_plain_attribute", "learned_transposed", "lm_tables_in_state_dict",
                  "lm_tables_on_cpu")
    assert mistake.description in messages or mistake.id in by_symptom




@pytest.mark.parametrize("name", sorted(CORRECT_VARIANTS))
def test_correct_alternatives_keep_full_marks(suite: Suite, name: str) -> None:
    env = reference_env(suite)
    exec(CORRECT_VARIANTS[name], env)  # noqa: S102
    result = grade_namespace(suite, env, name=name)
    assert [c.message for c in result.cases if not c.passed] == []


def test_failure_message_says_expected_received_and_what_to_revisit(suite: Suite) -> None:
    mistake = next(m for m in MISTAKES if m.id == "pe_sin_cos_swapped")
    env = {**reference_env(suite), **reference_namespace(mistake)}
    result = grade_namespace(suite, env, name="swapped")
    msg = next(c.message for c in result.cases if c.id == "q2_sinusoidal_pe/table_d4")
    assert "expected" in msg and "received" in msg and "Revisit:" in msg
    assert "Likely cause: sin and cos are swapped" in msg
    assert len(msg) < 1200  # a few values, not a wall of numbers


def test_storage_mistakes_say_which(suite: Suite) -> None:
    for mistake_id, word in (("pe_as_parameter", "nn.Parameter"), ("pe_plain_attribute", "plain attribute")):
        mistake = next(m for m in MISTAKES if m.id == mistake_id)
        env = {**reference_env(suite), **reference_namespace(mistake)}
        result = grade_namespace(suite, env, name=mistake_id)
        msg = next(c.message for c in result.cases if c.id == "q3_sinusoidal_module/pe_is_buffer")
        assert word in msg


def test_local_check_raises_with_the_message(suite: Suite) -> None:
    from autograder.build import _case_json

    case = next(c for c in suite.cases if c["id"] == "q7_alibi/bias_values")
    payload = _case_json(case, suite.expected, {c["id"]: c for c in suite.cases})
    env = {**reference_env(suite)}
    checks.run_case(env, payload)  # the reference passes silently
    mistake = next(m for m in MISTAKES if m.id == "alibi_sign_flipped")
    env.update(reference_namespace(mistake))
    with pytest.raises(AssertionError) as info:
        checks.run_case(env, payload)
    assert "wrong sign" in str(info.value)


def test_plain_data_round_trip_refuses_objects() -> None:
    import numpy as np

    data = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": [1, "x", None, float("nan")]}
    back = checks.loads(checks.dumps(data))
    assert back["a"].dtype == np.float32 and (back["a"] == data["a"]).all()
    with pytest.raises(TypeError):
        checks.to_plain(np.array([object()]))
    with pytest.raises(TypeError):
        checks.to_plain({"x": object()})


# --------------------------------------------------------------------------- code that computes nothing

# Notebooks whose every stub does nothing (zeros, identities, its first argument, an unconditional
# ValueError) yet fakes the facts that property checks read: buffers, length checks, equal or differing
# pairs, a tied head. None may earn a point on any question.
_LM_SKELETON = '''
class TinyCharLM(nn.Module):
    SCHEMES = ("learned", "sinusoidal", "rope", "alibi", "none")

    def __init__(self, vocab_size, num_hiddens=128, num_heads=4, num_blks=2, pos="rope", max_len=512,
                 bias=False):
        super().__init__()
        self.pos, self.num_heads, self.max_len = pos, num_heads, max_len
        self.head_dim = num_hiddens // num_heads
        self.token_emb = nn.Embedding(vocab_size, num_hiddens)
        if pos == "learned":
            self.pos_emb = nn.Embedding(max_len, num_hiddens)
        if pos == "sinusoidal":
            self.register_buffer("pe", torch.zeros(max_len, num_hiddens))
        self.blks = nn.ModuleList(
            nn.ModuleDict({"qkv": nn.Linear(num_hiddens, 3 * num_hiddens, bias=bias),
                           "proj": nn.Linear(num_hiddens, num_hiddens, bias=bias)})
            for _ in range(num_blks))

    def add_positions(self, H):
        return H

    def attend(self, q, k, v):
        return ATTEND

    def hidden(self, X):
        B, T = X.shape
        H = self.add_positions(self.token_emb(X))
        for blk in self.blks:
            q, k, v = (u.reshape(B, T, self.num_heads, self.head_dim).transpose(1, 2)
                       for u in blk["qkv"](H).chunk(3, dim=-1))
            H = H + blk["proj"](self.attend(q, k, v).transpose(1, 2).reshape(B, T, -1))
        return H

    def forward(self, X):
        return F.linear(self.hidden(X), self.token_emb.weight)
'''

_MODULES = '''
class SinusoidalPE(nn.Module):
    def __init__(self, d_model, max_len=512):
        super().__init__()
        self.max_len = max_len
        self.register_buffer("pe", torch.zeros(max_len, d_model))

    def forward(self, x):
        if x.shape[1] > self.max_len:
            raise ValueError(f"sequence length {x.shape[1]} is longer than max_len={self.max_len}")
        return x + self.pe[: x.shape[1]]


class LearnedPE(nn.Module):
    def __init__(self, max_len, d_model):
        super().__init__()
        self.max_len = max_len
        self.table = nn.Embedding(max_len, d_model)

    def forward(self, x):
        if x.shape[1] > self.max_len:
            raise ValueError(f"sequence length {x.shape[1]} is longer than max_len={self.max_len}")
        return x
'''

DO_NOTHING = {
    "zeros": _MODULES + _LM_SKELETON.replace("ATTEND", "torch.zeros_like(v)") + '''
def self_attention(X, W_q, W_k, W_v, causal=False):
    return torch.zeros(X.shape[-2], W_v.shape[-1], dtype=X.dtype)

def sinusoidal_pe(max_len, d):
    if d % 2:
        raise ValueError("d must be even")
    return np.zeros((max_len, d))

def rope_cache(seq_len, d, base=10000.0):
    if d % 2:
        raise ValueError("d must be even")
    return torch.zeros(seq_len, d // 2), torch.zeros(seq_len, d // 2)

def apply_rope(x, cos, sin):
    return torch.zeros_like(x)

def rope_attention(q, k, v, causal=True):
    return torch.zeros_like(v)

def alibi_slopes(num_heads):
    return torch.zeros(num_heads)

def alibi_bias(num_heads, seq_len):
    return torch.zeros(num_heads, seq_len, seq_len)

def alibi_attention(q, k, v):
    return torch.zeros_like(v)
''',
    "identities": _MODULES + _LM_SKELETON.replace("ATTEND", "v") + '''
def self_attention(X, W_q, W_k, W_v, causal=False):
    return X @ W_v

def sinusoidal_pe(max_len, d):
    if d % 2:
        raise ValueError("d must be even")
    return np.ones((max_len, d))

def rope_cache(seq_len, d, base=10000.0):
    if d % 2:
        raise ValueError("d must be even")
    return torch.ones(seq_len, d // 2), torch.zeros(seq_len, d // 2)

def apply_rope(x, cos, sin):
    return x

def rope_attention(q, k, v, causal=True):
    return v

def alibi_slopes(num_heads):
    return torch.ones(num_heads)

def alibi_bias(num_heads, seq_len):
    return torch.zeros(num_heads, seq_len, seq_len)

def alibi_attention(q, k, v):
    return v
''',
    "queries": _MODULES + _LM_SKELETON.replace("ATTEND", "q") + '''
def self_attention(X, W_q, W_k, W_v, causal=False):
    return X @ W_q

def sinusoidal_pe(max_len, d):
    return np.zeros((max_len, d))

def rope_cache(seq_len, d, base=10000.0):
    return torch.ones(seq_len, d // 2), torch.zeros(seq_len, d // 2)

def apply_rope(x, cos, sin):
    return x

def rope_attention(q, k, v, causal=True):
    return q

def alibi_slopes(num_heads):
    return torch.ones(num_heads)

def alibi_bias(num_heads, seq_len):
    return torch.zeros(num_heads, seq_len, seq_len)

def alibi_attention(q, k, v):
    return q
''',
    "return_first_argument": _LM_SKELETON.replace("ATTEND", "q") + '''
class SinusoidalPE(nn.Module):
    def __init__(self, d_model, max_len=512):
        super().__init__()

    def forward(self, x):
        return x


class LearnedPE(SinusoidalPE):
    pass

def self_attention(X, W_q, W_k, W_v, causal=False):
    return X

def sinusoidal_pe(max_len, d):
    return max_len

def rope_cache(seq_len, d, base=10000.0):
    return seq_len

def apply_rope(x, cos, sin):
    return x

def rope_attention(q, k, v, causal=True):
    return q

def alibi_slopes(num_heads):
    return num_heads

def alibi_bias(num_heads, seq_len):
    return num_heads

def alibi_attention(q, k, v):
    return q
''',
    "always_value_error": '''
MESSAGE = "d must be even; sequence length 12 is longer than max_len=10"

class SinusoidalPE(nn.Module):
    def __init__(self, d_model, max_len=512):
        super().__init__()

    def forward(self, x):
        raise ValueError(MESSAGE)


class LearnedPE(SinusoidalPE):
    pass


class TinyCharLM(nn.Module):
    def __init__(self, *args, **kwargs):
        raise ValueError(MESSAGE)

def self_attention(*args, **kwargs):
    raise ValueError(MESSAGE)

sinusoidal_pe = rope_cache = apply_rope = rope_attention = self_attention
alibi_slopes = alibi_bias = alibi_attention = self_attention
''',
    "forged_facts": _MODULES + _LM_SKELETON.replace("ATTEND", "v") + '''
def self_attention(X, W_q, W_k, W_v, causal=False):
    if causal:
        return torch.randn(X.shape[-2], W_v.shape[-1], dtype=X.dtype)
    return torch.zeros(X.shape[-2], W_v.shape[-1], dtype=X.dtype)

def sinusoidal_pe(max_len, d):
    if d % 2:
        raise ValueError("d must be even")
    return np.zeros((max_len, d))

def rope_cache(seq_len, d, base=10000.0):
    if d % 2:
        raise ValueError("d must be even")
    return torch.ones(seq_len, d // 2), torch.zeros(seq_len, d // 2)

def apply_rope(x, cos, sin):
    return x

def rope_attention(q, k, v, causal=True):
    return torch.zeros_like(v)

def alibi_slopes(num_heads):
    return torch.zeros(num_heads)

def alibi_bias(num_heads, seq_len):
    return torch.zeros(num_heads, seq_len, seq_len)

def alibi_attention(q, k, v):
    return torch.zeros_like(v)
''',
}



@cache
def _do_nothing_scores(name: str) -> tuple[dict[str, float], tuple[str, ...]]:
    from autograder.judge import load_suite

    env = {"np": np, "torch": torch, "nn": nn, "F": F, "math": math}
    exec(DO_NOTHING[name], env)  # noqa: S102
    result = grade_namespace(load_suite(), env, name=name)
    return result.question_scores(), tuple(c.message for c in result.cases)


@pytest.mark.parametrize("name", sorted(DO_NOTHING))
def test_local_checks_and_exports_gate_properties_as_the_grader_does(suite: Suite, name: str) -> None:
    """The test files of Otter, nbgrader and the student's checks carry each property's value cases: a
    do-nothing notebook fails every public property case there too, and the reference passes them."""
    from autograder.build import _case_json

    env = {"np": np, "torch": torch, "nn": nn, "F": F, "math": math}
    exec(DO_NOTHING[name], env)  # noqa: S102
    cases = {c["id"]: c for c in suite.cases}
    gated = [c for c in suite.cases if c["requires"] and not c["hidden"]]
    assert gated
    result = {r.id: r for r in grade_namespace(suite, env, name=name).cases}
    for case in gated:
        payload = _case_json(case, suite.expected, cases)
        checks.run_case(reference_env(suite), payload)
        if result[case["id"]].passed:
            continue
        with pytest.raises(AssertionError) as info:
            checks.run_case(env, payload)
        assert info.value.args[0] == result[case["id"]].message  # one message, both places


@pytest.mark.parametrize("name", sorted(DO_NOTHING))
def test_code_that_computes_nothing_earns_nothing(suite: Suite, name: str) -> None:
    scores, _ = _do_nothing_scores(name)
    earned = {q: p for q, p in scores.items() if p > 0 and q != "m1_tinycharlm"}
    assert earned == {}


def test_a_milestone_model_that_computes_nothing_earns_nothing(suite: Suite) -> None:
    earned = {name: _do_nothing_scores(name)[0].get("m1_tinycharlm", 0) for name in DO_NOTHING}
    assert earned == {name: 0 for name in DO_NOTHING}


def test_a_gated_property_says_which_value_case_must_pass_first(suite: Suite) -> None:
    _, messages = _do_nothing_scores("zeros")
    msg = next(m for m in messages if m.startswith("q2_sinusoidal_pe/relative_identity_d4:"))
    assert "q2_sinusoidal_pe/table_d4" in msg and "first" in msg
    # Gates stay within a question: attention that returns zeros costs Q1 only.
    env = reference_env(suite)
    exec("def self_attention(X, W_q, W_k, W_v, causal=False):\n"  # noqa: S102
         "    return torch.zeros(X.shape[-2], W_v.shape[-1], dtype=X.dtype)\n", env)
    scores = _scores(suite, env)
    assert scores["q1_equivariance"] == 0
    assert all(scores[q.id] == pytest.approx(q.points) for q in suite.questions
               if q.id in scores and q.id != "q1_equivariance")
