"""One upload, as a student waits for it: the Gradescope zip's run_autograder against `otter run`, paired run by run.

Two uploads: the reference notebook with its milestone checkpoint (dist/samples/reference/), and a wrong notebook
without one (a catalogued mistake from dist/samples/). Ours runs as Gradescope runs it (and as
/work/shared/tools/gradescope-sim does): the zip unzipped into a private /autograder inside bubblewrap, no network,
an empty HOME, the submission in /autograder/submission, `bash /autograder/run_autograder`; the python on PATH (this
one's folder first) stands in for the image that setup.sh builds. Otter's is `otter run -a OTTER_ZIP NOTEBOOK` on
the same notebook (as benchmarks/grading_throughput.py calls it). Each pair runs both, the order alternating.

    python benchmarks/upload.py              # builds the release when dist/ lacks it; 4 pairs per upload
    python benchmarks/upload.py --pairs 6 --build

Printed per upload: the medians, their ratio (ours / otter) against the goal (at most 0.5 with a checkpoint, 0.4
without), the scores side by side (the questions both grade: otter's zip grades no checkpoint and no written
answer), and where our time went, from the grader's opt-in timing record ($LESSON83_PHASES,
autograder/grading/phases.py; medians over the pairs), with the floor seen: the start-up, then the longer of the
notebook's path (the sandbox's start and the notebook's run, one after the other) and the checkpoint's (its reader's
start and the verification, beside them).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DIST = ROOT / "dist"
NAME = "lesson83"
GOALS = {"reference": 0.5, "wrong": 0.4}  # ours / otter, at most
WRONG = "mistake_pe_sin_cos_swapped.ipynb"  # a wrong notebook, uploaded without a checkpoint
SCORE_TOL = 0.01
FLOOR = ("start-up (interpreter and imports)", "sandbox start", "notebook run (cells and checks)")


@dataclass
class Upload:
    """One upload's timings and scores: per engine, the wall seconds of each run and the last run's scores."""

    name: str
    path: Path  # a notebook, or a folder (the notebook and its checkpoint files)
    walls: dict[str, list[float]] = field(default_factory=lambda: {"ours": [], "otter": []})
    scores: dict[str, dict[str, float]] = field(default_factory=dict)
    phases: list[dict[str, float]] = field(default_factory=list)  # ours: phase -> seconds, one per run
    spans: list[dict[str, object]] = field(default_factory=list)  # ours: the last run's spans


def release(dist: Path, *, build: bool) -> None:
    """Build the release into dist/ (`python -m autograder.cli release`) when asked or when it is missing."""
    wanted = [dist / f"{NAME}-gradescope-autograder.zip", dist / f"{NAME}-otter-autograder.zip", dist / "samples"]
    if build or not all(p.exists() for p in wanted):
        print("building the release ...", flush=True)
        subprocess.run([sys.executable, "-m", "autograder.cli", "release"], cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL)


def notebook_of(path: Path) -> Path:
    """The notebook of an upload: the file itself, or the one notebook of its folder."""
    return path if path.is_file() else next(iter(sorted(path.glob("*.ipynb"))))


def question_scores(results: dict[str, object]) -> dict[str, float]:
    """Per-question scores of a Gradescope results.json (tests named `QID` or `QID: visible tests`); a test its zip
    says it does not grade is left out."""
    out: dict[str, float] = {}
    for test in results.get("tests", []):  # type: ignore[union-attr]
        if test.get("score") is None or "not graded" in str(test["name"]):  # otter's zip grades no checkpoint
            continue
        qid = str(test["name"]).split(":", 1)[0].split(" ", 1)[0]
        out[qid] = round(out.get(qid, 0.0) + float(test["score"]), 4)
    return out


def image_env() -> dict[str, str]:
    """The environment the image gives: this python's folder first on PATH, nothing of this checkout's."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}"
    return env


def run_ours(zip_path: Path, upload: Path, work: Path) -> tuple[float, dict[str, object], dict[str, object]]:
    """run_autograder as Gradescope runs it (gradescope-sim's way): the wall seconds, results.json and the phases
    the grader recorded."""
    ag = work / "ag"
    for sub in ("source", "submission", "results", ".shim", ".home", ".tmp"):
        (ag / sub).mkdir(parents=True)
    with zipfile.ZipFile(zip_path) as zf:
        zf.extractall(ag / "source")
    for member in (ag / "source").rglob("*"):  # zipfile drops the modes; Gradescope keeps run_autograder's
        if member.name in ("run_autograder", "setup.sh"):
            member.chmod(0o755)
    if upload.is_dir():
        shutil.copytree(upload, ag / "submission", dirs_exist_ok=True)
    else:
        shutil.copy2(upload, ag / "submission")
    shutil.copy2(ag / "source" / "run_autograder", ag / "run_autograder")
    (ag / ".shim" / "mamba").write_text("#!/bin/sh\nexit 0\n")
    (ag / ".shim" / "mamba").chmod(0o755)
    binds = [a for d in sorted(Path("/").iterdir()) if str(d) not in ("/proc", "/dev", "/sys", "/autograder")
             and d.exists() for a in ("--ro-bind", str(d), str(d))]
    env = image_env()
    cmd = ["bwrap", "--tmpfs", "/", *binds, "--dev", "/dev", "--proc", "/proc", "--bind", str(ag), "/autograder",
           "--unshare-net", "--unshare-pid", "--die-with-parent", "--chdir", "/autograder",
           "--setenv", "PATH", f"/autograder/.shim:{env['PATH']}", "--setenv", "HOME", "/autograder/.home",
           "--setenv", "TMPDIR", "/autograder/.tmp", "--setenv", "LESSON83_PHASES", "/autograder/phases.json",
           "bash", "/autograder/run_autograder"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    wall = time.perf_counter() - start
    results = ag / "results" / "results.json"
    if not results.is_file():
        raise SystemExit(f"run_autograder wrote no results.json (exit {proc.returncode}): {proc.stderr[-2000:]}")
    phases = ag / "phases.json"
    return wall, json.loads(results.read_text()), json.loads(phases.read_text()) if phases.is_file() else {}


def run_otter(zip_path: Path, notebook: Path, work: Path) -> tuple[float, dict[str, object]]:
    """`otter run -a ZIP -o OUT NOTEBOOK` (benchmarks/grading_throughput.py's call): wall seconds, results.json."""
    local = Path(sys.executable).with_name("otter")
    otter = str(local) if local.is_file() else shutil.which("otter")
    if not otter:
        raise SystemExit("the otter CLI (otter-grader) is not installed beside this python nor on PATH")
    (work / "out").mkdir(parents=True)
    shutil.copyfile(notebook, work / notebook.name)
    start = time.perf_counter()
    proc = subprocess.run([otter, "run", "-a", str(zip_path), "-o", "out", "--no-logo", notebook.name], cwd=work,
                          capture_output=True, text=True, env=image_env(), timeout=600)
    wall = time.perf_counter() - start
    results = work / "out" / "results.json"
    if proc.returncode != 0 or not results.is_file():
        raise SystemExit(f"otter run failed (exit {proc.returncode}): {(proc.stdout + proc.stderr)[-2000:]}")
    return wall, json.loads(results.read_text())


def phase_seconds(record: dict[str, object]) -> dict[str, float]:
    """Seconds per phase (a phase timed twice is summed) and the figures the grader recorded."""
    out: dict[str, float] = {}
    for span in record.get("spans", []):  # type: ignore[union-attr]
        out[span["phase"]] = out.get(span["phase"], 0.0) + float(span["end"]) - float(span["start"])
    for name, value in record.get("figures", {}).items():  # type: ignore[union-attr]
        out[name] = float(value)
    if "end" in record:
        out["process, start to end"] = float(record["end"])  # type: ignore[arg-type]
    return out


def measure(upload: Upload, *, pairs: int, gradescope_zip: Path, otter_zip: Path, work: Path) -> None:
    """`pairs` pairs of runs, the order alternating (ours first in the even pairs), printing each."""
    for i in range(pairs):
        order = ("ours", "otter") if i % 2 == 0 else ("otter", "ours")
        line = []
        for engine in order:
            where = work / f"{upload.name}-{i}-{engine}"
            if engine == "ours":
                wall, results, record = run_ours(gradescope_zip, upload.path, where)
                upload.phases.append(phase_seconds(record))
                upload.spans = list(record.get("spans", []))  # type: ignore[arg-type]
            else:
                wall, results = run_otter(otter_zip, notebook_of(upload.path), where)
            upload.walls[engine].append(wall)
            upload.scores[engine] = question_scores(results)
            line.append(f"{engine} {wall:.2f} s")
            shutil.rmtree(where, ignore_errors=True)
        print(f"  {upload.name} pair {i + 1}/{pairs}: {', '.join(line)}", flush=True)


def compare(upload: Upload) -> tuple[list[str], int]:
    """The scores of the questions both grade, side by side, and the number that differ."""
    ours, otter = upload.scores["ours"], upload.scores["otter"]
    both = [q for q in ours if q in otter]
    lines = [f"  {'question':24s} {'ours':>7s} {'otter':>7s}"]
    lines += [f"  {q:24s} {ours[q]:7.2f} {otter[q]:7.2f}{'' if abs(ours[q] - otter[q]) <= SCORE_TOL else '  DIFFER'}"
              for q in both]
    differ = sum(abs(ours[q] - otter[q]) > SCORE_TOL for q in both)
    only = sorted(set(ours) - set(both))
    lines.append(f"  {len(both)} questions graded by both, {differ} differ; graded by ours alone: "
                 f"{', '.join(only) or 'none'} ({sum(ours[q] for q in only):g} points)")
    return lines, differ


def report(upload: Upload) -> tuple[list[str], bool]:
    """The upload's medians, ratio, goal, scores and phases; and whether the scores agree."""
    ours, otter = statistics.median(upload.walls["ours"]), statistics.median(upload.walls["otter"])
    ratio = ours / otter
    goal = GOALS[upload.name]
    met = ratio <= goal
    pairs = [o / t for o, t in zip(upload.walls["ours"], upload.walls["otter"])]
    lines = [f"{upload.name}: ours median {ours:.2f} s, otter median {otter:.2f} s, ratio ours/otter {ratio:.2f} "
             f"(pairs: {', '.join(f'{r:.2f}' for r in pairs)})   goal <= {goal:g}: {'MET' if met else 'NOT MET'}"]
    score_lines, differ = compare(upload)
    lines += ["  scores (per question):", *score_lines]
    if upload.phases:
        names = list(dict.fromkeys(k for p in upload.phases for k in p))
        med = {k: statistics.median(p.get(k, 0.0) for p in upload.phases) for k in names}
        lines.append("  where our time went (median seconds over the runs; phases overlap: the sandbox starts while "
                     "the grader reads expected values and verifies the checkpoint):")
        lines += [f"    {k:44s} {v:7.3f}" for k, v in med.items()]
        # the notebook's path (its sandbox's start, then its run) and the checkpoint's (its reader's start and the
        # verification, beside it) both follow the start-up; the longer one is the floor
        chain = sum(med.get(k, 0.0) for k in FLOOR[1:])
        check = med.get("checkpoint", 0.0)
        floor = med.get(FLOOR[0], 0.0) + max(chain, check)
        path = (f"{FLOOR[0]} + checkpoint (beside {' + '.join(FLOOR[1:])}, and longer)" if check > chain
                else " + ".join(FLOOR))
        lines.append(f"  floor seen: {floor:.2f} s = {path} (one after another whatever overlaps them); the rest of "
                     f"our {ours:.2f} s is bubblewrap, bash, judging and writing")
        lines.append("  the last run's spans (start, end): " + "; ".join(
            f"{s['phase']} {float(s['start']):.2f}-{float(s['end']):.2f}" for s in upload.spans))  # type: ignore[arg-type]
    return lines, differ == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=4, help="pairs of runs per upload (default 4)")
    parser.add_argument("--dist", type=Path, default=DIST, help="the release folder (default dist/)")
    parser.add_argument("--build", action="store_true", help="build the release first, even where dist/ has one")
    parser.add_argument("--wrong", default=WRONG, help=f"the wrong notebook among the samples (default {WRONG})")
    parser.add_argument("--only", choices=sorted(GOALS), help="time one upload alone")
    parser.add_argument("--work", type=Path, default=None, help="a folder for the runs (default: a temporary one)")
    args = parser.parse_args(argv)
    if args.pairs < 1:
        parser.error("--pairs must be at least 1")
    if not shutil.which("bwrap"):
        raise SystemExit("needs bubblewrap (apt-get install bubblewrap), as Gradescope's run_autograder does")
    if args.dist == DIST:
        release(DIST, build=args.build)
    samples = args.dist / "samples"
    uploads = [Upload("reference", samples / "reference"), Upload("wrong", samples / args.wrong)]
    uploads = [u for u in uploads if args.only in (None, u.name)]
    print(f"machine: {os.cpu_count()} cores, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"{args.pairs} pair(s) per upload, order alternating")
    work = args.work or Path(tempfile.mkdtemp(prefix="upload-bench-"))
    ok = True
    try:
        for upload in uploads:
            measure(upload, pairs=args.pairs, gradescope_zip=args.dist / f"{NAME}-gradescope-autograder.zip",
                    otter_zip=args.dist / f"{NAME}-otter-autograder.zip", work=work)
        for upload in uploads:
            lines, good = report(upload)
            ok &= good
            print("\n" + "\n".join(lines))
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\nload average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
