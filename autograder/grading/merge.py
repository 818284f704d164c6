"""The `merge` verb: scores graded elsewhere (a TA's written-answer scores, a platform's own points) read from CSV
files, checked against the suite, kept in merged_scores.json and written into grades.csv and summary.json."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any

from autograder.authoring.suite import Suite
from autograder.config import command
from autograder.course import Course, default_course
from autograder.grading.store import MERGED_FILE, MergeError, merged_scores, write_atomic, write_tables
from autograder.grading.submissions import Submission
from autograder.model import Status, spreadsheet_text


def merge_columns(suite: Suite) -> dict[str, float]:
    """Columns a scores file may fill, with their maximum: every graded question, and each written part."""
    cols = {q.id: q.points for q in suite.questions if q.graded}
    for q in suite.questions:
        cols |= {p.part: round(q.points / len(q.written), 4) for p in q.written}
    return cols


def read_scores_csv(path: Path, *, suite: Suite, ids: list[str]) -> tuple[dict[str, dict[str, float]], list[str]]:
    """The scores a CSV holds (id -> column -> score; blank cells are left out) and the columns it ignores.

    Raises MergeError, naming the row and the column, for an unknown student, an unknown question-like
    column or a score that is not a number between 0 and the column's points.
    """
    limits = merge_columns(suite)
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            table = list(csv.reader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise MergeError(f"{path}: cannot be read ({exc})") from exc
    if not table or "id" not in table[0]:
        raise MergeError(f"{path}: the first row must name the columns, one of them `id`")
    header = [h.strip() for h in table[0]]
    unknown = [h for h in header if re.match(r"^[qm]\d", h) and h not in limits and not h.endswith(" answer")]
    if unknown:
        raise MergeError(f"{path}: unknown score columns {unknown}; known: {sorted(limits)}")
    score_cols = [h for h in header if h in limits]
    if not score_cols:
        raise MergeError(f"{path}: no score column; name one of {sorted(limits)}")
    known = set(ids)
    written = {spreadsheet_text(i): i for i in ids}
    out: dict[str, dict[str, float]] = {}
    for n, cells in enumerate(table[1:], start=2):
        rec = dict(zip(header, cells))
        sid = rec.get("id", "").strip()
        sid = sid if sid in known else written.get(sid, sid)  # the id as spreadsheet_text wrote it
        if not sid and not any(rec.get(c, "").strip() for c in score_cols):
            continue
        if sid not in known:
            raise MergeError(f"{path}: row {n}: no student {sid!r} in this batch")
        for col in score_cols:
            text = rec.get(col, "").strip()
            if not text:
                continue
            try:
                value = float(text)
            except ValueError:
                raise MergeError(f"{path}: row {n} ({sid}), {col}: {text!r} is not a number") from None
            if not 0 <= value <= limits[col] + 1e-9:
                raise MergeError(f"{path}: row {n} ({sid}), {col}: {value:g} is outside 0 to {limits[col]:g}")
            out.setdefault(sid, {})[col] = round(value, 4)
    return out, [h for h in header if h not in limits and h != "id"]


def merge_scores(out: Path, files: list[Path], *, course: Course | None = None) -> dict[str, Any]:
    """Merge scores graded elsewhere (a TA's written-answer scores, a platform's own points) into the batch in
    `out`: they are kept in merged_scores.json (a later file or run wins per student and column) and
    grades.csv and summary.json are written again with them. Returns what was merged."""
    suite = default_course(course).suite
    try:
        before = json.loads((out / "summary.json").read_text(encoding="utf-8"))
        rows, lowered = before["rows"], list(before.get("limits_lowered") or [])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise MergeError(f"{out}: no summary.json of a graded batch; run `{command()} grade` first ({exc})") from None
    subs = [Submission(str(r["id"]), Path(), None, result_name=str(r.get("result") or "")) for r in rows]
    failed = {str(r["id"]): str(r.get("message") or Status.NOT_GRADED) for r in rows if not r.get("result")}
    stored = merged_scores(out)
    counts, ignored = {}, set()
    for path in files:
        scores, skipped = read_scores_csv(path, suite=suite, ids=[s.id for s in subs])
        ignored |= set(skipped)
        for sid, cols in scores.items():
            stored.setdefault(sid, {}).update(cols)
            for col in cols:
                counts[col] = counts.get(col, 0) + 1
    sources = [str(p) for p in files]
    write_atomic(out / MERGED_FILE, json.dumps({"sources": sources, "scores": stored}, indent=1))
    write_tables(suite, subs, out, failed=failed, limits_lowered=lowered)
    return {"merged": counts, "ignored": sorted(ignored), "students": len(stored)}
