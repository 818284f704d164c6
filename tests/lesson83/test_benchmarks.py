"""Smoke tests of the benchmarks: grading_throughput.py (a tiny run on the sample class prints its figures and
ratio), check_speed.py (one timed grader.check per question prints a row per question), checkpoint_verify.py,
checkpoint_class.py (a class of three with their own checkpoints, stage by stage, with its floor), release_time.py
(a one-question release, stage by stage) and milestone_time.py (the quick preset's projection)."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from autograder.authoring.suite import Suite
from autograder.config import ROOT
from autograder.course import Course
from autograder.release.common import tool_env


@pytest.mark.sandbox
@pytest.mark.build
def test_grading_throughput_smoke(fresh_build: dict[str, Path]) -> None:
    """Two submissions with this engine, one with `otter run`, on the sample class a fresh release writes; two rounds,
    and the goal judged on the median of their ratios."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "grading_throughput.py"), "--n", "2", "--otter-n", "1",
           "--rounds", "2", "--allow-small", "--samples", str(fresh_build["samples"]),
           "--autograder", str(fresh_build["otter_zip"])]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env=tool_env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert re.search(r"^ours \(grade_batch\)\s+\|\s+2 \|(\s+[\d.]+ \|){3}\s+[\d.]+$", out, re.M), out
    assert re.search(r"^otter run\s+\|\s+1 \|(\s+[\d.]+ \|){3}\s+[\d.]+$", out, re.M), out
    assert re.search(r"^ours, statuses: graded 2$", out, re.M), out
    assert re.search(r"^ratio otter median / our median: [\d.]+x \(same subset only: [\d.]+x\)", out, re.M), out
    assert re.search(r"^our median per submission: [\d.]+ s", out, re.M), out
    assert out.count("0 disagreement(s) on auto-graded totals among 1 submission(s)") == 2, out
    assert re.search(r"^=== round 2 of 2 ===$", out, re.M), out
    rounds = re.search(r"^rounds: ratio otter median / our median per round: ([\d.]+)x, ([\d.]+)x; median ([\d.]+)x"
                       r"   goal >= 50x \(median of the rounds\): (MET|NOT MET)$", out, re.M)
    assert rounds, out
    first, second, median = (float(x) for x in rounds.groups()[:3])
    assert abs(median - (first + second) / 2) <= 0.051, out


@pytest.mark.build
def test_check_speed_smoke(fresh_build: dict[str, Path], suite: Suite) -> None:
    """Every question's grader.check on a fresh student release, under one load process: a timing per question."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "check_speed.py"), "--smoke",
           "--student", str(fresh_build["student"])]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env=tool_env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert re.search(r"^load: 1 busy-loop process\(es\) during the timing", out, re.M), out
    checked = [q for q in suite.questions if q.cases]
    for q in checked:
        public = sum(not c.hidden for c in q.cases)
        row = rf"^{q.id}\s+\|\s+{public} \|(\s+[\d.]+ \|){{3}}\s+0\.30 \| (yes|NO)$"
        assert re.search(row, out, re.M), out
    assert re.search(rf"^\d+ of {len(checked)} within the goal of 0.3 s", out, re.M), out


@pytest.mark.sandbox
def test_checkpoint_verify_smoke(tmp_path: Path) -> None:
    """Two schemes, one mistake, the lies: before (20 windows re-evaluated) and new (sampled windows) CPU side by
    side, the verdicts and the class-scale projections of before and new."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "checkpoint_verify.py"), "--smoke", "--work", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    number = r"\s+[\d.]+"
    assert re.search(r"^checkpoint\s+before s\s+new s\s+before cpu\s+new cpu\s+ratio\s+windows\s+verdicts", out,
                     re.M), out
    for name in ("reference", "inflated_claims", "concentrated_lie", "spread_lie", "mistake_lm_rotates_v"):
        assert re.search(rf"^{name}{number * 4}\s+(\S+x|-)\s+[\d/]+\s", out, re.M), out
    assert re.search(r"^reference .* rope pass, alibi pass \(same\)$", out, re.M), out
    for name in ("inflated_claims", "concentrated_lie", "spread_lie"):
        assert re.search(rf"^{name} .* rope checkpoint_claims_disagree", out, re.M), out
    assert re.search(r"^all" + number * 4, out, re.M) and "flipped: none" in out, out
    assert re.search(r"^class scale: 2 distinct checkpoints verified as grade_batch does", out, re.M), out
    for name in ("before", "new"):
        assert re.search(rf"^  {name}\s.* [\d.]+ CPU-s per checkpoint; projected for 300 on 2 cores: [\d.]+ min",
                         out, re.M), out
    assert re.search(r"^  new / before: [\d.]+ of the CPU per checkpoint", out, re.M), out


@pytest.mark.sandbox
@pytest.mark.build
def test_checkpoint_class_smoke(fresh_build: dict[str, Path]) -> None:
    """A class of three, each the reference notebook with a checkpoint of its own, graded as `lesson83 grade` does:
    the wall time, the stages, the readers' requests, the CPU split, the floor, all at full marks, the goal line."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "checkpoint_class.py"), "--smoke", "--samples",
           str(fresh_build["samples"])]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env=tool_env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    number = r"\s+[\d.]+"
    assert re.search(r"^3 students, each the reference notebook with its checkpoint perturbed by 0.0001", out, re.M)
    assert re.search(r"^grading: [\d.]+ s wall, the grading process from start to end \(grade_batch's call: [\d.]+ s",
                     out, re.M), out
    for stage in ("start-up (interpreter and imports)", "suite", "sandbox start", "notebook run (cells and checks)",
                  "checkpoint", "judging (the checkpoint's wait included)", "writing"):
        assert re.search(rf"^  {re.escape(stage)}{number * 3}\s+\d+{number}$", out, re.M), (stage, out)
    assert re.search(r"^  checkpoint(\s+[\d.]+){3}\s+3\s", out, re.M), out
    # one child per checkpoint: the sample verification's, which takes the held-out pass along
    assert re.search(r"^checkpoint readers: \d+ started \([\d.]+ CPU-s of start-up\), 3 requests: sample 3 x [\d.]+ "
                     r"CPU-s", out, re.M), out
    assert re.search(r"^CPU-s: notebook runs [\d.]+ \([\d.]+ each\), checkpoint verification [\d.]+", out, re.M), out
    assert re.search(r"^child: cells\s+\|\s+[\d.]+ \|", out, re.M), out
    floor = re.search(r"^floor: ([\d.]+) s = fixed start-up ([\d.]+) s .* / (\d) cores; measured / floor: [\d.]+$", out,
                      re.M)
    assert floor and float(floor[1]) > float(floor[2]) > 0, out
    assert re.search(r"^full marks: 3 of 3 \(statuses: graded 3; totals ([\d.]+) of \1 auto-graded points\)$", out,
                     re.M), out
    assert re.search(r"^3 students with checkpoints on \d cores: [\d.]+ s   goal <= 150 s: (MET|NOT MET) \(judged for "
                     r"300 only\)$", out, re.M), out


@pytest.mark.build
def test_release_time_smoke() -> None:
    """A one-question release built by this checkout: a row per stage, ours apart from the tools, and the totals."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "release_time.py"), "--smoke"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env=tool_env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert re.search(r"^release build time: a one-question assignment \(--smoke\), 1 build\(s\)", out, re.M), out
    number = r"\s+\|\s+[\d.]+"
    for stage in ("import", "load questions", "expected values", "notebooks", "student release \\+ samples",
                  "gradescope bundle", "other"):
        assert re.search(rf"^{stage}\s+\| ours{number * 2}$", out, re.M), out
    for tool in ("otter assign", "nbgrader generate_assignment"):
        assert re.search(rf"^{tool}\s+\| tool{number * 2}$", out, re.M), out
    for total in ("ours", "external tools", "build"):
        assert re.search(rf"^{total}\s+\| total{number * 2}$", out, re.M), out
    assert re.search(r"^ours is \d+% of the build's [\d.]+ s$", out, re.M), out


def test_release_time_table_prints_the_ratio_of_our_part() -> None:
    """--compare: the old build's columns and the ratio of our part, of the tools' and of the whole build."""
    spec = importlib.util.spec_from_file_location("release_time", ROOT / "benchmarks" / "release_time.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    new = {"import": [2.0, 2.0], "expected values": [4.0, 4.0], "otter assign": [10.0, 9.0],
           "nbgrader generate_assignment": [20.0, 18.0]}
    old = new | {"expected values": [16.0, 15.0]}
    out = module.table(module._median([new]), module._median([old]), old_name="abc123")
    assert re.search(r"^expected values\s+\| ours\s+\|\s+4.00 \|\s+4.00 \|\s+16.00 \|\s+15.00$", out, re.M), out
    assert re.search(r"^ours\s+\| total\s+\|\s+6.00 \|\s+6.00 \|\s+18.00 \|\s+17.00$", out, re.M), out
    assert "ratio old (abc123) / new: ours 3.00x (cpu 2.83x), external tools 1.00x, build 1.33x" in out, out
    assert "ours is 17% of the build's 36.00 s" in out, out


@pytest.mark.training  # trains TinyCharLM (in a child process, beside a busy loop), as milestone_speed's smoke
def test_milestone_time_smoke(tmp_path: Path) -> None:
    """Two steps of one scheme, quiet and beside one busy loop, for both attentions: the table, the ratios, the
    projected range and the figures file the notebook is rendered from."""
    cmd = [sys.executable, "-m", "benchmarks.milestone_time", "--steps", "2", "--warmup", "1", "--eval-windows", "2",
           "--schemes", "none", "--loads", "0", "1", "--write", "--figures", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert re.search(r"^condition\s+attention\s+none \| mean ms \| eval s \| projected total \| CPU-s / threads \| "
                     r"load avg$", out, re.M), out
    for condition in ("quiet", "load 1"):
        for attention in ("fused \\(reference\\)", "explicit softmax"):
            row = rf"^{condition}\s+{attention}\s+[\d.]+ \|\s+[\d.]+ \|\s+[\d.]+ \|\s+[\d.]+ min\s+\|\s+[\d.]+ min"
            assert re.search(row, out, re.M), out
    assert re.search(r"^ratios, explicit softmax / fused: quiet [\d.]+x, load 1 [\d.]+x; load 1 / quiet: ", out, re.M)
    assert re.search(r"^quick preset on \d cores, quiet to load 1: fused \(reference\) [\d.]+-[\d.]+ min, explicit "
                     r"softmax [\d.]+-[\d.]+ min$", out, re.M), out
    figures = json.loads((tmp_path / "lesson83_milestone_time.json").read_text())
    assert figures["loads"] == [0, 1] and figures["schemes"] == ["none"] and figures["measured"]["steps"] == 2
    assert set(figures["minutes"]) == {"fused", "explicit"} and figures["preset"]["steps"] == 1000
    assert (tmp_path / "lesson83_milestone_time.txt").read_text().splitlines()[1:] == out.splitlines()[:-1]


@pytest.mark.sandbox
@pytest.mark.build
def test_upload_smoke(fresh_build: dict[str, Path], course: Course, tmp_path: Path) -> None:
    """One pair of the wrong upload (no checkpoint): ours as Gradescope runs the zip, and `otter run`; the medians,
    the ratio against its goal, the scores side by side (all agreeing) and where our time went, with the floor."""
    import shutil

    from autograder.release.gradescope import gradescope_bundle

    dist = tmp_path / "dist"
    gradescope_bundle(dist / "lesson83-gradescope-autograder.zip", course=course)
    shutil.copyfile(fresh_build["otter_zip"], dist / "lesson83-otter-autograder.zip")
    shutil.copytree(fresh_build["samples"], dist / "samples")
    cmd = [sys.executable, str(ROOT / "benchmarks" / "upload.py"), "--pairs", "1", "--only", "wrong", "--dist",
           str(dist)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env=tool_env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert re.search(r"^  wrong pair 1/1: ours [\d.]+ s, otter [\d.]+ s$", out, re.M), out
    assert re.search(r"^wrong: ours median [\d.]+ s, otter median [\d.]+ s, ratio ours/otter [\d.]+ \(pairs: [\d.]+\)"
                     r"   goal <= 0.4: (MET|NOT MET)$", out, re.M), out
    assert re.search(r"^  \d+ questions graded by both, 0 differ; graded by ours alone: ", out, re.M), out
    assert "DIFFER" not in out, out
    for phase in ("start-up (interpreter and imports)", "suite", "sandbox start", "notebook run (cells and checks)",
                  "judging (the checkpoint's wait included)", "writing", "leaderboard", "cells: child CPU s",
                  "checks: child CPU s"):
        assert re.search(rf"^    {re.escape(phase)}\s+[\d.]+$", out, re.M), (phase, out)
    assert re.search(r"^  floor seen: [\d.]+ s = ", out, re.M), out
