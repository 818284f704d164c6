"""The `merge` verb: scores graded elsewhere (a TA's written-answer scores, a platform's own points) read from CSV
files, checked against the suite, kept in merged_scores.json and written into grades.csv and summary.json."""

from __future__ import annotations

import csv
import difflib
import re
from pathlib import Path
from typing import Any

from autograder.authoring.suite import Suite
from autograder.config import command
from autograder.course import Course
from autograder.grading.feedback import write_feedback
from autograder.grading.gradebook import COMMENT_COLUMN, SUMMARY_FILE, Gradebook, MergeError
from autograder.grading.submissions import Submission
from autograder.grading.tables import write_tables
from autograder.model import Status, spreadsheet_text


def merge_columns(suite: Suite) -> dict[str, float]:
    """Columns a scores file may fill, with their maximum: every graded question, and each written part."""
    cols = {q.id: q.points for q in suite.questions if q.graded}
    for q in suite.questions:
        cols |= {p.part: round(q.points / len(q.written), 4) for p in q.written}
    return cols


COMMENT = COMMENT_COLUMN  # a scores file's comment on the student's whole work; "<column> comment": on one column
COMMENT_CHARS = 2000  # a longer comment is refused (a note for a student, not an essay)


def comment_column(header: str, limits: dict[str, float]) -> str | None:
    """The column a comment column comments on ("" for the student's whole work), or None when it is not one."""
    if header == COMMENT:
        return ""
    col = header.removesuffix(f" {COMMENT}")
    return col if col != header and col in limits else None


def comment_problem(text: str) -> str:
    """Why a comment cannot be shown to a student ("" when it can): too long, or not plain text."""
    if len(text) > COMMENT_CHARS:
        return f"{len(text)} characters, over the {COMMENT_CHARS} a comment may have; shorten it"
    odd = sorted({f"U+{ord(c):04X}" for c in text if not c.isprintable() and c not in "\n\t"})
    return f"not plain text (control characters {', '.join(odd[:5])}); write it as text" if odd else ""


def _lines(path: Path) -> list[tuple[int, list[str]]]:
    """The rows of a CSV file, each with the line it starts on (a quoted cell may span lines)."""
    with path.open(newline="", encoding="utf-8-sig") as f:
        reader, rows, end = csv.reader(f), [], 0
        for cells in reader:
            rows.append((end + 1, cells))
            end = reader.line_num
    return rows


def _nearest(word: str, known: list[str]) -> str:
    near = difflib.get_close_matches(word, known, n=3, cutoff=0.6)
    return f" (nearest: {', '.join(near)})" if near else ""


def check_scores_csv(path: Path, *, suite: Suite,
                     ids: list[str]) -> tuple[dict[str, dict[str, float]], list[str], list[str]]:
    """The scores a CSV holds (id -> column -> score; blank cells are left out), the columns it ignores, and every
    problem it has, each naming the file and its line: an unknown student, an unknown question-like column, a
    score that is not a number between 0 and the column's points, two rows for one student, a comment that is
    too long or not plain text. The comments (`comment`, `<column> comment`) are read by scores_and_comments."""
    scores, _comments, ignored, problems = scores_and_comments(path, suite=suite, ids=ids)
    return scores, ignored, problems


def scores_and_comments(path: Path, *, suite: Suite, ids: list[str]
                        ) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, str]], list[str], list[str]]:
    """check_scores_csv's scores, ignored columns and problems, with the comments the file holds (id -> the column
    commented on, "" for the student's whole work -> text; blank comments are left out)."""
    limits = merge_columns(suite)
    try:
        table = _lines(path)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        return {}, {}, [], [f"{path}: cannot be read ({exc})"]
    header = [h.strip() for h in table[0][1]] if table else []
    if "id" not in header:
        return {}, {}, [], [f"{path}, line 1: the first row must name the columns, one of them `id`"]
    problems: list[str] = []
    notes = {h: col for h in header if (col := comment_column(h, limits)) is not None}
    unknown = [h for h in header if re.match(r"^[qm]\d", h) and h not in limits and h not in notes
               and not h.endswith(" answer")]
    if unknown:
        problems.append(f"{path}, line 1: unknown score columns {unknown}; known: {sorted(limits)}")
    twice = sorted({h for h in header if header.count(h) > 1 and (h in limits or h in notes or h == "id")})
    if twice:
        problems.append(f"{path}, line 1: columns named twice: {', '.join(twice)}; keep one of each")
    score_cols = list(dict.fromkeys(h for h in header if h in limits))
    if not score_cols and not unknown and not notes:
        problems.append(f"{path}, line 1: no score column; name one of {sorted(limits)}")
    known = set(ids)
    written = {spreadsheet_text(i): i for i in ids}
    out: dict[str, dict[str, float]] = {}
    comments: dict[str, dict[str, str]] = {}
    rows_of: dict[str, list[int]] = {}
    for n, cells in table[1:]:
        rec = dict(zip(header, cells))
        sid = rec.get("id", "").strip()
        sid = written.get(sid, sid)  # the id as grades.csv writes it (`'=1+1` is `=1+1`), else the id itself
        if not sid and not any(rec.get(c, "").strip() for c in [*score_cols, *notes]):
            continue
        if not sid:
            problems.append(f"{path}, line {n}: scores with no id; fill in the student's id")
            continue
        if sid not in known:
            problems.append(f"{path}, line {n}: no student {sid!r} in this batch{_nearest(sid, sorted(known))}")
            continue
        rows_of.setdefault(sid, []).append(n)
        for col in score_cols:
            text = rec.get(col, "").strip()
            if not text:
                continue
            try:
                value = float(text)
            except ValueError:
                problems.append(f"{path}, line {n} ({sid}), {col}: {text!r} is not a number")
                continue
            if not 0 <= value <= limits[col] + 1e-9:
                problems.append(f"{path}, line {n} ({sid}), {col}: {value:g} is outside 0 to {limits[col]:g}")
                continue
            out.setdefault(sid, {})[col] = round(value, 4)
        for head, col in notes.items():
            text = rec.get(head, "").strip()
            why = comment_problem(text)
            if why:
                problems.append(f"{path}, line {n} ({sid}), {head}: {why}")
            elif text:
                comments.setdefault(sid, {})[col] = text
    for sid, lines in rows_of.items():
        if len(lines) > 1:
            problems.append(f"{path}, lines {', '.join(map(str, lines))} ({sid}): {len(lines)} rows for one "
                            "student; keep one")
    return out, comments, [h for h in header if h not in limits and h not in notes and h != "id"], problems


def read_scores_csv(path: Path, *, suite: Suite, ids: list[str]) -> tuple[dict[str, dict[str, float]], list[str]]:
    """The scores a CSV holds and the columns it ignores (check_scores_csv); MergeError listing every problem."""
    scores, ignored, problems = check_scores_csv(path, suite=suite, ids=ids)
    if problems:
        raise MergeError(problems)
    return scores, ignored


def merge_scores(out: Path, files: list[Path], *, course: Course) -> dict[str, Any]:
    """Merge scores graded elsewhere (a TA's written-answer scores, a platform's own points) into the batch in
    `out`: they are kept in merged_scores.json (a later file or run wins per student and column) and
    grades.csv and summary.json are written again with them. Returns what was merged.

    Every file is checked whole first: MergeError lists every problem of every file (check_scores_csv), and
    then nothing is written."""
    suite = course.suite
    book = Gradebook(out)
    try:
        before = book.read_summary()
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise MergeError(f"{out}: no {SUMMARY_FILE} of a graded batch; run `{command()} grade` first ({exc})") from None
    subs = [Submission(r.id, Path(), None, result_name=r.result or "", notes=list(r.notes))
            for r in before.rows]  # the notes reading the class made, as they were
    failed = {r.id: r.message or Status.NOT_GRADED for r in before.rows if not r.result}
    stored = book.merged_scores(command=command())
    said = book.merged_comments(command=command())
    counts, ignored = {}, set()
    checked = [scores_and_comments(path, suite=suite, ids=[s.id for s in subs]) for path in files]
    problems = [p for _, _, _, found in checked for p in found]
    if problems:  # every file checked whole; nothing is written until all of them are clean
        raise MergeError(problems)
    for scores, comments, skipped, _ in checked:
        ignored |= set(skipped)
        for sid, cols in scores.items():
            stored.setdefault(sid, {}).update(cols)
            for col in cols:
                counts[col] = counts.get(col, 0) + 1
        for sid, notes in comments.items():
            said.setdefault(sid, {}).update(notes)
            counts[COMMENT] = counts.get(COMMENT, 0) + len(notes)
    book.write_merged(stored, comments=said, sources=[str(p) for p in files])
    tables = write_tables(suite, subs, book, failed=failed, limits_lowered=before.limits_lowered)
    write_feedback(suite, book, tables)  # the students' feedback shows the merged scores
    return {"merged": counts, "ignored": sorted(ignored), "students": len(stored)}
