"""The report's compare page (compare.html): the same class graded twice, before and after, so an instructor sees
what moved. Per question the mean score before and after and how many students moved up or down; per student whose
total or a question's score moved, each move and the cases whose verdict changed; the students graded in only one
of the two runs, listed apart. The earlier run is read as stored results only (never its notebooks)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autograder.config import command
from autograder.grading.gradebook import RESULTS_DIR, SUMMARY_FILE, Gradebook
from autograder.model import CaseResult, Status, SubmissionResult
from autograder.report.model import batch_rows, read_record, unusable_record
from autograder.report.text import as_text, clip_text

PAGE = "compare.html"
MESSAGE_CHARS = 600  # a changed case's message, clipped to this on the page
EPS = 1e-9  # scores closer than this have not moved


class NotGrades(FileNotFoundError):
    """The folder given as the earlier run is not one `grade` wrote."""


def read_run(grades: Path) -> dict[str, SubmissionResult]:
    """Student id -> stored result of a graded folder, in the batch's order; NotGrades when it is not one."""
    use = f"pass --compare the folder an earlier `{command()} grade` wrote (its --out, holding {RESULTS_DIR}/)"
    book = Gradebook(grades)
    if not grades.is_dir():
        raise NotGrades(f"--compare {grades}: no such folder; {use}")
    if not book.exists():
        raise NotGrades(f"--compare {grades}: not a grades folder (no {RESULTS_DIR}/ and no {SUMMARY_FILE}); {use}")
    run: dict[str, SubmissionResult] = {}
    for sid, name, row in batch_rows(book):
        if isinstance(name, str) and "/" not in name and not name.startswith("."):
            record = read_record(book, name)
        else:
            record = unusable_record(sid, as_text(row.get("message") or "no stored result"))
            record["status"] = as_text(row.get("status") or Status.UNUSABLE)
        try:
            run[sid] = SubmissionResult.from_dict(record)
        except Exception as exc:  # noqa: BLE001 - one record must never stop the page
            run[sid] = SubmissionResult.from_dict(unusable_record(sid, f"not a stored result ({as_text(exc)[:300]})"))
    return run


def _verdict(c: CaseResult | None) -> str:
    if c is None:
        return "not judged"
    if c.passed:
        return "passed"
    return f"failed ({c.diagnosis})" if c.diagnosis else "failed"


@dataclass
class CaseChange:
    """Cases whose verdict differs between the runs the same way, with the same messages but for their ids (one
    entry for the lot, the messages shown as the first case's)."""

    ids: list[str]
    before: str  # the verdict: passed, failed (diagnosis), not judged
    after: str
    before_message: str = ""
    after_message: str = ""


@dataclass
class StudentMove:
    """A student whose total or a question's score moved."""

    id: str
    total: tuple[float, float]
    status: tuple[str, str]
    questions: list[tuple[str, float, float]] = field(default_factory=list)  # (question, before, after)
    cases: list[CaseChange] = field(default_factory=list)
    page: str = ""  # the student's page under students/ ("" when the new run has none)

    @property
    def delta(self) -> float:
        return self.total[1] - self.total[0]


@dataclass
class QuestionMove:
    """A question's mean before and after, over the students in both runs, and who moved."""

    id: str
    mean: tuple[float, float]
    up: int
    down: int


@dataclass
class Moved:
    """Everything the compare page shows."""

    questions: list[QuestionMove]
    students: list[StudentMove]  # the largest drop first, then by id
    only_before: list[tuple[str, float]]  # (id, total) of students graded only in the earlier run
    only_after: list[tuple[str, float]]
    both: int  # how many students are in both runs
    unread: list[tuple[str, str]] = field(default_factory=list)  # (id, why) of students whose results broke it


def _changed_cases(old: SubmissionResult, new: SubmissionResult) -> list[CaseChange]:
    was = {c.id: c for c in old.cases}
    now = {c.id: c for c in new.cases}
    out: dict[tuple[str, ...], CaseChange] = {}
    for cid in [*now, *(k for k in was if k not in now)]:
        a, b = was.get(cid), now.get(cid)
        if _verdict(a) == _verdict(b):
            continue
        said = [clip_text(as_text(c.message), MESSAGE_CHARS) if c is not None and not c.passed else "" for c in (a, b)]
        key = (_verdict(a), _verdict(b), *(m.replace(cid, "\0") for m in said))
        if key in out:
            out[key].ids.append(cid)
        else:
            out[key] = CaseChange([cid], _verdict(a), _verdict(b), *said)
    return list(out.values())


def _comparable(old: SubmissionResult, new: SubmissionResult) -> None:
    """Raises when the two results of one student cannot be compared."""
    for r in (old, new):
        _ = [float(r.total), *(float(r.score(q)) for q in r.question_scores())]
    _changed_cases(old, new)


def compare_runs(old: dict[str, SubmissionResult], new: dict[str, SubmissionResult], question_ids: list[str],
                 *, pages: dict[str, str] | None = None) -> Moved:
    """What moved from `old` to `new` (id -> result each). question_ids: the columns, in order; a question scored
    in either run but not listed is added after them. pages: id -> the student's page in this report."""
    both, unread = [], []
    for sid in (sid for sid in new if sid in old):
        try:  # one result that cannot be compared is named; the rest of the class is compared
            _comparable(old[sid], new[sid])
            both.append(sid)
        except Exception as exc:  # noqa: BLE001
            unread.append((sid, f"{type(exc).__name__}: {clip_text(as_text(exc), 200)}"))
    seen = {q for sid in both for r in (old[sid], new[sid]) for q in r.question_scores()}
    qids = [*question_ids, *sorted(seen - set(question_ids))]
    questions = []
    for q in qids:
        pairs = [(old[sid].score(q), new[sid].score(q)) for sid in both]
        n = len(pairs) or 1
        questions.append(QuestionMove(q, (sum(a for a, _ in pairs) / n, sum(b for _, b in pairs) / n),
                                      sum(b - a > EPS for a, b in pairs), sum(a - b > EPS for a, b in pairs)))
    students = []
    for sid in both:
        a, b = old[sid], new[sid]
        qs = [(q, a.score(q), b.score(q)) for q in qids if abs(a.score(q) - b.score(q)) > EPS]
        if not qs and abs(a.total - b.total) <= EPS:
            continue
        students.append(StudentMove(sid, (a.total, b.total), (a.status, b.status), qs, _changed_cases(a, b),
                                    (pages or {}).get(sid, "")))
    students.sort(key=lambda s: (s.delta, s.id))
    return Moved(questions, students, sorted((sid, r.total) for sid, r in old.items() if sid not in new),
                 sorted((sid, r.total) for sid, r in new.items() if sid not in old), len(both), unread)


def compare_page(old_grades: Path, old: dict[str, SubmissionResult], students: list[Any], question_ids: list[str],
                 *, grades: Path, title: str) -> dict[str, str]:
    """{PAGE: the page} comparing the run stored in `old_grades` (read by read_run into `old`) with this report's
    students (the run in `grades`)."""
    from autograder.report.render import render_template

    moved = compare_runs(old, {s.id: s.result for s in students}, question_ids,
                         pages={s.id: s.page for s in students})
    page = render_template("moved.html.j2", page_title=f"{title}: before and after", m=moved, title=title,
                   before=str(old_grades.resolve()), after=str(grades), message_chars=MESSAGE_CHARS)
    return {PAGE: page}
