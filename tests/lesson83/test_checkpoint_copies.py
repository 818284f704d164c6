"""Checkpoint copies found by what they compute (issue 41 item 1; autograder/report/similarity.py's output_pairs):
the milestone plug-in's reader computes each scheme's losses on held-out windows by 64-token segments
(segment_losses), and the similarity report pairs checkpoints whose losses agree within LOSS_TOLERANCE. A copy of
the reference checkpoint under other weights (residual units permuted, heads reordered, value spaces rotated,
queries and keys rescaled: tests/helpers/copied_checkpoint.py) is listed though its weights lie far apart;
independently trained checkpoints (other seeds) are not."""

from __future__ import annotations

import io

import pytest
import torch

from autograder.config import ROOT
from autograder.course import course_of
from autograder.report.similarity import LOSS_TOLERANCE, output_pairs, weight_pairs
from helpers.copied_checkpoint import reparametrised

ms = course_of().lesson.plugin  # assignments/lesson83/lesson83_checkpoint.py
lm = ms.LESSON.trainer
CHECKPOINT = ROOT / "reference" / "lesson83_checkpoint"


@pytest.fixture(scope="module")
def reference() -> dict[str, dict[str, torch.Tensor]]:
    torch.set_num_threads(1)
    return ms.load_checkpoint((CHECKPOINT / "milestone.pt").read_bytes())[1]


def losses(state: dict[str, torch.Tensor], pos: str) -> list[float]:
    """segment_losses of these weights, as the reader child computes them."""
    return ms.segment_losses(ms.heldout_nll(ms.build_model(pos, state), ms.heldout_tokens()))


def copy_of(state: dict[str, torch.Tensor], pos: str, seed: int = 3) -> dict[str, torch.Tensor]:
    return reparametrised(state, heads=ms.ARCH["num_heads"], seed=seed, reorder_heads=pos != "alibi")


def test_a_copy_under_other_weights_is_listed_by_what_it_computes(reference: dict[str, dict]) -> None:
    own = {pos: losses(state, pos) for pos, state in reference.items()}
    copied = {pos: losses(copy_of(state, pos), pos) for pos, state in reference.items()}
    noisy = {}  # the benchmarks' "distinct" checkpoints: the reference times (1 + 1e-4 noise), a copy too
    gen = torch.Generator().manual_seed(5)
    for pos, state in reference.items():
        noisy[pos] = losses({k: v * (1 + 1e-4 * torch.randn(v.shape, generator=gen)) for k, v in state.items()}, pos)
    assert all(len(v) == ms.HELDOUT_WINDOWS * 512 // ms.SEGMENT for v in own.values())
    assert all(v == round(v, ms.SEGMENT_DECIMALS) for row in own.values() for v in row)  # no digit rounding flips
    pairs = output_pairs({"orig": own, "copy": copied, "noisy": noisy})
    assert set(pairs) == {("copy", "orig"), ("noisy", "orig"), ("copy", "noisy")}
    assert set(pairs[("copy", "orig")]) == set(ms.SCHEMES)
    assert max(pairs[("copy", "orig")].values()) <= 2 * 10 ** -ms.SEGMENT_DECIMALS  # float rounding only
    sketches = {"orig": {p: ms.weight_sketch(s) for p, s in reference.items()},
                "copy": {p: ms.weight_sketch(copy_of(s, p)) for p, s in reference.items()}}
    assert weight_pairs(sketches) == []  # its weights are far from the original's: the sketches alone miss it


@pytest.mark.training
def test_independently_trained_checkpoints_are_not_listed(reference: dict[str, dict]) -> None:
    """Two short runs of the quick preset's rope model with other seeds (1 and 2): neither is listed with the other
    or with the reference, by a wide margin (0.04 nats after 100 steps; 0.6 and more after the preset's 1000)."""
    quick = lm.PRESETS["quick"]

    def trained(seed: int) -> list[float]:
        model, _ = lm.train(ms.TinyCharLM, "rope", steps=100, batch_size=quick["batch_size"],
                            context=quick["context"], lr=quick["lr"], seed=seed, device="cpu", progress=False)
        return losses(model.state_dict(), "rope")

    rows = {"s1": trained(1), "s2": trained(2), "reference": losses(reference["rope"], "rope")}
    assert output_pairs({sid: {"rope": v} for sid, v in rows.items()}) == {}
    gaps = [max(abs(a - b) for a, b in zip(rows[x], rows[y], strict=True)) for x in rows for y in rows if x < y]
    assert min(gaps) > 10 * LOSS_TOLERANCE, gaps


@pytest.mark.sandbox
def test_the_reader_child_stores_the_losses_a_copy_shares(reference: dict[str, dict], tmp_path: object) -> None:
    """Through the sandboxed reader (verify): the reparametrised copy, uploaded with the reference's milestone.json,
    verifies as the original does (the finding: it also ranks as the original); each part's stored figures carry its
    held-out losses, and the report pairs the two by them."""
    rules = course_of().suite.milestone_rules
    claims = (CHECKPOINT / "milestone.json").read_bytes()
    config = torch.load(io.BytesIO((CHECKPOINT / "milestone.pt").read_bytes()), weights_only=True)
    config["state_dicts"] = {pos: copy_of(state, pos) for pos, state in reference.items()}
    buffer = io.BytesIO()
    torch.save(config, buffer)
    stored = {}
    for sid, pt in (("orig", (CHECKPOINT / "milestone.pt").read_bytes()), ("copy", buffer.getvalue())):
        verdict = ms.verify({"milestone.pt": pt, "milestone.json": claims}, rules=rules, memory_mb=ms.CHILD_MEMORY_MB)
        assert verdict.ok, verdict.message
        stored[sid] = {pos: part.received["heldout_losses"] for pos, part in verdict.parts.items()}
        assert all(part.received.get("leaderboard") for part in verdict.parts.values())
    pairs = output_pairs(stored)
    assert list(pairs) == [("copy", "orig")] and set(pairs[("copy", "orig")]) == set(ms.SCHEMES)
