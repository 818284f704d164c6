"""One reader child per checkpoint (issue 43): the milestone plug-in's sample verification asks the same child for the
held-out pass (the leaderboard's figures, the similarity report's losses and sketch), which heldout_figures then
finds kept; the figures are those a child of their own computes, and the verification's CPU leaves that pass out."""

from __future__ import annotations

from typing import Any

import pytest

from autograder.config import ROOT
from autograder.course import course_of
from helpers.milestone import other_weights

ms = course_of().lesson.plugin  # assignments/lesson83/lesson83_checkpoint.py
CHECKPOINT = ROOT / "reference" / "lesson83_checkpoint"

pytestmark = pytest.mark.sandbox


def test_a_checkpoint_is_verified_and_measured_in_one_child(monkeypatch: pytest.MonkeyPatch) -> None:
    rules = course_of().suite.milestone_rules
    claims = (CHECKPOINT / "milestone.json").read_bytes()
    pt = other_weights(CHECKPOINT / "milestone.pt", 11)
    asked: list[dict[str, Any]] = []
    answers: list[dict[str, Any]] = []
    run_child = ms._run_child

    def counted(data: bytes, request: dict[str, Any], **kw: Any) -> dict[str, Any]:
        asked.append(request)
        answers.append(run_child(data, request, **kw))
        return answers[-1]

    monkeypatch.setattr(ms, "_run_child", counted)
    verdict = ms.verify({"milestone.pt": pt, "milestone.json": claims}, rules=rules, memory_mb=ms.CHILD_MEMORY_MB)
    assert verdict.ok, verdict.message
    assert [(r["method"], r.get("heldout")) for r in asked] == [("sample", True)]
    merged = {pos: part.received for pos, part in verdict.parts.items()}
    assert all(row.get("leaderboard") and row.get("heldout_losses") and row.get("sketch") for row in merged.values())
    # the same figures from a child of their own (the path a checkpoint takes when the first child could not)
    found = ms.verify_checkpoint(pt, claims, rules=rules, memory_mb=ms.CHILD_MEMORY_MB)
    ms._HELDOUT.clear()
    alone = ms.heldout_figures(pt, found, memory_mb=ms.CHILD_MEMORY_MB)
    assert [r["method"] for r in asked[1:]] == ["heldout"]  # the windows were kept; the held-out pass asked alone
    for pos, row in alone.items():
        assert {k: merged[pos][k] for k in row} == row, pos
    # the child says what the held-out pass took of its CPU: the verification's figure leaves it out
    assert 0 < answers[0]["heldout_cpu_s"] < answers[0]["cpu_s"]
