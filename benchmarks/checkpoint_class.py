"""A class of N students, each with a checkpoint of its own, graded as `lesson83 grade` grades it: wall, stages, floor.

The class (default 300) is built in a temporary folder: one folder per student holding the reference notebook
(dist/samples/reference/lesson83.ipynb) and its milestone.pt with the weights perturbed by 1e-4 relative noise (seed
= the student's number, as benchmarks/checkpoint_verify.py perturbs them) and milestone.json unchanged. A fresh
process grades it with the package's batch grader exactly as `lesson83 grade` does (grade_batch into a fresh out
folder, the workers of grading_config.yaml), with the grader's opt-in phase record ($LESSON83_PHASES,
autograder/grading/phases.py) and the throughput benchmark's CPU split (benchmarks/grading_throughput.py), and
counts each checkpoint reader's requests and CPU seconds. The expected values are computed (and cached) before the
clock starts, as a release leaves them for every grading run. Printed: the wall time (the grading process from its
start to its end, and grade_batch's call), where it went stage by stage, how many got full marks (all must), and
the floor those measured costs allow: the fixed start-up plus the CPU seconds of the notebook runs, of the
checkpoint verification (its reader processes and their children) and of the grading process itself, spread over
the cores; the goal is at most 150 s for 300 students on 2 cores.

    python benchmarks/checkpoint_class.py               # 300 students (about 3 minutes on 2 cores)
    python benchmarks/checkpoint_class.py --smoke       # 3 students: the benchmark still runs
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.grading_throughput import SAMPLES, cpu_split, goal, grade_ours, machine_lines  # noqa: E402

NOTEBOOK = "lesson83.ipynb"
FILES = ("milestone.pt", "milestone.json")
CLASS = 300
SMOKE = 3
GOAL_S = 150.0
NOISE = 1e-4  # relative noise on every floating-point weight, per student


# --------------------------------------------------------------------------- the class


def build_class(dest: Path, *, n: int, samples: Path = SAMPLES) -> list[Path]:
    """n student folders under `dest`: the reference notebook, its milestone.json, and its milestone.pt with the
    weights times (1 + NOISE x standard normal noise), seed i for student i (checkpoint_verify.perturbed's rule)."""
    import torch

    source = samples / "reference"
    missing = [name for name in (NOTEBOOK, *FILES) if not (source / name).is_file()]
    if missing:
        raise SystemExit(f"{source} lacks {', '.join(missing)}; build the release first: "
                         "python -m autograder.cli release")
    ckpt = torch.load(source / "milestone.pt", map_location="cpu", weights_only=True)
    out = []
    for i in range(n):
        folder = dest / f"student{i:03d}"
        folder.mkdir(parents=True)
        gen = torch.Generator().manual_seed(i)
        states = {pos: {k: v * (1 + NOISE * torch.randn(v.shape, generator=gen)) if v.is_floating_point() else v
                        for k, v in state.items()} for pos, state in ckpt["state_dicts"].items()}
        buf = io.BytesIO()
        torch.save({"config": ckpt["config"], "state_dicts": states}, buf)
        (folder / "milestone.pt").write_bytes(buf.getvalue())
        for name in (NOTEBOOK, "milestone.json"):
            shutil.copyfile(source / name, folder / name)
        out.append(folder)
    return out


# --------------------------------------------------------------------------- the grading process


def grade_child(*, submissions: Path, out: Path, record: Path, workers: int | None) -> None:
    """In the grading process ($LESSON83_PHASES set by the caller): grade with grade_ours (grade_batch, as `lesson83
    grade` calls it, the CPU of each sandboxed run recorded), counting each checkpoint reader's start-up and
    requests; the figures go to `record` as JSON."""
    from autograder.checkpoint import reader_pool
    from autograder.course import course_of
    from autograder.grading import phases
    from autograder.sandbox import Verifier, WorkerPool

    phases.started("start-up (interpreter and imports)")

    requests: list[dict[str, Any]] = []
    starts: list[float] = []
    exits: list[float | None] = []
    request, start, close = Verifier.request, Verifier.start, Verifier.close

    def counted_request(self: Verifier, data: bytes, req: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        began = time.monotonic()
        answer = request(self, data, req, **kwargs)
        requests.append({"method": str(req.get("method")), "cpu_s": float(answer.get("cpu_s", 0.0)),
                         "wall_s": time.monotonic() - began, "error": "error" in answer})
        return answer

    def counted_start(self: Verifier) -> Verifier:
        was = self.alive()
        started = start(self)
        if not was:
            starts.append(float(self.startup.get("cpu_s", 0.0)))
        return started

    def counted_close(self: Verifier, **kwargs: Any) -> None:
        running = self.proc is not None
        close(self, **kwargs)
        if running:
            exits.append(self.exit_cpu_s)

    first_run: list[float] = []  # this process's CPU seconds when the first notebook run starts
    run_one = WorkerPool.run

    def noted_run(self: WorkerPool, source: bytes, **kwargs: Any) -> Any:
        if not first_run:
            first_run.append(time.process_time())
        return run_one(self, source, **kwargs)

    Verifier.request, Verifier.start = counted_request, counted_start  # type: ignore[method-assign]
    Verifier.close = counted_close  # type: ignore[method-assign]
    WorkerPool.run = noted_run  # type: ignore[method-assign]  # grade_ours wraps it in turn
    course = course_of()
    run, import_s = grade_ours(submissions, out=out, workers=workers)
    plugin = course.lesson.plugin
    with phases.phase("closing the checkpoint readers"):
        reader_pool(plugin.PLUGIN, shipped=plugin.SHIPPED).close()  # as the process's exit would (atexit)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    record.write_text(json.dumps({
        "total_s": run.total_s, "import_s": import_s, "workers": run.workers, "note": run.note,
        "cpu_self_s": run.cpu_self_s, "cpu_process_s": usage.ru_utime + usage.ru_stime,
        "cpu_first_run_s": first_run[0] if first_run else 0.0, "cpu_jobs": run.cpu_jobs,
        "steps": run.steps, "statuses": run.statuses, "totals": run.totals,
        "points": sum(course.suite.question_points().values()), "auto_points": auto_points(out),
        "requests": requests, "reader_starts": starts, "reader_exits": exits}))


def auto_points(out: Path) -> dict[str, float]:
    """Per submission, the points its auto-graded questions could earn (its result file's cases)."""
    points = {}
    for row in json.loads((out / "summary.json").read_text())["rows"]:
        if row["result"] is not None:
            result = json.loads((out / "results" / row["result"]).read_text())
            points[row["id"]] = round(sum(float(c.get("points", 0.0)) for c in result.get("cases", [])), 4)
    return points


# --------------------------------------------------------------------------- the report


def machine_cpu() -> tuple[float, float]:
    """The machine's busy and idle core-seconds since boot (/proc/stat; zeros where it cannot be read)."""
    try:
        ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0.0, 0.0
    hz = os.sysconf("SC_CLK_TCK")
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle and iowait
    return (sum(ticks[:8]) - idle) / hz, idle / hz


def extents(spans: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per phase: how many spans, their summed seconds, and their extent (first start to last end)."""
    out: dict[str, dict[str, float]] = {}
    for s in spans:
        row = out.setdefault(s["phase"], {"n": 0, "sum": 0.0, "first": s["start"], "last": s["end"]})
        row["n"] += 1
        row["sum"] += s["end"] - s["start"]
        row["first"], row["last"] = min(row["first"], s["start"]), max(row["last"], s["end"])
    return out


def report(data: dict[str, Any], record: dict[str, Any], *, wall_s: float, cores: int, n: int,
           load: tuple[float, float], machine: tuple[float, float]) -> tuple[list[str], bool]:
    """The benchmark's lines, and whether every student got full marks."""
    spans, figures = extents(record.get("spans", [])), record.get("figures", {})
    lines = [f"grading: {wall_s:.1f} s wall, the grading process from start to end (grade_batch's call: "
             f"{data['total_s']:.1f} s; {data['note']}); load average {load[0]:.2f} at start, {load[1]:.2f} at end"]
    lines.append(f"  {'stage (phases overlap)':<44} {'from s':>7} {'to s':>7} {'extent s':>8} {'spans':>5} "
                 f"{'summed s':>8}")
    for name, row in spans.items():
        lines.append(f"  {name:<44} {row['first']:7.1f} {row['last']:7.1f} {row['last'] - row['first']:8.1f} "
                     f"{int(row['n']):5d} {row['sum']:8.1f}")
    for name, value in figures.items():
        lines.append(f"  {name:<44} {value:.1f}")
    requests = data["requests"]
    methods = sorted({r["method"] for r in requests})
    reader_cpu = sum(x for x in data["reader_exits"] if x is not None)
    children = sum(r["cpu_s"] for r in requests)
    lines.append(f"checkpoint readers: {len(data['reader_starts'])} started ({sum(data['reader_starts']):.1f} CPU-s "
                 f"of start-up), {len(requests)} requests: " + ", ".join(
                     f"{m} {sum(r['method'] == m for r in requests)} x "
                     f"{statistics.median([r['cpu_s'] for r in requests if r['method'] == m]):.2f} CPU-s "
                     f"(wall {statistics.median([r['wall_s'] for r in requests if r['method'] == m]):.2f} s)"
                     for m in methods) + f"; children {children:.1f} CPU-s, readers in all (as they exited) "
                 f"{reader_cpu:.1f} CPU-s" + (" (a reader did not say)" if None in data["reader_exits"] else ""))
    notebooks = sum(data["cpu_jobs"])
    grader = data["cpu_process_s"] - data["cpu_first_run_s"]  # judging, storing, verifying's own part, writing
    lines.append(f"CPU-s: notebook runs {notebooks:.1f} ({notebooks / max(1, len(data['cpu_jobs'])):.3f} each), "
                 f"checkpoint verification {reader_cpu:.1f} ({reader_cpu / n:.3f} each), the grading process "
                 f"{data['cpu_process_s']:.1f} ({grader:.1f} of them once the first notebook ran)")
    if data["steps"]:
        lines += cpu_split(data["steps"])
    # The floor: what precedes the first notebook run (the interpreter, imports, suite, the sandbox's start beside
    # the expected values), then every CPU second measured after it spread over the cores.
    # The readers start beside the sandbox: their start-up is part of the fixed start-up, not of the work after it.
    fixed = max(spans.get(name, {}).get("last", 0.0) for name in ("suite", "sandbox start", "expected values"))
    verifying = reader_cpu - sum(data["reader_starts"])
    work = notebooks + verifying + grader
    floor = fixed + work / cores
    lines.append(f"floor: {floor:.1f} s = fixed start-up {fixed:.1f} s (interpreter, imports, suite, sandbox start "
                 f"beside the expected values and the readers' start) + ({notebooks:.1f} CPU-s of notebook runs + "
                 f"{verifying:.1f} of checkpoint verification + {grader:.1f} of the grading process) / {cores} cores; "
                 f"measured / floor: {wall_s / floor:.2f}")
    if machine[0] or machine[1]:
        busy, idle = machine
        lines.append(f"the machine during the run: {busy:.1f} busy core-seconds ({busy - work:.1f} of them not "
                     f"counted above: the sandbox workers' start-up and service, start-up before the first run, "
                     f"other processes), {idle:.1f} idle ({idle / (cores * wall_s):.0%} of {cores} x {wall_s:.1f} s)")
    full = [sid for sid, total in data["totals"].items() if total >= data["auto_points"].get(sid, float("inf")) - 1e-9]
    statuses: dict[str, int] = {}
    for s in data["statuses"].values():
        statuses[s] = statuses.get(s, 0) + 1
    said = ", ".join(f"{k} {v}" for k, v in sorted(statuses.items()))
    lines.append(f"full marks: {len(full)} of {n} (statuses: {said}"
                 f"; totals {', '.join(sorted({f'{t:g}' for t in data['totals'].values()}))} of "
                 f"{', '.join(sorted({f'{p:g}' for p in data['auto_points'].values()}))} auto-graded points)")
    lines.append(f"{n} students with checkpoints on {cores} cores: {wall_s:.1f} s   goal <= {GOAL_S:g} s: "
                 f"{goal(wall_s <= GOAL_S)}" + ("" if n == CLASS else f" (judged for {CLASS} only)"))
    return lines, len(full) == n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=CLASS, help=f"students (default {CLASS})")
    parser.add_argument("--smoke", action="store_true", help=f"a class of {SMOKE}: the benchmark runs")
    parser.add_argument("--workers", type=int, default=None, help="the grader's workers (default: grading_config)")
    parser.add_argument("--samples", type=Path, default=SAMPLES, help="the release's sample submissions folder")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder and print its path")
    parser.add_argument("--grade", type=Path, default=None, help=argparse.SUPPRESS)  # the grading process's class
    parser.add_argument("--out", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--record", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.grade is not None:
        grade_child(submissions=args.grade, out=args.out, record=args.record, workers=args.workers)
        return 0
    n = SMOKE if args.smoke else args.n
    if n < 1:
        parser.error("--n must be at least 1")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    print("\n".join(machine_lines()))
    tmp = Path(tempfile.mkdtemp(prefix="checkpoint-class-"))
    try:
        began = time.perf_counter()
        build_class(tmp / "class", n=n, samples=args.samples)
        print(f"{n} students, each the reference notebook with its checkpoint perturbed by {NOISE:g} (claims "
              f"unchanged), built in {time.perf_counter() - began:.1f} s under {tmp / 'class'}", flush=True)
        from autograder.course import course_of
        from autograder.grading.phases import PHASES_ENV

        course_of().suite.expected  # noqa: B018 - cached as `release` leaves them: a course's every grading run finds them

        env = {**os.environ, PHASES_ENV: str(tmp / "phases.json")}
        cmd = [sys.executable, str(Path(__file__).resolve()), "--grade", str(tmp / "class"), "--out",
               str(tmp / "grades"), "--record", str(tmp / "record.json")]
        if args.workers:
            cmd += ["--workers", str(args.workers)]
        load0, machine0 = os.getloadavg()[0], machine_cpu()
        began = time.perf_counter()
        proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - began
        machine = tuple(b - a for a, b in zip(machine0, machine_cpu(), strict=True))
        if proc.returncode != 0:
            print(proc.stdout[-3000:] + proc.stderr[-3000:], file=sys.stderr)
            return 1
        data = json.loads((tmp / "record.json").read_text())
        record = json.loads((tmp / "phases.json").read_text())
        lines, full = report(data, record, wall_s=wall, cores=cores, n=n,
                             load=(load0, os.getloadavg()[0]), machine=machine)
        print("\n".join(lines))
    finally:
        if args.keep:
            print(f"kept: {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0 if full else 1


if __name__ == "__main__":
    sys.exit(main())
