"""Checkpoint verification before and after issue 23: CPU seconds per checkpoint and verdicts, side by side.

"before" is the grader of issue 13 as it stood: a child forked per checkpoint from a pre-started verifier (torch
imported and the five models built once), one thread, the configured verify_windows (100) re-evaluated in one
512-token pass each with the attention by query chunks (method "prefix"), the three figures compared with
milestone.json's within rel_tol. "new" is today's grader (method "sample"): milestone.json's perplexities must be
the exp-mean of its per-window losses, and a secret random sample of sample_windows windows per scheme, plus every
window with a probability proportional to how far its claim lies below the reference-based prediction, is
recomputed and compared window by
window (docs/milestone.md). The checkpoints are the committed reference; the sample class's inflated claims (the
perplexities x 0.9, the windows untouched); the same lie told consistently (every window loss + log 0.9); a
concentrated lie (3% of the windows claimed at loss 0) and a spread one (every window 0.03 nats lower), each with
consistent perplexities; and one checkpoint per catalogued milestone mistake: the reference weights of the schemes
it touches loaded into the mistaken TinyCharLM, tuned a few steps with it, and its claims measured by that class
as the student's notebook would (the quick preset's 300 windows); only those schemes are verified. The class-scale
figure verifies N distinct checkpoints (the reference with its weights perturbed by 1e-4 relative noise, its
claims unchanged) as grade_batch does, from VERIFY_SLOTS threads on verifiers started for the run, before and new
in turn, and projects the CPU time of a class of 300 on 2 cores (start-up counted once).
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import random
import resource
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from autograder.course import course_of
from reference.lesson83_mistakes import MISTAKES, reference_namespace

ms = course_of().lesson.plugin  # the milestone plug-in: assignments/lesson83/lesson83_checkpoint.py

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
    claims = json.loads((REFERENCE / "milestone.json").read_text())
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
        models, table = {}, lm.Table()
        table.windows = {}
        for pos in schemes:
            model, affected, fits = _affected(cls, pos, states[pos])
            if not affected:
                continue
            table.windows[pos] = {int(c): v for c, v in claims["window_loss"][pos].items()}
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
                table.windows[pos] = lm.evaluate_windows(model, max_windows=claim_windows)
            table[pos] = lm.ppl_from_windows(table.windows[pos])
        pt.parent.mkdir(parents=True, exist_ok=True)
        lm.save_checkpoint(models, table, preset="quick", pt_path=pt, json_path=js)
        out[f"mistake_{m.id}"] = (pt, js, tuple(models))
    return out


def timed(pt: Path | bytes, js: Path | bytes, *, schemes: Sequence[str], windows: int, method: str,
          started: ms.Verifier, rng: random.Random | None = None) -> tuple[dict[str, Any], float, float]:
    """verify_checkpoint's verdict with `method`, its wall-clock seconds and the CPU seconds of its child (forked
    from the verifier `started`)."""
    wall = time.perf_counter()
    result = ms.verify_checkpoint(pt, js, schemes=schemes, rules=ms.load_rules(), max_windows=windows,
                                  method=method, verifier=started, rng=rng)
    return result, time.perf_counter() - wall, result["cpu_s"]


def verdicts(result: dict[str, Any]) -> dict[str, str]:
    """Per scheme: pass, or the problem id."""
    return {pos: "pass" if row["passed"] else str(row["problem"]) for pos, row in result["schemes"].items()}


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
    grader before issue 23 ("prefix") and today's ("sample") in turn, `rounds` times n/rounds checkpoints each;
    the summary lines and the checkpoints not passed."""
    import queue


    memory_mb = course_of().config.submissions.checkpoint_memory_mb
    claims = (REFERENCE / "milestone.json").read_bytes()
    files, rules = perturbed(n), ms.load_rules()
    methods = {"before": "prefix", "new": "sample"}
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
        said = [v.exit_cpu_s for v in pools[name]]  # as they said it: inside bubblewrap no wait reaches this process
        cpu[name] += sum(said) if None not in said else _children_cpu() - children  # type: ignore[arg-type]
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


def escape_bound(residuals: Sequence[float], *, k: int, audit: float, delta: float) -> tuple[float, int]:
    """The largest probability that a lie moving one figure by more than rel_tol escapes the sampled grader, for a
    model whose true window losses lie `residuals` (nats) above the reference-based prediction, and the number of
    lied windows that attains it. A lie on m windows escapes the k uniform draws with probability
    C(n-m, k) / C(n, k), and the deficit audit with probability exp(-audit (1 - R/delta)) at most, R the part of
    the lie hidden in the model's own excess (the m largest positive residuals, summed, over n): docs/milestone.md."""
    n, top = len(residuals), sorted((max(r, 0.0) for r in residuals), reverse=True)
    worst, hidden, miss = (0.0, 0), 0.0, 1.0
    for m in range(1, n + 1):
        hidden += top[m - 1] / n
        miss = math.prod((n - m - j) / (n - j) for j in range(k)) if m <= n - k else 0.0
        worst = max(worst, (miss * math.exp(-audit * max(0.0, 1 - hidden / delta)), m))
    return worst


def escape_table(files: dict[str, Path], rules: ms.MilestoneRules) -> list[str]:
    """Per honest claims file (its claims are the truth): per scheme, the spread of its windows' residuals from the
    reference-based prediction (fitted on all windows) and the worst escape bound over its contexts."""
    ref, base = ms.reference_windows(), int(lm.val_starts()[0])
    delta = math.log1p(rules.rel_tol) - 2 * rules.window_tol
    lines = [f"escape bound: k = {rules.sample_windows}, deficit_audit = {rules.deficit_audit:g}, "
             f"delta = log(1 + {rules.rel_tol:g}) - 2 x {rules.window_tol:g} = {delta:.4f}; exp(-audit) = "
             f"{math.exp(-rules.deficit_audit):.2%} for a model that tracks the reference"]
    for name, path in files.items():
        claims = json.loads(path.read_text())
        starts = lm.val_starts(max_windows=lm.PRESETS[claims["preset"]]["eval_windows"]).tolist()
        for pos, row in claims["window_loss"].items():
            cells, worst = [], (0.0, 0)
            for c in lm.CONTEXTS:
                y, x = row[str(c)], [ref[pos][c][t - base] for t in starts]
                a, b = ms._fit(x, y)
                r = [v - a - b * u for u, v in zip(x, y, strict=True)]
                sd = math.sqrt(math.fsum(v * v for v in r) / len(r))
                bound = escape_bound(r, k=rules.sample_windows, audit=rules.deficit_audit, delta=delta)
                worst = max(worst, bound)
                cells.append(f"{c}: sd {sd:.3f}, mean excess {math.fsum(max(v, 0) for v in r) / len(r):.4f}")
            lines.append(f"  {name:<34} {pos:<10} escape <= {worst[0]:.2%} (lie on {worst[1]} windows); "
                         + "; ".join(cells))
    return lines


def lies(claims: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Dishonest milestone.json files made from honest claims: the sample class's (perplexities x 0.9, windows
    untouched), the same lie told consistently, a concentrated one and a spread one (perplexities recomputed)."""
    def consistent(change: Any) -> dict[str, Any]:
        windows = {p: {c: [round(change(i, v), 6) for i, v in enumerate(row)] for c, row in r.items()}
                   for p, r in claims["window_loss"].items()}
        ppl = {p: {c: v for c, v in lm.ppl_from_windows({int(c): row for c, row in r.items()}).items()}
               for p, r in windows.items()}
        return claims | {"window_loss": windows, "ppl": {p: {str(c): v for c, v in r.items()} for p, r in ppl.items()}}

    n = len(next(iter(next(iter(claims["window_loss"].values())).values())))
    few = set(random.Random(7).sample(range(n), max(1, 3 * n // 100)))
    return {"inflated_claims": claims | {"ppl": {p: {c: v * 0.9 for c, v in row.items()}
                                                 for p, row in claims["ppl"].items()}},
            "inflated_windows": consistent(lambda i, v: max(0.0, v + math.log(0.9))),
            "concentrated_lie": consistent(lambda i, v: 0.0 if i in few else v),
            "spread_lie": consistent(lambda i, v: max(0.0, v - 0.03))}


def main(argv: Sequence[str] | None = None) -> int:
    """Print before and new CPU seconds per checkpoint and the verdicts side by side, and the class-scale figures."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="tiny run (two schemes, one mistake, 20 windows)")
    parser.add_argument("--cores", type=int, default=2, help="CPUs this process and its children may use")
    parser.add_argument("--tune-steps", type=int, default=20, help="steps each mistaken model trains")
    parser.add_argument("--work", type=Path, default=None, help="folder for the mistakes' checkpoints (reused)")
    parser.add_argument("--class-n", type=int, default=None, help="distinct checkpoints at class scale (24)")
    parser.add_argument("--escape", type=Path, nargs="*", default=None, help="only: the escape bound for honest "
                        "claims files (default: the reference's and the mistakes' under --work)")
    parser.add_argument("--seed", type=int, default=None, help="the new grader's window sampler (default: secret)")
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
    rules = ms.load_rules()
    if args.escape is not None:
        files = {"reference": REFERENCE / "milestone.json"} | (
            {f"{p.parent.name}": p for p in args.escape} if args.escape else
            {f"mistake_{p.parent.name}": p for p in sorted((args.work or Path()).glob("mistakes/*/milestone.json"))})
        print("\n".join(escape_table(files, rules)))
        return 0
    windows = 20 if args.smoke else rules.verify_windows
    work = args.work or Path(tempfile.mkdtemp(prefix="checkpoint_verify_"))
    claims = json.loads((REFERENCE / "milestone.json").read_text())
    checkpoints = {"reference": (REFERENCE / "milestone.pt", REFERENCE / "milestone.json", schemes)}
    for name, record in lies(claims).items():
        (work / name).mkdir(parents=True, exist_ok=True)
        (work / name / "milestone.json").write_text(json.dumps(record))
        checkpoints[name] = (REFERENCE / "milestone.pt", work / name / "milestone.json", schemes)
    began = time.perf_counter()
    checkpoints |= mistake_checkpoints(work / "mistakes", schemes=schemes, tune_steps=2 if args.smoke else
                                       args.tune_steps, claim_windows=lm.PRESETS["quick"]["eval_windows"],
                                       only=("lm_rotates_v",) if args.smoke else ())
    rng = random.Random(args.seed) if args.seed is not None else None
    started = ms.Verifier().start()
    print(f"{len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()} cores, torch "
          f"{torch.__version__}, load average {os.getloadavg()[0]:.1f}; before: {windows} windows re-evaluated, one "
          f"512-token pass each, figures compared within {rules.rel_tol:.0%}; new: {rules.sample_windows} random "
          f"windows per scheme ({'seed ' + str(args.seed) if rng else 'secret seed'}) plus others with a probability "
          f"proportional to their claim's deficit "
          f"(deficit_audit {rules.deficit_audit:g}), each within {rules.window_tol:g} nats; both a child "
          f"forked from a started verifier, one thread (its start-up, once: {started.startup['cpu_s']:.1f} CPU-s); "
          f"mistakes' checkpoints built in {time.perf_counter() - began:.0f} s under {work}")
    print(f"{'checkpoint':<40} {'before s':>8} {'new s':>6} {'before cpu':>10} {'new cpu':>8} {'ratio':>6} "
          f"{'windows':>8}  verdicts (before -> new)")
    flipped, totals, count = [], [0.0] * 4, 0
    for name, (pt, js, touched) in checkpoints.items():
        if not touched:
            print(f"{name:<40} {'its weights and claims are the reference checkpoint:':>50} {', '.join(schemes)}")
            continue
        # from scratch each (no figure of these weights kept from an earlier row): claims that are not the
        # checkpoint's own evaluation pay the whole re-evaluation in the new column too
        ms._MEASURED.clear()
        ms._WINDOWS.clear()
        new, new_s, new_cpu = timed(pt, js, schemes=touched, windows=windows, method="sample", started=started,
                                    rng=rng)
        ms._MEASURED.clear()  # before from scratch
        before, before_s, before_cpu = timed(pt, js, schemes=touched, windows=windows, method="prefix",
                                             started=started)
        for i, v in enumerate((before_s, new_s, before_cpu, new_cpu)):
            totals[i] += v
        count += new_cpu > 0.2
        was, now = verdicts(before), verdicts(new)
        if name in ("inflated_windows", "concentrated_lie", "spread_lie"):
            # the old grader's verdict on these is the target: every scheme's claims are more than 2% off
            flipped += [f"{name}/{pos}: {now[pos]} (a lie must disagree)" for pos in now
                        if now[pos] != "checkpoint_claims_disagree"]
        else:
            flipped += [f"{name}/{pos}: {was[pos]} -> {now[pos]}" for pos in was if was[pos] != now[pos]]
        if before["ok"] != new["ok"]:
            flipped.append(f"{name}: ok {before['ok']} -> {new['ok']}")
        nothing = new_cpu <= 0.02  # nothing evaluated: cached or unfit
        ratio = "-" if nothing else f"{before_cpu / new_cpu:5.1f}x"
        checked = "/".join(str(row.get("checked", 0)) for row in new["schemes"].values())
        same = all(was[pos] == now[pos] for pos in was)
        shown = (", ".join(f"{p} {v}" for p, v in now.items()) + (" (same)" if same else
                 " (before: " + ", ".join(f"{p} {v}" for p, v in was.items()) + ")")
                 if before["ok"] else before["message"][:60])
        print(f"{name:<40} {before_s:8.2f} {new_s:6.2f} {before_cpu:10.2f} {new_cpu:8.2f} {ratio:>6} {checked:>8}  "
              f"{shown}", flush=True)
    print(f"{'all':<40} {totals[0]:8.2f} {totals[1]:6.2f} {totals[2]:10.2f} {totals[3]:8.2f} "
          f"{totals[2] / max(totals[3], 1e-9):5.1f}x")
    print("ratio: before / new CPU; windows: per scheme, the windows the new grader recomputed (random + flagged); "
          f"load average now {os.getloadavg()[0]:.1f}")
    started.close()
    lines, failed = class_scale(args.class_n or (2 if args.smoke else 24), schemes=schemes, windows=windows,
                                rounds=1 if args.smoke else 2)
    print("\n".join(lines))
    flipped += failed
    print(f"flipped: {'; '.join(flipped) if flipped else 'none'}")
    return 1 if flipped else 0


if __name__ == "__main__":
    raise SystemExit(main())
