"""Each student's feedback file (feedback/<id>.html beside grades.csv): a page safe to hand out, rendered only from
the student-safe view each stored result holds (its `gradescope` view: the visible cases in full, each hidden case's
verdict and what to revisit, never its inputs or expected values) and the scores `merge` kept."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2

from autograder.authoring.suite import Suite
from autograder.grading.gradebook import Gradebook, Record
from autograder.grading.submissions import result_file_name
from autograder.grading.tables import Tables, merged_or_problem, merged_value
from autograder.model import row_question, shown

MARKER = ".autograder-feedback"  # only a folder holding this file is ever replaced
HERE = Path(__file__).parent


@lru_cache(maxsize=1)
def _template() -> jinja2.Template:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["shown"] = shown  # every score the page shows: at most two decimals
    return env.get_template("feedback.html.j2")


@dataclass
class QuestionFeedback:
    """One question of a student's feedback: its score, its cases as the student may see them, its written parts."""

    id: str
    title: str
    points: float
    score: float | None
    tests: list[dict[str, Any]]
    parts: list[tuple[str, str, float | None, float]]  # (part, prompt, score or None, max)
    manual: bool
    comments: list[tuple[str, str]]  # a TA's comments merged on this question or its parts: (column, text)
    causes: list[str]  # the catalogued mistakes its failed hidden cases matched, in the catalogue's words


def feedback_name(result_name: str) -> str:
    """The feedback file of a submission: its results/ file name (its id when that is a plain name) as .html."""
    return result_name.removesuffix(".json") + ".html"


def _student_view(record: Record) -> dict[str, Any]:
    """The student-safe part of a stored result: its Gradescope view and the per-question scores (numbers)."""
    view = record.gradescope
    if not isinstance(view.get("tests"), list):
        raise ValueError("its stored result has no student view; run the grade command again with --force")
    return {"tests": [t for t in view["tests"] if isinstance(t, dict)], "output": str(view.get("output") or ""),
            "status": record.result.status, "questions": record.result.question_scores()}


def likely_causes(suite: Suite, record: Record) -> dict[str, str]:
    """Case id -> the catalogued mistake a failed hidden case's output matched, in the catalogue's own words (a
    general description, never the case's values); the student-safe view says only what to revisit."""
    known = {m.id: m.description for m in suite.lesson.mistakes}
    known |= {c.known_cause["id"]: c.known_cause["description"] for c in suite.cases if c.known_cause}
    return {c.id: known[c.diagnosis] for c in record.result.cases
            if c.hidden and not c.passed and c.diagnosis in known}


def _questions(suite: Suite, view: dict[str, Any], merged: dict[str, float], said: dict[str, str],
               causes: dict[str, str]) -> list[QuestionFeedback]:
    out = []
    for q in suite.questions:
        if not q.graded:
            continue
        tests = [t for t in view["tests"] if row_question(str(t.get("name", ""))) == q.id]
        points = suite.question_points().get(q.id, q.points)
        value = merged_value(q, merged)
        if value is None and not q.manual:
            value = float(view["questions"].get(q.id, 0.0))
        share = round(q.points / len(q.written), 4) if q.written else 0.0
        parts = [(p.part, p.prompt, merged.get(p.part), share) for p in q.written]
        notes = [(col, said[col]) for col in (q.id, *(p.part for p in q.written)) if said.get(col)]
        mistakes = list(dict.fromkeys(why for cid, why in causes.items() if cid.split("/")[0] == q.id))
        out.append(QuestionFeedback(q.id, q.title, points, value, tests, parts, q.manual, notes, mistakes))
    return out


def render_feedback(suite: Suite, sid: str, record: Record | None, merged: dict[str, float], *,
                    problem: str = "", said: dict[str, str] | None = None) -> str:
    """One student's feedback page (`record`: the stored result; None with `problem` when there is none; `said`:
    a TA's comments merged for this student, column ("" the whole work) -> text)."""
    said = said or {}
    view = _student_view(record) if record is not None else None
    causes = likely_causes(suite, record) if record is not None else {}
    questions = _questions(suite, view, merged, said, causes) if view is not None else []
    scored = [q.score for q in questions if q.score is not None]
    return _template().render(sid=sid, view=view, questions=questions, problem=problem,
                              comment=said.get(""),
                              total=round(sum(scored), 4), max_total=round(sum(q.points for q in questions), 4),
                              pending=[q.id for q in questions if q.score is None])


def feedback_page(suite: Suite, sid: str, record: Record | None, merged: dict[str, dict[str, float]], *,
                  said: dict[str, str] | None = None) -> str:
    """One student's page, isolated: a stored result the page cannot show (whatever it raises: a missing field, a
    number no float holds, a structure too deep to walk) gets a page saying so, and the class's other pages are
    written all the same; the grader's own words stay in grades.csv."""
    if record is None:  # the grader failed on it: its reason (the grader's own, for TAs) stays in grades.csv
        return render_feedback(suite, sid, None, {}, problem="the grader could not grade it")
    try:
        return render_feedback(suite, sid, record, merged.get(sid, {}), said=said)
    except (ValueError, KeyError, TypeError):
        problem = "its stored result could not be read"
    except Exception:  # noqa: BLE001 - RecursionError, OverflowError, a template error: one page, never the class
        problem = "its stored result could not be shown"
    return render_feedback(suite, sid, None, {}, problem=problem)


def write_feedback(suite: Suite, book: Gradebook, tables: Tables) -> Path:
    """Write the grades folder's feedback/: one page per row of the summary (from the records the tables were made
    from), built in a temporary folder and swapped in whole (a re-run or `merge` replaces it; a folder it did not
    write is never replaced). Returns the folder."""
    merged, _ = merged_or_problem(book)  # when it cannot be read, grades.csv's summary says why
    dest = book.feedback_dir
    if dest.exists() and not (dest / MARKER).exists():
        raise FileExistsError(f"{dest} exists and was not written by the grader; move it away and grade again")
    tmp = Path(tempfile.mkdtemp(dir=book.folder, prefix=f".{dest.name}.tmp-"))
    try:
        for row in tables.summary.rows:
            record = tables.records.get(row.id) if row.result else None
            name = feedback_name(row.result or result_file_name(row.id, row.id.encode("utf-8", "surrogateescape")))
            (tmp / name).write_text(feedback_page(suite, row.id, record, merged,
                                                  said=tables.comments.get(row.id)),
                                    encoding="utf-8", errors="backslashreplace")
        (tmp / MARKER).write_text("written by the grader; the whole folder is replaced on the next run\n")
        tmp.chmod(0o755)
        old = dest.with_name(f".{dest.name}.old")
        if old.exists():
            shutil.rmtree(old)
        if dest.exists():
            dest.replace(old)
        tmp.replace(dest)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest
