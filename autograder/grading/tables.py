"""The batch's tables, made from its records: one grades.csv row per submission, the merged scores put in, and
summary.json's counts and means (written through the Gradebook)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autograder.authoring.questions import Question
from autograder.authoring.suite import Suite
from autograder.config import command
from autograder.grading.gradebook import COMMENT_COLUMN, MERGED_FILE, Gradebook, MergeError, Record, Summary, SummaryRow
from autograder.grading.submissions import Submission
from autograder.model import Status, csv_text, full_marks

UNSANDBOXED = ("graded WITHOUT a sandbox (no bubblewrap, no uid drop): student code ran as the grader's user "
               "and could read what it can")


@dataclass
class Tables:
    """What write_tables wrote: the grades.csv rows (id, total, a cell per question, status, message) and the
    summary."""

    rows: list[dict[str, Any]]
    summary: Summary
    records: dict[str, Record]  # id -> the record each graded row was made from
    comments: dict[str, dict[str, str]] = field(default_factory=dict)  # merge's: id -> column ("" whole) -> text


def failure_text(exc: BaseException) -> str:
    """An exception in one short line, for a row's message."""
    return f"{type(exc).__name__}: {str(exc)[:300]}"


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


def merged_or_problem(book: Gradebook) -> tuple[dict[str, dict[str, float]], str]:
    """The merged scores of `book` and "" or, when its file cannot be used, {} and why (the grades are written all
    the same; the summary says why the scores are missing)."""
    try:
        return book.merged_scores(command=command()), ""
    except MergeError as exc:
        return {}, str(exc)


def merged_comments(book: Gradebook) -> dict[str, dict[str, str]]:
    """The comments `merge` stored ({} when its file cannot be used: the summary says why)."""
    try:
        return book.merged_comments(command=command())
    except MergeError:
        return {}


def comment_cell(notes: dict[str, str]) -> str:
    """A student's merged comments in one grades.csv cell: the comment on the whole work first, then each
    column's as `column: text`."""
    return " | ".join(text if col == "" else f"{col}: {text}" for col, text in sorted(notes.items()))


def record_row(suite: Suite, sid: str, record: Record | None, why: str | None) -> dict[str, Any]:
    """The grades.csv row of one submission: from its record, or "not graded" with the reason."""
    qids = list(suite.question_points())
    if why is None and record is not None:
        row = {"id": sid, **record.result.csv_row(qids)}
        if record.isolation == "none":  # said on the row itself: grades a TA can trust less
            row["message"] = f"{UNSANDBOXED}; {row['message']}".rstrip("; ")
        return row
    return {"id": sid, "total": None, **dict.fromkeys(qids), "status": Status.NOT_GRADED,
            "message": why or Status.NOT_GRADED}


def stored_records(book: Gradebook, subs: list[Submission], failed: dict[str, str]) -> dict[str, Record]:
    """The records stored in `book` for `subs` (merge's view of an earlier run); a record that cannot be read
    puts its submission in `failed`, with the reason."""
    records = {}
    for sub in subs:
        if sub.id in failed:
            continue
        try:
            records[sub.id] = book.read_record(sub.result_name)
        except Exception as exc:  # noqa: BLE001 - a damaged store is one row's problem
            failed[sub.id] = (f"not graded: its stored result could not be read ({failure_text(exc)}); run the "
                              "grade command again")
    return records


def write_tables(suite: Suite, subs: list[Submission], book: Gradebook, *, records: dict[str, Record] | None = None,
                 failed: dict[str, str] | None = None, limits_lowered: list[str] | None = None) -> Tables:
    """grades.csv and summary.json of exactly these submissions (atomic writes); one row each, always.

    records: each submission's record (id -> Record), as the run holds them; a submission not in it (and not
    failed) is read from the folder. A row that is not graded has empty score cells; every cell that came from a
    student is spreadsheet-safe. limits_lowered: the configured limits that the grader's own hard limits lowered
    in the run. Manual questions have a column too, empty until `merge` brings their scores (merged_scores.json),
    which also replace a question's automatic score when the scores file has that question's column.
    """
    failed = dict(failed or {})
    records = dict(records or {})
    missing = [s for s in subs if s.id not in records and s.id not in failed]
    records |= stored_records(book, missing, failed)
    qids = list(suite.question_points())
    manual = {q.id: q.points for q in suite.questions if q.graded and q.manual}
    merged, merge_problem = merged_or_problem(book)
    comments = {sid: notes for sid, notes in merged_comments(book).items() if notes}
    rows = []
    for sub in subs:
        row = record_row(suite, sub.id, records.get(sub.id), failed.get(sub.id)) | dict.fromkeys(manual)
        if row["total"] is not None:
            apply_merged(suite, row, merged.get(sub.id, {}))
        row["notes"] = [*([sub.picked] if sub.picked else []), *sub.notes]  # what reading the class noticed
        rows.append(row)
    columns = [*qids, *manual]
    said = [comment_cell(comments.get(r["id"], {})) for r in rows] if comments else []  # a column once a TA wrote
    table = [["id", "total", *columns, "status", "message", *([COMMENT_COLUMN] if said else [])]]
    table += [[r["id"], *("" if r[k] is None else r[k] for k in ("total", *columns)), r["status"], r["message"],
               *([said[n]] if said else [])] for n, r in enumerate(rows)]
    book.write_grades_csv(csv_text(table))
    scored = [r for r in rows if r["total"] is not None]
    points = suite.question_points() | manual

    def mean(q: str) -> float | None:
        have = [r[q] for r in scored if r[q] is not None]
        return round(sum(have) / len(have), 3) if have else (0.0 if q in qids else None)

    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    summary = Summary(
        submissions=len(rows), status_counts=counts, mean_per_question={q: mean(q) for q in columns},
        max_per_question=points,
        full_marks_per_question={q: sum(full_marks(r[q], points[q]) for r in scored) for q in columns},
        mean_total=round(sum(r["total"] for r in scored) / len(scored), 3) if scored else 0.0,
        auto_points=suite.auto_points, manual_points=round(sum(manual.values()), 4),
        merged={"file": MERGED_FILE, "students": len(merged), "problem": merge_problem}
        if merged or merge_problem else None,
        limits_lowered=list(limits_lowered or []),
        rows=[SummaryRow(r["id"], None if r["status"] == Status.NOT_GRADED else sub.result_name, r["status"],
                         r["message"], r["notes"]) for r, sub in zip(rows, subs)])
    book.write_summary(summary)
    return Tables(rows, summary, records, comments)
