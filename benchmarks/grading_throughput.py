"""Grading throughput: our sandboxed engine against `otter run` on the same honest submissions, side by side.

One run builds N honest submissions (copies of the reference, the blank template and every catalogued
mistake from dist/samples/, cycled to N), grades all of them with `autograder.grading.batch.grade_batch` and a
subset of them one by one with the real `otter run` CLI on the release's Otter autograder zip (half of them
before ours and half after, so that a drift of the machine's speed weighs on both engines alike), then prints the
timings, the ratio, the extrapolation to 100 submissions and a score comparison.

    python benchmarks/grading_throughput.py                  # N=40, otter run on 8 of them, three rounds
    python benchmarks/grading_throughput.py --n 100 --otter-n 4

By default the whole measurement runs three times over (`--rounds`), otter's calls straddling ours in each round,
and the goal of 50x is judged on the median of the rounds' ratios: one round's ratio moved between 45x and 66x on
identical code on the shared 2-core machines, whose speed drifts by a third within minutes.

The adversarial samples are left out on purpose: `otter run` has no timeout, so an infinite loop would
never return. Nothing here is a timed test; the figures go into the README.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import itertools
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DIST = ROOT / "dist"
SAMPLES = DIST / "samples"
OTTER_ZIP = DIST / "lesson83-otter-autograder.zip"

GOAL_MEDIAN_S = 1.0
GOAL_SPEEDUP = 50.0
GOAL_100_S = 60.0
SCORE_TOL = 0.01


@dataclass
class EngineRun:
    """What one engine did: wall time of the whole run, per-submission wall times and scores."""

    engine: str
    total_s: float
    per_sub: dict[str, float]
    totals: dict[str, float] = field(default_factory=dict)
    questions: dict[str, dict[str, float]] = field(default_factory=dict)
    statuses: dict[str, str] = field(default_factory=dict)
    workers: int = 1
    note: str = ""
    cpu_self_s: float = float("nan")  # CPU seconds of this (grading) process during the run
    cpu_jobs: list[float] = field(default_factory=list)  # CPU seconds of each submission's sandboxed run(s)
    # per submission: CPU seconds of each step, child side (as the child reports, ExecResult.timing) and grader side
    steps: list[dict[str, float]] = field(default_factory=list)


# --------------------------------------------------------------------------- inputs


def _reference_notebook(samples: Path) -> Path:
    """The reference notebook: samples/reference.ipynb, or the one notebook of the folder samples/reference/
    (the sample class uploads the reference as a folder with its milestone checkpoint; only the notebook is
    benchmarked, as `otter run` grades a notebook)."""
    found = sorted((samples / "reference").glob("*.ipynb")) if (samples / "reference").is_dir() else []
    return found[0] if len(found) == 1 else samples / "reference.ipynb"


def honest_samples(*, samples: Path = SAMPLES) -> list[Path]:
    """reference, blank, then every mistake_* notebook (sorted); never the adversarial ones."""
    wanted = [_reference_notebook(samples), samples / "blank.ipynb", *sorted(samples.glob("mistake_*.ipynb"))]
    missing = [p for p in wanted[:2] if not p.is_file()]
    if missing or len(wanted) < 3:
        raise SystemExit(f"{samples} lacks the sample submissions ({', '.join(map(str, missing)) or 'mistake_*'}); "
                         "build the release first: python -m autograder.cli release")
    return wanted


def build_submissions(dest: Path, *, n: int, samples: Path = SAMPLES) -> list[Path]:
    """Copy the honest samples into `dest`, cycled to `n` files named NNN_<sample>.ipynb."""
    dest.mkdir(parents=True, exist_ok=True)
    out, reference = [], _reference_notebook(samples)
    for i, src in zip(range(n), itertools.cycle(honest_samples(samples=samples))):
        path = dest / f"{i:03d}_{'reference' if src == reference else src.stem}.ipynb"
        shutil.copyfile(src, path)
        out.append(path)
    return out


def sample_of(path: Path) -> str:
    """The sample a copy came from: 007_mistake_pe_plain_attribute.ipynb -> mistake_pe_plain_attribute."""
    return path.stem.split("_", 1)[1]


def otter_subset(subs: list[Path], *, k: int) -> list[Path]:
    """k submissions for `otter run`: the reference, the blank, then distinct mistakes spread over the catalogue."""
    first: dict[str, Path] = {}
    for p in subs:
        first.setdefault(sample_of(p), p)
    chosen = [first[s] for s in ("reference", "blank") if s in first][:k]
    mistakes = [p for s, p in first.items() if s not in ("reference", "blank")]
    need = k - len(chosen)
    if need > 0 and mistakes:
        step = len(mistakes) / need
        picks = sorted({int(i * step) for i in range(need)})
        chosen += [mistakes[i] for i in picks if i < len(mistakes)]
    extra = [p for p in subs if p not in chosen]  # only when k exceeds the number of distinct samples
    return chosen + extra[: max(0, k - len(chosen))]


# --------------------------------------------------------------------------- our engine


def grade_ours(folder: Path, *, out: Path, workers: int | None) -> tuple[EngineRun, float]:
    """Grade `folder` with grade_batch (force, no progress bar); returns the run and the import time."""
    t0 = time.perf_counter()
    from autograder.course import course_of
    from autograder.grading.batch import grade_batch
    from autograder.sandbox import WorkerPool

    import_s = time.perf_counter() - t0
    cpu_jobs: list[float] = []
    steps: list[dict[str, float]] = []
    run = WorkerPool.run

    def timed_run(self: WorkerPool, source: bytes, **kwargs: object) -> object:
        talk0 = time.thread_time()
        result = run(self, source, **kwargs)  # type: ignore[arg-type]
        cpu_jobs.append(result.cpu_s)
        steps.append({**split_timing(result.timing), "grader: conversation": time.thread_time() - talk0})
        return result

    WorkerPool.run = timed_run  # type: ignore[method-assign]  # records each job's CPU (the zygote's wait4 rusage)
    workers = workers or course_of().config.execution.workers
    t1 = time.perf_counter()
    self0 = resource.getrusage(resource.RUSAGE_SELF)
    try:
        summary = grade_batch(folder, out=out, force=True, workers=workers, progress=False, course=course_of())
    finally:
        WorkerPool.run = run  # type: ignore[method-assign]
    total = time.perf_counter() - t1
    self1 = resource.getrusage(resource.RUSAGE_SELF)
    per_sub, statuses, totals, questions = {}, {}, {}, {}
    for row in json.loads((out / "summary.json").read_text())["rows"]:  # the batch's rows and result files
        sid = row["id"]
        statuses[sid] = row["status"]
        if row["result"] is None:  # not graded (the sandbox failed): no time, no score
            continue
        record = json.loads((out / "results" / row["result"]).read_text())
        per_sub[sid] = float(record.get("wall_s", float("nan")))
        totals[sid] = float(record["total"])
        questions[sid] = {q: float(record["questions"].get(q, 0.0)) for q in summary.questions}
    run = EngineRun("ours (grade_batch)", total, per_sub, totals, questions, statuses, workers=workers,
                    note=f"sandbox: {summary.sandbox}, workers: {workers}", cpu_self_s=_cpu(self1) - _cpu(self0),
                    cpu_jobs=cpu_jobs, steps=steps)
    for i, (judge_s, store_s) in enumerate(zip(summary.cpu["judge"], summary.cpu["store"], strict=False)):
        if i < len(steps):  # judged in the order run (one main thread); the medians need no pairing
            steps[i].update({"grader: judging": judge_s, "grader: storing": store_s})
    return run, import_s


def split_timing(timing: dict[str, object]) -> dict[str, float]:
    """A run's child-side CPU (ExecResult.timing) as named steps, the probes summed per question."""
    out = {"child: fork and cgroup (setup)": float(timing.get("setup", 0.0)),  # type: ignore[arg-type]
           "child: cells": float(timing.get("cells", 0.0))}  # type: ignore[arg-type]
    probes = timing.get("probes", {})
    for key, cpu in sorted(probes.items() if isinstance(probes, dict) else []):
        name = f"child: probes {key.split('/', 1)[0]}"
        out[name] = out.get(name, 0.0) + float(cpu)
    out["child: start, frames, exit (rest)"] = float(timing.get("rest", 0.0))  # type: ignore[arg-type]
    return out


def cpu_split(steps: list[dict[str, float]]) -> list[str]:
    """Median CPU seconds per submission of each step, and its share of the summed medians."""
    names = list(dict.fromkeys(k for s in steps for k in s))
    med = {k: statistics.median(s.get(k, 0.0) for s in steps) for k in names}
    total = sum(med.values()) or 1.0
    rows = [["step", "median CPU s/submission", "share"]]
    rows += [[k, f"{v:.4f}", f"{v / total:.0%}"] for k, v in med.items()]
    rows.append(["sum of the medians", f"{sum(med.values()):.4f}", ""])
    return ["CPU split per submission (child steps as the child reports them; grader steps by thread CPU):",
            table(rows)]


def _cpu(usage: resource.struct_rusage) -> float:
    return usage.ru_utime + usage.ru_stime


# --------------------------------------------------------------------------- otter run


def otter_command() -> list[str]:
    """The otter CLI of this Python (the one next to sys.executable), else the first on PATH."""
    local = Path(sys.executable).with_name("otter")
    if local.is_file():
        return [str(local)]
    found = shutil.which("otter")
    if not found:
        raise SystemExit("the otter CLI (otter-grader 7) is not installed in this environment")
    return [found]


def otter_scores(results_json: Path) -> dict[str, float]:
    """Per-question auto scores from otter run's results.json (Gradescope format: tests[].name/score)."""
    data = json.loads(results_json.read_text())
    return {t["name"]: float(t["score"]) for t in data.get("tests", []) if t.get("score") is not None}


def grade_otter(subs: list[Path], *, autograder: Path, work: Path, timeout_s: float,
                verbose: bool = False) -> EngineRun:
    """Run `otter run -a ZIP -o DIR SUB` once per submission, serially, timing each call end to end."""
    from autograder.model import Status

    cmd = otter_command()
    per_sub: dict[str, float] = {}
    questions: dict[str, dict[str, float]] = {}
    statuses: dict[str, str] = {}
    t0 = time.perf_counter()
    for i, sub in enumerate(subs, 1):
        sid = sub.stem
        run_dir = work / sid
        out_dir = run_dir / "out"
        out_dir.mkdir(parents=True)
        local = run_dir / sub.name
        shutil.copyfile(sub, local)
        start = time.perf_counter()
        try:
            proc = subprocess.run([*cmd, "run", "-a", str(autograder), "-o", str(out_dir), "--no-logo", local.name],
                                  cwd=run_dir, capture_output=True, text=True, timeout=timeout_s)
            rc, tail = proc.returncode, (proc.stdout + proc.stderr)[-600:]
        except subprocess.TimeoutExpired:
            rc, tail = -1, f"killed after {timeout_s:g} s"
        per_sub[sid] = time.perf_counter() - start
        results = out_dir / "results.json"
        if rc == 0 and results.is_file():
            questions[sid] = otter_scores(results)
            statuses[sid] = Status.GRADED
        else:
            statuses[sid] = f"failed (rc {rc})"
            print(f"  otter run failed on {sub.name}: {tail.strip()}", file=sys.stderr)
        if verbose:
            print(f"  otter run {i}/{len(subs)} {sub.name}: {per_sub[sid]:.1f} s", file=sys.stderr)
    total = time.perf_counter() - t0
    return EngineRun("otter run", total, per_sub, {}, questions, statuses, note="serial, one process per call")


def joined(runs: list[EngineRun]) -> EngineRun:
    """One engine's runs over disjoint submissions as one run (times, scores and statuses together)."""
    first = runs[0]
    return EngineRun(first.engine, sum(r.total_s for r in runs), {k: v for r in runs for k, v in r.per_sub.items()},
                     {k: v for r in runs for k, v in r.totals.items()},
                     {k: v for r in runs for k, v in r.questions.items()},
                     {k: v for r in runs for k, v in r.statuses.items()}, note=first.note)


# --------------------------------------------------------------------------- report


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100), as numpy's default."""
    xs = sorted(values)
    if not xs:
        return float("nan")
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def machine_lines() -> list[str]:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = os.cpu_count() or 0

    def version(dist: str) -> str:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    return [f"machine: {os.cpu_count()} cores ({affinity} usable), CPU: {model}",
            f"python {platform.python_version()}, torch {version('torch')}, otter-grader {version('otter-grader')}, "
            f"bwrap: {'yes' if shutil.which('bwrap') else 'no'}",
            f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}"]


def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [" | ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def goal(ok: bool) -> str:
    return "MET" if ok else "NOT MET"


def compare_scores(ours: EngineRun, otter: EngineRun) -> list[str]:
    """One line per submission graded by both: auto-graded totals side by side, disagreements flagged."""
    lines = [f"{'submission':44s} {'ours':>7s} {'otter':>7s}  verdict"]
    disagree = 0
    for sid in otter.per_sub:
        if sid not in ours.totals:
            lines.append(f"{sid:44s} {'-':>7s} {'-':>7s}  not graded by ours")
            continue
        if sid not in otter.questions:
            lines.append(f"{sid:44s} {ours.totals[sid]:7.3f} {'-':>7s}  otter run failed")
            disagree += 1
            continue
        qids = list(ours.questions[sid])  # auto-graded questions only (merged manual scores are not compared)
        theirs = otter.questions[sid]
        otter_total = sum(theirs.get(q, 0.0) for q in qids)
        diffs = [f"{q} {ours.questions[sid][q]:g} vs {theirs.get(q, 0.0):g}" for q in qids
                 if abs(ours.questions[sid][q] - theirs.get(q, 0.0)) > SCORE_TOL]
        ignored = sorted(set(theirs) - set(qids))
        verdict = "agree" if not diffs else "DISAGREE: " + "; ".join(diffs)
        if ignored:
            verdict += f" (otter-only tests not compared: {', '.join(ignored)})"
        disagree += bool(diffs)
        lines.append(f"{sid:44s} {ours.totals[sid]:7.3f} {otter_total:7.3f}  {verdict}")
    lines.append(f"{disagree} disagreement(s) on auto-graded totals among {len(otter.per_sub)} submission(s); "
                 "manual questions (q9) are not compared.")
    return lines


def report(ours: EngineRun, import_s: float, otter: EngineRun | None, *, n: int, cores: int) -> list[str]:
    our_times = list(ours.per_sub.values())
    our_med = statistics.median(our_times)
    rows = [["engine", "submissions", "total wall s", "median s/submission", "p90 s/submission",
             "wall s / submission"],
            [ours.engine, str(len(our_times)), f"{ours.total_s:.1f}", f"{our_med:.3f}",
             f"{percentile(our_times, 90):.3f}", f"{ours.total_s / len(our_times):.3f}"]]
    otter_med = None
    if otter and otter.per_sub:
        ot = list(otter.per_sub.values())
        otter_med = statistics.median(ot)
        rows.append([otter.engine, str(len(ot)), f"{otter.total_s:.1f}", f"{otter_med:.3f}",
                     f"{percentile(ot, 90):.3f}", f"{otter.total_s / len(ot):.3f}"])
    lines = [table(rows),
             f"ours: total includes worker start-up (grade_batch call, {ours.note}); importing "
             f"autograder.grading.batch took a further {import_s:.1f} s; "
             "per-submission times are results/<id>.json wall_s."]
    if ours.cpu_jobs:
        lines.append(f"ours, CPU s: sandboxed runs median {statistics.median(ours.cpu_jobs):.3f} per submission "
                     f"(sum {sum(ours.cpu_jobs):.1f}); grading process {ours.cpu_self_s:.1f} in all "
                     f"({ours.cpu_self_s / len(ours.cpu_jobs):.3f} per submission, reference values included)")
    if ours.steps:
        lines += cpu_split(ours.steps)
    if otter:
        lines.append(f"otter run: {otter.note}; each time is the whole CLI call (Python start-up, kernel, tests).")
    statuses: dict[str, int] = {}
    for s in ours.statuses.values():
        statuses[s] = statuses.get(s, 0) + 1
    lines.append("ours, statuses: " + ", ".join(f"{k} {v}" for k, v in sorted(statuses.items())))
    lines.append("")
    if otter_med is not None:
        subset_med = statistics.median(ours.per_sub[s] for s in otter.per_sub if s in ours.per_sub)
        ratio = otter_med / our_med
        lines.append(f"ratio otter median / our median: {ratio:.1f}x (same subset only: "
                     f"{otter_med / subset_med:.1f}x)   goal >= {GOAL_SPEEDUP:g}x: {goal(ratio >= GOAL_SPEEDUP)}")
    lines.append(f"our median per submission: {our_med:.3f} s   goal <= {GOAL_MEDIAN_S:g} s: "
                 f"{goal(our_med <= GOAL_MEDIAN_S)}")
    # Fixed-cost estimate: the batch's wall time less the submissions' own wall time spread over the workers
    # (worker start-up, plus judging and writing in the grader process where it does not overlap).
    busy = sum(our_times) / max(1, ours.workers)
    startup = max(0.0, ours.total_s - busy)
    modelled_100 = startup + busy * 100 / len(our_times)
    if n == 100:
        ours_100, how = ours.total_s, "measured"
    else:
        ours_100, how = modelled_100, f"model from {n}: fixed cost + 100 x per-submission rate; --n 100 measures"
    lines.append(f"100 submissions on {cores} cores, ours: {ours_100:.1f} s ({how})   goal <= {GOAL_100_S:g} s: "
                 f"{goal(ours_100 <= GOAL_100_S)}")
    lines.append(f"  ours, estimated split: fixed {startup:.1f} s (start-up, grader-side overhead) + "
                 f"{busy / len(our_times):.3f} s per submission (sum of per-submission wall / {ours.workers} workers); "
                 f"model for 100: {modelled_100:.1f} s")
    if otter_med is not None:
        lines.append(f"100 submissions on {cores} cores, otter run: {otter_med * 100 / cores:.0f} s "
                     f"(100 x median / {cores}, ideal parallel calls; serial: {otter_med * 100:.0f} s)")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=40, help="honest submissions to grade with our engine (>= 40)")
    parser.add_argument("--otter-n", type=int, default=8,
                        help="of those, how many to grade with `otter run` (about 10 s each; 0 skips otter)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="measure both engines this many times over, otter's calls straddling ours in each round; "
                             "the goal is judged on the median of the rounds' ratios (default 3)")
    parser.add_argument("--workers", type=int, default=None, help="our engine's workers (default: grading_config)")
    parser.add_argument("--otter-timeout", type=float, default=600.0, help="seconds before one otter run is killed")
    parser.add_argument("--samples", type=Path, default=SAMPLES, help="folder of sample submissions")
    parser.add_argument("--autograder", type=Path, default=OTTER_ZIP, help="the Otter autograder zip")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder and print its path")
    parser.add_argument("--allow-small", action="store_true", help="allow --n below 40 (smoke runs only)")
    args = parser.parse_args(argv)
    if args.n < 40 and not args.allow_small:
        parser.error("--n must be at least 40 (the benchmark's minimum); --allow-small for a smoke run")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.otter_n and not args.autograder.is_file():
        parser.error(f"{args.autograder} is missing; build the release: python -m autograder.cli release")
    sys.path.insert(0, str(ROOT))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1

    print("\n".join(machine_lines()))
    tmp = Path(tempfile.mkdtemp(prefix="grading-throughput-"))
    try:
        subs = build_submissions(tmp / "submissions", n=args.n, samples=args.samples)
        distinct = len({sample_of(p) for p in subs})
        print(f"{len(subs)} honest submissions ({distinct} distinct samples: reference, blank, "
              f"{distinct - 2} catalogued mistakes, cycled) in {tmp / 'submissions'}")
        subset = otter_subset(subs, k=min(args.otter_n, len(subs))) if args.otter_n > 0 else []
        # otter's calls straddle ours (half before, half after), so a drift of the machine's speed during a round
        # (it moves by a third within minutes on the shared machines) weighs on both engines alike
        first, second = subset[:len(subset) // 2], subset[len(subset) // 2:]
        ratios: list[float] = []

        def otter_part(part: list[Path], when: str, work: Path) -> EngineRun | None:
            if not part:
                return None
            print(f"grading {len(part)} with otter run, one by one, {when} ours: "
                  f"{', '.join(p.stem for p in part)} ...", flush=True)
            return grade_otter(part, autograder=args.autograder.resolve(), work=work, timeout_s=args.otter_timeout,
                               verbose=True)

        for r in range(1, args.rounds + 1):
            if args.rounds > 1:
                print(f"\n=== round {r} of {args.rounds} ===", flush=True)
            before = otter_part(first, "before", tmp / f"otter{r}")
            print("grading with ours ...", flush=True)
            ours, import_s = grade_ours(tmp / "submissions", out=tmp / f"ours{r}", workers=args.workers)
            print(f"  ours: {len(ours.per_sub)} graded in {ours.total_s:.1f} s", flush=True)
            after = otter_part(second, "after", tmp / f"otter{r}")
            otter_runs = [run for run in (before, after) if run is not None]
            otter = joined(otter_runs) if otter_runs else None
            print()
            print("\n".join(report(ours, import_s, otter, n=args.n, cores=cores)))
            if otter:
                print()
                print("scores, auto-graded questions only (ours: grades.csv; otter: results.json tests[].score)")
                print("\n".join(compare_scores(ours, otter)))
                if otter.per_sub:
                    ratios.append(statistics.median(otter.per_sub.values()) / statistics.median(ours.per_sub.values()))
        if len(ratios) > 1:
            ratio = statistics.median(ratios)
            print(f"\nrounds: ratio otter median / our median per round: {', '.join(f'{x:.1f}x' for x in ratios)}; "
                  f"median {ratio:.1f}x   goal >= {GOAL_SPEEDUP:g}x (median of the rounds): "
                  f"{goal(ratio >= GOAL_SPEEDUP)}")
        print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    finally:
        if args.keep:
            print(f"kept: {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
