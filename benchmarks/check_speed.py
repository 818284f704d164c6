"""Local check speed: each question's `grader.check` on the public cases, timed while every core is kept busy.

The student's notebook calls `grader.check("q2_sinusoidal_pe")` after each answer. This benchmark runs those
calls with Otter, on a copy of the student release (student_templates/lesson83 by default) and a namespace
holding the reference solution (so every public case runs to the end and passes), while one busy-loop process
per core competes for the CPU, as on a student's laptop running something else or a shared course server.
Each question is checked once to warm up, then timed --repeats times; the median is judged against the goal
(the check's own CPU seconds are printed beside it: steadier than wall time on a shared machine).
The warm-up also fills lesson83_checks' per-process memo of meta-device op layouts and its cache of milestone
models (as a student's first check does; a model is reused while the notebook's names are bound to the same
objects and the model is as built); the verdicts a check reuses for its gates are dropped at the end of every
check. The warm-up's own time is printed too, on a line of its own ("first check").

    python benchmarks/check_speed.py               # 5 timed runs per question, one load process per core
    python benchmarks/check_speed.py --smoke       # one timed run, one load process: checks the code, not speed

Exit status 1 when a median is over the goal (never with --smoke). Nothing here is a timed test; the figures
go into the README.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
STUDENT = ROOT / "student_templates" / "lesson83"
GOAL_S = 0.3
BUSY_LOOP = "while True:\n    pass\n"


def cores() -> int:
    """CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def start_load(n: int) -> list[subprocess.Popen]:
    """n busy-loop processes (each keeps one core busy until stopped)."""
    return [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(n)]


def stop_load(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        proc.kill()
    for proc in procs:
        proc.wait()


def questions_in_order(notebook: Path) -> list[str]:
    """The questions the notebook checks, in the order of its grader.check cells."""
    import re

    import nbformat

    nb = nbformat.read(str(notebook), as_version=4)
    return [m.group(1) for c in nb.cells if c.cell_type == "code"
            for m in re.finditer(r'^grader\.check\("([a-z0-9_]+)"\)', c.source, re.M)]


def solution_namespace() -> dict[str, Any]:
    """The reference solution and the right multiple-choice answers, as a finished notebook holds them."""
    sys.path.insert(0, str(ROOT))
    from autograder.authoring.questions import load_questions, mc_answers
    from autograder.course import course_of
    from reference.lesson83_mistakes import reference_namespace

    return reference_namespace() | mc_answers(load_questions(course_of().config, course_of().lesson))


def time_checks(student: Path, *, questions: list[str] | None, repeats: int) -> list[dict[str, Any]]:
    """Per question: public cases, every timed run's seconds and whether all public cases passed."""
    import otter

    env = solution_namespace()
    os.chdir(student)
    sys.path.insert(0, str(student))  # the test files import lesson83_checks from the student folder
    grader = otter.Notebook("lesson83.ipynb")
    rows = []
    for q in questions or questions_in_order(student / "lesson83.ipynb"):
        began = time.perf_counter()
        result = grader.check(q, env)  # warm-up: reads the test file, imports what the probes need
        first = time.perf_counter() - began
        times, cpu = [], []
        for _ in range(repeats):
            began, began_cpu = time.perf_counter(), time.process_time()
            result = grader.check(q, env)
            times.append(time.perf_counter() - began)
            cpu.append(time.process_time() - began_cpu)
        # the summary case (what was checked, what is graded after submission) is not a check of its own
        public = sum(tc.body.test_func.__name__ != "test_summary" for tc in result.test_cases)
        rows.append({"question": q, "public": public, "times": times, "cpu": cpu, "first": first,
                     "passed": result.passed_all})
    return rows


def table(rows: list[dict[str, Any]], *, goal: float) -> list[str]:
    lines = [f"{'question':<22}| public cases | median s |  max s | median CPU s | goal s | within goal",
             f"{'-' * 22}|--------------|----------|--------|--------------|--------|------------"]
    for r in rows:
        med = statistics.median(r["times"])
        ok = "yes" if med <= goal else "NO"
        note = "" if r["passed"] else " (a public case failed: see the check's output)"
        lines.append(f"{r['question']:<22}| {r['public']:>12} | {med:8.3f} | {max(r['times']):6.3f} | "
                     f"{statistics.median(r['cpu']):12.3f} | {goal:6.2f} | {ok}{note}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--student", type=Path, default=STUDENT, help="the student release folder to check")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per question")
    parser.add_argument("--load", type=int, default=None,
                        help="busy-loop processes during the timing (default: one per core)")
    parser.add_argument("--goal", type=float, default=GOAL_S, help="goal for each question's median, in seconds")
    parser.add_argument("--questions", nargs="+", default=None, help="only these questions (default: all)")
    parser.add_argument("--smoke", action="store_true", help="one timed run and one load process: the code, not speed")
    args = parser.parse_args(argv)
    repeats, load = (1, 1) if args.smoke else (args.repeats, args.load if args.load is not None else cores())
    import torch

    print(f"python {platform.python_version()}, torch {torch.__version__}, {cores()} cores, torch threads "
          f"{torch.get_num_threads()} (the checks run on 1 and restore this)")
    print(f"load: {load} busy-loop process(es) during the timing; load average before: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    work = Path(tempfile.mkdtemp(prefix="check-speed-"))
    here = Path.cwd()
    procs = []
    try:
        shutil.copytree(args.student, work / "lesson83")
        procs = start_load(load)
        time.sleep(0.5)  # let the load processes start spinning
        rows = time_checks(work / "lesson83", questions=args.questions, repeats=repeats)
        print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    finally:
        stop_load(procs)
        os.chdir(here)
        shutil.rmtree(work, ignore_errors=True)
    print(f"grader.check on the public cases, median of {repeats} timed run(s) after one warm-up, under load")
    print("\n".join(table(rows, goal=args.goal)))
    print("first check (the warm-up: one-off imports, model builds and layouts included), s: "
          + ", ".join(f"{r['question']} {r['first']:.3f}" for r in rows))
    over = [r["question"] for r in rows if statistics.median(r["times"]) > args.goal]
    failed = [r["question"] for r in rows if not r["passed"]]
    print(f"{len(rows) - len(over)} of {len(rows)} within the goal of {args.goal:g} s"
          + (f"; over: {', '.join(over)}" if over else "") + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 0 if args.smoke or not (over or failed) else 1


if __name__ == "__main__":
    sys.exit(main())
