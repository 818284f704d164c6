"""Grading Lesson 83: its reference, its blank template, every catalogued mistake and correct alternative, and its
questions' checks, gates and messages. The judge's engine behaviour (messages, stubs, local and Otter checks, plain
data) is tested on the demo lesson: tests/engine/test_judge_engine.py."""

from __future__ import annotations

import functools
import math
from functools import cache

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from autograder.authoring.suite import Suite, reference_env
from autograder.config import ROOT
from autograder.course import course_of
from autograder.grading.judge import grade_namespace, notebook_env
from autograder.release.common import grader_limits
from helpers.attempts import DO_NOTHING
from reference.lesson83_mistakes import MISTAKES, reference_namespace
from reference.variants import CORRECT_VARIANTS

TEMPLATE = ROOT / "student_templates" / "lesson83" / "lesson83.ipynb"
LESSON = course_of().lesson
LIMITS = grader_limits(course_of().config)  # the grader's time limits each case carries
checks = LESSON.checks


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


def test_storage_mistakes_say_which(suite: Suite) -> None:
    for mistake_id, word in (("pe_as_parameter", "nn.Parameter"), ("pe_plain_attribute", "plain attribute")):
        mistake = next(m for m in MISTAKES if m.id == mistake_id)
        env = {**reference_env(suite), **reference_namespace(mistake)}
        result = grade_namespace(suite, env, name=mistake_id)
        msg = next(c.message for c in result.cases if c.id == "q3_sinusoidal_module/pe_is_buffer")
        assert word in msg


# --------------------------------------------------------------------------- code that computes nothing

# hidden and forward: the template gives them as they are, the reference's own


@cache
def _do_nothing_scores(name: str) -> tuple[dict[str, float], tuple[str, ...]]:
    from autograder.course import course_of

    env = {"np": np, "torch": torch, "nn": nn, "F": F, "math": math}
    exec(DO_NOTHING[name], env)  # noqa: S102
    result = grade_namespace(course_of().suite, env, name=name)
    return result.question_scores(), tuple(c.message for c in result.cases)


@pytest.mark.parametrize("name", sorted(DO_NOTHING))
def test_local_checks_and_exports_gate_properties_as_the_grader_does(suite: Suite, name: str) -> None:
    """The test files of Otter, nbgrader and the student's checks carry each property's value cases: a
    do-nothing notebook fails every public property case there too, and the reference passes them."""
    from autograder.release.common import case_json

    env = {"np": np, "torch": torch, "nn": nn, "F": F, "math": math}
    exec(DO_NOTHING[name], env)  # noqa: S102
    cases = {c.id: c for c in suite.cases}
    gated = [c for c in suite.cases if c.requires and not c.hidden]
    assert gated
    result = {r.id: r for r in grade_namespace(suite, env, name=name).cases}
    for case in gated:
        payload = case_json(case, suite.expected, cases, lesson=LESSON, limits=LIMITS)
        checks.run_case(reference_env(suite), payload)
        if result[case.id].passed:
            continue
        with pytest.raises(AssertionError) as info:
            checks.run_case(env, payload)
        said = result[case.id].message
        if ": waits for " in said and said.rsplit(", as ", 1)[-1].endswith(" says"):
            # the grader says a question's gate once (its first gated case) and points the others to it; the
            # local check of the case itself gives the whole sentence
            assert info.value.args[0].startswith(f"{case.name}: counts once "), info.value.args[0]
        elif "left out of this question's total" not in said:  # left out: a grading-time rescaling (one penalty)
            # one message, both places: the student's local copy names the cases without the grader's ids
            assert info.value.args[0] == said.replace(f"{case.question}/", "")


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
    assert "work on `table_d4` first" in msg and "q2_sinusoidal_pe/table_d4" not in msg.split(": ", 1)[1]
    # Gates stay within a question: attention that returns zeros costs Q1 only.
    env = reference_env(suite)
    exec("def self_attention(X, W_q, W_k, W_v, causal=False):\n"  # noqa: S102
         "    return torch.zeros(X.shape[-2], W_v.shape[-1], dtype=X.dtype)\n", env)
    scores = _scores(suite, env)
    assert scores["q1_equivariance"] == 0
    assert all(scores[q.id] == pytest.approx(q.points) for q in suite.questions
               if q.id in scores and q.id != "q1_equivariance")


# --------------------------------------------------------------------------- one penalty per mistake (#11)

EARLIER = {"pe_sin_cos_swapped": "Q2 `sinusoidal_pe`", "pe_exponent_i_over_d": "Q2 `sinusoidal_pe`",
           "rope_interleaved": "Q5 `rope_cache` and `apply_rope`",
           "rope_negative_angle": "Q5 `rope_cache` and `apply_rope`",
           "alibi_sign_flipped": "Q7 `alibi_slopes` and `alibi_bias`"}


@pytest.mark.parametrize("mistake_id", sorted(EARLIER))
def test_a_wrong_earlier_function_costs_points_only_where_it_is_made(suite: Suite, mistake_id: str) -> None:
    """Q3 adds the student's own Q2 table and Q6 uses their own Q5 RoPE, so both keep full marks; the milestone
    cannot be isolated, so each of its failures names the earlier function."""
    mistake = next(m for m in MISTAKES if m.id == mistake_id)
    result = grade_namespace(suite, {**reference_env(suite), **reference_namespace(mistake)}, name=mistake_id)
    points = {q.id: q.points for q in suite.questions}
    lost = {q for q, s in result.question_scores().items() if s < points[q] - 1e-9}
    assert lost == {mistake.question, "m1_tinycharlm"}
    failed = [c for c in result.cases if c.question == "m1_tinycharlm" and not c.passed]
    assert failed and all(f"This comes from your {EARLIER[mistake_id]}" in c.message for c in failed)


def test_local_checks_judge_later_questions_against_the_students_own_earlier_output(suite: Suite) -> None:
    from autograder.release.common import case_json

    cases = {c.id: c for c in suite.cases}
    for mistake_id, case_id in (("pe_sin_cos_swapped", "q3_sinusoidal_module/forward_adds_table"),
                                ("rope_interleaved", "q6_rope_attention/matches_reference")):
        mistake = next(m for m in MISTAKES if m.id == mistake_id)
        payload = case_json(cases[case_id], suite.expected, cases, lesson=LESSON, limits=LIMITS)
        assert "basis" not in checks.loads(payload)["expected"]["value"]  # no reference table ships for this
        checks.run_case({**reference_env(suite), **reference_namespace(mistake)}, payload)  # passes


def test_milestone_bases_mirror_public_cases_of_the_earlier_question(suite: Suite) -> None:
    """A milestone case names the earlier function by comparing its output with the expected value of a public
    case of that question, so its test file holds no value a student could not already see."""
    public = {(c.question, c.probe, checks.dumps(c.args)) for c in suite.cases if not c.hidden}
    bases = [c for c in suite.cases if "basis" in c.args]
    assert {c.question for c in bases} == {"q3_sinusoidal_module", "q6_rope_attention", "m1_tinycharlm"}
    for case in bases:
        spec = case.args["basis"]
        if not spec.get("own"):
            assert (spec["question"], spec["probe"], checks.dumps(spec["args"])) in public  # hidden ones too


def test_a_constant_table_earns_no_q3_points_and_the_message_names_q2(suite: Suite) -> None:
    """A zero table and a forward that returns x "add the student's own table correctly": a degenerate table is
    not a genuine attempt, so Q3 is judged against the reference and says where the cause is."""
    env = reference_env(suite)
    exec("def sinusoidal_pe(max_len, d):\n    return np.zeros((max_len, d))\n"  # noqa: S102
         "class SinusoidalPE(SinusoidalPE):\n    def forward(self, x):\n        return x\n", env)
    result = grade_namespace(suite, env, name="constant")
    assert result.question_scores()["q3_sinusoidal_module"] == 0
    msg = next(c.message for c in result.cases if c.id == "q3_sinusoidal_module/forward_adds_table")
    assert "This comes from your Q2 `sinusoidal_pe`" in msg and "does not change with position" in msg


def test_a_milestone_scheme_whose_logits_are_wrong_costs_at_least_its_sixth(suite: Suite) -> None:
    """Five schemes: wrong logits of one cost at least a sixth of m1 (not a fifth: its properties that still hold,
    causality or the prefix, keep their points next to a genuine attempt, #21.2)."""
    cases = [c for c in suite.cases if c.question == "m1_tinycharlm"]
    points = next(q.points for q in suite.questions if q.id == "m1_tinycharlm")

    def waits_for(case: dict, name: str) -> bool:
        reqs = case.requires
        return name in reqs or any(waits_for(next(c for c in cases if c.name == r), name) for r in reqs)

    for pos in ("learned", "sinusoidal", "rope", "alibi", "none"):
        names = (f"logits_{pos}", f"hidden_logits_{pos}")
        cost = sum(c.points for c in cases if c.name in names or any(waits_for(c, n) for n in names))
        assert cost >= points / 6 - 1e-6, pos
    for mistake_id in ("lm_rope_model_width", "lm_alibi_bias_scaled"):  # a whole scheme broken inside the model
        mistake = next(m for m in MISTAKES if m.id == mistake_id)
        scores = _scores(suite, {**reference_env(suite), **reference_namespace(mistake)})
        assert scores["m1_tinycharlm"] <= points * 5 / 6 + 1e-6


# --------------------------------------------------------------------------- messages (#11)


def test_an_alibi_mismatch_shows_a_row_with_past_keys(suite: Suite) -> None:
    mistake = next(m for m in MISTAKES if m.id == "alibi_sign_flipped")
    result = grade_namespace(suite, {**reference_env(suite), **reference_namespace(mistake)}, name="sign")
    msg = next(c.message for c in result.cases if c.id == "q7_alibi/bias_values")
    assert "expected row [0, 4]: [-1.0000, -0.7500, -0.5000, -0.2500, 0.0000]" in msg


def test_a_learned_table_with_the_wrong_number_of_rows_is_not_read_by_its_columns(suite: Suite) -> None:
    case = next(c for c in suite.cases if c.id == "q4_learned_pe/grad_only_used_rows")
    env = reference_env(suite)
    exec("class LearnedPE(LearnedPE):\n"  # noqa: S102
         "    def __init__(self, max_len, d_model):\n"
         "        super().__init__(max_len, d_model)\n"
         "        self.table = nn.Embedding(max_len + 3, d_model)\n", env)
    verdict = checks.judge(case.plain(), checks.run_probe(env, case.probe, case.args), suite.expected[case.id])
    assert not verdict.passed and "has 13 rows" in verdict.message and "[0, 1, 2, 3, 4, 5, 6, 7]" not in verdict.message


def test_a_scaled_alibi_bias_is_not_blamed_on_the_slopes(suite: Suite) -> None:
    env = reference_env(suite)
    exec("def alibi_attention(q, k, v):\n"  # noqa: S102
         "    H, T, d = q.shape[-3], q.shape[-2], q.shape[-1]\n"
         "    scores = (q @ k.transpose(-2, -1) + alibi_bias(H, T).to(q.dtype)) / math.sqrt(d)\n"
         "    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float('-inf'))\n"
         "    return torch.softmax(scores, dim=-1) @ v\n", env)
    result = grade_namespace(suite, env, name="scaled_bias")
    failed = [c for c in result.cases if not c.passed]
    assert failed and {c.question for c in failed} == {"q7_alibi"}
    revisit = {c.id: c.revisit for c in suite.cases}
    assert not any("slopes depend" in c.message or "slopes depend" in revisit[c.id] for c in failed)
    msg = next(c.message for c in failed if c.id == "q7_alibi/attention_matches")
    assert "Likely cause: the ALiBi bias is divided by sqrt(d)" in msg


def test_a_property_next_to_wrong_values_names_no_catalogued_mistake(suite: Suite) -> None:
    """Outputs of the rope and none models that differ with q = k = 0 are no proof that v is rotated: here the
    rope scheme lacks the causal mask. The case fails and names no catalogued mistake."""
    env = reference_env(suite)
    exec("class TinyCharLM(TinyCharLM):\n"  # noqa: S102
         "    def attend(self, q, k, v):\n"
         "        if self.pos == 'rope':\n"
         "            cos, sin = self.rope_cos[:q.shape[-2]], self.rope_sin[:q.shape[-2]]\n"
         "            return F.scaled_dot_product_attention(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v)\n"
         "        return super().attend(q, k, v)\n", env)
    result = grade_namespace(suite, env, name="rope_not_causal")
    case = next(c for c in result.cases if c.id == "m1_tinycharlm/values_not_rotated")
    assert not case.passed and case.diagnosis is None and "v as well" not in case.message
    assert "Likely cause" not in case.message  # the rope logits are a genuine attempt: the property is judged


def test_local_check_judges_a_gate_again_when_the_function_is_rebound(suite: Suite) -> None:
    """Within one grader.check a gate reuses the verdict of a value case just judged, but never after the
    student rebinds the function it judged: a do-nothing table must not pass odd_d_raises on a stale verdict."""
    from autograder.release.common import case_json

    cases = {c.id: c for c in suite.cases}
    table, raises = (case_json(cases[f"q2_sinusoidal_pe/{n}"], suite.expected, cases, lesson=LESSON, limits=LIMITS)
                     for n in ("table_d4", "odd_d_raises"))
    checks.MEMO.clear()
    env = dict(reference_env(suite))
    checks.check_case(env, table)  # the reference table passes and its verdict is remembered

    def zeros_but_raises(max_len: int, d: int) -> torch.Tensor:
        if d % 2:
            raise ValueError("d must be even")
        return torch.zeros(max_len, d)

    env["sinusoidal_pe"] = zeros_but_raises
    with pytest.raises(AssertionError) as info:
        checks.check_case(env, raises)  # its own check passes; the gate (table_d4) is judged again and fails
    assert "table_d4" in str(info.value), str(info.value)
    checks.MEMO.clear()


INPLACE_THEN_CPU = (
    "class TinyCharLM(TinyCharLM):\n"
    "    def attend(self, q, k, v):\n"
    "        if self.pos != 'none':\n"
    "            return super().attend(q, k, v)\n"
    "        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)\n"
    "        out.mul_(1.0)  # in place on the attention output: allowed\n"
    "        return out + torch.zeros(out.shape[-1])  # made on the CPU whatever the device: stops a GPU run\n")


def test_local_device_check_agrees_with_the_grader_after_an_in_place_op_on_attention(suite: Suite) -> None:
    """The local check's memo of meta-device layouts hands out an op's output as the op would (a non-leaf), so an
    in-place op on it runs as it does in the grader, and the table made on the CPU after it is still found."""
    from autograder.release.common import case_json

    cases = {c.id: c for c in suite.cases}
    case = cases["m1_tinycharlm/same_device"]
    env = dict(reference_env(suite))
    exec(INPLACE_THEN_CPU, env)  # noqa: S102
    graded = next(c for c in grade_namespace(suite, env, name="t").cases if c.id == case.id)
    assert not graded.passed and graded.diagnosis == "lm_tables_on_cpu", graded.message
    checks.MEMO.clear()
    with pytest.raises(AssertionError) as info:  # the learned model's trace fills the memo that none's then uses
        checks.check_case(env, case_json(case, suite.expected, cases, lesson=LESSON, limits=LIMITS))
    assert "pos='none'" in str(info.value) and "on cpu" in str(info.value), str(info.value)
    checks.MEMO.clear()


STATEFUL_MODELS = {
    "buffer written through .data": (
        "class TinyCharLM(TinyCharLM):\n"
        "    def add_positions(self, H):\n"
        "        if self.pos == 'sinusoidal':\n"
        "            self.pe.data.mul_(1.5)  # unseen by autograd's version counter\n"
        "        return super().add_positions(H)\n"),
    "buffer written through numpy": (
        "class TinyCharLM(TinyCharLM):\n"
        "    def attend(self, q, k, v):\n"
        "        if self.pos == 'alibi':\n"
        "            self.alibi_mask.numpy()[:, :, :1] += 0.5\n"
        "        return super().attend(q, k, v)\n"),
    "mask cached on the first call": (
        "class TinyCharLM(TinyCharLM):\n"
        "    def attend(self, q, k, v):\n"
        "        if self.pos != 'none':\n"
        "            return super().attend(q, k, v)\n"
        "        T = q.shape[-2]\n"
        "        if not hasattr(self, 'first_mask'):\n"
        "            self.first_mask = torch.ones(T, T, dtype=torch.bool).triu(1)\n"
        "        s = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5\n"
        "        if self.first_mask.shape[0] >= T:\n"
        "            s = s.masked_fill(self.first_mask[:T, :T], float('-inf'))\n"
        "        return torch.softmax(s, -1) @ v\n"),
    "attribute rebound to an equal value of another type": (
        "class TinyCharLM(TinyCharLM):\n"
        "    def __init__(self, *args, **kwargs):\n"
        "        super().__init__(*args, **kwargs)\n"
        "        self.seen = 0\n"
        "    def forward(self, X):\n"
        "        out = super().forward(X) * (1.1 if self.seen is False else 1.0)\n"
        "        self.seen = False  # == 0, but a bool: the model is no longer as built\n"
        "        return out\n"),
    "call counter": (
        "class TinyCharLM(TinyCharLM):\n"
        "    def forward(self, X):\n"
        "        self.calls = getattr(self, 'calls', 0) + 1\n"
        "        return super().forward(X) * (1.0 if self.calls == 1 else 1.1)\n"),
}


@pytest.mark.parametrize("name", list(STATEFUL_MODELS))
def test_a_model_that_changes_itself_is_built_afresh_for_every_probe(suite: Suite, name: str) -> None:
    """The milestone probes reuse a scheme's model only while it is as built: a model whose forward pass changes a
    buffer or an attribute gets, probe by probe, the outputs of a model built for that probe alone."""
    env = dict(reference_env(suite))
    exec(STATEFUL_MODELS[name], env)  # noqa: S102
    m1 = [c for c in suite.cases if c.question == "m1_tinycharlm"]  # lm_device runs the kept models
    reused = [checks.run_probe(env, c.probe, c.args) for c in m1]  # one namespace: models may be reused
    alone = [checks.run_probe(dict(env), c.probe, c.args) for c in m1]  # a new namespace each: never reused
    for case, a, b in zip(m1, reused, alone, strict=True):
        assert checks.dumps(a) == checks.dumps(b), case.id


ALIASED_MODELS = {  # name -> (the class, the schemes whose device check finds a tensor left on the CPU)
    "a plain attribute aliasing a buffer": (
        "class TinyCharLM(TinyCharLM):\n"
        "    def __init__(self, *args, **kwargs):\n"
        "        super().__init__(*args, **kwargs)\n"
        "        if self.pos == 'sinusoidal':\n"
        "            self.table = self.pe  # stays behind on the CPU when the model moves\n"
        "    def add_positions(self, H):\n"
        "        if self.pos == 'sinusoidal':\n"
        "            return H + self.table[:H.shape[1]]\n"
        "        return super().add_positions(H)\n", {"sinusoidal"}),
    "a list aliasing a block": (
        "class TinyCharLM(TinyCharLM):\n"
        "    def __init__(self, *args, **kwargs):\n"
        "        super().__init__(*args, **kwargs)\n"
        "        self.first = [self.blks[0]]  # the module itself moves\n"
        "    def add_positions(self, H):\n"
        "        return super().add_positions(H) + 0 * self.first[0]['proj'](H)\n", set()),
    "a list aliasing a parameter": (
        "class TinyCharLM(TinyCharLM):\n"
        "    def __init__(self, *args, **kwargs):\n"
        "        super().__init__(*args, **kwargs)\n"
        "        self.first = [self.token_emb.weight]  # .to('cuda') sets the Parameter's .data: this one moves\n"
        "    def add_positions(self, H):\n"
        "        return super().add_positions(H) + 0 * self.first[0][0]\n", set()),
}


@pytest.mark.parametrize("name", list(ALIASED_MODELS))
def test_the_device_check_of_a_kept_model_finds_what_it_finds_on_a_fresh_one(suite: Suite, name: str) -> None:
    """lm_device runs each model the milestone probes keep as it is: aliases of a buffer, a parameter or a
    module mean there what they mean on a model built for the device check alone."""
    source, expected = ALIASED_MODELS[name]
    env = dict(reference_env(suite))
    exec(source, env)  # noqa: S102
    case = next(c for c in suite.cases if c.probe == "lm_device")
    checks.run_probe(env, "lm_structure", {"schemes": case.args["schemes"]})  # builds and keeps the models
    checks.run_probe(env, "lm_structure", {"schemes": case.args["schemes"]})  # hands out the kept ones
    kept = checks.run_probe(env, case.probe, case.args)
    alone = checks.run_probe(dict(env), case.probe, case.args)
    assert checks.dumps(kept) == checks.dumps(alone)
    assert {pos for pos, r in kept.items() if r["finding"]} == expected, kept


# --------------------------------------------------------------------------- diagnoses (#21.3)


def _graded_with(suite: Suite, code: str):
    env = reference_env(suite) | {}
    ns = reference_namespace()
    exec(code, ns)  # noqa: S102 - a wrong redefinition on top of the reference, as a notebook holds it
    return grade_namespace(suite, {**env, **ns}, name="t")


def test_rope_cache_returning_sin_then_cos_is_not_called_a_negative_angle(suite: Suite) -> None:
    result = _graded_with(suite, "_rc = rope_cache\n"
                                 "def rope_cache(seq_len, d, base=10000.0):\n"
                                 "    c, s = _rc(seq_len, d, base)\n"
                                 "    return s, c\n")
    diagnoses = {c.diagnosis for c in result.cases if c.question == "q5_rope" and not c.passed}
    assert "rope_cache_sin_cos_swapped" in diagnoses
    assert "rope_negative_angle" not in diagnoses
    scores = next(c for c in result.cases if c.id == "q5_rope/scores_seed42")
    assert "(sin, cos)" in scores.message and "-theta" in scores.message  # the scores cannot tell: both named


def test_a_per_column_exponent_is_catalogued_with_its_cause(suite: Suite) -> None:
    result = _graded_with(suite, "def sinusoidal_pe(max_len, d):\n"
                                 "    if d % 2:\n"
                                 "        raise ValueError('d must be even')\n"
                                 "    pe = np.zeros((max_len, d))\n"
                                 "    for pos in range(max_len):\n"
                                 "        for col in range(d):\n"
                                 "            angle = pos / 10000 ** (col / d)\n"
                                 "            pe[pos, col] = math.sin(angle) if col % 2 == 0 else math.cos(angle)\n"
                                 "    return pe\n")
    table = next(c for c in result.cases if c.id == "q2_sinusoidal_pe/table_d4")
    assert table.diagnosis == "pe_exponent_per_column"
    assert "pair index" in table.message


def test_the_hidden_hint_for_a_flipped_alibi_sign_points_at_the_bias(suite: Suite) -> None:
    mistake = next(m for m in MISTAKES if m.id == "alibi_sign_flipped")
    result = grade_namespace(suite, {**reference_env(suite), **reference_namespace(mistake)}, name="t")
    view = result.gradescope(revisit=suite.revisit())
    hint = next(line for line in view["output"].splitlines() if line.startswith("q7_alibi: a hidden case failed"))
    assert "slope_h * (j - i)" in hint and "negative for past keys" in hint
    assert "q.shape[-3]" not in hint


# --------------------------------------------------------------------------- devices (#21.1, #20.7)

_REUSES_OWN_ATTENTION = '''
class TinyCharLM(TinyCharLM):
    def attend(self, q, k, v):
        if self.pos == "rope":
            return rope_attention(q, k, v)
        if self.pos == "alibi":
            return alibi_attention(q, k, v)
        return super().attend(q, k, v)
'''


def test_a_model_that_reuses_its_own_q6_and_q7_attention_keeps_full_marks(suite: Suite) -> None:
    """The lesson's rope_attention and alibi_attention, which earn full marks in Q6 and Q7, work on any device,
    so a TinyCharLM built on them loses nothing (it lost m1's device case when Q6 left its tables on the CPU)."""
    result = _graded_with(suite, _REUSES_OWN_ATTENTION)
    assert [c.message for c in result.cases if not c.passed] == []


@pytest.mark.parametrize("test", ["q.device.type == 'meta'", "q.is_meta", "str(q.device) == 'meta'",
                                  "q.device != torch.device('cpu') and q.get_device() < 0"])
def test_the_device_check_cannot_be_dodged_by_moving_tables_only_on_meta(suite: Suite, test: str) -> None:
    dodge = ("\nclass TinyCharLM(TinyCharLM):\n"
             "    def attend(self, q, k, v):\n"
             "        if self.pos != 'rope':\n"
             "            return super().attend(q, k, v)\n"
             "        cos, sin = rope_cache(q.shape[-2], self.head_dim)\n"
             f"        if {test}:\n"
             "            cos, sin = cos.to(q.device), sin.to(q.device)\n"
             "        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)\n"
             "        return F.scaled_dot_product_attention(q, k, v, is_causal=True)\n")
    case = next(c for c in _graded_with(suite, dodge).cases if c.id == "m1_tinycharlm/same_device")
    assert not case.passed and case.diagnosis == "lm_tables_on_cpu"
    assert "on the cuda device" in case.message


def test_a_model_that_moves_its_tables_to_the_queries_device_passes_the_disguised_trace(suite: Suite) -> None:
    """Code written for a GPU (.cuda() on a cuda input, device=q.device, is_cuda) runs on the disguised trace."""
    code = ("\nclass TinyCharLM(TinyCharLM):\n"
            "    def attend(self, q, k, v):\n"
            "        if self.pos != 'rope':\n"
            "            return super().attend(q, k, v)\n"
            "        cos, sin = rope_cache(q.shape[-2], self.head_dim)\n"
            "        if q.is_cuda:\n"
            "            cos, sin = cos.cuda(), sin.to(q.device)\n"
            "        elif q.device.type != 'cpu':\n"
            "            cos, sin = cos.to(q.device), sin.to(str(q.device))\n"
            "        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)\n"
            "        mask = torch.ones(q.shape[-2], q.shape[-2], dtype=torch.bool, device=q.device).tril()\n"
            "        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)\n")
    case = next(c for c in _graded_with(suite, code).cases if c.id == "m1_tinycharlm/same_device")
    assert case.passed, case.message


# --------------------------------------------------------------------------- genuine attempts (#21.2)

_LEARNED_FROM_ONE = """
class LearnedPE(nn.Module):
    def __init__(self, max_len, d_model):
        super().__init__()
        self.max_len = max_len
        self.table = nn.Embedding(max_len, d_model)

    def forward(self, x):
        T = x.shape[1]
        if T > self.max_len:
            raise ValueError(f"sequence length {T} is longer than max_len={self.max_len}")
        return x + self.table(torch.arange(1, T + 1))
"""


def test_one_wrong_value_keeps_the_properties_that_hold(suite: Suite) -> None:
    """LearnedPE with positions from 1 fails its forward values, yet its table is one nn.Embedding(max_len, d)
    and it refuses T > max_len: those property cases keep their points (they were all gated to 0)."""
    result = _graded_with(suite, _LEARNED_FROM_ONE)
    passed = {c.id for c in result.cases if c.question == "q4_learned_pe" and c.passed}
    assert {"q4_learned_pe/table_shape", "q4_learned_pe/too_long_raises"} <= passed
    assert "q4_learned_pe/forward_adds_rows" not in passed
    assert 0 < result.question_scores()["q4_learned_pe"] < 8


@pytest.mark.parametrize(("name", "gap"), [
    ("zeros", "constant"), ("identities", "inputs unchanged"), ("constants", "constant")])
def test_a_gate_says_why_an_output_is_not_a_genuine_attempt(suite: Suite, name: str, gap: str) -> None:
    _, messages = _do_nothing_scores(name)
    msg = next(m for m in messages if m.startswith("q1_equivariance/permutation_equivariant:"))
    assert "a real answer" in msg and gap in msg and "computes something" not in msg


# --------------------------------------------------------------------------- a lookup table of public answers (#20.6)


def _key(value: object) -> object:
    """A call's arguments as a hashable key: tensors and arrays by shape, dtype, device and a hash of their bytes."""
    import hashlib

    if isinstance(value, torch.Tensor):
        raw = b"" if value.device.type == "meta" else value.detach().cpu().contiguous().numpy().tobytes()
        return ("T", tuple(value.shape), str(value.dtype), value.device.type, hashlib.sha1(raw).hexdigest())
    if isinstance(value, np.ndarray):
        return ("A", value.shape, str(value.dtype), hashlib.sha1(value.tobytes()).hexdigest())
    if isinstance(value, list | tuple):
        return tuple(_key(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _key(v)) for k, v in value.items()))
    return repr(value)


def _copy(value: object) -> object:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, tuple | list):
        return type(value)(_copy(v) for v in value)
    return value


def _zeros(value: object) -> object:
    if isinstance(value, torch.Tensor):
        return torch.zeros_like(value).detach()
    if isinstance(value, np.ndarray):
        return np.zeros_like(value)
    if isinstance(value, tuple | list):
        return type(value)(_zeros(v) for v in value)
    return value


def _lookup_env(suite: Suite, table: dict, *, record: bool) -> dict:
    """The reference namespace with each graded function and class wrapped: recording, every call's output is
    kept under its arguments; replaying, a kept call returns its output and any other call zeros of the
    reference's shape (the multiple-choice answers are left out: the public cases do not carry them)."""
    ref = reference_env(suite)
    env = {k: v for k, v in ref.items() if not k.startswith("q8_")}
    names = {n for q in suite.questions for n in getattr(q, "solution", [])}

    def lookup(name: str, call, args: tuple, kwargs: dict) -> object:
        k = (name, _key(args), _key(kwargs))
        if record:
            out = call(*args, **kwargs)
            table.setdefault(k, _copy(out))
            return out
        if k in table:
            return _copy(table[k])
        try:
            return _zeros(call(*args, **kwargs))
        except Exception:  # noqa: BLE001 - where the reference raises, the lookup returns nothing
            return None

    def lookup_call(name: str, fn, *args, **kwargs) -> object:
        return lookup(name, fn, args, kwargs)

    for name in names:
        obj = ref[name]
        if isinstance(obj, type) and issubclass(obj, nn.Module):
            def make(base: type, name: str = name) -> type:
                class Lookup(base):
                    def __init__(self, *args, **kwargs) -> None:
                        super().__init__(*args, **kwargs)
                        self.lookup_key = repr(_key((args, kwargs)))

                    def forward(self, *args, **kwargs):
                        return lookup(f"{name}{self.lookup_key}", super().forward, args, kwargs)
                Lookup.__name__ = Lookup.__qualname__ = name
                return Lookup
            env[name] = make(obj)
        elif callable(obj):
            env[name] = functools.partial(lookup_call, name, obj)
    return env


def test_a_lookup_table_of_the_public_answers_earns_nothing(suite: Suite) -> None:
    """A notebook that returns the public cases' expected values for the public arguments (they ship with the
    student's checks) and zeros elsewhere (issue #32 finding 10): a public case pays only once a hidden value case of
    its question holds, and no hidden case calls a graded function with the arguments of a public one, so it earns
    nothing on any question (it earned the public share before)."""
    run_probe = suite.lesson.checks.run_probe
    table: dict = {}
    recording = _lookup_env(suite, table, record=True)
    for case in suite.cases:
        if not case.hidden:
            run_probe(recording, case.probe, case.args)
    public_calls = set(table)
    hidden_table: dict = {}
    hidden_recording = _lookup_env(suite, hidden_table, record=True)
    for case in suite.cases:
        if case.hidden:
            run_probe(hidden_recording, case.probe, {k: v for k, v in case.args.items() if k != "basis"})
    reused = sorted({k[0] for k in set(hidden_table) & public_calls})
    assert reused == [], f"hidden cases call these with the arguments of a public case: {reused}"
    scores = grade_namespace(suite, _lookup_env(suite, table, record=False), name="lookup").question_scores()
    assert {q: s for q, s in scores.items() if s > 0} == {}


def test_an_alibi_bias_cut_from_a_table_of_1024_positions_fails_both_long_cases(suite: Suite) -> None:
    """Q7's long cases call alibi_bias with more than 1024 positions (the usual max_len), public and hidden, so a
    bias sliced from a precomputed 1024-long table fails both; it passes every shorter case."""
    result = _graded_with(suite, "_ab = alibi_bias\n"
                                 "_TABLE = {h: _ab(h, 1024) for h in range(1, 9)}\n"
                                 "def alibi_bias(num_heads, seq_len):\n"
                                 "    return _TABLE[num_heads][:, :seq_len, :seq_len]\n")
    failed = {c.id for c in result.cases if c.question == "q7_alibi" and not c.passed}
    assert failed == {"q7_alibi/long_sequence", "q7_alibi/hidden_long_sequence"}, failed
