"""The milestone's quick preset on 2 CPU cores, measured: quiet and under load, fused and explicit-softmax attention.

A student without a GPU trains the five schemes with the quick preset (lesson83_milestone.PRESETS["quick"]) and
the notebook says how long that takes. This benchmark measures it, side by side, for

  - fused: the reference TinyCharLM (F.scaled_dot_product_attention), and
  - explicit: the same model with attention written as softmax(Q K^T / sqrt(d) + mask) V, which the notebook
    allows (the causal mask built in every call, as a student would write it),

each on a quiet machine and under load (busy-loop processes beside it, as benchmarks/check_speed.py runs). Each
scheme trains through the trainer's own train() for --warmup untimed steps and --steps timed ones (the per-step
time of the quick preset's steps is their mean), and one evaluation of --eval-windows windows is timed after an
untimed pass; the projected total is, over the five schemes, preset steps x mean step time + the evaluation
scaled to the preset's windows (model set-up, under a second a scheme, is left out). Beside it, the same
projection of this process's CPU seconds divided by the torch threads: on a machine shared with other jobs the wall
time counts their work too, and this column is what an idle machine would need at best.

    python -m benchmarks.milestone_time              # sized to finish within 6 minutes on a quiet 2-core machine
    python -m benchmarks.milestone_time --write      # also writes benchmarks/figures/lesson83_milestone_time.json
                                                     # and .txt, which the notebook's milestone text is rendered from
    python -m benchmarks.milestone_time --steps 2 --warmup 1 --eval-windows 2 --schemes rope   # a smoke run

With more cores than --cores, this process and its load are kept to the first --cores CPUs.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from torch import nn

from autograder.lesson import ENGINE_ROOT, lesson_named_in
from benchmarks.check_speed import start_load, stop_load
from benchmarks.milestone_speed import same_logits
from reference.lesson83 import TinyCharLM, apply_rope

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "benchmarks" / "figures"
NAME = "lesson83_milestone_time"  # the figures file the notebook's milestone text is rendered from
lm = lesson_named_in(ENGINE_ROOT / "grading_config.yaml").trainer  # lesson83_milestone


class ExplicitSoftmaxLM(TinyCharLM):
    """The reference TinyCharLM with attention as softmax(Q K^T / sqrt(d) + mask) V: no fused kernel."""

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        T = q.shape[-2]
        if self.pos == "rope":
            cos, sin = self.rope_cos[:T], self.rope_sin[:T]
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if self.pos == "alibi":
            mask = self.alibi_mask[:, :T, :T]  # the ALiBi bias with -inf above the diagonal
        else:
            mask = torch.full((T, T), float("-inf"), device=q.device).triu(1)
        return torch.softmax(scores + mask, dim=-1) @ v


ATTENTIONS: dict[str, type[nn.Module]] = {"fused": TinyCharLM, "explicit": ExplicitSoftmaxLM}
LABELS = {"fused": "fused (reference)", "explicit": "explicit softmax"}


def measure(model_cls: type[nn.Module], pos: str, *, warmup: int, steps: int, eval_windows: int,
            preset: dict[str, Any]) -> tuple[float, float, float]:
    """(mean seconds of a timed training step, seconds of one evaluation at the preset's windows, and the CPU
    seconds of this process for both: on a shared machine the wall time also counts the others' work)."""
    cpu: list[float] = []

    def clock() -> float:  # the pace's clock, noting this process's CPU time at every mark (one a step)
        cpu.append(time.process_time())
        return time.perf_counter()

    pace = lm.Pace(clock=clock)
    model, _ = lm.train(model_cls, pos, steps=warmup + steps, batch_size=preset["batch_size"],
                        context=preset["context"], lr=preset["lr"], seed=preset["seed"], device="cpu",
                        progress=False, report_every=1, pace=pace)
    per_step = [seconds for _, seconds in pace.early + pace.measured][warmup:]  # one interval a step
    cpu_step = (cpu[warmup + steps] - cpu[warmup]) / steps  # cpu[0] at the start, cpu[k] after step k
    lm.evaluate_ppl(model, max_windows=min(eval_windows, 16))  # untimed: the first passes are slow
    began, began_cpu = time.perf_counter(), time.process_time()
    lm.evaluate_ppl(model, max_windows=eval_windows)
    scale = len(lm.val_starts(max_windows=preset["eval_windows"])) / len(lm.val_starts(max_windows=eval_windows))
    cpu_total = preset["steps"] * cpu_step + (time.process_time() - began_cpu) * scale
    return sum(per_step) / len(per_step), (time.perf_counter() - began) * scale, cpu_total


def run(*, loads: Sequence[int], schemes: Sequence[str], warmup: int, steps: int, eval_windows: int,
        say: Callable[[str], None]) -> list[dict[str, Any]]:
    """A row per (load, attention): per-scheme step and evaluation seconds and the projected total."""
    preset = lm.PRESETS["quick"]
    rows = []
    for load in loads:
        procs = start_load(load) if load else []
        try:
            time.sleep(0.5 if load else 0.0)  # let the load processes start spinning
            before = os.getloadavg()[0]
            for attention, model_cls in ATTENTIONS.items():
                step_s, eval_s, cpu_s = {}, {}, {}
                for pos in schemes:
                    step_s[pos], eval_s[pos], cpu_s[pos] = measure(model_cls, pos, warmup=warmup, steps=steps,
                                                                   eval_windows=eval_windows, preset=preset)
                total = sum(preset["steps"] * step_s[p] + eval_s[p] for p in schemes)
                rows.append({"load": load, "attention": attention, "step_s": step_s, "eval_s": eval_s,
                             "total_s": total, "cpu_s": sum(cpu_s.values()),
                             "load_average": [before, os.getloadavg()[0]]})
                say(row_line(rows[-1], schemes))
        finally:
            stop_load(procs)
    return rows


def condition(load: int) -> str:
    return "quiet" if load == 0 else f"load {load}"


def header(schemes: Sequence[str]) -> str:
    return (f"{'condition':<10} {'attention':<18} " + " ".join(f"{p:>10}" for p in schemes)
            + " | mean ms | eval s | projected total | CPU-s / threads | load avg")


def row_line(row: dict[str, Any], schemes: Sequence[str]) -> str:
    mean = sum(row["step_s"].values()) / len(row["step_s"])
    return (f"{condition(row['load']):<10} {LABELS[row['attention']]:<18} "
            + " ".join(f"{1000 * row['step_s'][p]:10.1f}" for p in schemes)
            + f" | {1000 * mean:7.1f} | {sum(row['eval_s'].values()):6.1f} | {row['total_s'] / 60:9.1f} min"
            + f"   | {row['cpu_s'] / torch.get_num_threads() / 60:9.1f} min | "
            + f"{row['load_average'][0]:.1f}-{row['load_average'][1]:.1f}")


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Projected minutes per attention, quietest and busiest condition, and the ratios."""
    total = {(r["attention"], r["load"]): r["total_s"] for r in rows}
    loads = sorted({r["load"] for r in rows})
    quiet, busy = loads[0], loads[-1]
    minutes = {a: [total[(a, quiet)] / 60, total[(a, busy)] / 60] for a in ATTENTIONS}
    return {"minutes": minutes, "loads": [quiet, busy],
            "explicit_over_fused": {condition(n): total[("explicit", n)] / total[("fused", n)] for n in loads},
            "load_over_quiet": {a: total[(a, busy)] / total[(a, quiet)] for a in ATTENTIONS}}


def pin(cores: int) -> list[int]:
    """Keep this process (and the load it starts) to the first `cores` CPUs it may use; returns them."""
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    chosen = allowed[:cores]
    if hasattr(os, "sched_setaffinity") and len(chosen) < len(allowed):
        os.sched_setaffinity(0, chosen)
    return chosen


def commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="timed training steps per scheme (after --warmup)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed training steps per scheme first")
    parser.add_argument("--eval-windows", type=int, default=32, help="validation windows of the timed evaluation")
    parser.add_argument("--schemes", nargs="+", default=list(lm.SCHEMES), choices=lm.SCHEMES)
    parser.add_argument("--loads", nargs="+", type=int, default=[0, 2],
                        help="busy-loop processes beside the run, one condition each (0: quiet)")
    parser.add_argument("--cores", type=int, default=2, help="CPUs to run on")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: as the trainer "
                        "chooses on a CPU, lesson83_milestone.cpu_threads(): one fewer than the CPUs, at least one)")
    parser.add_argument("--write", action="store_true", help=f"write {NAME}.json and .txt into --figures")
    parser.add_argument("--figures", type=Path, default=FIGURES, help="folder for --write")
    args = parser.parse_args(argv)
    chosen = pin(args.cores)
    torch.set_num_threads(args.threads or lm.cpu_threads())
    for pos in args.schemes:
        assert same_logits(pos, ExplicitSoftmaxLM) < 1e-4, f"{pos}: the two attentions disagree"
    preset = lm.PRESETS["quick"]
    out = io.StringIO()

    def say(line: str) -> None:
        print(line, flush=True)
        out.write(line + "\n")

    began = time.perf_counter()
    say(f"quick preset: {len(args.schemes)} scheme(s) x {preset['steps']} steps of batch {preset['batch_size']}, "
        f"context {preset['context']}, and an evaluation of {preset['eval_windows']} windows each; CPUs "
        f"{','.join(map(str, chosen))} of {os.cpu_count()}, {torch.get_num_threads()} torch threads, "
        f"torch {torch.__version__}, "
        f"python {platform.python_version()}")
    say(f"measured: {args.steps} training steps per scheme after {args.warmup} warm-up steps, and "
        f"{args.eval_windows} evaluation windows, extrapolated; load average before: "
        + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    say("per-step ms of each scheme, the evaluations of all schemes (s), the projected total and its CPU seconds "
        "divided by the torch threads (what an idle machine would need at best):")
    say(header(args.schemes))
    rows = run(loads=args.loads, schemes=args.schemes, warmup=args.warmup, steps=args.steps,
               eval_windows=args.eval_windows, say=say)
    result = summary(rows)
    m = result["minutes"]
    quiet, busy = (condition(n) for n in result["loads"])
    say("ratios, explicit softmax / fused: " + ", ".join(
        f"{k} {v:.2f}x" for k, v in result["explicit_over_fused"].items())
        + f"; {busy} / {quiet}: " + ", ".join(f"{LABELS[a]} {v:.2f}x" for a, v in result["load_over_quiet"].items()))
    say(f"quick preset on {len(chosen)} cores, {quiet} to {busy}: fused (reference) {m['fused'][0]:.1f}-"
        f"{m['fused'][1]:.1f} min, explicit softmax {m['explicit'][0]:.1f}-{m['explicit'][1]:.1f} min")
    say(f"benchmark wall time {time.perf_counter() - began:.0f} s; load average at end: "
        + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    if args.write:
        args.figures.mkdir(parents=True, exist_ok=True)
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        record = {"command": "python -m benchmarks.milestone_time " + " ".join(argv or sys.argv[1:]),
                  "date": stamp, "commit": commit(), "cores": len(chosen), "torch": torch.__version__,
                  "preset": {k: preset[k] for k in ("steps", "batch_size", "context", "eval_windows")},
                  "measured": {"steps": args.steps, "warmup": args.warmup, "eval_windows": args.eval_windows},
                  "schemes": list(args.schemes), "rows": rows, **result}
        (args.figures / f"{NAME}.json").write_text(json.dumps(record, indent=1) + "\n")
        (args.figures / f"{NAME}.txt").write_text(f"# {record['command']}, {stamp}, at commit {record['commit']}\n"
                                                  + out.getvalue())
        print(f"wrote {args.figures / NAME}.json and .txt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
