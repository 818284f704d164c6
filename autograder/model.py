"""The engine's typed data: the graded cases, the verdict on each case, on a checkpoint and on a submission
(checked when read back), the status words, and their views (the stored record, Gradescope's results.json, the
grades.csv row)."""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from typing import Any


class Status:
    """The status word of a sandboxed run (ExecResult), of a submission's result and of its grades.csv row: the one
    place each is spelled."""

    GRADED = "graded"
    TIMED_OUT = "timed out"
    OUT_OF_MEMORY = "out of memory"
    UNREADABLE = "could not be read"
    CRASHED = "crashed"
    TAMPERING = "tampering detected"
    NOT_GRADED = "not graded"  # the grader failed on it (sandbox, judging, storing): nothing stored, a re-run grades it
    UNUSABLE = "unusable result"  # the report's word for a stored result it cannot use


# The words a sandboxed run ends with (ExecResult.status); NOT_GRADED is the batch's, UNUSABLE the report's.
RUN_STATUSES = (Status.GRADED, Status.TIMED_OUT, Status.OUT_OF_MEMORY, Status.UNREADABLE, Status.CRASHED,
                Status.TAMPERING)


@dataclass(frozen=True, kw_only=True)
class Case:
    """One graded case of a question: the probe to run and how to judge its output, built once from the question
    file (autograder.authoring.questions). The fields are in the order of the plain view the checks read."""

    name: str
    hidden: bool = False
    weight: float = 1
    probe: str
    args: dict[str, Any] = field(default_factory=dict)
    check: str
    what: str | None = None
    first: str | None = None
    second: str | None = None
    why: str | None = None
    words: tuple[str, ...] = ()
    dtype: str | None = None
    atol: float
    rtol: float
    diagnosis: str | None = None
    requires: tuple[str, ...] = ()  # names of value cases of the same question that must hold first
    # How a failing value case may still count as close to the reference (it then opens the gates of the cases
    # that require it): the normalisations its output may need (near), and a relative error it may have (within).
    near: tuple[str, ...] = ()
    within: float | None = None
    claim: bool = False  # its points rest on a fact the student's process reports (a review flag holds them)
    revisit: str
    known_cause: dict[str, str] | None = None  # {"id", "description"} of the catalogued mistake it diagnoses
    id: str  # "<question>/<name>"
    question: str
    points: float

    @property
    def required(self) -> list[str]:
        """The ids of the cases it requires, in the order the question file names them."""
        return [f"{self.question}/{r}" for r in self.requires]

    def plain(self) -> dict[str, Any]:
        """The case as plain data (a fresh dict, lists for tuples, no known_cause when it has none): the form the
        lesson's shipped checks receive and the generated test files carry."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.known_cause is None:
            del out["known_cause"]
        return out | {"words": list(self.words), "requires": list(self.requires), "near": list(self.near)}


@dataclass(frozen=True)
class CheckpointCase:
    """One graded part of the milestone checkpoint (for example one scheme), verified from uploaded files."""

    id: str
    question: str
    points: float
    part: str
    hidden: bool = False


@dataclass
class PartVerdict:
    """One graded part of a checkpoint (one grades.csv case): passed or why not, and the figures received."""

    passed: bool
    message: str = ""
    problem: str | None = None  # an id of the plug-in's PROBLEMS when not passed
    received: dict[str, dict[str, Any]] = field(default_factory=dict)  # e.g. measured, claimed, bounds


@dataclass
class CheckpointVerdict:
    """A milestone checkpoint's verdict (a plug-in's `verify`): ok when it could be verified at all, the share of
    the points a passing part earns (credit, named by label when below 1), and per part its verdict. (A case's
    verdict is the checks runtime's Verdict: another thing, hence another name.)"""

    ok: bool
    message: str = ""
    problem: str | None = None
    credit: float = 0.0
    label: str | None = None  # what the credit depends on (e.g. the preset the checkpoint was trained with)
    parts: dict[str, PartVerdict] = field(default_factory=dict)


# The old name of CheckpointVerdict, kept for one release because it is part of the plug-in API (plug-ins build
# `checkpoint.Verdict(...)`; docs/checkpoint.md): use CheckpointVerdict. To be removed in the release after next.
Verdict = CheckpointVerdict


# What a student reads on Gradescope under a status other than "graded".
class Reason:
    """Why a case ended as it did (CaseResult.reason): the one vocabulary the messages, the report, the feedback
    and the platforms' rows are written from; nothing reads a reason back out of a message."""

    PASSED = "passed"
    MISMATCH = "mismatch"  # it ran and its answer is not the reference's, and no catalogued mistake explains it
    CATALOGUED = "catalogued cause"  # its answer is a catalogued mistake's (CaseResult.diagnosis names it)
    RAISED = "raised"  # the student's code raised
    BLANK = "blank stub"  # a stub still as the template left it
    MISSING = "missing definition"  # a name the question grades is not defined
    SYNTAX_ERROR = "syntax error"  # the cell that should define it did not compile
    TIME_LIMIT = "time limit"  # its probe never ran: a time limit (or it waits only for cases that did not run)
    STOPPED = "stopped"  # no output: the submission stopped before it ran
    WAITS = "waits"  # it waits for cases of its question that do not hold yet
    UNSHOWN = "not shown by a hidden case"  # a public case passes, but pays once a hidden case shows the code computes
    HELD = "held for review"  # it passed, but rests on a fact a review flag holds
    EARLIER = "earlier question"  # left out of its question's total: the mistake is an earlier question's


# Reasons that say what stopped a case from being judged, not what the answer got wrong: the student is told that
# cause (never a hint about the answer), and the TA report counts each apart.
CAUSES = (Reason.SYNTAX_ERROR, Reason.TIME_LIMIT, Reason.BLANK, Reason.MISSING, Reason.STOPPED)


# how the grader's note on a step the machine slowed ends (its CPU time under the limit: nothing is charged)
UNCHARGED = "the machine was slow, and the grader charges CPU time, so nothing was charged"
NOT_RUN = "not run: time limit"  # how a case whose probe never ran for time begins its message (after its id)

# What a student is told of a hidden case that failed for a cause (CAUSES, HELD): the cause, never a hint about the
# answer (the question's notes above the cases say where).
CAUSE_TEXT = {
    Reason.TIME_LIMIT: f"{NOT_RUN} (the notes above say which check was slow)",
    Reason.SYNTAX_ERROR: "not run: a cell this question needs has a syntax error (the notes above say which)",
    Reason.BLANK: "a function this question grades still has the template's `...` body: write it, then run its cell",
    Reason.MISSING: "a function or class this question grades is not defined: run the cell that defines it",
    Reason.STOPPED: "not run: the notebook stopped before this case (the status above says why)",
    Reason.HELD: "held for review: a person will look at a part of your code; these points follow their decision",
}


def likely_cause(cases: list[CaseResult], revisit: dict[str, str]) -> str:
    """A question's likely cause, for the line the student reads first: a cause that stopped its cases (a syntax
    error, a time limit, a blank stub...), else the idea to revisit of a case whose answer a catalogued mistake
    explains, else of a wrong answer, else of any failed case; "" when none failed."""
    failed = sorted((c for c in cases if not c.passed), key=lambda c: not c.hidden)  # the hidden ones' hints first
    order = [*CAUSES, Reason.HELD, Reason.CATALOGUED, Reason.MISMATCH, Reason.RAISED]
    for reason in order:
        hit = next((c for c in failed if c.reason == reason), None)
        if hit is not None:
            return CAUSE_TEXT.get(reason) or f"Revisit: {revisit.get(hit.id) or ''}".strip()
    return f"Revisit: {revisit.get(failed[0].id) or ''}".strip() if failed else ""

STUDENT_HELP = {
    Status.TIMED_OUT: "The notebook as a whole ran past its time limit; what the cells before the running one "
                      "defined was still graded, the rest earns nothing. Look for an endless loop, or training "
                      "outside the cell tagged for it.",
    Status.OUT_OF_MEMORY: "The notebook used more memory than the grader allows; the cases that had not run earn "
                          "nothing. Look for very large arrays.",
    Status.CRASHED: "The notebook stopped the grader (sys.exit, exit() or a fatal error); the cases that had not "
                    "run earn nothing. Run it from the top (Kernel > Restart & Run All) to find where.",
    Status.TAMPERING: "The notebook changed the grading environment (for example replaced a numpy or torch "
                      "function); your points come from your outputs alone, and a TA will review it.",
}

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
# Characters a CSV cell never holds raw: control characters but newline and tab (ESC recolours a terminal that
# prints the file, CR rewrites its line), and the bidirectional controls that reorder what a spreadsheet or a
# terminal shows (U+202A-U+202E embeddings and overrides, U+2066-U+2069 isolates, U+200E/F and U+061C marks).
CSV_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group(0))
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def spreadsheet_text(text: str) -> str:
    """A CSV cell as written in every CSV the package writes: each control or bidirectional character becomes a
    visible escape (ESC as \\x1b, U+202E as \\u202e), and a cell that starts like a formula gets a leading
    apostrophe, so a spreadsheet shows it as text. A cell that starts with an apostrophe gets one more, so that
    the apostrophe is reversible (`from_spreadsheet_text`): `=1+1` is written `'=1+1` and `'=1+1` is written
    `''=1+1`, never the same cell."""
    text = CSV_UNSAFE.sub(_escape, text)
    return "'" + text if text[:1] in (*FORMULA_STARTS, "'") else text


def from_spreadsheet_text(cell: str) -> str:
    """The text a cell written by `spreadsheet_text` stands for, as far as the apostrophe goes: one leading
    apostrophe that `spreadsheet_text` would have added is taken off (`'=1+1` -> `=1+1`, `''x` -> `'x`); any other
    cell is returned as it is. Ids never hold the characters it escapes, so an id comes back exactly."""
    return cell[1:] if cell[:1] == "'" and cell[1:2] in (*FORMULA_STARTS, "'") else cell


def csv_text(rows: Iterable[Iterable[Any]]) -> str:
    """Rows as CSV text, every text cell through `spreadsheet_text` (numbers are written as they are)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    for row in rows:
        writer.writerow([spreadsheet_text(c) if isinstance(c, str) else c for c in row])
    return buf.getvalue()


def shown(value: float) -> str:
    """A score as a student reads it: at most two decimals, no trailing zeros ("35.9971" -> "36", "0.4706" ->
    "0.47", "2.5" -> "2.5"); grades.csv and the stored results keep full precision."""
    text = f"{round(float(value), 2):.2f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def shown_number(value: float) -> float:
    """A score as a student's platform stores it (Gradescope's results.json): rounded to two decimals."""
    return round(float(value), 2) + 0.0


def full_marks(score: float | None, points: float) -> bool:
    """The one definition of "full marks": a score that reaches the question's points (not the batch's best)."""
    return score is not None and score >= points - 1e-6


class RecordError(ValueError):
    """A stored result that is not one: the message names the field and what it should hold."""


def _finite(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and abs(v) < 1e300 and v == v


_CASE_TYPES = {"id": str, "question": str, "passed": bool, "hidden": bool, "message": str,
               "diagnosis": (str, type(None))}


def record_problem(record: Any, *, derived: bool = False) -> str:
    """Why `record` is not a stored result ("" when it is): the one check of a results/<file>.json, each field
    `SubmissionResult.from_dict` reads with its type. With `derived`, also the fields the TA report reads beside
    them: the total and per-question scores `to_dict` writes, the path and the captured output."""
    if not isinstance(record, dict):
        return f"the stored result is {type(record).__name__}, not an object"
    if not isinstance(record.get("status"), str):
        return "its status is not text"
    if not isinstance(record.get("submission", ""), str):
        return "its submission is not text"
    if derived and not _finite(record.get("total")):
        return "its total is not a number"
    questions = record.get("questions") if derived else {}
    if not isinstance(questions, dict) or not all(isinstance(k, str) and _finite(v) for k, v in questions.items()):
        return "its per-question scores are not numbers"
    for key in ("notes", "student_notes"):
        notes = record.get(key, [])
        if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
            return f"its {key.replace('_', ' ')} are not a list of text"
    for key in ("path", "stdout", "fingerprint") if derived else ("fingerprint",):
        if not isinstance(record.get(key), str | None):
            return f"its {key} is not text"
    cases = record.get("cases") if derived else record.get("cases", [])
    if not isinstance(cases, list):
        return "its cases are not a list"
    for n, c in enumerate(cases):
        if not isinstance(c, dict):
            return f"case {n} is not an object"
        for key, kind in _CASE_TYPES.items():
            if not isinstance(c.get(key), kind):
                return f"case {n} has no proper {key}"
        if not (_finite(c.get("points")) and _finite(c.get("max_points"))):
            return f"case {n} has no proper points"
    return ""


@dataclass
class CaseResult:
    """The verdict on one test case."""

    id: str
    question: str
    points: float
    max_points: float
    passed: bool
    hidden: bool
    message: str = ""
    diagnosis: str | None = None
    received: Any = None  # the probe output of a failed case (plain data), for the TA report
    expected: Any = None  # the reference value a failed case was judged against (plain data), for the TA report
    reason: str = ""  # Reason: why it ended so ("" in results stored before reasons existed)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CaseResult:
        """A case as `asdict` stored it; keys it does not know are ignored, missing optional ones take defaults."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def row_name(question: str, *, hidden: bool) -> str:
    """The name of a question's Gradescope row of visible (or hidden) cases: "q1_center: visible tests"."""
    return f"{question}: {'hidden' if hidden else 'visible'} tests"


def row_question(name: str) -> str:
    """The question a Gradescope row belongs to (from `row_name`, or a case id of a result stored before rows)."""
    return name.split(":")[0].split("/")[0]


def short_name(case_id: str) -> str:
    """A case's name within its question: "q2_pick/answers_valid" -> "answers_valid"."""
    return case_id.split("/", 1)[-1]


def without_ids(text: str, questions: Iterable[str]) -> str:
    """Student-facing text without the grader's case ids: each "<question>/<name>" of `questions` becomes its
    name ("waits for q1_center/small" -> "waits for small"); the TA's copy keeps the ids."""
    names = sorted({q for q in questions if q}, key=len, reverse=True)
    if not names:
        return text
    pattern = re.compile(r"(?<![\w/])(?:" + "|".join(map(re.escape, names)) + r")/([\w.-]+)")
    return pattern.sub(lambda m: m.group(1), text)


def _case_line(case: CaseResult, n: int, revisit: dict[str, str]) -> str:
    """One case's line in its row: a visible case's message (without its id), a hidden case's verdict and, when it
    failed, its cause or the idea to revisit (never its values)."""
    if case.hidden:
        if case.passed:
            return f"hidden case {n}: passed"
        if case.reason in CAUSE_TEXT:  # says its cause, no more than the notes
            return f"hidden case {n}: {CAUSE_TEXT[case.reason]}"
        return f"hidden case {n}: failed; revisit: {revisit.get(case.id)}"
    message = case.message.removeprefix(f"{case.id}: ").removeprefix(f"{case.id} ")
    return f"{short_name(case.id)}: {without_ids(message, [case.question]) or 'passed'}"


@dataclass
class SubmissionResult:
    """Everything the grader concluded about one submission, with its views: the stored record (`to_dict`,
    `from_dict`), the student's Gradescope results.json (`gradescope`), the grades.csv row (`csv_row`) and
    what the TA report asks of it (`failed`, `score`, `diagnoses`)."""

    submission: str
    status: str
    cases: list[CaseResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # for TAs: everything, the sandbox's words included
    student_notes: list[str] = field(default_factory=list)  # written by the grader alone; the student sees them
    fingerprint: str = ""  # the suite's fingerprint when it was judged: the expected values stored belong to it

    def question_scores(self) -> dict[str, float]:
        scores: dict[str, float] = {}
        for c in self.cases:
            scores[c.question] = round(scores.get(c.question, 0.0) + c.points, 4)
        return scores

    @property
    def total(self) -> float:
        return round(sum(c.points for c in self.cases), 4)

    @property
    def ran(self) -> bool:
        """The notebook ran to its end and every case was judged."""
        return self.status == Status.GRADED

    # ------------------------------------------------------------------ the stored record

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"total": self.total, "questions": self.question_scores()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SubmissionResult:
        """The result a record of `to_dict` holds (a stored results/<file>.json); the record's other keys (its
        key, path, stdout, the sandbox's words) are not part of it. Raises RecordError, naming the field, on a
        record that is not one (record_problem)."""
        why = record_problem(data)
        if why:
            raise RecordError(why)
        return cls(data.get("submission", ""), data["status"], [CaseResult.from_dict(c) for c in data.get("cases", [])],
                   list(data.get("notes", [])), list(data.get("student_notes", [])), data.get("fingerprint") or "")

    # ------------------------------------------------------------------ the student's view

    def gradescope(self, *, revisit: dict[str, str]) -> dict[str, Any]:
        """The Gradescope results.json of this submission, the student's view of it (`revisit`: case id -> the
        idea a failed case sends the student back to).

        A question has at most two rows (`row_name`): its visible cases in one, its hidden cases in another, each
        case a line of the row's output, the row's score the sum of its cases' points. Visible cases keep their
        messages (their probes run before any hidden one). A hidden case says only that
        it failed and which idea to revisit: never its inputs, expected or received values; and nothing the
        student's process wrote or raised (notes, stdout) reaches this view. The TA's copy in results/ keeps
        everything.
        """
        rows: dict[tuple[str, bool], list[CaseResult]] = {}
        hidden_failed = {}
        for c in self.cases:
            if c.max_points <= 0:
                continue
            rows.setdefault((c.question, c.hidden), []).append(c)
            if c.hidden and not c.passed and c.reason != Reason.TIME_LIMIT:  # the notes above say which was slow
                hidden_failed[c.question] = likely_cause([x for x in self.cases if x.question == c.question],
                                                         revisit)
        tests, questions = [], {c.question for c in self.cases}
        for (question, hidden), cases in rows.items():
            lines = [without_ids(_case_line(c, n, revisit), questions) for n, c in enumerate(cases, 1)]
            tests.append({"name": row_name(question, hidden=hidden),
                          "score": shown_number(sum(c.points for c in cases)),
                          "max_score": shown_number(sum(c.max_points for c in cases)),
                          "status": "passed" if all(c.passed for c in cases) else "failed",
                          "output": "\n".join(lines), "visibility": "hidden" if hidden else "visible"})
        lines = [f"Status: {self.status}", STUDENT_HELP.get(self.status, ""), *self.student_notes]
        if self.status != Status.UNREADABLE:  # nothing ran: the reading problem says it all
            lines += [f"{q}: a hidden case failed. {why}" for q, why in hidden_failed.items()]
        output = without_ids("\n".join(x for x in lines if x), questions)
        return {"score": shown_number(self.total), "tests": tests, "output": output,
                "stdout_visibility": "hidden", "extra_data": {"status": self.status}}

    # ------------------------------------------------------------------ the gradebook's view

    def csv_row(self, questions: list[str]) -> dict[str, Any]:
        """Its grades.csv cells: the total, a score per question of `questions`, the status and a one-line
        message (the reason first, the cells' own notes after) when it is not "graded", and when a graded one lost
        points: what the student was told first (a syntax error, a time limit), else its first failed case."""
        scores = self.question_scores()
        why_first = [n for n in self.notes if not n.startswith(("cell ", "skipped cells"))] or self.notes
        message = "" if self.status == Status.GRADED else "; ".join(why_first)
        lost = [c for c in self.cases if c.points < c.max_points]
        if not message and lost:
            first = (lost[0].message or lost[0].id).splitlines()[0]
            message = "; ".join(self.student_notes) or f"{len(lost)} of {len(self.cases)} cases lost points: {first}"
        held = [n for n in self.notes if n.startswith("review: ") and "held for TA review" in n]  # after the reason
        slowed = sum(n.endswith(UNCHARGED) for n in self.notes)
        stall = f"the machine slowed {slowed} step(s) past their limits on the clock; nothing was charged" \
            if slowed else ""
        message = "; ".join([m for m in (message, *held, stall) if m])
        return {"total": float(self.total), **{q: float(scores.get(q, 0.0)) for q in questions},
                "status": self.status, "message": " ".join(message.split())[:300]}

    # ------------------------------------------------------------------ the TA report's view

    def failed(self, question: str | None = None) -> list[CaseResult]:
        """The cases that failed (of one question, when named)."""
        return [c for c in self.cases if not c.passed and (question is None or c.question == question)]

    def diagnoses(self, question: str | None = None) -> list[str]:
        """The diagnoses of the failed cases, each once, in case order."""
        return list(dict.fromkeys(c.diagnosis for c in self.failed(question) if c.diagnosis))

    def score(self, question: str) -> float:
        return self.question_scores().get(question, 0.0)
