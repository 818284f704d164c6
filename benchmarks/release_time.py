"""Release build time: where `lesson83 release` spends its time, ours against the external tools', old against new.

One run builds the release the way `lesson83 release` does (`autograder.release.build`, then the Gradescope
bundle) in a fresh process per build and times each stage from outside, by wrapping the stage functions of
`autograder.release` (`autograder.build` before issue 22): importing the engine (torch, nbformat), loading the
questions, the expected values (the reference and every catalogued mistake through every probe), writing the Otter
master and nbgrader source notebooks, `otter assign`, `nbgrader generate_assignment`, the student release and
sample class, and the Gradescope bundle. "ours" is everything but the two external tools; seconds are wall time, with
the CPU time of the process (ours) or of its children (the tools) beside them.

    python benchmarks/release_time.py                   # one build of this checkout
    python benchmarks/release_time.py --compare         # and of the baseline (8fa2479, before issue 13 item 5)
    python benchmarks/release_time.py --compare HEAD~3 --repeat 3   # medians of 3 builds each, interleaved
    python benchmarks/release_time.py --smoke --compare  # tiny: a one-question assignment (q2) and its intro

`--compare REV` builds the revision REV from `git archive` in a temporary folder with this environment's
Python and tools. Nothing here is a timed test; the figures go into the README.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BASELINE = "8fa2479"  # main before issue 13 item 5 (the release took about 60 s on 2 cores)
SMOKE_QUESTIONS = ("00_intro", "q2_sinusoidal_pe")
EXTERNAL = ("otter assign", "nbgrader generate_assignment")
# Stage -> the functions of autograder.release whose time it is (wrapped by name in every module of the package
# that binds them, so the same wrappers time an older layout of the package; a name missing there is skipped).
STAGES: dict[str, tuple[str, ...]] = {
    "load questions": ("load_config", "load_questions"),
    "expected values": ("expected_values",),
    "notebooks": ("otter_master", "nbgrader_source", "nbgrader_hidden_cases", "nbgrader_public_cases",
                  "_write_nb", "write_nb"),
    "student release + samples": ("_normalise_student", "normalise_student", "_answer_stubs", "write_samples"),
    "gradescope bundle": ("gradescope_bundle",),
}
ORDER = ("import", "load questions", "expected values", "notebooks", *EXTERNAL, "student release + samples",
         "gradescope bundle", "other")


def _cpu(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


# --------------------------------------------------------------------------- one build (in its own process)


def _child(out: Path, *, config: Path | None, assignments: Path | None) -> None:
    """Build once with this process's `autograder` (PYTHONPATH picks the tree) and write the timings as JSON."""
    wall0, cpu0 = time.perf_counter(), _cpu(resource.RUSAGE_SELF)
    try:
        import autograder.release as b
        from autograder.release import common, gradescope, nbgrader, otter, sample, student

        modules: list[Any] = [b, common, gradescope, nbgrader, otter, sample, student]
    except ImportError:  # a revision before issue 22: one module
        import autograder.build as b

        modules = [b]

    seconds: dict[str, list[float]] = {"import": [time.perf_counter() - wall0, _cpu(resource.RUSAGE_SELF) - cpu0]}
    depth = [0]  # a stage called from inside another one (e.g. _write_nb) counts once, in the outer one

    def timed(stage: str | None, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            name = kwargs.get("what") if stage is None else stage
            who = resource.RUSAGE_CHILDREN if name in EXTERNAL else resource.RUSAGE_SELF
            start, cpu = time.perf_counter(), _cpu(who)
            depth[0] += 1
            try:
                return fn(*args, **kwargs)
            finally:
                depth[0] -= 1
                if depth[0] == 0:
                    row = seconds.setdefault(str(name), [0.0, 0.0])
                    row[0] += time.perf_counter() - start
                    row[1] += _cpu(who) - cpu
        return run

    for stage, names in STAGES.items():
        for name in names:
            for module in modules:
                if hasattr(module, name):
                    setattr(module, name, timed(stage, getattr(module, name)))
    for module in modules:
        for name in ("_run", "run_tool"):  # the external tools, under their old and new names
            if hasattr(module, name):
                setattr(module, name, timed(None, getattr(module, name)))
    options: dict[str, Any] = {"assignments": assignments} if assignments is not None else {}
    bundle: dict[str, Any] = {}  # the Gradescope bundle is the package's own course's (as the command line builds it)
    try:  # a Course where the tree's build takes one (after issue 22; required after issue 39), else the config's path
        from autograder.course import Course

        options["course"] = Course.load(config) if config is not None else Course.load()
        bundle["course"] = Course.load()
    except ImportError:
        if config is not None:
            options["config_path"] = config
    with tempfile.TemporaryDirectory(prefix="release-time-") as tmp:
        b.build(work=Path(tmp) / "out", **options)
        b.gradescope_bundle(Path(tmp) / "gradescope.zip", **bundle)
    total = [time.perf_counter() - wall0, _cpu(resource.RUSAGE_SELF) - cpu0]
    ours = [sum(v[i] for k, v in seconds.items() if k not in EXTERNAL) for i in (0, 1)]
    tools_wall = sum(v[0] for k, v in seconds.items() if k in EXTERNAL)
    seconds["other"] = [total[0] - tools_wall - ours[0], total[1] - ours[1]]
    out.write_text(json.dumps({"seconds": seconds, "module": b.__file__}))


def _tree(rev: str, dest: Path) -> Path:
    """The repository at `rev`, unpacked from `git archive` (committed files only)."""
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", rev], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def _smoke_inputs(dest: Path) -> tuple[Path, Path]:
    """A one-question assignment (the intro and q2) and a config with only its points."""
    import yaml

    assignments = dest / "assignments"
    assignments.mkdir(parents=True)
    for stem in SMOKE_QUESTIONS:
        shutil.copy(ROOT / "assignments" / "lesson83" / f"{stem}.md", assignments)
    config = yaml.safe_load((ROOT / "grading_config.yaml").read_text())
    config["questions"] = {q: p for q, p in config["questions"].items() if q in SMOKE_QUESTIONS}
    config["milestone"]["points"] = 0  # the smoke assignment has no milestone question to declare a checkpoint
    config["total_points"] = sum(p["points"] for p in config["questions"].values())
    (dest / "grading_config.yaml").write_text(yaml.safe_dump(config))
    return dest / "grading_config.yaml", assignments


def measure(tree: Path, *, smoke: Path | None) -> dict[str, list[float]]:
    """One build of the tree in a fresh process: stage -> [wall s, CPU s]."""
    with tempfile.TemporaryDirectory(prefix="release-time-") as tmp:
        out = Path(tmp) / "times.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(out)]
        if smoke:
            cmd += ["--config", str(smoke / "grading_config.yaml"), "--assignments", str(smoke / "assignments")]
        env = dict(os.environ, PYTHONPATH=str(tree))
        proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"the build of {tree} failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
        data = json.loads(out.read_text())
    if not Path(data["module"]).is_relative_to(tree):
        raise SystemExit(f"the build of {tree} imported {data['module']} instead")
    return data["seconds"]


# --------------------------------------------------------------------------- the table


def _median(runs: list[dict[str, list[float]]]) -> dict[str, list[float]]:
    return {k: [statistics.median(r.get(k, [0.0, 0.0])[i] for r in runs) for i in (0, 1)] for k in ORDER}


def _totals(t: dict[str, list[float]]) -> dict[str, list[float]]:
    ours = [sum(v[i] for k, v in t.items() if k not in EXTERNAL) for i in (0, 1)]
    tools = [sum(v[i] for k, v in t.items() if k in EXTERNAL) for i in (0, 1)]
    return {"ours": ours, "external tools": tools, "build": [ours[0] + tools[0], ours[1] + tools[1]]}


def table(new: dict[str, list[float]], old: dict[str, list[float]] | None, *, old_name: str) -> str:
    """One row per stage and per total: seconds and CPU seconds, this checkout then the old build."""
    head = ["stage", "who", "new s", "new cpu"] + (["old s", "old cpu"] if old else [])
    rows = [head]
    totals_new, totals_old = _totals(new), _totals(old) if old else {}
    for name in (*ORDER, *totals_new):
        who = "tool" if name in EXTERNAL else "total" if name in totals_new else "ours"
        pick = totals_new if name in totals_new else new
        row = [name, who, *(f"{x:.2f}" for x in pick[name])]
        if old:
            row += [f"{x:.2f}" for x in (totals_old if name in totals_new else old)[name]]
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = [" | ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
             for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    if old:
        def ratio(key: str, i: int) -> str:
            return f"{totals_old[key][i] / max(totals_new[key][i], 1e-9):.2f}x"

        lines.append(f"ratio old ({old_name}) / new: ours {ratio('ours', 0)} (cpu {ratio('ours', 1)}), "
                     f"external tools {ratio('external tools', 0)}, build {ratio('build', 0)}")
    share = totals_new["ours"][0] / max(totals_new["build"][0], 1e-9)
    lines.append(f"ours is {100 * share:.0f}% of the build's {totals_new['build'][0]:.2f} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--compare", nargs="?", const=BASELINE, metavar="REV",
                   help=f"also build git revision REV (default {BASELINE}) and print the ratio")
    p.add_argument("--repeat", type=int, default=1, help="builds of each tree (medians per stage)")
    p.add_argument("--smoke", action="store_true", help="tiny: a one-question assignment (the intro and q2)")
    p.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--config", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--assignments", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        _child(args.child, config=args.config, assignments=args.assignments)
        return 0
    with tempfile.TemporaryDirectory(prefix="release-time-") as tmp:
        smoke = Path(tmp) / "smoke" if args.smoke else None
        if smoke:
            _smoke_inputs(smoke)
        old_tree = _tree(args.compare, Path(tmp) / "old") if args.compare else None
        new_runs, old_runs = [], []
        for _ in range(args.repeat):  # interleaved, so a change in the machine's load hits both alike
            new_runs.append(measure(ROOT, smoke=smoke))
            if old_tree:
                old_runs.append(measure(old_tree, smoke=smoke))
    what = "a one-question assignment (--smoke)" if smoke else "the whole release"
    print(f"release build time: {what}, {args.repeat} build(s) per tree (medians), {os.cpu_count()} CPU(s), "
          f"load average {os.getloadavg()[0]:.1f}")
    print(table(_median(new_runs), _median(old_runs) if old_runs else None, old_name=args.compare or ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
