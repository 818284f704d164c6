"""Issue 32 (findings 5, 6, 7, 9): a check asks only what its question's text asks, Q4 checks the device its text
asks for, and a mistake costs its own question once, whether it returns a wrong value or raises."""

from __future__ import annotations

import re

import pytest

from autograder.authoring.questions import load_questions
from autograder.authoring.suite import Suite, reference_env
from autograder.course import course_of
from autograder.grading.judge import grade_namespace
from reference.lesson83_mistakes import reference_namespace


def _graded(suite: Suite, code: str):
    """The reference notebook with `code` run on top (a student's mistake), judged in this process."""
    ns = reference_namespace()
    exec(compile(code, "<student>", "exec"), ns)  # noqa: S102 - trusted test code
    return grade_namespace(suite, {**reference_env(suite), **ns}, name="student")


def _lost(suite: Suite, result) -> dict[str, float]:
    points = {q.id: q.points for q in suite.questions}
    return {q: round(points[q] - s, 2) for q, s in result.question_scores().items() if s < points[q] - 1e-9}


# --------------------------------------------------------------------------- 32.3: only what the text asks


def _asks(sentence: str, word: str, case_args: dict) -> bool:
    """Whether a sentence of the question's text that names ValueError asks for this word in its message: the
    word itself, or a number of the case's arguments where the sentence asks to name both numbers."""
    if word.lower() in sentence.lower():
        return True
    numbers = set(re.findall(r"\d+", str(case_args)))
    return word.isdigit() and word in numbers and re.search(r"\bnam(e|es|ing)\b[^.]*\bboth\b", sentence) is not None


def test_every_required_message_word_is_asked_for_by_its_question_text() -> None:
    """A `words:` entry of a case (what a ValueError's message must contain) must be asked for by the question's
    student-facing text (its rendered markdown cells), in a sentence that names ValueError."""
    unasked = []
    for q in load_questions(course_of().config, course_of().lesson):
        prose = " ".join(c.source for c in q.cells if c.kind == "markdown")
        sentences = [s for s in re.split(r"(?<=[.!?])\s+", prose) if "ValueError" in s]
        for case in q.cases:
            unasked += [f"{case.id}: {w!r}" for w in case.words
                        if not any(_asks(s, w, case.args) for s in sentences)]
    assert unasked == [], f"message words no question text asks for: {unasked}"


def test_a_value_error_message_without_the_unstated_word_keeps_its_points(suite: Suite) -> None:
    """Q2, Q3 and Q5 ask for a ValueError only: its message is the student's (finding 5)."""
    result = _graded(suite, '''
def sinusoidal_pe(max_len, d, _right=sinusoidal_pe):
    if d % 2:
        raise ValueError(f"d={d} is odd")
    return _right(max_len, d)

def rope_cache(seq_len, d, base=10000.0, _right=rope_cache):
    if d % 2:
        raise ValueError(f"d={d} is odd")
    return _right(seq_len, d, base)

class SinusoidalPE(SinusoidalPE):
    def forward(self, x):
        if x.shape[1] > self.pe.shape[0]:
            raise ValueError("the sequence is longer than the table")
        return super().forward(x)
''')
    assert _lost(suite, result) == {}, [c.message for c in result.cases if not c.passed]


# --------------------------------------------------------------------------- 32.3: Q4 on any device


def test_learned_positions_made_on_the_cpu_lose_q4s_device_cases(suite: Suite) -> None:
    """Q4's text asks for torch.arange(T, device=x.device) (finding 6): positions made on the CPU lose Q4's device
    cases, with the catalogued cause, and nothing else."""
    result = _graded(suite, '''
class LearnedPE(LearnedPE):
    def forward(self, x):
        T = x.shape[1]
        if T > self.max_len:
            raise ValueError(f"sequence length {T} is longer than max_len={self.max_len}")
        return x + self.table(torch.arange(T))
''')
    failed = [c for c in result.cases if not c.passed]
    assert {c.id for c in failed} == {"q4_learned_pe/any_device", "q4_learned_pe/hidden_any_device"}
    assert all(c.diagnosis == "learned_positions_on_cpu" and "torch.arange" in c.message for c in failed)
    assert set(_lost(suite, result)) == {"q4_learned_pe"}


# --------------------------------------------------------------------------- 32.4: one penalty when it raises


BATCHED_AXIS = '''
def apply_rope(x, cos, sin):
    half = x.shape[1] // 2  # the wrong axis once x has leading axes
    x1, x2 = x[..., :half], x[..., half:]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
'''


def test_an_apply_rope_that_raises_on_batched_input_costs_q5_only(suite: Suite) -> None:
    """Finding 7: the error costs Q5's batched cases; Q6 and M1, which call apply_rope on batched input, leave the
    cases that raise it out of their totals rather than failing them again."""
    result = _graded(suite, BATCHED_AXIS)
    assert set(_lost(suite, result)) == {"q5_rope"}, _lost(suite, result)
    left_out = [c for c in result.cases if "left out of this question's total" in c.message]
    assert {c.question for c in left_out} == {"q6_rope_attention", "m1_tinycharlm"}
    assert all("your Q5" in c.message and "RuntimeError" in c.message for c in left_out)


def test_a_left_out_case_earns_the_share_of_its_questions_other_cases(suite: Suite) -> None:
    """With the same raising apply_rope and a Q6 mistake of its own (scores not scaled), Q6's left-out cases earn
    what its judged cases earn, so Q6 loses in proportion, never the left-out cases' whole weight."""
    result = _graded(suite, BATCHED_AXIS + '''
def rope_attention(q, k, v, causal=True):
    T, d = q.shape[-2], q.shape[-1]
    cos, sin = (t.to(q.device) for t in rope_cache(T, d))
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    scores = q @ k.transpose(-2, -1)
    if causal:
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v
''')
    q6 = [c for c in result.cases if c.question == "q6_rope_attention"]
    out = [c for c in q6 if "left out" in c.message]
    judged = [c for c in q6 if c not in out]
    share = sum(c.points for c in judged) / sum(c.max_points for c in judged)
    assert out and 0 < share < 1
    assert all(c.points == pytest.approx(c.max_points * share, abs=1e-3) for c in out)


def test_frozen_parameter_rope_tables_cost_only_the_state_dict_cases(suite: Suite) -> None:
    """Finding 7: RoPE tables stored as frozen nn.Parameters are a storage mistake (the state-dict cases); the
    probes no longer overwrite them with random values, so the logits cases hold."""
    result = _graded(suite, '''
class TinyCharLM(TinyCharLM):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.pos == "rope":
            cos, sin = rope_cache(self.max_len, self.head_dim)
            del self.rope_cos, self.rope_sin
            self.rope_cos = nn.Parameter(cos, requires_grad=False)
            self.rope_sin = nn.Parameter(sin, requires_grad=False)
''')
    failed = {c.id for c in result.cases if not c.passed}
    assert failed == {"m1_tinycharlm/state_dict_rope", "m1_tinycharlm/hidden_state_dict_rope"}, failed


# --------------------------------------------------------------------------- 32.4: which tensor was off device


@pytest.mark.parametrize("fn, mask, question", [
    ("rope_attention", "torch.ones(T, T, dtype=torch.bool, device=q.device)", "q6_rope_attention"),
    ("alibi_attention", "torch.ones(T, T, dtype=torch.bool, device=q.device)", "q7_alibi"),
])
def test_a_mask_made_on_the_cpu_is_named_as_the_cause_not_the_tables(suite: Suite, fn: str, mask: str,
                                                                     question: str) -> None:
    """Finding 9: only the causal mask is made on the CPU; the likely cause names it (a bool tensor of shape
    (T, T)), not the RoPE tables or the ALiBi bias, which were moved."""
    source = reference_namespace()[fn]
    import inspect
    code = inspect.getsource(source).replace(mask, "torch.ones(T, T, dtype=torch.bool)")
    assert "device=q.device)" not in code.split("torch.ones(T, T")[1].split("\n")[0]
    result = _graded(suite, re.sub(r"\s*# (BEGIN|END) SOLUTION", "", code))
    failed = [c for c in result.cases if not c.passed]
    assert failed and {c.question for c in failed} == {question}
    for c in failed:
        cause = c.message.split("Likely cause:", 1)[1]
        assert "bool tensor of shape" in cause and "RoPE tables" not in cause and "ALiBi bias" not in cause
        assert c.diagnosis is None
