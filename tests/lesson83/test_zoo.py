"""The garbage zoo and the honest partial zoo (issue #31 Done-when 2, issue #32 Done-when 5 and finding 10): code
that computes nothing earns 0 on every question, however it fakes the properties, and so does one question's garbage
in an otherwise reference notebook (issue #40 Done-when 2); honest partial work (the catalogue, and near-misses it
does not list) keeps the points of every property that holds."""

from __future__ import annotations

from functools import cache

import pytest

from autograder.authoring.suite import Suite, reference_env
from autograder.course import course_of
from autograder.grading.judge import grade_namespace
from autograder.model import SubmissionResult
from helpers.zoo import GARBAGE, GARBAGE_ON_REFERENCE, NEAR_MISSES
from reference.lesson83_mistakes import MISTAKES, reference_namespace

GATED = ("earns its points only once", "waits for", "hidden cases show")  # what a closed gate says


@cache
def _graded(kind: str, name: str) -> SubmissionResult:
    suite = course_of().suite
    if kind == "garbage":
        env: dict = {}
        exec(GARBAGE[name], env)  # noqa: S102 - test code
    elif kind == "garbage_on_reference":  # in the reference's own namespace, so its other functions call this one
        ns = reference_namespace()
        exec(GARBAGE_ON_REFERENCE[name], ns)  # noqa: S102
        env = {**reference_env(suite), **ns}
    elif kind == "near":
        env = reference_env(suite)
        exec(NEAR_MISSES[name], env)  # noqa: S102
    else:
        mistake = next(m for m in MISTAKES if m.id == name)
        env = {**reference_env(suite), **reference_namespace(mistake)}
    return grade_namespace(suite, env, name=name)


@pytest.mark.parametrize("name", sorted(GARBAGE))
def test_garbage_earns_nothing_on_any_question(suite: Suite, name: str) -> None:
    scores = _graded("garbage", name).question_scores()
    assert {q: s for q, s in scores.items() if s > 0} == {}


@pytest.mark.parametrize("question", sorted(GARBAGE_ON_REFERENCE))
def test_one_questions_garbage_earns_nothing_beside_the_reference(suite: Suite, question: str) -> None:
    assert _graded("garbage_on_reference", question).question_scores()[question] == 0


def _gated(result: SubmissionResult) -> list[str]:
    return [c.id for c in result.cases if not c.passed and any(g in c.message for g in GATED)]


@pytest.mark.parametrize("name", sorted(NEAR_MISSES))
def test_near_misses_keep_every_property_that_holds(suite: Suite, name: str) -> None:
    assert _gated(_graded("near", name)) == []


@pytest.mark.parametrize("mistake_id", [m.id for m in MISTAKES])
def test_catalogued_mistakes_keep_every_property_that_holds(suite: Suite, mistake_id: str) -> None:
    assert _gated(_graded("mistake", mistake_id)) == []


def test_a_full_width_rope_cache_loses_only_its_shape_and_value_cases(suite: Suite) -> None:
    result = _graded("near", "rope_full_width_cache")
    failed = {c.id for c in result.cases if not c.passed}
    assert failed == {"q5_rope/cache_shapes", "q5_rope/cache_values"}
    lost = sum(c.max_points - c.points for c in result.cases)
    assert lost == pytest.approx(0.84, abs=0.01)


def test_declared_normalisations_are_known_to_the_checks(suite: Suite) -> None:
    known = set(suite.lesson.checks.NORMALISATIONS)
    assert {n for c in suite.cases for n in c.near} <= known
    assert all(not c.near and c.within is None for c in suite.cases if c.requires)  # only value cases declare them
