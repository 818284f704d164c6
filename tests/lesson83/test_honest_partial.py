"""The honest partial zoo (issue #40 finding 2, Done-when 2): uncatalogued near-misses keep every case that truly holds,
because a failing value case opens its gates when its output is a genuine attempt by the question's contract, judged
in the grader from what the probe recorded; the contract holds of the reference, every catalogued mistake and every
correct variant, and of no garbage; the local checks follow the same rule.

For each near-miss, PAYS lists the cases of its question that earn their points, worked out by hand:
- Q1, scaling after the softmax (softmax(QK^T) / sqrt(d_k) V): every value is off by 1/sqrt(d_k), yet the weights still
  come from the scores, so f(PX) = P f(X) holds and the causal mask still breaks the symmetry.
- Q1, a causal mask that also hides the diagonal (.triu()): row 0 of every causal output is NaN (its value cases fail,
  nothing else); the unmasked cases are right and the mask still breaks the symmetry.
- Q4, an extra LayerNorm after x + table: the values and the trainable count (the norm's 2 d parameters) are wrong; the
  length errors, the gradient rows (rows 0..T-1 only) and the device cases hold.
- Q4, the length check written T >= max_len: only the full-length forward raises, and the hidden table case, whose
  consequence forward runs at T = max_len; everything else holds (the raising value case holds back nothing else).
- Q6, scaling after the softmax, and RoPE applied to the attention output instead of q and k: every value (q = k = 0
  too) is wrong; both device cases hold.
- Q7, slopes 2^(-h) (the wrong power of two: right for 8 heads only): the cases with 8 heads pass, the Toeplitz
  cases and both device cases hold; every other slope, bias and attention value is wrong.
- M1, an explicit softmax without the 1/sqrt(d) scale in TinyCharLM.attend: the logits of every scheme are wrong, and so
  are the cases that compare logits with the reference's under a change (the state-dict consequences, the tied
  head); causality, prefix consistency, the unrotated values (q = k = 0: no scores to scale) and the devices hold.
"""

from __future__ import annotations

from functools import cache

import pytest

from autograder.authoring.suite import Suite, reference_env
from autograder.course import course_of
from autograder.grading.judge import grade_namespace
from autograder.model import SubmissionResult
from autograder.release.common import case_json
from helpers.zoo import GARBAGE, GARBAGE_ON_REFERENCE
from reference.lesson83_mistakes import MISTAKES, reference_namespace
from reference.variants import CORRECT_VARIANTS

HONEST: dict[str, str] = {
    "q1_scale_after_softmax": '''
def self_attention(X, W_q, W_k, W_v, causal=False):
    Q, K, V = X @ W_q, X @ W_k, X @ W_v
    scores = Q @ K.transpose(-2, -1)
    if causal:
        T = X.shape[-2]
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(scores, dim=-1) / math.sqrt(Q.shape[-1]) @ V
''',
    "q1_mask_hides_diagonal": '''
def self_attention(X, W_q, W_k, W_v, causal=False):
    Q, K, V = X @ W_q, X @ W_k, X @ W_v
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
    if causal:
        T = X.shape[-2]
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(), float("-inf"))
    return torch.softmax(scores, dim=-1) @ V
''',
    "q4_layernorm": '''
class LearnedPE(nn.Module):
    def __init__(self, max_len, d_model):
        super().__init__()
        self.max_len = max_len
        self.table = nn.Embedding(max_len, d_model)
        self.norm = nn.LayerNorm(d_model)

    def forward(self, x):
        T = x.shape[1]
        if T > self.max_len:
            raise ValueError(f"sequence length {T} is longer than max_len={self.max_len}")
        return self.norm(x + self.table(torch.arange(T, device=x.device)))
''',
    "q4_length_check_ge": '''
class LearnedPE(nn.Module):
    def __init__(self, max_len, d_model):
        super().__init__()
        self.max_len = max_len
        self.table = nn.Embedding(max_len, d_model)

    def forward(self, x):
        T = x.shape[1]
        if T >= self.max_len:
            raise ValueError(f"sequence length {T} is longer than max_len={self.max_len}")
        return x + self.table(torch.arange(T, device=x.device))
''',
    "q6_scale_after_softmax": '''
def rope_attention(q, k, v, causal=True):
    T, d = q.shape[-2], q.shape[-1]
    cos, sin = (t.to(q.device) for t in rope_cache(T, d))
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    scores = q @ k.transpose(-2, -1)
    if causal:
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(scores, dim=-1) / math.sqrt(d) @ v
''',
    "q6_rope_on_output": '''
def rope_attention(q, k, v, causal=True):
    T, d = q.shape[-2], q.shape[-1]
    cos, sin = (t.to(q.device) for t in rope_cache(T, d))
    scores = q @ k.transpose(-2, -1) / math.sqrt(d)
    if causal:
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return apply_rope(torch.softmax(scores, dim=-1) @ v, cos, sin)
''',
    "q7_slopes_wrong_power": '''
def alibi_slopes(num_heads):
    h = torch.arange(1, num_heads + 1, dtype=torch.float64)
    return (2.0 ** (-h)).float()
''',
    "m1_softmax_without_scale": '''
class TinyCharLM(TinyCharLM):
    def attend(self, q, k, v):
        T = q.shape[-2]
        if self.pos == "rope":
            cos, sin = self.rope_cos[:T], self.rope_sin[:T]
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        scores = q @ k.transpose(-2, -1)
        if self.pos == "alibi":
            scores = scores + self.alibi_mask[:, :T, :T]
        else:
            future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
            scores = scores.masked_fill(future, float("-inf"))
        return torch.softmax(scores, dim=-1) @ v
''',
}

QUESTION = {"q1": "q1_equivariance", "q4": "q4_learned_pe", "q6": "q6_rope_attention", "q7": "q7_alibi",
            "m1": "m1_tinycharlm"}

PAYS: dict[str, set[str]] = {
    "q1_scale_after_softmax": {"permutation_equivariant", "causal_breaks_symmetry", "hidden_equivariant_long"},
    "q1_mask_hides_diagonal": {"matches_reference", "permutation_equivariant", "causal_breaks_symmetry",
                               "hidden_matches_larger", "hidden_equivariant_long"},
    "q4_layernorm": {"too_long_raises", "grad_only_used_rows", "any_device", "hidden_too_long_raises",
                     "hidden_grad_rows", "hidden_any_device"},
    "q4_length_check_ge": {"table_shape", "forward_adds_rows", "too_long_raises", "grad_only_used_rows", "any_device",
                           "hidden_too_long_raises", "hidden_grad_rows", "hidden_any_device"},
    "q6_scale_after_softmax": {"any_device", "hidden_any_device"},
    "q6_rope_on_output": {"any_device", "hidden_any_device"},
    "q7_slopes_wrong_power": {"bias_depends_on_offset", "any_device", "hidden_slopes_h8", "hidden_attention_heads",
                              "hidden_bias_depends_on_offset", "hidden_any_device"},
    "m1_softmax_without_scale": {"causal_rope", "causal_alibi", "prefix_learned", "prefix_alibi", "values_not_rotated",
                                 "same_device", "hidden_causal_none", "hidden_prefix_rope", "hidden_prefix_sinusoidal",
                                 "hidden_same_device"},
}


def _namespace(code: str) -> dict:
    """The reference notebook with `code` run in its namespace (so the reference's other functions call it)."""
    ns = reference_namespace()
    exec(code, ns)  # noqa: S102 - test code
    return {**reference_env(course_of().suite), **ns}


@cache
def _graded(name: str) -> SubmissionResult:
    suite = course_of().suite
    return grade_namespace(suite, _namespace(HONEST[name]), name=name)


@pytest.mark.parametrize("name", sorted(HONEST))
def test_an_honest_near_miss_keeps_exactly_what_holds(suite: Suite, name: str) -> None:
    question = QUESTION[name.split("_")[0]]
    result = _graded(name)
    paid = {c.id.split("/", 1)[1] for c in result.cases if c.question == question and c.passed}
    assert paid == PAYS[name]
    assert all(c.points == c.max_points for c in result.cases if c.passed)


# --------------------------------------------------------------------------- the contracts themselves


def _contracted(suite: Suite) -> list:
    """The value cases whose probe this lesson judges by a contract of its own (not by `within:` alone)."""
    return [c for c in suite.cases if not c.requires and (c.probe in ("attention", "module_forward", "lm_logits") or (
        c.probe == "call" and c.args.get("fn") == "alibi_bias"))]


def _gap(suite: Suite, case, env: dict) -> str:
    """attempt_gap of the case's output in env, judged as if nothing (no reference, no catalogued mistake) matched it:
    the genuine-attempt test and the contract alone."""
    checks = suite.lesson.checks
    got = checks.run_probe(env, case.probe, case.args)
    want = suite.expected[case.id]["value"]
    far = {"value": {k: v + 1e3 if k == "value" else v for k, v in want.items()}, "variants": []}
    return checks.attempt_gap(case.plain(), got, far)


def _code_of(question: str) -> list[tuple[str, str]]:
    return [(m.id, m.code) for m in MISTAKES if m.question == question]


@pytest.mark.parametrize("question", ["q1_equivariance", "q4_learned_pe", "q3_sinusoidal_module", "q6_rope_attention",
                                      "q7_alibi", "m1_tinycharlm"])
def test_the_reference_every_catalogued_mistake_and_variant_meet_the_contract(suite: Suite, question: str) -> None:
    cases = [c for c in _contracted(suite) if c.question == question]
    assert cases
    broken = []
    for name, code in [("reference", ""), *_code_of(question), *CORRECT_VARIANTS.items()]:
        env = _namespace(code)
        broken += [f"{name}: {c.id}: {gap}" for c in cases if (gap := _gap(suite, c, env))]
    assert broken == []


def test_garbage_breaks_the_contract_though_it_passes_the_generic_tests(suite: Suite) -> None:
    """Generic tests (not constant, not an input, the same when called again) are necessary, not sufficient: finding
    3's garbage passes them on every contracted case where it runs, and breaks the contract on every one."""
    env: dict = {}
    exec(GARBAGE["finding3"], env)  # noqa: S102 - test code
    checks, generic, broken = suite.lesson.checks, [], []
    for case in _contracted(suite):
        got = checks.run_probe(env, case.probe, case.args)
        if "error" in got:
            continue
        want = suite.expected[case.id]["value"]
        if not checks.degenerate(case.plain(), got, want, ["value"], inputs=lambda c: []):
            generic.append(case.id)
        if not _gap(suite, case, env):
            broken.append(case.id)
    assert broken == []
    assert {"q6_rope_attention/matches_reference", "q4_learned_pe/forward_adds_rows",
            "m1_tinycharlm/logits_none"} <= set(generic)


@pytest.mark.parametrize("question", sorted(GARBAGE_ON_REFERENCE))
def test_one_questions_garbage_breaks_its_contract(suite: Suite, question: str) -> None:
    env = _namespace(GARBAGE_ON_REFERENCE[question])
    assert all(_gap(suite, c, env) for c in _contracted(suite) if c.question == question)


def test_nan_rows_fail_their_value_case_only(suite: Suite) -> None:
    """A NaN row (a mask that hides the diagonal) fails its value case, and the output is still a genuine attempt; an
    output mostly NaN is not."""
    case = next(c for c in suite.cases if c.id == "q1_equivariance/causal_matches_reference")
    assert _gap(suite, case, _namespace(HONEST["q1_mask_hides_diagonal"])) == ""
    mostly_nan = HONEST["q1_mask_hides_diagonal"].replace("return torch.softmax(scores, dim=-1) @ V",
                                                          "return (torch.softmax(scores, dim=-1) @ V) * torch.nan")
    assert "NaN" in _gap(suite, case, _namespace(mostly_nan))


def test_the_local_check_follows_the_same_rule(suite: Suite) -> None:
    """A student's local check (Otter's and nbgrader's test files run checks_runtime's run_case in the kernel) passes
    a property next to an honest near-miss's failing value case, and fails it next to garbage, as the grader does."""
    checks = suite.lesson.checks
    cases = {c.id: c for c in suite.cases}
    case = cases["q6_rope_attention/any_device"]
    payload = case_json(case, suite.expected, cases, lesson=suite.lesson, limits={})
    checks.run_case(_namespace(HONEST["q6_rope_on_output"]), payload)  # passes: raises nothing
    with pytest.raises(AssertionError, match="counts once"):
        checks.run_case(_namespace(GARBAGE_ON_REFERENCE["q6_rope_attention"]), payload)


def test_a_value_case_that_raises_opens_its_gates_only_by_the_contracts_calls(suite: Suite) -> None:
    """The full-length forward of a `T >= max_len` check raises, and its probe's shorter calls meet the contract;
    a module that raises on every input shows nothing."""
    case = next(c for c in suite.cases if c.id == "q4_learned_pe/hidden_full_length")
    assert _gap(suite, case, _namespace(HONEST["q4_length_check_ge"])) == ""
    always = HONEST["q4_length_check_ge"].replace("if T >= self.max_len:", "if True:")
    assert _gap(suite, case, _namespace(always)).startswith("it raised an error")


def test_the_grader_decides_from_the_recorded_outputs(suite: Suite) -> None:
    """judge_outputs (the grader's process) judges the contract from the outputs the child recorded: the same near-miss
    outputs with the contract's turned call made to disagree close the gate there; no verdict comes from the child."""
    from autograder.grading.judge import judge_outputs, probe_namespace

    outputs = probe_namespace(suite, _namespace(HONEST["q6_rope_on_output"]))
    honest = {r.id: r.passed for r in judge_outputs(suite, outputs)}
    assert honest["q6_rope_attention/any_device"]
    for key in ("turned", "turned_pairs"):
        calls = outputs["q6_rope_attention/matches_reference"]["contract"]
        calls[key] = calls[key] + 1.0
    forged = {r.id: r.passed for r in judge_outputs(suite, outputs)}
    assert not forged["q6_rope_attention/any_device"]
