"""Plain-text summaries that the command line prints after a stage: aligned tables of its results."""

from __future__ import annotations

import shlex
from pathlib import Path

from autograder.grading.batch import BatchSummary
from autograder.grading.gradebook import Gradebook
from autograder.model import Status, full_marks


def text_table(rows: list[list[str]]) -> str:
    """Rows as aligned columns (the first left-aligned, the others right-aligned), a rule under the header."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def grade_summary(summary: BatchSummary, *, points: dict[str, float]) -> str:
    """What `grade` did: counts per status, the mean and full marks per question (`points` of each), the
    submissions it could not grade, and where the grades are."""
    rows = [r for r in summary.rows if r["total"] is not None]
    kept = f", kept {summary.kept} other student(s)' results as they were (--only)" if summary.kept else ""
    lines = [f"graded {summary.graded_now} submission(s), reused {summary.reused} unchanged result(s){kept}; "
             f"sandbox: {summary.sandbox}",
             "status:  " + ", ".join(f"{k} {v}" for k, v in sorted(summary.counts().items()))]
    if rows:
        table = [["question", "mean", "full marks"]]
        for q in summary.questions:
            mean = sum(r[q] for r in rows) / len(rows)
            full = sum(full_marks(r[q], points[q]) for r in rows)
            table.append([q, f"{mean:.2f}", f"{full}/{len(rows)}"])
        lines.append(text_table(table))
    lines += [f"not graded: {r['id']}: {r['message']}" for r in not_graded(summary)]
    lines += [f"note: {r['id']}: {n}" for r in summary.rows for n in r.get("notes") or ()]
    lines += [f"limits lowered: {n}" for n in summary.limits_lowered]
    book = Gradebook(summary.out)
    lines.append(f"grades: {book.grades_csv}   per-submission results: {book.results_dir}/")
    return "\n".join(lines)


def not_graded(summary: BatchSummary) -> list[dict[str, object]]:
    """The rows the grader failed on in this run (a re-run grades them)."""
    return [r for r in summary.rows if r["status"] == Status.NOT_GRADED]


def report_folder(grades: Path) -> Path:
    """Where the TA report of the grades folder `grades` goes when a printed hint names it: beside it, `grades`
    renamed `report` (dist/grades -> dist/report, dist/nbgrader-grades -> dist/nbgrader-report), else NAME-report."""
    grades = grades.resolve()
    name = grades.name.replace("grades", "report") if "grades" in grades.name else f"{grades.name}-report"
    return grades.with_name(name)


def report_hint(grades: Path, *, command: str) -> str:
    """The command that writes the TA report of `grades` (`command`: how to run this package, with its --config),
    with every path absolute, so that it runs as printed from any folder and writes beside the grades."""
    return f"{command} report {shlex.quote(str(grades.resolve()))} --out {shlex.quote(str(report_folder(grades)))}"
