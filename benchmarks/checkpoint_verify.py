"""Checkpoint verification before and after issue 13: seconds per checkpoint, how far the figures move, verdicts.

"old" is the grader before issue 13: 300 validation windows, one pass per context (evaluate_ppl). "new" is
today's: the configured verify_windows (100), one 512-token pass per window read at all three contexts
(measure_ppl). Both run the real verify_checkpoint with its limited child. The checkpoints are the committed
reference, the same weights with inflated claims (the sample class's), and one checkpoint per catalogued
milestone mistake: the reference weights of the schemes it touches loaded into the mistaken TinyCharLM,
tuned a few steps with it, and claims measured by that class as the student's notebook would (300 windows, the
quick preset's table); only those schemes are verified (the others are the reference row).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from autograder import milestone as ms
from reference.lesson83_mistakes import MISTAKES, reference_namespace

lm = ms.LESSON.trainer  # lesson83_milestone

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "reference" / "lesson83_checkpoint"
OLD_WINDOWS = 300  # what grading_config.yaml said before issue 13


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _affected(cls: type, pos: str, state: dict[str, torch.Tensor]) -> tuple[torch.nn.Module, bool, bool]:
    """The mistaken model with the reference weights; whether the mistake touches this scheme; whether the
    grader's TinyCharLM still loads its state dict (names and shapes)."""
    torch.manual_seed(0)
    model = cls(pos=pos, **lm.ARCH)
    model.load_state_dict(state, strict=False)
    fits = set(model.state_dict()) == set(state)
    X = torch.randint(1, len(lm.VOCAB), (2, 64), generator=torch.Generator().manual_seed(0))
    reference = ms.build_model(pos, state)
    with torch.no_grad():
        same = torch.allclose(model.eval()(X), reference(X), atol=1e-5)
    trainable = {n for n, _ in model.named_parameters()} == {n for n, _ in reference.named_parameters()}
    return model, not (same and fits and trainable), fits


def mistake_checkpoints(folder: Path, *, schemes: Sequence[str], tune_steps: int, claim_windows: int | None,
                        only: Sequence[str] = ()) -> dict[str, tuple[Path, Path, tuple[str, ...]]]:
    """Per milestone mistake, a checkpoint of the schemes it touches (the others are the reference's) under
    folder, reused when already there, and those schemes."""
    _, states = lm.load_checkpoint(REFERENCE / "milestone.pt")
    claims = json.loads((REFERENCE / "milestone.json").read_text())["ppl"]
    tokens = lm.corpus_tokens()
    out = {}
    for m in MISTAKES:
        if m.question != "m1_tinycharlm" or (only and m.id not in only):
            continue
        pt, js = folder / m.id / "milestone.pt", folder / m.id / "milestone.json"
        if pt.exists() and js.exists():
            out[f"mistake_{m.id}"] = (pt, js, tuple(json.loads(js.read_text())["ppl"]))
            continue
        cls = reference_namespace(m)["TinyCharLM"]
        models, table = {}, {}
        for pos in schemes:
            model, affected, fits = _affected(cls, pos, states[pos])
            if not affected:
                continue
            table[pos] = {int(c): v for c, v in claims[pos].items()}
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
            model.train()
            for batch in lm.batch_starts(steps=tune_steps, batch_size=16, seed=1):
                X, Y = lm.windows(tokens, batch, 128)
                loss = F.cross_entropy(model(X).flatten(0, 1), Y.flatten())
                opt.zero_grad()
                loss.backward()
                opt.step()
            models[pos] = model
            if fits:  # weights the grader refuses earn nothing whatever they claim
                table[pos] = lm.evaluate_ppl(model, max_windows=claim_windows)
        pt.parent.mkdir(parents=True, exist_ok=True)
        lm.save_checkpoint(models, table, preset="quick", pt_path=pt, json_path=js)
        out[f"mistake_{m.id}"] = (pt, js, tuple(models))
    return out


def timed(pt: Path, js: Path, *, schemes: Sequence[str], windows: int, method: str) -> tuple[dict[str, Any], float,
                                                                                              float]:
    """verify_checkpoint's verdict, its wall-clock seconds and its child's CPU seconds."""
    cpu, wall = _children_cpu(), time.perf_counter()
    result = ms.verify_checkpoint(pt, js, schemes=schemes, rules=ms.load_rules(), max_windows=windows,
                                  method=method)
    return result, time.perf_counter() - wall, _children_cpu() - cpu


def verdicts(result: dict[str, Any]) -> dict[str, str]:
    """Per scheme: pass, or the problem id."""
    return {pos: "pass" if row["passed"] else str(row["problem"]) for pos, row in result["schemes"].items()}


def move(old: dict[str, Any], new: dict[str, Any]) -> float:
    """Largest relative difference between the old and the new figure of any scheme and context."""
    diffs = [abs(b[c] - a[c]) / a[c] for pos, row in old["schemes"].items()
             if (a := row["ppl"]) and (b := new["schemes"][pos]["ppl"]) for c in a]
    return max(diffs, default=0.0)


def margin(result: dict[str, Any], rules: ms.MilestoneRules) -> float:
    """Smallest relative distance of a new figure from a verdict boundary (rel_tol or a bound)."""
    gaps = []
    for row in result["schemes"].values():
        if not row["ppl"] or not row["claimed"]:
            continue
        gaps += [abs(d - rules.rel_tol) for d in row["rel_diff"].values()]
        gaps += [abs(row["ppl"][c] - bound) / bound for c, bound in row["thresholds"].items()]
    return min(gaps, default=math.inf)


def main(argv: Sequence[str] | None = None) -> int:
    """Print old and new seconds per checkpoint side by side, the figures' largest move and the verdicts."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="tiny run (two schemes, one mistake, 20 windows)")
    parser.add_argument("--cores", type=int, default=2, help="CPUs this process and its children may use")
    parser.add_argument("--tune-steps", type=int, default=20, help="steps each mistaken model trains")
    parser.add_argument("--work", type=Path, default=None, help="folder for the mistakes' checkpoints (reused)")
    args = parser.parse_args(argv)
    if hasattr(os, "sched_setaffinity"):
        cpus = sorted(os.sched_getaffinity(0))[: args.cores]
        os.sched_setaffinity(0, cpus)
    torch.set_num_threads(max(1, args.cores))
    schemes = ("rope", "alibi") if args.smoke else lm.SCHEMES
    old_windows, new_windows = (20, 20) if args.smoke else (OLD_WINDOWS, ms.load_rules().verify_windows)
    work = args.work or Path(tempfile.mkdtemp(prefix="checkpoint_verify_"))
    claims = json.loads((REFERENCE / "milestone.json").read_text())
    inflated = claims | {"ppl": {p: {c: v * 0.9 for c, v in row.items()} for p, row in claims["ppl"].items()}}
    (work / "inflated").mkdir(parents=True, exist_ok=True)
    (work / "inflated" / "milestone.json").write_text(json.dumps(inflated))
    checkpoints = {"reference": (REFERENCE / "milestone.pt", REFERENCE / "milestone.json", schemes),
                   "inflated_claims": (REFERENCE / "milestone.pt", work / "inflated" / "milestone.json", schemes)}
    began = time.perf_counter()
    checkpoints |= mistake_checkpoints(work / "mistakes", schemes=schemes, tune_steps=2 if args.smoke else
                                       args.tune_steps, claim_windows=20 if args.smoke else
                                       lm.PRESETS["quick"]["eval_windows"],
                                       only=("lm_rotates_v",) if args.smoke else ())
    rules = ms.load_rules()
    print(f"{len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()} cores, torch "
          f"{torch.__version__}; old: {old_windows} windows, a pass per context; new: {new_windows} windows, one "
          f"512-token pass each; mistakes' checkpoints built in {time.perf_counter() - began:.0f} s under {work}")
    print(f"{'checkpoint':<40} {'old s':>7} {'new s':>7} {'old cpu':>8} {'new cpu':>8} {'ratio':>6} "
          f"{'moved':>7} {'margin':>7}  verdicts")
    flipped, totals = [], [0.0, 0.0, 0.0, 0.0]
    worst = 0.0
    for name, (pt, js, touched) in checkpoints.items():
        if not touched:
            print(f"{name:<40} {'its weights and claims are the reference checkpoint:':>50} {', '.join(schemes)}")
            continue
        old, old_s, old_cpu = timed(pt, js, schemes=touched, windows=old_windows, method="legacy")
        new, new_s, new_cpu = timed(pt, js, schemes=touched, windows=new_windows, method="prefix")
        for i, v in enumerate((old_s, new_s, old_cpu, new_cpu)):
            totals[i] += v
        before, after = verdicts(old), verdicts(new)
        flipped += [f"{name}/{pos}: {before[pos]} -> {after[pos]}" for pos in before if before[pos] != after[pos]]
        if old["ok"] != new["ok"]:
            flipped.append(f"{name}: ok {old['ok']} -> {new['ok']}")
        worst = max(worst, moved := move(old, new))
        ratio = f"{old_cpu / new_cpu:5.1f}x" if new_cpu > 0.05 else "cached"
        shown = ", ".join(f"{p} {v}" for p, v in after.items()) if old["ok"] else old["message"][:60]
        print(f"{name:<40} {old_s:7.2f} {new_s:7.2f} {old_cpu:8.2f} {new_cpu:8.2f} {ratio:>6} {moved:7.2%} "
              f"{margin(new, rules):7.2%}  {shown}", flush=True)
    print(f"{'all':<40} {totals[0]:7.2f} {totals[1]:7.2f} {totals[2]:8.2f} {totals[3]:8.2f} "
          f"{totals[2] / max(totals[3], 1e-9):5.1f}x {worst:7.2%}")
    print("moved: the largest relative change of a figure (scheme, context) from old to new; margin: the new "
          "figures' smallest relative distance from a verdict boundary (rel_tol, a bound)")
    print(f"flipped: {'; '.join(flipped) if flipped else 'none'}")
    return 1 if flipped else 0


if __name__ == "__main__":
    raise SystemExit(main())
