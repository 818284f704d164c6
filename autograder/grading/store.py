"""The grading stage's store: each submission's result (results/<file>.json, written atomically; a result whose
key still matches is not graded again), the scores `merge` kept, and the tables made from them (grades.csv,
summary.json)."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any

from autograder.authoring.questions import Question
from autograder.authoring.suite import Suite
from autograder.config import command
from autograder.grading.submissions import Submission
from autograder.model import Status, SubmissionResult, csv_text, full_marks


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a short-named temporary file beside it, renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".part")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with suppress(OSError):
            os.unlink(tmp)
        raise


def result_key(sub: Submission, fingerprint: str, files: Sequence[str]) -> str:
    """What a stored result is valid for: the submission's notebook (or why it is unreadable), its checkpoint
    files and the suite fingerprint; a stored result with another key is graded again."""
    h = hashlib.sha256(sub.source if sub.source is not None
                       else b"problem\0" + sub.problem.encode("utf-8", "backslashreplace"))
    for name in files:  # the checkpoint's (Suite.checkpoint_files)
        h.update(hashlib.sha256(sub.files.get(name, b"")).digest())
    h.update("\0".join(sub.file_problems).encode("utf-8", "backslashreplace") + fingerprint.encode())
    if sub.picked:  # which of several notebooks was graded, and which were left: the student is told
        h.update(b"picked\0" + sub.picked.encode("utf-8", "backslashreplace"))
    return h.hexdigest()


def stored_key(path: Path) -> str | None:
    """The key of the result stored at `path`; None when there is none or it cannot be read."""
    try:
        key = json.loads(path.read_text(encoding="utf-8")).get("key")
    except (OSError, ValueError, AttributeError):
        return None  # absent or damaged: graded again
    return key if isinstance(key, str) else None


def failure_text(exc: BaseException) -> str:
    """An exception in one short line, for a row's message."""
    return f"{type(exc).__name__}: {str(exc)[:300]}"


def store_result(results_dir: Path, sub: Submission, key: str, result: SubmissionResult, extra: dict[str, Any], *,
                 revisit: dict[str, str]) -> None:
    """Write one submission's result (what the TA report reads, with the student's Gradescope view) atomically."""
    record = {"key": key, "path": os.path.abspath(sub.path), **result.to_dict(), **extra,
              "gradescope": result.gradescope(revisit=revisit)}
    write_atomic(results_dir / sub.result_name, json.dumps(record, indent=1))


UNSANDBOXED = ("graded WITHOUT a sandbox (no bubblewrap, no uid drop): student code ran as the grader's user "
               "and could read what it can")


MERGED_FILE = "merged_scores.json"  # scores graded elsewhere (by hand, by another platform), kept by `merge`


class MergeError(ValueError):
    """Scores that cannot be merged. Made from a list (`problems`: each names its file, line and column), the
    message lists them all and says that nothing was written; made from one text, it is that text."""

    def __init__(self, problems: str | list[str]) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        if isinstance(problems, str):
            super().__init__(problems)
            return
        n = len(self.problems)
        super().__init__(f"{n} problem{'s' if n != 1 else ''} in the scores; nothing was merged (fix "
                         f"{'every line' if n != 1 else 'it'}, then run merge again):\n"
                         + "\n".join(f"  {p}" for p in self.problems))


def merged_scores(out: Path) -> dict[str, dict[str, float]]:
    """The scores `merge` stored in `out` (student id -> column -> score); {} when there are none."""
    try:
        data = json.loads((out / MERGED_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise MergeError(f"{out / MERGED_FILE}: cannot be read ({exc})") from None
    try:
        return {str(k): {str(c): float(v) for c, v in row.items()} for k, row in data["scores"].items()}
    except (KeyError, TypeError, ValueError, AttributeError):
        raise MergeError(f"{out / MERGED_FILE}: not a file written by `{command()} merge`") from None


def merged_value(q: Question, scores: dict[str, float]) -> float | None:
    """A question's merged score for one student: its own column, else the sum of its written parts once every
    part is scored; None when nothing was merged for it."""
    value = scores.get(q.id)
    parts = [scores.get(p.part) for p in q.written]
    if value is None and parts and all(v is not None for v in parts):
        value = round(sum(v for v in parts if v is not None), 4)
    return value


def apply_merged(suite: Suite, row: dict[str, Any], scores: dict[str, float]) -> None:
    """Put a student's merged scores into their row (a question's column replaces the grader's score)."""
    for q in suite.questions:
        value = merged_value(q, scores)
        if value is not None and q.id in row:
            row["total"] = round(row["total"] - (row[q.id] or 0.0) + value, 4)
            row[q.id] = value


def _row(suite: Suite, sub: Submission, out: Path, failed: dict[str, str]) -> dict[str, Any]:
    """The grades.csv row of one submission: from its stored result, or "not graded" with the reason."""
    qids = list(suite.question_points())
    why = failed.get(sub.id)
    if why is None:
        try:
            record = json.loads((out / "results" / sub.result_name).read_text(encoding="utf-8"))
            row = {"id": sub.id, **SubmissionResult.from_dict(record).csv_row(qids)}
            if record.get("isolation") == "none":  # said on the row itself: grades a TA can trust less
                row["message"] = f"{UNSANDBOXED}; {row['message']}".rstrip("; ")
            return row
        except Exception as exc:  # noqa: BLE001 - a damaged store is one row's problem
            why = f"not graded: its stored result could not be read ({failure_text(exc)}); run the grade command again"
    return {"id": sub.id, "total": None, **dict.fromkeys(qids), "status": Status.NOT_GRADED, "message": why}


def write_tables(suite: Suite, subs: list[Submission], out: Path, *, failed: dict[str, str] | None = None,
                 limits_lowered: list[str] | None = None) -> list[dict[str, Any]]:
    """grades.csv and summary.json of exactly these submissions (atomic writes); one row each, always.

    A row that is not graded has empty score cells; every cell that came from a student is spreadsheet-safe.
    limits_lowered: the configured limits that the grader's own hard limits lowered in the run (summary.json).
    Manual questions have a column too, empty until `merge` brings their scores (merged_scores.json), which
    also replace a question's automatic score when the scores file has that question's column.
    """
    qids = list(suite.question_points())
    manual = {q.id: q.points for q in suite.questions if q.graded and q.manual}
    try:
        merged, merge_problem = merged_scores(out), ""
    except MergeError as exc:  # the grades are written all the same; the summary says why the scores are missing
        merged, merge_problem = {}, str(exc)
    rows = []
    for sub in subs:
        row = _row(suite, sub, out, failed or {}) | dict.fromkeys(manual)
        if row["total"] is not None:
            apply_merged(suite, row, merged.get(sub.id, {}))
        row["notes"] = [*([sub.picked] if sub.picked else []), *sub.notes]  # what reading the class noticed
        rows.append(row)
    columns = [*qids, *manual]
    table = [["id", "total", *columns, "status", "message"]]
    table += [[r["id"], *("" if r[k] is None else r[k] for k in ("total", *columns)), r["status"], r["message"]]
              for r in rows]
    write_atomic(out / "grades.csv", csv_text(table))
    scored = [r for r in rows if r["total"] is not None]
    points = suite.question_points() | manual

    def mean(q: str) -> float | None:
        have = [r[q] for r in scored if r[q] is not None]
        return round(sum(have) / len(have), 3) if have else (0.0 if q in qids else None)

    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    summary = {"submissions": len(rows), "status_counts": counts, "mean_per_question": {q: mean(q) for q in columns},
               "max_per_question": points,
               "full_marks_per_question": {q: sum(full_marks(r[q], points[q]) for r in scored) for q in columns},
               "mean_total": round(sum(r["total"] for r in scored) / len(scored), 3) if scored else 0.0,
               "auto_points": suite.auto_points, "manual_points": round(sum(manual.values()), 4),
               "merged": {"file": MERGED_FILE, "students": len(merged), "problem": merge_problem}
               if merged or merge_problem else None,
               "limits_lowered": list(limits_lowered or []),
               "rows": [{"id": r["id"], "result": None if r["status"] == Status.NOT_GRADED else sub.result_name,
                         "status": r["status"], "message": r["message"],
                         **({"notes": r["notes"]} if r["notes"] else {})} for r, sub in zip(rows, subs)]}
    write_atomic(out / "summary.json", json.dumps(summary, indent=1))
    return rows
