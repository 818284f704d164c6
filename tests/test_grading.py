"""Grading the reference, the blank template, every catalogued mistake and correct alternatives."""

from __future__ import annotations

import pytest

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
    assert mistake.description in messages or mistake.id in ("pe_as_parameter", "pe_plain_attribute",
                                                             "learned_transposed", "lm_tables_in_state_dict")




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
