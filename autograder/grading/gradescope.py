"""Grade one Gradescope submission folder into its results.json (what the bundle's run_autograder runs)."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from autograder.course import Course
from autograder.grading.batch import grade_batch
from autograder.grading.figures import gradescope_entries
from autograder.grading.phases import phase, started, timed
from autograder.sandbox import UnsandboxedError, require_isolation


@dataclass
class GradescopeRun:
    """Whether the submission was graded, and the status line for the autograder's log."""

    graded: bool
    line: str


def import_quietly(name: str) -> None:
    """Import a module ahead of its first use; a failure is left for that use to report."""
    with contextlib.suppress(Exception):
        importlib.import_module(name)


def grade_gradescope(submission: Path, results: Path, *, course: Course,
                     allow_unsandboxed: bool = False) -> GradescopeRun:
    """Grade the folder `submission` (/autograder/submission) and write Gradescope's results.json to `results`.

    When the grader fails (not the student), results.json says so with score 0, so Gradescope shows an error; so
    it does, running nothing, where nothing would confine student code (unless `allow_unsandboxed`).
    One upload, one sandboxed worker (the config's workers are for a class), started before the suite is read.
    With $LESSON83_PHASES set, where the time went is written to that file (autograder/grading/phases.py), never
    into results.json.
    """
    started("start-up (interpreter and imports)")
    try:
        require_isolation(allow_unsandboxed=allow_unsandboxed)
    except UnsandboxedError as exc:
        results.parent.mkdir(parents=True, exist_ok=True)
        results.write_text(json.dumps({"score": 0, "output": "Not graded: the autograder's sandbox is not available. "
                                       "Ask your instructor to fix the autograder.", "stdout_visibility": "hidden",
                                       "tests": [], "extra_data": {"isolation": "none", "refused": str(exc)}}))
        return GradescopeRun(False, f"error: {exc}")
    # torch, imported beside the sandbox's start: judging a wrong answer may compute with it (the student's own
    # earlier output taken further), and would otherwise import it after the run, while the student waits
    threading.Thread(target=timed("torch import (beside the sandbox's start)", import_quietly), args=("torch",),
                     daemon=True).start()
    with tempfile.TemporaryDirectory(prefix="gradescope-") as tmp:
        subs = Path(tmp) / "in"
        # Links are copied as links and pipes or devices not at all: the grader refuses both, never follows them.
        shutil.copytree(submission, subs / "submission", symlinks=True,
                        copy_function=lambda src, dst: shutil.copy2(src, dst) if os.path.isfile(src) else None)
        summary = grade_batch(subs, out=Path(tmp) / "out", force=True, course=course, progress=False, workers=1,
                              sandbox_first=True, allow_unsandboxed=allow_unsandboxed)
    row = summary.tables.summary.rows[0]
    graded = summary.tables.records.get(row.id) if row.result is not None else None
    if graded is None:  # the grader failed (not the student): say so, and let Gradescope show an error
        out = {"score": 0, "output": f"Not graded: {row.message} Ask your instructor to re-run the "
                                      "autograder.", "stdout_visibility": "hidden", "tests": []}
        status, total, isolation = row.status, 0.0, "not started"
    else:
        out = dict(graded.gradescope)
        out["extra_data"] = {**out.get("extra_data", {}), "isolation": graded.isolation}
        with phase("leaderboard"):
            board = gradescope_entries(course.suite, graded.to_json())  # verified figures only
        if board:
            out["leaderboard"] = board
        status, total, isolation = graded.result.status, graded.result.total, graded.isolation or "not started"
    with phase("writing"):
        results.parent.mkdir(parents=True, exist_ok=True)
        results.write_text(json.dumps(out, indent=1))
    return GradescopeRun(graded is not None, f"status: {status}; score {total:g}; sandbox: {summary.sandbox}; "
                                             f"isolation: {isolation}")
