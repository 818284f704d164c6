"""The report's pages: the class index, one page per student and per written part, built from the stored
results with the Jinja2 templates under templates/ and the static CSS and script under static/."""

from __future__ import annotations

import base64
import hashlib
import shlex
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import quote

import jinja2
import yaml
from markupsafe import Markup

from autograder.authoring.questions import LETTERS, Question, shuffled
from autograder.authoring.suite import Suite
from autograder.config import runnable_command
from autograder.grading.gradebook import Gradebook
from autograder.grading.tables import merged_value
from autograder.model import CaseResult, Status, csv_text, full_marks
from autograder.report.code import code_view, resolve_path
from autograder.report.compare import checkpoint_rows, detail, gate_of
from autograder.report.model import (
    APART,
    INVALID,
    SYNTAX,
    TIMED,
    UNDEFINED,
    UNDIAGNOSED,
    UNFINISHED,
    UNRECOGNISED,
    Cluster,
    Student,
    lesson_title,
    misconception,
    plain_math,
    unusable_record,
)
from autograder.report.text import as_text, clip_text, esc, score_text

HERE = Path(__file__).parent
MESSAGE_CHARS = 4_000
MANUAL_CSV = "manual_scores.csv"  # the written-answer scores a TA fills in, for `merge`
CSS = (HERE / "static" / "report.css").read_text(encoding="utf-8")
# The only script of the report, allowed by its hash in each page's Content-Security-Policy (nothing a student
# wrote can run). It sorts a table.sortable when a header is clicked and filters the rows of the table an
# input.filter names. With scripts off the tables stay complete, in their default order, and the filter box stays
# hidden. Hook for tests and bookmarks: ?sort=<table id>:<column>[:desc] and ?q=<table id>:<text>.
SCRIPT = (HERE / "static" / "report.js").read_text(encoding="utf-8")
SCRIPT_HASH = base64.b64encode(hashlib.sha256(SCRIPT.encode("utf-8")).digest()).decode("ascii")


def _finalize(value: Any) -> Markup:
    """Every value a template prints, escaped as `esc` does (quotes too; lone surrogates become escapes), unless
    it is Markup already: what autoescape would do, with the report's one way of escaping."""
    return value if isinstance(value, Markup) else Markup(esc(value))


@lru_cache(maxsize=1)
def _templates() -> jinja2.Environment:
    """The report's templates; every value put into one is escaped unless it is already Markup."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                             keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True,
                             undefined=jinja2.StrictUndefined, finalize=_finalize)
    env.filters |= {"score": score_text, "clip": clip_text, "quote": quote}
    return env


def render_template(template: str, *, page_title: str, **values: Any) -> str:
    """A whole page from one of templates/ (`page_title`: text)."""
    return _templates().get_template(template).render(
        page_title=as_text(page_title), css=Markup(CSS), script=Markup(SCRIPT), script_hash=SCRIPT_HASH, **values)


def question_code(cells: list[tuple[int, str]], q: Question, why: str = "") -> str:
    """The student's code for question `q` as HTML (code.code_view says what is shown)."""
    return _templates().get_template("code.html.j2").render(v=code_view(cells, q, why), q=q)


def blocks_html(blocks: list[dict[str, Any]]) -> Markup:
    """compare.detail's blocks as HTML."""
    return Markup(_templates().get_template("compare.html.j2").render(blocks=blocks))


def checkpoint_table(received: Any, *, rel_tol: float) -> str:
    """The checkpoint's values per context as HTML ("" when the output holds none): compare.checkpoint_rows."""
    return str(blocks_html(checkpoint_rows(received, rel_tol=rel_tol)))


@dataclass(frozen=True)
class RenderContext:
    """What every page of one report is built from."""

    suite: Suite
    questions: list[Question]
    known: dict[str, tuple[str, str]]
    grades: Path
    merged: dict[str, dict[str, float]] = field(default_factory=dict)  # scores brought in by the merge verb
    regrade: str = ""  # the commands that grade the batch again and rewrite this report

    @property
    def manual(self) -> list[Question]:
        return [q for q in self.suite.questions if q.graded and q.manual]

    @property
    def title(self) -> str:
        return lesson_title(self.suite)

    @property
    def parts(self) -> list[str]:
        return [p.part for q in self.manual for p in q.written]


_KIND = {UNRECOGNISED: "unk", UNFINISHED: "fin", SYNTAX: "unk", TIMED: "unk", UNDEFINED: "fin"}
_KIND |= dict.fromkeys(APART, "fin")
TOP_MISTAKES = 3  # the mistakes per question on the index's first screen (the rest: its section)
NAMES_PER_MISTAKE = 5
_APART_LABEL = {UNFINISHED: "unfinished", UNRECOGNISED: "unrecognised", SYNTAX: SYNTAX, TIMED: TIMED,
                UNDEFINED: UNDEFINED} | dict.fromkeys(APART, "not uploaded")
# What each group without a catalogued mistake means, for the TA (the cases' typed reasons put a student there).
_UNDIAGNOSED_TEXT = {
    SYNTAX: "a cell this question needs has a syntax error: nothing in it ran (each student's page names the cell "
            "and line).",
    TIMED: "the question's checks ran out of their time share: the cases not run earn nothing (each student's "
           "page says which check was slow).",
    UNDEFINED: "a function or class this question grades was never defined (its cell not run, or misnamed).",
}


def _diag_text(ctx: RenderContext, d: str, qid: str) -> str:
    if d == UNFINISHED:
        return ("not attempted or left unfinished: a stub of this question still holds `...` (or returns None), "
                "so there is nothing to diagnose.")
    if d in _UNDIAGNOSED_TEXT:
        return _UNDIAGNOSED_TEXT[d]
    if d == UNRECOGNISED:
        return ("no catalogued mistake matches these outputs and nothing stopped the checks; read each student's "
                "message and code (an exception, or a new kind of mistake).")
    home, text = ctx.known.get(d, (qid, "(no description in the catalogue)"))
    return text if home == qid else f"{text} (a {home} mistake that carries over into {qid})"


def _carried(ctx: RenderContext, d: str, qid: str) -> str:
    home = ctx.known.get(d, (qid, ""))[0]
    return "" if d in UNDIAGNOSED or home == qid else f" ← {home.split('_')[0]}"


def _example(cluster: Cluster) -> tuple[Student, CaseResult] | None:
    for prefer_public in (True, False):
        for s in cluster.students:
            for c in s.failed(cluster.question):
                if (cluster.diagnosis in UNDIAGNOSED or c.diagnosis == cluster.diagnosis) and (
                        not prefer_public or not c.hidden):
                    return s, c
    return None


def column_names(questions: list[Question]) -> dict[str, str]:
    """A short, distinct column heading per question: the part of its id before the first underscore (q5 for
    q5_name), or its whole id where two questions share that part."""
    short = {q.id: q.id.split("_")[0] for q in questions}
    taken = list(short.values())
    return {qid: name if taken.count(name) == 1 else qid for qid, name in short.items()}


def _choices(ctx: RenderContext, q: Question, students: list[Student]) -> list[dict[str, Any]]:
    """Per multiple-choice item: how many students chose each option, the right one marked with its reason and
    each wrong one with its misconception (from the question's source), and who chose it."""
    ran = [s for s in students if s.ran]
    out = []
    for c in q.choices:
        shown, right = shuffled(c)
        picks = {s.id: s.pick(q, c) for s in ran}
        rows = []
        for letter, text in [*zip(LETTERS, shown), (INVALID, "no valid answer (not a letter A–D, or never judged)")]:
            who = [s for s in ran if picks[s.id] == letter or (letter == INVALID and picks[s.id] in ("", INVALID))]
            meaning = (ctx.known.get(f"{c.var}:{letter}", (q.id, ""))[1] if letter == INVALID
                       else "" if letter == right else misconception(c, text))
            rows.append({"letter": letter, "text": plain_math(text), "who": who, "right": letter == right,
                         "meaning": meaning, "frac": len(who) / len(ran) if ran else 0.0})
        out.append({"choice": c, "rows": rows})
    return out


def _question_row(ctx: RenderContext, q: Question, students: list[Student], groups: list[Cluster]) -> dict[str, Any]:
    """One row of the first screen's table: the mean, the share at full marks, the question's most common
    mistakes with their students, and apart from them who left it unfinished, whose failures match no
    catalogued mistake, and who handed in nothing to judge (APART: a checkpoint never uploaded)."""
    n = len(students)
    scores = [s.score(q.id) for s in students]
    mean = sum(scores) / n if n else 0.0
    full = sum(full_marks(v, q.points) for v in scores)
    mistakes = [c for c in groups if c.diagnosis not in UNDIAGNOSED and c.diagnosis not in APART]
    sizes = [len(c.students) for c in mistakes]
    lead = sizes[0] if sizes and sizes[0] >= 2 and (len(sizes) == 1 or sizes[1] < sizes[0]) else 0
    chips = [{"cluster": c, "label": c.diagnosis + _carried(ctx, c.diagnosis, q.id),
              "cls": "lead" if len(c.students) == lead else "diag"} for c in mistakes[:TOP_MISTAKES]]
    apart = [{"cluster": c, "label": _APART_LABEL.get(c.diagnosis, c.diagnosis), "cls": _KIND[c.diagnosis]}
             for c in groups if c.diagnosis in UNDIAGNOSED or c.diagnosis in APART]
    return {"q": q, "mean": mean, "frac": mean / q.points if q.points else 1.0, "full": full,
            "full_frac": full / n if n else 0, "chips": chips, "more": max(0, len(mistakes) - TOP_MISTAKES),
            "apart": apart, "apart_n": sum(len(c["cluster"].students) for c in apart), "grouped": sum(sizes),
            "names": NAMES_PER_MISTAKE}


def _section(ctx: RenderContext, q: Question, students: list[Student], groups: list[Cluster]) -> dict[str, Any]:
    """A question's failures: its option tables, and one card per group (wrong picks are in the tables)."""
    cards = [{"cluster": c, "kind": f"cluster {_KIND[c.diagnosis]}" if c.diagnosis in _KIND else "cluster",
              "label": c.diagnosis + _carried(ctx, c.diagnosis, q.id), "desc": _diag_text(ctx, c.diagnosis, q.id),
              "example": _example(c)}
             for c in groups if not (q.choices and c.diagnosis in ctx.known)]
    return {"q": q, "lost": len({s.id for c in groups for s in c.students}), "cards": cards,
            "choices": _choices(ctx, q, students) if q.choices else []}


def held_for_review(ctx: RenderContext, s: Student) -> dict[str, str] | None:
    """How a TA clears a student's held review flags ({"line": the exact line for the decisions file, "file": that
    file, "command": the rerun}), or None when nothing is held."""
    review = s.record.get("review")
    if not isinstance(review, dict) or review.get("cleared") or not review.get("held"):
        return None
    digest = review.get("digest")
    if not isinstance(digest, str):
        return None
    line = yaml.safe_dump({s.id: digest}, allow_unicode=True, width=10_000).strip()
    return {"line": line, "file": str(Gradebook(ctx.grades).review_decisions_path), "command": ctx.regrade,
            "held": str(review.get("held"))}


def index_page(ctx: RenderContext, students: list[Student], groups: dict[str, list[Cluster]]) -> str:
    """The class page: every student's scores, the questions, the failures by diagnosis, the written answers and
    the submissions that did not run."""
    counts: dict[str, int] = {}
    for s in students:
        counts[s.status] = counts.get(s.status, 0) + 1
    manual = ctx.manual
    names = column_names([*ctx.questions, *manual])
    roster = [{"s": s, "scores": [(s.score(q.id), full_marks(s.score(q.id), q.points),
                                   [_APART_LABEL[d] for d in s.labels(q) if d in APART]) for q in ctx.questions],
               "manual": [merged_value(q, ctx.merged.get(s.id, {})) for q in manual],
               "diagnoses": " ".join(d for d in s.diagnosis_ids(ctx.questions) if d not in APART)} for s in students]
    roster_head = [("student", "student", ""), ("status", "status", ""), ("total", "total", "num"),
                   *((q.id, names[q.id], "num") for q in ctx.questions),
                   *((q.id, f"{names[q.id]} (by hand)", "num") for q in manual), ("diagnoses", "diagnoses", "")]
    return render_template(
        "index.html.j2", page_title=f"{ctx.title} failure report", title=ctx.title, n=len(students),
        counts=sorted(counts.items(), key=lambda kv: (kv[0] != Status.GRADED, -kv[1])), graded=Status.GRADED,
        mean_total=sum(s.total for s in students) / len(students) if students else 0.0,
        auto=ctx.suite.auto_points, manual=manual, roster=roster, roster_head=roster_head,
        columns=", ".join(f"{names[q.id]} = {q.id}" for q in [*ctx.questions, *manual]),
        regrade_command=ctx.regrade, stale=[s for s in students if _other_suite(ctx, s)],
        held=[(s, h) for s in students if (h := held_for_review(ctx, s))],
        fingerprint=ctx.suite.fingerprint,
        questions_head=[("question", "question", ""), ("mean", "mean score", "num"), ("full", "full marks", "num"),
                        ("groups", "most common mistakes, and who (largest first)", ""),
                        ("apart", "no diagnosis", "")],
        question_rows=[_question_row(ctx, q, students, groups[q.id]) for q in ctx.questions],
        ran=sum(s.ran for s in students),
        sections=[_section(ctx, q, students, groups[q.id]) for q in ctx.questions],
        written=[(p, sum(bool(s.answers.get(p.part)) for s in students)) for q in manual for p in q.written],
        manual_csv=MANUAL_CSV,
        merge_command=f"{runnable_command()} merge {shlex.quote(str(ctx.grades))} {MANUAL_CSV}",
        not_run=sorted((s for s in students if not s.ran), key=lambda s: (s.status, s.id)),
        message_chars=MESSAGE_CHARS)


def written_page(ctx: RenderContext, q: Question, part_index: int, students: list[Student]) -> str:
    """One written part: the prompt, the model answer, and every student's answer (escaped) beside it."""
    part = q.written[part_index]
    rows = [{"s": s, "answer": s.answers.get(part.part), "words": len((s.answers.get(part.part) or "").split()),
             "score": ctx.merged.get(s.id, {}).get(part.part)} for s in students]
    return render_template("written.html.j2", page_title=f"{part.part} · {ctx.title}", q=q, part=part,
                   per_part=q.points / len(q.written), rows=rows,
                   answered=sum(bool(s.answers.get(part.part)) for s in students), manual_csv=MANUAL_CSV,
                   command=runnable_command(), message_chars=MESSAGE_CHARS)


def manual_csv(ctx: RenderContext, students: list[Student]) -> str:
    """The sheet a TA fills in: an id, one empty score column per written part, a comment, then the answers."""
    parts = ctx.parts
    rows = [["id", *parts, "comment", *(f"{p} answer" for p in parts)]]
    for s in students:
        have = ctx.merged.get(s.id, {})
        rows.append([as_text(s.id), *(score_text(have[p]) if p in have else "" for p in parts), "",
                     *(as_text(s.answers.get(p) or "") for p in parts)])
    return csv_text(rows)


def _other_suite(ctx: RenderContext, s: Student) -> str:
    """What the page says when the student's result was judged against another version of the suite ("" when
    it was judged against this one, or has no cases)."""
    if not s.result.cases or s.result.fingerprint == ctx.suite.fingerprint:
        return ""
    when = (f"suite {s.result.fingerprint}" if s.result.fingerprint
            else "a version of the suite that stored no fingerprint")
    return (f"Judged against another version of the tests ({when}; the current one is {ctx.suite.fingerprint}): "
            "the expected values shown are the ones stored with this result, the ones it was judged against. "
            "Grade the batch again to judge it against the current tests.")


def _case(ctx: RenderContext, s: Student, c: CaseResult) -> dict[str, Any]:
    """One failed case of a student: its badges, whether a gate kept it from being checked, the message to show
    and its expected versus received."""
    case = next((x for x in ctx.suite.cases if x.id == c.id), None)
    blocked, alone = gate_of(ctx.suite, s.result, c)
    out: dict[str, Any] = {"case": c, "blocked": blocked, "gated": bool(blocked and alone is not None and alone.passed),
                           "alone": bool(blocked and alone is not None), "message": c.message, "detail": ""}
    out["diagnosis"] = c.diagnosis + _carried(ctx, c.diagnosis, c.question) if c.diagnosis else ""
    if out["gated"]:
        return out
    if out["alone"]:  # the stored message is the gate's: show what its own check says
        out["message"] = alone.message
    tol, rules = ctx.suite.config.tolerances, ctx.suite.milestone_rules
    out["detail"] = blocks_html(detail(case, c.expected, c.received, atol=case.atol if case else tol.atol,
                                       rtol=case.rtol if case else tol.rtol, rel_tol=getattr(rules, "rel_tol", 0.0),
                                       reason=c.reason))
    return out


def _file_link(ctx: RenderContext, s: Student) -> tuple[str, str]:
    """The student's submission file (notebook, zip or folder) as the grader read it, and its file: URL ("" when
    it is not found)."""
    path = s.record.get("path")
    if not isinstance(path, str) or not path:
        return "", ""
    found = resolve_path(path, ctx.grades)
    try:
        return path, found.resolve().as_uri() if found is not None else ""
    except (ValueError, OSError):
        return path, ""


def student_page(ctx: RenderContext, s: Student) -> str:
    """One student: scores, each failed case (message, expected versus received, the code graded), the written
    answers and the notebook's output."""
    path, href = _file_link(ctx, s)
    scores = [{"q": q, "lost": len(s.failed(q.id)), "score": s.score(q.id), "labels": " ".join(s.labels(q))}
              for q in ctx.questions]
    sections = [{"q": q, "score": s.score(q.id), "cases": [_case(ctx, s, c) for c in s.failed(q.id)],
                 "picks": [ctx.known.get(d, (q.id, d))[1] for d in s.wrong_picks(q)],
                 "code": Markup(question_code(s.cells, q, s.code_problem))}
                for q in ctx.questions if s.failed(q.id)]
    return render_template("student.html.j2", page_title=f"{s.id} · {ctx.title}", s=s, auto=ctx.suite.auto_points,
                   path=path, href=href, regrade_command=ctx.regrade, stale=_other_suite(ctx, s), scores=scores,
                   held=held_for_review(ctx, s),
                   manual_scores=[(q, merged_value(q, ctx.merged.get(s.id, {}))) for q in ctx.manual],
                   sections=sections, message_chars=MESSAGE_CHARS,
                   written=[(p, s.answers.get(p.part), ctx.merged.get(s.id, {}).get(p.part))
                            for q in ctx.manual for p in q.written],
                   stdout=str(s.record.get("stdout") or ""))


def report_csv(students: list[Student], questions: list[Question]) -> str:
    """One row per student for a gradebook: id, status, total, per-question scores and the diagnosis ids."""
    rows = [["id", "status", "total", *(q.id for q in questions), "diagnoses"]]
    rows += [[as_text(s.id), as_text(s.status), score_text(s.total), *(score_text(s.score(q.id)) for q in questions),
              as_text(" ".join(s.diagnosis_ids(questions)))] for s in students]
    return csv_text(rows)


def student_page_or_note(ctx: RenderContext, s: Student) -> str:
    """The student's page; when their stored result breaks it, a page saying so, and the student is marked
    "unusable result" so the index lists them with the reason."""
    try:
        return student_page(ctx, s)
    except Exception as exc:  # noqa: BLE001 - one record must never stop the class report
        why = f"the report could not show this result ({type(exc).__name__}: {clip_text(as_text(exc), 300)})"
        s.use(unusable_record(s.id, why) | {"path": s.record.get("path")})
        s.cells = []
        return student_page(ctx, s)


def _fallback(title: str, exc: Exception, **values: Any) -> str:
    return render_template("fallback.html.j2", page_title=title,
                           error=f"{type(exc).__name__}: {clip_text(as_text(exc), 300)}",
                           **{"heading": "", "students": [], **values})


def failed_page(title: str, exc: Exception, *, what: str, where: str) -> str:
    """A top-level page of the report that could not be built: what, why, and where to look instead."""
    return _fallback(title, exc, heading=title, what=what, where=where)


def written_page_or_note(ctx: RenderContext, q: Question, n: int, students: list[Student]) -> str:
    try:
        return written_page(ctx, q, n, students)
    except Exception as exc:  # noqa: BLE001 - the rest of the report is written all the same
        return _fallback(q.written[n].part, exc, what="This page", where="the answers are on the students' pages.")


def plain_index(students: list[Student], exc: Exception, *, title: str) -> str:
    return _fallback(f"{title} failure report", exc, heading=f"{title} · failure report", what="The summary",
                     where="the students' pages are below.", students=students)
