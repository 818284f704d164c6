"""Grading the reference, the blank template, every catalogued mistake and correct alternatives."""

from __future__ import annotations

import pytest

from autograder import lesson83_checks as checks
from autograder.config import ROOT
from autograder.judge import Suite, grade_namespace, notebook_env, reference_env
from reference.mistakes import MISTAKES, reference_namespace

TEMPLATE = ROOT / "student_templates" / "lesson83" / "lesson83.ipynb"


def _scores(suite: Suite, env: dict) -> dict[str, float]:
    return grade_namespace(suite, env, name="t").question_scores()


def test_reference_earns_full_marks_on_every_question(suite: Suite) -> None:
    result = grade_namespace(suite, reference_env(suite), name="reference")
    failed = [c.message for c in result.cases if not c.passed]
    assert failed == []
    for q in suite.questions:
        if q.graded and not q.manual:
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
    assert mistake.description in messages or mistake.id in ("pe_as_parameter", "pe_plain_attribute",
                                                             "learned_transposed")


CORRECT_VARIANTS = {
    "loops_and_math": '''
def sinusoidal_pe(max_len, d):
    if d % 2 != 0:
        raise ValueError("d must be even")
    pe = np.zeros((max_len, d))
    for pos in range(max_len):
        for i in range(d // 2):
            w = 10000 ** (2 * i / d)
            pe[pos, 2 * i] = math.sin(pos / w)
            pe[pos, 2 * i + 1] = math.cos(pos / w)
    return pe
''',
    "exp_log_float32_module": '''
class SinusoidalPE(nn.Module):
    def __init__(self, d_model, max_len=512):
        super().__init__()
        self.max_len = max_len
        pe = torch.zeros(max_len, d_model)
        pos = torch.arange(max_len).float().unsqueeze(1)
        div = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
        pe[:, 0::2] = torch.sin(pos * div)
        pe[:, 1::2] = torch.cos(pos * div)
        self.register_buffer("pe", pe)

    def forward(self, x):
        if x.size(1) > self.max_len:
            raise ValueError(f"got {x.size(1)} positions but max_len is {self.max_len}")
        return x + self.pe[: x.size(1)].unsqueeze(0)
''',
    "einsum_attention": '''
def self_attention(X, W_q, W_k, W_v, causal=False):
    q, k, v = X @ W_q, X @ W_k, X @ W_v
    s = torch.einsum("id,jd->ij", q, k) / q.shape[-1] ** 0.5
    if causal:
        s = s + torch.triu(torch.full_like(s, float("-inf")), diagonal=1)
    return torch.einsum("ij,jd->id", s.softmax(-1), v)
''',
    "rope_numpy_inside": '''
def rope_cache(seq_len, d, base=10000.0):
    if d % 2:
        raise ValueError("d must be even")
    ang = np.outer(np.arange(seq_len), base ** (-np.arange(0, d, 2) / d))
    return torch.from_numpy(np.cos(ang)).float(), torch.from_numpy(np.sin(ang)).float()

def apply_rope(x, cos, sin):
    h = x.shape[-1] // 2
    rot = torch.cat([-x[..., h:], x[..., :h]], dim=-1)
    return x * torch.cat([cos, cos], -1) + rot * torch.cat([sin, sin], -1)
''',
    "alibi_loops": '''
def alibi_slopes(num_heads):
    return torch.tensor([2 ** (-8 * h / num_heads) for h in range(1, num_heads + 1)])

def alibi_bias(num_heads, seq_len):
    j = torch.arange(seq_len)
    return alibi_slopes(num_heads).view(-1, 1, 1) * (j.view(1, -1) - j.view(-1, 1))
''',
    "learned_parameter_lookup": '''
class LearnedPE(nn.Module):
    def __init__(self, max_len, d_model):
        super().__init__()
        self.max_len = max_len
        self.pos = nn.Embedding(max_len, d_model)

    def forward(self, x):
        if x.shape[1] > self.max_len:
            raise ValueError(f"length {x.shape[1]} exceeds max_len {self.max_len}")
        return x + self.pos.weight[: x.shape[1]]
''',
    "float64_module_table": '''
class SinusoidalPE(nn.Module):
    def __init__(self, d_model, max_len=512):
        super().__init__()
        self.register_buffer("pe", torch.from_numpy(sinusoidal_pe(max_len, d_model)))

    def forward(self, x):
        if x.shape[1] > self.pe.shape[0]:
            raise ValueError(f"T={x.shape[1]} > max_len={self.pe.shape[0]}")
        return x + self.pe[: x.shape[1]].to(x.dtype)
''',
    "torch_inside_sinusoidal": '''
def sinusoidal_pe(max_len, d):
    if d % 2 == 1:
        raise ValueError(f"d must be even, got {d}")
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]
    inv = torch.exp(-math.log(10000.0) * torch.arange(0, d, 2, dtype=torch.float64) / d)
    pe = torch.stack([torch.sin(pos * inv), torch.cos(pos * inv)], dim=-1).reshape(max_len, d)
    return pe.numpy()
''',
    "rope_inverse_frequency_explicit_base": '''
def rope_cache(seq_len, d, base=10000.0):
    if d % 2:
        raise ValueError("RoPE needs an even d")
    inv_freq = 1.0 / (base ** (torch.arange(0, d, 2).double() / d))
    t = torch.arange(seq_len).double()
    freqs = t[:, None] * inv_freq[None, :]
    return freqs.cos().float(), freqs.sin().float()

def rope_attention(q, k, v, causal=True):
    cos, sin = rope_cache(q.shape[-2], q.shape[-1], base=10000.0)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
''',
    "alibi_einsum_float64": '''
def alibi_attention(q, k, v):
    H, T, d = q.shape[-3:]
    s = torch.einsum("...id,...jd->...ij", q.double(), k.double()) / math.sqrt(d)
    s = s + alibi_bias(H, T).double()
    s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
    return (s.softmax(-1) @ v.double()).to(q.dtype)
''',
}


def test_mutation_score(suite: Suite, capsys: pytest.CaptureFixture) -> None:
    caught = 0
    for mistake in MISTAKES:
        env = {**reference_env(suite), **reference_namespace(mistake)}
        result = grade_namespace(suite, env, name=mistake.id)
        caught += result.total < suite.auto_points
    kept = 0
    for code in CORRECT_VARIANTS.values():
        env = reference_env(suite)
        exec(code, env)  # noqa: S102
        kept += grade_namespace(suite, env, name="variant").total == suite.auto_points
    with capsys.disabled():
        print(f"\nmutation score: {caught}/{len(MISTAKES)} mistakes caught ({100 * caught / len(MISTAKES):.0f}%), "
              f"{kept}/{len(CORRECT_VARIANTS)} correct variants kept full marks")
    assert caught == len(MISTAKES) and kept == len(CORRECT_VARIANTS) >= 8


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
    payload = _case_json(case, suite.expected[case["id"]])
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
