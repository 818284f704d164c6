"""The milestone's time, promised and estimated: the notebook's time for the quick preset comes from the measured
figures file, and the progress line's time left is within 25% of the real remaining time once a tenth of the
steps are done (on a fake clock that the model's own forward passes advance: no timing, no sleeping)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from autograder.authoring import questions
from autograder.config import ROOT
from autograder.course import course_of

ms = course_of().lesson.plugin  # the milestone plug-in: assignments/lesson83/lesson83_checkpoint.py

pytestmark = pytest.mark.training  # the tiers are in pyproject.toml

lm = ms.LESSON.trainer  # lesson83_milestone
TOLERANCE = 0.25
SCHEMES = ("learned", "sinusoidal", "rope", "alibi", "none")
LINE = re.compile(r"(?:scheme (\d+)/(\d+) )?\w+ \[[# ]*\] (\d+)/(\d+) loss \S+ \S+ tok/s, about (.+?) left")


class FakeClock:
    """Seconds that pass only when a forward pass says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def timed_model(clock: FakeClock, *, step_cost: Callable[[int, int, int], float],
                eval_cost: float = 0.0) -> type[nn.Module]:
    """A model class of almost no work whose forward passes advance `clock`: training step `local` of the run
    of model number `run` (step `overall` counted over all runs) costs step_cost(overall, run, local) seconds,
    an evaluation pass eval_cost seconds per thousand tokens times T / 128 (attention grows with the context).
    Passes of the trainer's device check (on `meta`, also shown as cuda) cost nothing: these runs train on the CPU."""
    counts = {"overall": 0, "runs": 0}

    class Timed(nn.Module):
        def __init__(self, *, pos: str, vocab_size: int, **_: object) -> None:
            super().__init__()
            self.pos, self.run, self.local = pos, counts["runs"], 0
            counts["runs"] += 1
            self.emb = nn.Embedding(vocab_size, 4)

        def forward(self, X: torch.Tensor) -> torch.Tensor:
            if X.device.type == "cpu":
                if self.training:
                    clock.now += step_cost(counts["overall"], self.run, self.local)
                    counts["overall"] += 1
                    self.local += 1
                else:
                    clock.now += eval_cost * X.numel() / 1000 * X.shape[1] / 128
            return self.emb(X) @ self.emb.weight.T

    return Timed


def seconds(text: str) -> float:
    """duration()'s words back to seconds: '45 s', '3 min 05 s', '1 h 02 min'."""
    units = {"h": 3600, "min": 60, "s": 1}
    return float(sum(int(n) * units[u] for n, u in re.findall(r"(\d+) (h|min|s)\b", text)))


def estimates(monkeypatch: pytest.MonkeyPatch, clock: FakeClock) -> list[tuple[float, float, float]]:
    """Collects (fraction of all steps done, fake time, seconds left as printed) from each progress line."""
    lines: list[tuple[float, float, float]] = []

    def record(*args: object, **_: object) -> None:
        for part in re.split(r"[\r\n]", " ".join(map(str, args))):
            if m := LINE.search(part):
                stage, stages, done, steps = (int(g) if g else 1 for g in m.groups()[:4])
                fraction = ((stage - 1) * steps + done) / (stages * steps)
                lines.append((fraction, clock(), seconds(m.group(5))))

    monkeypatch.setattr(lm, "print", record, raising=False)  # the trainer's print, nobody else's
    return lines


def assert_within(lines: list[tuple[float, float, float]], end: float) -> None:
    checked = [(f, end - t, left) for f, t, left in lines if f >= 0.1 - 1e-9]
    assert len(checked) >= 5, lines
    wrong = [(f"{f:.0%} done", f"{real:.0f} s left", f"{left:.0f} s estimated") for f, real, left in checked
             if abs(left - real) > TOLERANCE * real]
    assert not wrong, wrong


# Step costs (seconds). The warm-up: the first steps of a process are slowest, each new model's first few slower.
def warm_up(overall: int, run: int, local: int) -> float:
    return 20.0 if run == 0 and local < 5 else 3.0 if local < 5 else 1.0


def slowing(total: int) -> Callable[[int, int, int], float]:
    """Each step slower than the one before: 1 s at the start, 1.5 s at the end (a machine getting busier)."""
    return lambda overall, run, local: 1.0 + 0.5 * overall / total


def steady(overall: int, run: int, local: int) -> float:
    return 1.0


@pytest.mark.parametrize("name", ["steady", "warm_up", "slowing"])
def test_time_left_of_the_milestone_is_within_a_quarter(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Five schemes of 200 steps with an evaluation after each (a sixth of the time, as on a CPU), printed every
    100 steps: every estimate from the first (a tenth of all steps) on is within 25% of the real time left."""
    preset = {"steps": 200, "batch_size": 2, "context": 16, "lr": 1e-3, "seed": 0, "eval_windows": 32}
    monkeypatch.setitem(lm.PRESETS, "tiny", preset)
    cost = {"steady": steady, "warm_up": warm_up, "slowing": slowing(len(SCHEMES) * preset["steps"])}[name]
    clock = FakeClock()
    model_cls = timed_model(clock, step_cost=cost, eval_cost=0.5)
    lines = estimates(monkeypatch, clock)
    lm.run_milestone(model_cls, "tiny", schemes=SCHEMES, device="cpu", clock=clock)
    assert_within(lines, clock())
    assert [round(f, 2) for f, _, _ in lines] == [round(0.1 * k, 2) for k in range(1, 11)]


@pytest.mark.parametrize("name", ["warm_up", "slowing"])
def test_time_left_of_one_run_is_within_a_quarter(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """One run of 100 steps printed every 5: from step 10 on, within 25% of the real time left."""
    cost = {"warm_up": lambda overall, run, local: 10.0 if local < 3 else 1.0, "slowing": slowing(100)}[name]
    clock = FakeClock()
    model_cls = timed_model(clock, step_cost=cost)
    lines = estimates(monkeypatch, clock)
    info: dict = {}
    lm.train(model_cls, "none", steps=100, batch_size=2, context=16, device="cpu", report_every=5,
             pace=lm.Pace(clock=clock), info=info)
    assert_within(lines, clock())
    assert info["seconds"] == pytest.approx(clock())  # the steps' time is read on the same clock


def test_pace_leaves_out_the_warm_up_and_follows_the_recent_half() -> None:
    clock = FakeClock()
    pace = lm.Pace(clock=clock, warmup=10)
    pace.start(1000)
    assert pace.skip == 10
    clock.now = 50.0  # 10 slow warm-up steps
    pace.mark(10)
    assert pace.per_step() == pytest.approx(5.0)  # nothing else measured yet: the warm-up is all there is
    for done, per_step in ((40, 1.0), (70, 1.0), (100, 2.0), (130, 2.0)):
        clock.now += 30 * per_step
        pace.mark(done)
    assert pace.per_step() == pytest.approx(2.0)  # the recent half: the machine got slower
    clock.now += 30 * 1.0
    pace.mark(160)
    assert pace.per_step() == pytest.approx((30 * 1.0 + 2 * 30 * 2.0) / 90)  # 90 of the 150 measured steps
    pace.start(40)  # a short run: its warm-up is at most a twentieth of it
    assert pace.skip == 2


# --------------------------------------------------------------------------- the promised time


FIGURES = ROOT / "benchmarks" / "figures" / "lesson83_milestone_time.json"


def quick_preset_text(figures: dict[str, Any] | None, monkeypatch: pytest.MonkeyPatch) -> str:
    """The notebook's milestone text where it describes the quick preset, rendered with these figures."""
    monkeypatch.setattr(questions, "milestone_time", lambda config: figures)
    m1 = next(q for q in questions.load_questions(course_of().config, course_of().lesson) if q.id == "m1_tinycharlm")
    return next(c.source for c in m1.cells if c.kind == "markdown" and '**`"quick"`**' in c.source)


def test_the_notebook_gives_the_measured_range_for_both_attentions(monkeypatch: pytest.MonkeyPatch) -> None:
    figures = {"cores": 2, "loads": [0, 2], "minutes": {"fused": [4.6, 9.2], "explicit": [13.1, 27.05]}}
    text = quick_preset_text(figures, monkeypatch)
    assert "On 2 cores it takes about 4–10 minutes with `scaled_dot_product_attention` and about 13–28 minutes " \
           "with an explicit softmax" in text, text
    assert "2 other busy programs" in text and "five minutes" not in text, text
    unmeasured = quick_preset_text(None, monkeypatch)  # no figures: no time promised at all
    assert "minutes" not in unmeasured.split('**`"quick"`**')[1].split("\n")[0], unmeasured


def test_committed_figures_measure_the_current_quick_preset() -> None:
    """Changing the quick preset (or the schemes) without measuring it again fails here: run
    `python -m benchmarks.milestone_time --write` and regenerate the release."""
    if not FIGURES.is_file():  # the notebook then promises no time at all (test above)
        pytest.skip(f"{FIGURES.name} not written yet: run `python -m benchmarks.milestone_time --write` on a quiet "
                    "2-core machine and regenerate the release")
    figures = json.loads(FIGURES.read_text())
    quick = lm.PRESETS["quick"]
    assert figures["preset"] == {k: quick[k] for k in ("steps", "batch_size", "context", "eval_windows")}
    assert figures["schemes"] == list(lm.SCHEMES) and figures["cores"] == 2 and figures["loads"] == [0, 2]
    for attention in ("fused", "explicit"):
        quiet, busy = figures["minutes"][attention]
        assert 0 < quiet <= busy, figures["minutes"]
        rows = [r for r in figures["rows"] if r["attention"] == attention]
        assert [r["load"] for r in rows] == [0, 2]
        for row in rows:  # the projection is the per-step times and evaluations it lists
            total = sum(quick["steps"] * row["step_s"][p] + row["eval_s"][p] for p in lm.SCHEMES)
            assert total == pytest.approx(row["total_s"])
        assert [r["total_s"] / 60 for r in rows] == pytest.approx([quiet, busy])
