"""Checkpoint verification before and after issue 13: CPU seconds per checkpoint, how far the figures move,
verdicts, and a class-scale figure.

Three graders side by side, each running the real verify_checkpoint with its memory-limited reader:
"old" (when issue 13 was filed): a fresh Python process per checkpoint that imports torch, 300 validation
windows and a pass per context (evaluate_ppl), on every CPU (up to 4 threads); "before" (the grader before the
attention chunks): a child forked per checkpoint from a pre-started verifier (torch imported and the five models
built once), one thread, the configured verify_windows (100), one 512-token pass per window read at all three
contexts (measure_ppl, method "plain"); "new" (today's grader): as "before", with the reference model's causal
attention computed by query chunks (CausalChunks, method "prefix"). The checkpoints are the committed reference,
the same weights with inflated claims (the sample class's), and one checkpoint per catalogued milestone mistake:
the reference weights of the schemes it touches loaded into the mistaken TinyCharLM, tuned a few steps with it,
and claims measured by that class as the student's notebook would (300 windows, the quick preset's table); only
those schemes are verified (the others are the reference row). The class-scale figure verifies N distinct
checkpoints (the reference with its weights perturbed by 1e-4 relative noise, its claims unchanged) as
grade_batch does, from VERIFY_SLOTS threads on verifiers started for the run, "before" and "new" interleaved in
rounds at the same moment, and projects the CPU time of a class of 300 on 2 cores (start-up counted once).
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import resource
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
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
OLD_BATCH = 50  # windows per forward pass before this change
CLASS = 300  # the class size of the goal
GOAL_S = 15 * 60  # ... graded in 15 minutes on 2 cores


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


def timed(pt: Path | bytes, js: Path, *, schemes: Sequence[str], windows: int, mode: str,
          started: ms.Verifier) -> tuple[dict[str, Any], float, float]:
    """verify_checkpoint's verdict, its wall-clock seconds and the CPU seconds of its reader: for "old" a
    verifier process started for this checkpoint (start-up included), for "before" and "new" a child forked from
    the verifier `started` before."""
    wall = time.perf_counter()
    if mode in ("before", "new"):
        result = ms.verify_checkpoint(pt, js, schemes=schemes, rules=ms.load_rules(), max_windows=windows,
                                      method="plain" if mode == "before" else "prefix", verifier=started)
        return result, time.perf_counter() - wall, result["cpu_s"]
    cpu = _children_cpu()
    with ms.Verifier(threads=ms._threads()) as verifier:
        result = ms.verify_checkpoint(pt, js, schemes=schemes, rules=ms.load_rules(), max_windows=windows,
                                      batch_size=OLD_BATCH, method="legacy", verifier=verifier)
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
    """How far (relative difference, or relative distance from a bound) the figures are from changing any
    scheme's verdict: a pass must stay within rel_tol and under every bound; a disagreement needs one figure
    to stay beyond rel_tol; a figure above a bound needs agreement and that bound to hold."""
    gaps = []
    for row in result["schemes"].values():
        if not row["ppl"] or not row["claimed"]:
            continue
        agree = [rules.rel_tol - d for d in row["rel_diff"].values()]
        under = [(bound - row["ppl"][c]) / bound for c, bound in row["thresholds"].items()]
        if row["passed"]:
            gaps.append(min(agree + under))
        elif not row["agrees"]:
            gaps.append(max(-g for g in agree))
        else:
            gaps.append(min([*agree, max(-g for g in under if g < 0)]))
    return min(gaps, default=math.inf)


def perturbed(n: int) -> list[bytes]:
    """n distinct milestone.pt files: the reference's weights times (1 + 1e-4 noise), seed i."""
    ckpt = torch.load(REFERENCE / "milestone.pt", map_location="cpu", weights_only=True)
    out = []
    for i in range(n):
        gen = torch.Generator().manual_seed(i)
        states = {pos: {k: v * (1 + 1e-4 * torch.randn(v.shape, generator=gen)) if v.is_floating_point() else v
                        for k, v in state.items()} for pos, state in ckpt["state_dicts"].items()}
        buf = io.BytesIO()
        torch.save({"config": ckpt["config"], "state_dicts": states}, buf)
        out.append(buf.getvalue())
    return out


def class_scale(n: int, *, schemes: Sequence[str], windows: int, rounds: int = 2) -> tuple[list[str], list[str]]:
    """Verify n distinct checkpoints as grade_batch does (VERIFY_SLOTS at a time, one verifier each), with the
    grader before the chunks ("plain") and today's ("prefix") in turn, `rounds` times n/rounds checkpoints each;
    the summary lines and the checkpoints not passed."""
    import queue

    from autograder.config import load_config

    memory_mb = load_config().submissions.checkpoint_memory_mb
    claims = (REFERENCE / "milestone.json").read_bytes()
    files, rules = perturbed(n), ms.load_rules()
    methods = {"before": "plain", "new": "prefix"}
    load = [os.getloadavg()[0]]
    cpu = {name: 0.0 for name in methods}
    wall = {name: 0.0 for name in methods}
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in methods}
    pools: dict[str, list[ms.Verifier]] = {}
    startup = {}
    for name in methods:  # the verifiers a grading run starts, once
        before = time.process_time()
        pools[name] = [ms.Verifier().start() for _ in range(ms.VERIFY_SLOTS)]
        startup[name] = sum(v.startup["cpu_s"] for v in pools[name])
        cpu[name] += time.process_time() - before
    for part in range(rounds):
        batch = files[part * n // rounds:(part + 1) * n // rounds]
        for name, method in methods.items():
            free: queue.Queue[ms.Verifier] = queue.Queue()
            for verifier in pools[name]:
                free.put(verifier)

            def one(pt: bytes, method: str = method, free: queue.Queue[ms.Verifier] = free) -> dict[str, Any]:
                verifier = free.get()
                try:
                    return ms.verify_checkpoint(pt, claims, schemes=schemes, rules=rules, max_windows=windows,
                                                memory_mb=memory_mb, method=method, verifier=verifier)
                finally:
                    free.put(verifier)

            began, parent = time.perf_counter(), time.process_time()
            with ThreadPoolExecutor(ms.VERIFY_SLOTS) as ex:
                results[name] += list(ex.map(one, batch))
            wall[name] += time.perf_counter() - began
            cpu[name] += time.process_time() - parent
            load.append(os.getloadavg()[0])
    for name in methods:  # the verifiers exit: their CPU time, and their children's, is counted
        children = _children_cpu()
        for verifier in pools[name]:
            verifier.close()
        cpu[name] += _children_cpu() - children
    lines = [f"class scale: {n} distinct checkpoints verified as grade_batch does ({ms.VERIFY_SLOTS} at a time), "
             f"before and new in turn, {rounds} rounds of {n // rounds}; load average "
             f"{min(load):.1f}-{max(load):.1f}"]
    per = {}
    for name in methods:
        per[name] = (cpu[name] - startup[name]) / n
        total = startup[name] + CLASS * per[name]
        lines.append(f"  {name:<7} {wall[name]:7.1f} s wall, {cpu[name]:7.1f} CPU-s ({startup[name]:.1f} of them "
                     f"the verifiers' start-up): {per[name]:.2f} CPU-s per checkpoint; projected for {CLASS} on 2 "
                     f"cores: {total / 2 / 60:.1f} min ({total / 2 / GOAL_S:.0%} of the {GOAL_S // 60}-minute goal, "
                     f"leaving {max(0.0, 2 * GOAL_S - total) / CLASS:.1f} CPU-s per submission for its notebook)")
    lines.append(f"  new / before: {per['new'] / per['before']:.2f} of the CPU per checkpoint "
                 f"({per['before'] / per['new']:.2f}x less)")
    failed = [f"{name} perturbed {i}: {verdicts(r)}" for name in methods for i, r in enumerate(results[name])
              if not (r["ok"] and all(row["passed"] for row in r["schemes"].values()))]
    drift = max(move(a, b) for a, b in zip(results["before"], results["new"]))
    lines.append(f"  figures, new against before, over the {n} checkpoints: largest relative change {drift:.1e}")
    if drift > 1e-5:
        failed.append(f"class scale: new and before figures differ by {drift:.1e}")
    return lines, failed


def window_spread(*, schemes: Sequence[str], counts: Sequence[int], base: int = OLD_WINDOWS) -> list[str]:
    """Why verify_windows is not smaller: for each count k dividing `base`, the largest relative move of a
    reference figure (any scheme and context) from its `base`-window figure, over the base/k subsets of k evenly
    spaced windows (every offset), as an honest checkpoint's figures would move at k windows."""
    _, states = lm.load_checkpoint(REFERENCE / "milestone.pt")
    tokens, starts = lm.corpus_tokens(), lm.val_starts(max_windows=base)
    lines = []
    nll = {}
    with torch.inference_mode():
        for pos in schemes:
            model = ms.build_model(pos, states[pos])
            nll[pos] = torch.cat([F.cross_entropy(model(X).transpose(1, 2), Y, reduction="none").double()
                                  for X, Y in (lm.windows(tokens, b, max(lm.CONTEXTS)) for b in starts.split(10))])

    def figures(rows: torch.Tensor) -> dict[int, float]:
        prefix = rows.sum(0).cumsum(0)
        return {c: math.exp(prefix[c - 1].item() / (len(rows) * c)) for c in lm.CONTEXTS}

    for k in counts:
        step, worst, first = base // k, (0.0, ""), 0.0
        for pos, rows in nll.items():
            full = figures(rows)
            for offset in range(step):
                sub = figures(rows[offset::step])
                for c in lm.CONTEXTS:
                    worst = max(worst, (abs(sub[c] - full[c]) / full[c], f"{pos} at {c}"))
                    first = max(first, abs(sub[c] - full[c]) / full[c]) if offset == 0 else first
        lines.append(f"{k:>4} windows: figures move by up to {worst[0]:.2%} ({worst[1]}) over {step} offset(s), "
                     f"{first:.2%} at offset 0 (the grader's windows)")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Print old, before and new CPU seconds per checkpoint side by side, how far the figures move, the verdicts
    and the class-scale figures of before and new."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="tiny run (two schemes, one mistake, 20 windows)")
    parser.add_argument("--cores", type=int, default=2, help="CPUs this process and its children may use")
    parser.add_argument("--tune-steps", type=int, default=20, help="steps each mistaken model trains")
    parser.add_argument("--work", type=Path, default=None, help="folder for the mistakes' checkpoints (reused)")
    parser.add_argument("--class-n", type=int, default=None, help="distinct checkpoints at class scale (24)")
    parser.add_argument("--spread", action="store_true", help="only: how far the reference's figures move at "
                        "fewer windows (every offset of 100, 75, 60, 50 of the base windows)")
    parser.add_argument("--spread-base", type=int, choices=(300, 3000), default=OLD_WINDOWS,
                        help="--spread from the 300-window figures (a quick run's claims) or all 3000 (a full run's)")
    args = parser.parse_args(argv)
    if hasattr(os, "sched_setaffinity"):
        cpus = sorted(os.sched_getaffinity(0))[: args.cores]
        os.sched_setaffinity(0, cpus)
    torch.set_num_threads(max(1, args.cores))
    schemes = ("rope", "alibi") if args.smoke else lm.SCHEMES
    if args.spread:
        print(f"from the reference's {args.spread_base}-window figures, {', '.join(schemes)}:")
        print("\n".join(window_spread(schemes=schemes, counts=(100, 75, 60, 50), base=args.spread_base)))
        return 0
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
    started = ms.Verifier().start()
    print(f"{len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()} cores, torch "
          f"{torch.__version__}, load average {os.getloadavg()[0]:.1f}; old: a process per checkpoint, {old_windows} "
          f"windows, a pass per context, {ms._threads()} threads; before: a child forked from a started verifier, "
          f"one thread, {new_windows} windows, one 512-token pass each; new: as before, the attention by query "
          f"chunks of {ms.CAUSAL_CHUNK} (the verifier's start-up, once: {started.startup['cpu_s']:.1f} CPU-s); "
          f"mistakes' checkpoints built in {time.perf_counter() - began:.0f} s under {work}")
    print(f"{'checkpoint':<40} {'old s':>7} {'new s':>7} {'old cpu':>8} {'before cpu':>10} {'new cpu':>8} "
          f"{'ratio':>6} {'vs before':>9} {'moved':>7} {'drift':>8} {'margin':>7}  verdicts")
    flipped, totals = [], [0.0] * 5
    worst = drift_worst = 0.0
    for name, (pt, js, touched) in checkpoints.items():
        if not touched:
            print(f"{name:<40} {'its weights and claims are the reference checkpoint:':>50} {', '.join(schemes)}")
            continue
        old, old_s, old_cpu = timed(pt, js, schemes=touched, windows=old_windows, mode="old", started=started)
        before, _, before_cpu = timed(pt, js, schemes=touched, windows=new_windows, mode="before", started=started)
        new, new_s, new_cpu = timed(pt, js, schemes=touched, windows=new_windows, mode="new", started=started)
        for i, v in enumerate((old_s, new_s, old_cpu, before_cpu, new_cpu)):
            totals[i] += v
        was, now = verdicts(old), verdicts(new)
        flipped += [f"{name}/{pos}: {was[pos]} -> {now[pos]}" for pos in was if was[pos] != now[pos]]
        flipped += [f"{name}/{pos}: before {v} -> new {now[pos]}" for pos, v in verdicts(before).items()
                    if v != now[pos]]
        drift_worst = max(drift_worst, drift := move(before, new))
        if drift > 1e-5:  # the same windows and pass, the attention by chunks: only float rounding may differ
            flipped.append(f"{name}: before and new figures differ by {drift:.2e}")
        if old["ok"] != new["ok"]:
            flipped.append(f"{name}: ok {old['ok']} -> {new['ok']}")
        worst = max(worst, moved := move(old, new))
        nothing = new_cpu <= 0.2  # nothing evaluated: cached or unfit
        ratio = "-" if nothing else f"{old_cpu / new_cpu:5.1f}x"
        versus = "-" if nothing else f"{before_cpu / new_cpu:5.2f}x"
        shown = ", ".join(f"{p} {v}" for p, v in now.items()) if old["ok"] else old["message"][:60]
        print(f"{name:<40} {old_s:7.2f} {new_s:7.2f} {old_cpu:8.2f} {before_cpu:10.2f} {new_cpu:8.2f} {ratio:>6} "
              f"{versus:>9} {moved:7.2%} {drift:8.1e} {margin(new, rules):7.2%}  {shown}", flush=True)
    print(f"{'all':<40} {totals[0]:7.2f} {totals[1]:7.2f} {totals[2]:8.2f} {totals[3]:10.2f} {totals[4]:8.2f} "
          f"{totals[2] / max(totals[4], 1e-9):5.1f}x {totals[3] / max(totals[4], 1e-9):8.2f}x {worst:7.2%} "
          f"{drift_worst:8.1e}")
    print("ratio: old / new CPU; vs before: before / new CPU; moved: the largest relative change of a figure (scheme, "
          "context) from old to new; drift: the same from before to new (float rounding of the chunked attention); "
          "margin: how far the new figures are from changing a verdict (relative difference past rel_tol, or "
          f"distance from a bound); load average now {os.getloadavg()[0]:.1f}")
    started.close()
    lines, failed = class_scale(args.class_n or (2 if args.smoke else 24), schemes=schemes, windows=new_windows,
                                rounds=1 if args.smoke else 2)
    print("\n".join(lines))
    flipped += failed
    print(f"flipped: {'; '.join(flipped) if flipped else 'none'}")
    return 1 if flipped else 0


if __name__ == "__main__":
    raise SystemExit(main())
