"""The report's data: each student's stored result (checked once, then read through results.SubmissionResult), and
the groups of students who failed a question the same way."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autograder.authoring.questions import LETTERS, Choice, Question, shuffled
from autograder.authoring.suite import Suite
from autograder.checkpoint import MISSING
from autograder.config import command
from autograder.grading.bindings import stub_state
from autograder.grading.gradebook import RESULTS_DIR, Gradebook
from autograder.model import CaseResult, Reason, Status, SubmissionResult
from autograder.model import record_problem as stored_record_problem
from autograder.report.code import code_cells, submission_cells, written_answers
from autograder.report.text import as_text

UNRECOGNISED = "unrecognised"
UNFINISHED = "unfinished"
SYNTAX = "syntax error"  # a cell the question needs did not compile (Reason.SYNTAX_ERROR)
TIMED = "time limit"  # the question's checks ran out of time (Reason.TIME_LIMIT)
UNDEFINED = "not defined"  # a name the question grades was never defined (Reason.MISSING)
# Groups with no catalogued mistake, each counted apart on the first screen: what stopped the checks (from the
# cases' typed reasons), a stub left blank, and answers no catalogue explains.
UNDIAGNOSED = (SYNTAX, TIMED, UNDEFINED, UNFINISHED, UNRECOGNISED)
CAUSE_LABELS = {Reason.SYNTAX_ERROR: SYNTAX, Reason.TIME_LIMIT: TIMED, Reason.MISSING: UNDEFINED}
APART = (MISSING,)  # diagnoses that say what was not handed in, not what the code got wrong: counted apart
INVALID = "invalid"  # the label of a multiple-choice answer that is not one of the letters


@dataclass
class Student:
    """One submission's stored result (the record as stored, and the results object it holds), plus what the
    report derives from it."""

    id: str
    record: dict[str, Any]  # as stored: the result's fields and the grader's own (path, stdout, ...)
    page: str  # file name under students/
    cells: list[tuple[int, str]] = field(default_factory=list)  # (index, source) of the notebook's code cells
    code_problem: str = ""  # why there are no cells, when there are none
    answers: dict[str, str | None] = field(default_factory=dict)  # written part -> answer (None: no answer cell)
    stub: str | None = None  # what a probe says of a blank stub (the lesson's runtime: STUB); None: not looked for
    result: SubmissionResult = field(init=False)

    def __post_init__(self) -> None:
        self.use(self.record)

    def use(self, record: dict[str, Any]) -> None:
        """Show `record` (a stored result that record_problem accepts, or one made by the report)."""
        self.record, self.result = record, SubmissionResult.from_dict(record)

    @property
    def status(self) -> str:
        return self.result.status

    @property
    def ran(self) -> bool:
        return self.result.ran

    def failed(self, qid: str | None = None) -> list[CaseResult]:
        return self.result.failed(qid)

    def diagnoses(self, qid: str | None = None) -> list[str]:
        return self.result.diagnoses(qid)

    def labels(self, q: Question) -> list[str]:
        """The groups this student falls in on question `q` (none when they lost no points there).

        Every diagnosis on the failed cases; but a question whose stubs were all left as they were is
        only "unfinished" (a diagnosis there describes the stub's output, not a mistake), and one with
        some stubs left is "unfinished" too. Failures with no diagnosis are "unrecognised".
        """
        failed = self.failed(q.id)
        if not failed or not self.ran:
            return []
        names = set(q.solution) | {c.var for c in q.choices}
        stubs = stub_state(self.cells, names)
        if names and all(stubs.get(n) for n in names):
            return [UNFINISHED]
        found = self.diagnoses(q.id) + self.wrong_picks(q)
        causes = list(dict.fromkeys(CAUSE_LABELS[c.reason] for c in failed if c.reason in CAUSE_LABELS))
        # a result stored before reasons existed says "not filled in" only in its words
        blank = any(c.reason == Reason.BLANK or (not c.reason and self.stub is not None and self.stub in c.message)
                    for c in failed)
        if any(stubs.values()) or (not found and not causes and blank):
            return [*found, *causes, UNFINISHED]
        return found + causes or [UNRECOGNISED]

    def pick(self, q: Question, choice: Choice) -> str:
        """The letter this student chose for a multiple-choice item, INVALID when it is not a letter, "" when
        the item was never judged (the notebook stopped before it)."""
        case_id = next((c.id for c in q.cases if c.check == "choice_correct"
                        and c.args.get("names") == [choice.var]), None)
        case = next((c for c in self.result.cases if c.id == case_id), None)
        if case is None:
            return ""
        if case.passed:
            return shuffled(choice)[1]
        got = case.received
        letter = got.get(choice.var) if isinstance(got, dict) else None
        return letter if isinstance(letter, str) and letter in LETTERS else INVALID

    def wrong_picks(self, q: Question) -> list[str]:
        """One label per multiple-choice item answered wrongly: `<variable>:<letter>` (or `:invalid`)."""
        if not self.ran:
            return []
        picks = [(c.var, self.pick(q, c), shuffled(c)[1]) for c in q.choices]
        return [f"{var}:{got}" for var, got, right in picks if got and got != right]

    def diagnosis_ids(self, questions: list[Question]) -> list[str]:
        """The catalogued mistakes this student's failures were grouped under, question by question."""
        ids = [d for q in questions for d in self.labels(q) if d not in UNDIAGNOSED]
        return list(dict.fromkeys(ids))

    def score(self, qid: str) -> float:
        return self.result.score(qid)

    @property
    def total(self) -> float:
        return self.result.total


@dataclass
class Cluster:
    """Students who failed one question the same way (one diagnosis, or none recognised)."""

    question: str
    diagnosis: str
    students: list[Student] = field(default_factory=list)

    @property
    def anchor(self) -> str:
        return f"{self.question}--{self.diagnosis}"


def _page_name(sid: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9_.-]", "_", sid).lstrip(".")
    if slug != sid or not slug or len(slug) > 100:
        slug = f"{slug[:60]}-{_digest(sid)}"
    return f"{slug}.html"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]



def record_problem(record: Any) -> str:
    """Why the report cannot use a stored result ("" when it can): the model's one check of a stored result, with
    the fields the report reads beside it (its total and per-question scores)."""
    return stored_record_problem(record, derived=True)


def unusable_record(sid: str, why: str) -> dict[str, Any]:
    return {"submission": sid, "status": Status.UNUSABLE, "cases": [], "questions": {}, "total": 0, "notes": [why]}


def read_record(book: Gradebook, name: str) -> dict[str, Any]:
    """A stored result read as data (a regular file under the cap), or an "unusable result" saying why not."""
    stem = name.removesuffix(".json")
    try:
        record = book.record_data(name)
    except (OSError, ValueError, RecursionError) as exc:
        return unusable_record(stem, f"{RESULTS_DIR}/{as_text(name)} could not be read: {as_text(exc)[:300]}")
    why = record_problem(record)
    return unusable_record(stem, f"{RESULTS_DIR}/{as_text(name)}: {why}") if why else record


def batch_rows(book: Gradebook) -> list[tuple[str, str | None, dict[str, Any]]]:
    """(id, result file, summary row) of the batch, in its order: the summary's rows, else every stored result."""
    try:
        return [(as_text(r.id), r.result, {"status": r.status, "message": r.message})
                for r in book.read_summary().rows]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return [(as_text(name.removesuffix(".json")), name, {}) for name in book.record_names()]


def load_students(grades: Path, *, limits: Any = None, parts: list[str] | None = None,
                  stub: str | None = None) -> list[Student]:
    """The results of the batch, in the order of the batch (summary.json), else every stored result.

    Never raises for what a stored result holds: a result the report cannot use becomes a student whose
    status is "unusable result" and whose note says why; a submission the grader left "not graded" keeps
    the grader's message. stub: what a probe says of a blank stub (the lesson's runtime's STUB), for the labels.
    """
    book = Gradebook(grades)
    if not book.exists():
        raise FileNotFoundError(f"{grades}: no {RESULTS_DIR}/ folder; run `{command()} grade` first")
    students = []
    for sid, name, row in batch_rows(book):
        if not isinstance(name, str) or "/" in name or name.startswith("."):
            message = as_text(row.get("message") or "no stored result")
            record = {"submission": sid, "status": as_text(row.get("status") or Status.UNUSABLE), "cases": [],
                      "questions": {}, "total": 0, "notes": [message]}
        else:
            record = read_record(book, name)
        try:
            student = Student(sid, record, _page_name(sid))
        except Exception as exc:  # noqa: BLE001 - a record record_problem let through but the results object refuses
            record = unusable_record(sid, f"{RESULTS_DIR}/{as_text(name)}: not a stored result ({as_text(exc)[:300]})")
            student = Student(sid, record, _page_name(sid))
        student.stub = stub
        if student.status not in (Status.UNREADABLE, Status.UNUSABLE) and record.get("path"):
            cells, student.code_problem = submission_cells(record.get("path"), grades, limits=limits)
            student.cells = code_cells(cells)
            student.answers = written_answers(cells, parts or []) if cells else {}
        students.append(student)
    pages = [s.page.lower() for s in students]
    for s in students:  # Alice and alice must not share a page on a case-insensitive disk
        if pages.count(s.page.lower()) > 1:
            s.page = f"{s.page[:-5]}-{_digest(s.id)}.html"
    return students


def lesson_title(suite: Suite) -> str:
    """The lesson's name in the report's titles: the title of its opening prose (the notebook's heading), else the
    assignment's name from the grading config."""
    return next((q.title for q in suite.questions if q.kind == "prose" and q.title), suite.config.assignment)


def catalogue(suite: Suite) -> dict[str, tuple[str, str]]:
    """Every diagnosis id the judge can give: (the question it belongs to, its description with the fix)."""
    known = {c.known_cause["id"]: (c.question, c.known_cause["description"])
             for c in suite.cases if c.known_cause}
    checkpoint: dict[str, tuple[str, str]] = {}
    graded = [c.question for c in suite.checkpoint_cases]  # none unless the lesson grades a milestone
    if graded:
        checkpoint = {k: (graded[0], v) for k, v in suite.lesson.plugin.PROBLEMS.items()}
    return known | {m.id: (m.question, m.description) for m in suite.lesson.mistakes} | checkpoint


def clusters(students: list[Student], questions: list[Question]) -> dict[str, list[Cluster]]:
    """Per question: students who lost points there, grouped by diagnosis, largest group first.

    A student goes into every diagnosis found on the failed cases of that question; when none has one,
    into "unfinished" (a stub was left as it was) or else "unrecognised". Submissions that did not run
    normally (timed out, crashed, ...) are left out: the status section lists them. The mistakes come first,
    then what was not handed in (APART), then the undiagnosed groups.
    """
    out: dict[str, list[Cluster]] = {}
    for q in questions:
        groups: dict[str, Cluster] = {}
        for s in students:
            try:
                labels = s.labels(q)
            except Exception:  # noqa: BLE001 - one result never stops the index; its own page says what it holds
                labels = []
            for d in labels:
                groups.setdefault(d, Cluster(q.id, d)).students.append(s)
        out[q.id] = sorted(groups.values(), key=lambda c: (c.diagnosis in UNDIAGNOSED, c.diagnosis in APART,
                                                           c.diagnosis == UNFINISHED, -len(c.students),
                                                           c.diagnosis))
    return out


_TEX = {"$": "", "\\approx": "≈", "\\sin": "sin", "\\cos": "cos", "\\cdot": "·"}


def plain_math(text: str) -> str:
    """An option's text for the report: its inline TeX ($\\sin(1/100) \\approx 0.0100$) as plain text."""
    for tex, plain in _TEX.items():
        text = text.replace(tex, plain)
    return text


def misconception(choice: Choice, text: str) -> str:
    """What choosing the wrong option `text` shows, from the question's source (`misconceptions`)."""
    wrong = choice.options.index(text) - 1
    return choice.misconceptions[wrong] if 0 <= wrong < len(choice.misconceptions) else "a wrong option"


def choice_catalogue(questions: list[Question]) -> dict[str, tuple[str, str]]:
    """The label of every wrong multiple-choice pick (`<variable>:<letter>`, `<variable>:invalid`): its question
    and what the pick means, from the question's source (the option's text and its misconception)."""
    out: dict[str, tuple[str, str]] = {}
    for q in questions:
        for c in q.choices:
            shown, right = shuffled(c)
            for letter, text in zip(LETTERS, shown):
                if letter == right:
                    continue
                out[f"{c.var}:{letter}"] = (q.id, f"chose {letter}, “{plain_math(text)}”: {misconception(c, text)}")
            out[f"{c.var}:{INVALID}"] = (q.id, f"{c.var} is not one of the letters A–D (left as ..., or not a "
                                               "string).")
    return out


