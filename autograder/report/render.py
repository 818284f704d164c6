"""The report's pages: the class index, one page per student and per written part, built from the stored
results with the Jinja2 templates under templates/ and the static CSS and script under static/."""

from __future__ import annotations

import base64
import hashlib
import shlex
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from urllib.parse import quote

import jinja2
from markupsafe import Markup

from autograder.batch import merged_value
from autograder.config import runnable_command
from autograder.content import LETTERS, Question, shuffled
from autograder.report.code import _resolve, question_code
from autograder.report.compare import _detail, gate_of
from autograder.report.model import (
    INVALID,
    UNDIAGNOSED,
    UNFINISHED,
    UNRECOGNISED,
    Cluster,
    Student,
    _unusable,
    lesson_title,
    misconception,
    plain_math,
)
from autograder.report.text import _clip, _score, _text, esc
from autograder.results import CaseResult, Status, csv_text, full_marks
from autograder.suite import Suite

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


@lru_cache(maxsize=1)
def _templates() -> jinja2.Environment:
    """The report's templates; every value put into one is escaped unless it is already Markup."""
    return jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                              keep_trailing_newline=True, undefined=jinja2.StrictUndefined)


def _page(title: str, body: str) -> str:
    """A whole page: `body` is HTML built from escaped parts; `title` is text."""
    return _templates().get_template("page.html.j2").render(
        title=_text(title), body=Markup(body), css=Markup(CSS), script=Markup(SCRIPT), script_hash=SCRIPT_HASH)


def _link(s: Student, prefix: str = "students/") -> str:
    return f'<a href="{esc(prefix + quote(s.page))}">{esc(s.id)}</a>'


def _bar(frac: float) -> str:
    cls = "" if frac >= 0.8 else "mid" if frac >= 0.5 else "low"
    return f'<span class="bar"><i class="{cls}" style="width:{max(0.0, min(frac, 1.0)) * 100:.0f}%"></i></span>'


@dataclass(frozen=True)
class _Ctx:
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


_KIND = {UNRECOGNISED: "unk", UNFINISHED: "fin"}


def _diag_text(ctx: _Ctx, d: str, qid: str) -> str:
    if d == UNFINISHED:
        return ("not attempted or left unfinished: a stub of this question still holds `...` (or returns None), "
                "so there is nothing to diagnose.")
    if d == UNRECOGNISED:
        return ("no catalogued mistake matches these outputs; read each student's message and code "
                "(a stub left empty, an exception, or a new kind of mistake).")
    home, text = ctx.known.get(d, (qid, "(no description in the catalogue)"))
    return text if home == qid else f"{text} (a {home} mistake that carries over into {qid})"


def _carried(ctx: _Ctx, d: str, qid: str) -> str:
    home = ctx.known.get(d, (qid, ""))[0]
    return "" if d in UNDIAGNOSED or home == qid else f" ← {home.split('_')[0]}"


def _names(students: list[Student], limit: int = 8, prefix: str = "students/") -> str:
    more = f' <span class="note">+{len(students) - limit} more</span>' if len(students) > limit else ""
    return ", ".join(_link(s, prefix) for s in students[:limit]) + more


def _example(cluster: Cluster) -> tuple[Student, CaseResult] | None:
    for prefer_public in (True, False):
        for s in cluster.students:
            for c in s.failed(cluster.question):
                if (cluster.diagnosis in UNDIAGNOSED or c.diagnosis == cluster.diagnosis) and (
                        not prefer_public or not c.hidden):
                    return s, c
    return None


def _sortable(tid: str, head: list[tuple[str, str, str]], rows: list[str], *, search: str = "",
              cls: str = "", wrap: str = "") -> str:
    """A table that the page's script sorts by any column (headers: data-col, label, css class) and, with
    `search`, filters through a box that stays hidden while scripts are off (the rows then stay as written);
    with `wrap`, the table (not its box) sits in a div of that class."""
    box = (f'<input class="filter" type="search" hidden data-table="{esc(tid)}" placeholder="{esc(search)}" '
           f'aria-label="{esc(search)}">' if search else "")
    ths = "".join(f'<th data-col="{esc(col)}"{f" class={c}" if c else ""}>{esc(label)}</th>' for col, label, c in head)
    table = (f'<table class="sortable {cls}" id="{esc(tid)}"><thead><tr>{ths}</tr></thead>'
             f'<tbody>{"".join(rows)}</tbody></table>')
    return box + (f'<div class="{esc(wrap)}">{table}</div>' if wrap else table)


def column_names(questions: list[Question]) -> dict[str, str]:
    """A short, distinct column heading per question: the part of its id before the first underscore (q5 for
    q5_name), or its whole id where two questions share that part."""
    short = {q.id: q.id.split("_")[0] for q in questions}
    taken = list(short.values())
    return {qid: name if taken.count(name) == 1 else qid for qid, name in short.items()}


def _regrade(ctx: _Ctx) -> str:
    return (f'<div class="note" id="regrade">To regrade (only submissions that changed are graded again; add '
            f"--force after a grader change), then rewrite this report:</div><pre>{esc(ctx.regrade)}</pre>"
            ) if ctx.regrade else ""


def _choice_tables(ctx: _Ctx, q: Question, students: list[Student]) -> str:
    """Per multiple-choice item: how many students chose each option, the right one marked with its reason and
    each wrong one with its misconception (from the question's source), and who chose it."""
    ran = [s for s in students if s.ran]
    out = []
    for c in q.choices:
        shown, right = shuffled(c)
        picks = {s.id: s.pick(q, c) for s in ran}
        rows = []
        for letter, text in [*zip(LETTERS, shown), (INVALID, "no valid answer (not a letter A–D, or never "
                                                                     "judged)")]:
            who = [s for s in ran if picks[s.id] == letter or (letter == INVALID and picks[s.id] in ("", INVALID))]
            if letter == right:
                meaning = f'<td class="right">right: {esc(c.why)}</td>'
            elif letter == INVALID:
                meaning = f"<td>{esc(ctx.known.get(f'{c.var}:{letter}', (q.id, ''))[1])}</td>"
            else:
                meaning = f"<td>{esc(misconception(c, text))}</td>"
            frac = len(who) / len(ran) if ran else 0.0
            rows.append(f'<tr id="{esc(q.id)}--{esc(c.var)}:{esc(letter)}"><td><b>{esc(letter)}</b></td>'
                        f"<td>{esc(plain_math(text))}</td><td class=\"num\">{len(who)}{_bar(frac)}</td>{meaning}"
                        f'<td class="who">{_names(who, 12) if letter != right else ""}</td></tr>')
        out.append(f'<h3>{esc(c.var)} <span class="meta">{esc(c.prompt)}</span></h3>'
                   f'<table class="opt qt"><tr><th>option</th><th>text</th><th class="num">chosen by</th>'
                   f"<th>what it shows</th><th>who</th></tr>{''.join(rows)}</table>")
    return "".join(out)


def _student_file(ctx: _Ctx, s: Student) -> str:
    """A link to the student's submission file (notebook, zip or folder) as the grader read it."""
    path = s.record.get("path")
    if not isinstance(path, str) or not path:
        return ""
    found = _resolve(path, ctx.grades)
    try:
        href = found.resolve().as_uri() if found is not None else ""
    except (ValueError, OSError):
        href = ""
    label = f"<code>{esc(path)}</code>"
    return f' · file <a href="{esc(href)}">{label}</a>' if href else f" · file {label} (not found)"


def _manual_cells(ctx: _Ctx, s: Student) -> str:
    return "".join(f'<td class="num">{"" if v is None else _score(v)}</td>'
                   for v in (merged_value(q, ctx.merged.get(s.id, {})) for q in ctx.manual))


def everyone_table(ctx: _Ctx, students: list[Student]) -> str:
    """Every student's scores and diagnoses, with its search box: the first thing on the index."""
    manual = ctx.manual
    names = column_names([*ctx.questions, *manual])
    head = [("student", "student", ""), ("status", "status", ""), ("total", "total", "num"),
            *((q.id, names[q.id], "num") for q in ctx.questions),
            *((q.id, f"{names[q.id]} (by hand)", "num") for q in manual), ("diagnoses", "diagnoses", "")]
    body = []
    for s in students:
        cells = "".join(f'<td class="num{"" if full_marks(s.score(q.id), q.points) else " lost"}">'
                        f"{_score(s.score(q.id))}</td>" for q in ctx.questions)
        st = f'<span class="status{"" if s.ran else " bad"}">{esc(s.status)}</span>'
        body.append(f'<tr><td>{_link(s)}</td><td>{st}</td><td class="num">{_score(s.total)}'
                    f'</td>{cells}{_manual_cells(ctx, s)}<td>{esc(" ".join(s.diagnosis_ids(ctx.questions)))}</td></tr>')
    return ('<h2 id="students-list">All students</h2>'
            + _sortable("students", head, body, search="search students, statuses, diagnoses", cls="scores",
                        wrap="roster")
            + '<p class="note">report.csv holds this table for a gradebook. Columns: '
            + esc(", ".join(f"{names[q.id]} = {q.id}" for q in [*ctx.questions, *manual])) + ".</p>")


def index_page(ctx: _Ctx, students: list[Student], groups: dict[str, list[Cluster]]) -> str:
    n = len(students)
    ran = [s for s in students if s.ran]
    counts: dict[str, int] = {}
    for s in students:
        counts[s.status] = counts.get(s.status, 0) + 1
    auto = ctx.suite.auto_points
    mean_total = sum(s.total for s in students) / n if n else 0.0
    manual = ctx.manual
    status_line = " · ".join(f"{v} {esc(k)}" if k == Status.GRADED else f'<a href="#statuses">{v} {esc(k)}</a>'
                             for k, v in sorted(counts.items(), key=lambda kv: (kv[0] != Status.GRADED, -kv[1])))
    out = [f"<h1>{esc(ctx.title)} · failure report</h1>",
           f'<p class="sub">{n} submission{"s" if n != 1 else ""} ({status_line}) · mean total '
           f"{_score(mean_total)} / {_score(auto)} auto-graded points"
           + (f' · {", ".join(f"<a href=#written>{esc(q.id)}</a>" for q in manual)} graded by hand' if manual else "")
           + '<br><span class="note">For staff only: shows hidden test cases and reference values.</span></p>'
           + '<p class="note">Jump to: <a href="#students-list">students</a> · <a href="#questions-list">questions</a>'
           + ' · <a href="#diagnoses">failures by diagnosis</a>' + (' · <a href="#written">written answers</a>'
                                                                   if manual else "")
           + ' · <a href="#not-run">submissions that did not run</a> · <a href="#regrade">regrade</a></p>']
    out += [everyone_table(ctx, students), _regrade(ctx)]
    stale = [s for s in students if _other_suite(ctx, s)]
    if stale:
        many = len(stale) != 1
        out.append(f'<p class="note stale">{len(stale)} result{"s were" if many else " was"} judged against another '
                   f"version of the tests than the current one ({esc(ctx.suite.fingerprint)}): {_names(stale)}. "
                   f"{'Their' if many else 'Its'} page shows the expected values stored with the result; grade the "
                   "batch again to judge against the current tests.</p>")

    # per-question pass rates, with the failure clusters of each at a glance
    rows = []
    for q in ctx.questions:
        scores = [s.score(q.id) for s in students]
        mean = sum(scores) / n if n else 0.0
        full = sum(full_marks(v, q.points) for v in scores)
        lines = []
        sizes = sorted((len(c.students) for c in groups[q.id] if c.diagnosis not in UNDIAGNOSED), reverse=True)
        lead = sizes[0] if sizes and sizes[0] >= 2 and (len(sizes) == 1 or sizes[1] < sizes[0]) else 0
        for c in groups[q.id][:5]:
            cls = _KIND.get(c.diagnosis) or ("lead" if len(c.students) == lead else "diag")
            lines.append(f'<div class="cl"><a class="chip {cls}" href="#{esc(c.anchor)}"><b>{len(c.students)}</b>'
                         f"{esc(c.diagnosis + _carried(ctx, c.diagnosis, q.id))}</a> "
                         f'<span class="who">{_names(c.students, 6)}</span></div>')
        if len(groups[q.id]) > 5:
            lines.append(f'<div class="note"><a href="#{esc(q.id)}">{len(groups[q.id]) - 5} more groups</a></div>')
        frac = mean / q.points if q.points else 1.0
        rows.append(f'<tr><td data-v="{esc(q.id)}"><a href="#{esc(q.id)}"><b>{esc(q.id)}</b></a>'
                    f'<div class="qtitle">{esc(q.title)}</div></td>'
                    f'<td class="num" data-v="{frac:.6f}">{_score(mean)} / {_score(q.points)}{_bar(frac)}</td>'
                    f'<td class="num" data-v="{full / n if n else 0:.6f}">{100 * full / n if n else 0:.0f}% '
                    f'<span class="note">({full}/{n})</span></td>'
                    f"<td data-v=\"{sum(len(c.students) for c in groups[q.id])}\">"
                    f"{''.join(lines) or '<span class=note>none</span>'}</td></tr>")
    out.append('<h2 id="questions-list">Questions</h2><p class="note">Full marks: the question\'s points reached. '
               "Click a heading to sort.</p>"
               + _sortable("questions", [("question", "question", ""), ("mean", "mean score", "num"),
                                         ("full", "full marks", "num"),
                                         ("groups", "who lost points, grouped by diagnosis (largest first)", "")],
                           rows, cls="qt"))

    # clusters, per question
    out.append(f'<h2 id="diagnoses">Failures by diagnosis</h2><p class="note">Students of the {len(ran)} '
               "submissions that ran normally, grouped by the catalogued mistake their outputs match, per "
               "question.</p>")
    for q in ctx.questions:
        cl = groups[q.id]
        lost = {s.id for c in cl for s in c.students}
        head = (f'<h3 id="{esc(q.id)}">{esc(q.id)} <span class="meta">{esc(q.title)} · '
                f"{len(lost)} of {len(ran)} lost points</span></h3>")
        options = _choice_tables(ctx, q, students) if q.choices else ""
        cl = [c for c in cl if not (q.choices and c.diagnosis in ctx.known)]  # picks: in the option tables
        if not cl:
            note = "" if lost else '<p class="note">Every submission that ran earned full marks here.</p>'
            out.append(f'<section class="qsec">{head}{options}{note}</section>')
            continue
        cards = []
        for c in cl:
            ex = _example(c)
            example = ""
            if ex:
                s, case = ex
                example = (f'<div class="note">example: {esc(s.id)}, {esc(case.id)}</div>'
                           f'<pre class="ex">{esc(_clip(case.message, MESSAGE_CHARS))}</pre>')
            kind = f"cluster {_KIND[c.diagnosis]}" if c.diagnosis in _KIND else "cluster"
            cards.append(f'<div class="{kind}" id="{esc(c.anchor)}"><div class="head">'
                         f'<span class="count">{len(c.students)}</span>'
                         f"{esc(c.diagnosis + _carried(ctx, c.diagnosis, q.id))}</div>"
                         f'<p class="desc">{esc(_diag_text(ctx, c.diagnosis, q.id))}</p>'
                         f'<div class="who">students: {_names(c.students, 40)}</div>{example}</div>')
        out.append(f'<section class="qsec">{head}{options}{"".join(cards)}</section>')

    # written answers
    if manual:
        items = []
        for q in manual:
            for part in q.written:
                answered = sum(bool(s.answers.get(part.part)) for s in students)
                items.append(f'<li><a href="written/{esc(quote(part.part))}.html">{esc(part.part)}</a> · '
                             f"{answered} of {n} answered · {esc(_clip(part.prompt, 160))}</li>")
        out.append('<h2 id="written">Written answers (graded by hand)</h2><ul class="notes">' + "".join(items)
                   + f'</ul><p class="note">Each page shows every student\'s answer beside the model answer. Copy '
                   f'<a href="{MANUAL_CSV}">{MANUAL_CSV}</a> out of this folder (the next report replaces it), fill in '
                   f"the scores, then merge them into grades.csv and summary.json:</p>"
                   f"<pre>{esc(f'{runnable_command()} merge {shlex.quote(str(ctx.grades))} {MANUAL_CSV}')}</pre>"
                   '<p class="note">On Gradescope these answers are graded on Gradescope\'s own manual-grading page, '
                   "and on nbgrader in Formgrader; merge such scores here only to see them in grades.csv.</p>")

    # statuses
    odd = [s for s in students if not s.ran]
    out.append('<h2 id="not-run">Submissions that did not run normally</h2>')
    if odd:
        body = [f'<tr><td><span class="status bad">{esc(s.status)}</span></td><td>{_link(s)}</td>'
                f'<td>{esc(_clip("; ".join(s.result.notes), 400))}</td></tr>'
                for s in sorted(odd, key=lambda s: (s.status, s.id))]
        out.append(_sortable("statuses", [("status", "status", ""), ("student", "student", ""),
                                          ("notes", "notes", "")], body))
    else:
        out.append('<p class="note">None: every submission ran to the end.</p>')

    return _page(f"{ctx.title} failure report", "\n".join(out))


def written_page(ctx: _Ctx, q: Question, part_index: int, students: list[Student]) -> str:
    """One written part: the prompt, the model answer, and every student's answer (escaped) beside it."""
    part = q.written[part_index]
    per_part = q.points / len(q.written)
    rows = []
    for s in students:
        answer = s.answers.get(part.part)
        if answer is None:
            shown = f'<span class="note">no answer cell{": " + esc(s.code_problem) if s.code_problem else ""}</span>'
        elif not answer:
            shown = '<span class="note">left as the template had it</span>'
        else:
            shown = esc(_clip(answer, MESSAGE_CHARS))
        score = ctx.merged.get(s.id, {}).get(part.part)
        rows.append(f'<tr><td>{_link(s, "../students/")}</td><td class="num">{len((answer or "").split())}</td>'
                    f'<td class="num">{"" if score is None else _score(score)}</td>'
                    f'<td class="answer">{shown}</td></tr>')
    answered = sum(bool(s.answers.get(part.part)) for s in students)
    body = ['<p><a href="../index.html#written">← class report</a></p>',
            f"<h1>{esc(part.part)} <span class=\"note\">{esc(q.id)} · {_score(per_part)} points · {answered} of "
            f"{len(students)} answered</span></h1>",
            f'<h2>Prompt</h2><div class="answer">{esc(part.prompt)}</div>',
            f'<h2>Model answer</h2><div class="answer model">{esc(part.answer)}</div>',
            "<h2>Answers</h2>",
            _sortable("answers", [("student", "student", ""), ("words", "words", "num"),
                                  ("score", "score", "num"), ("answer", "answer", "")],
                      rows, search="search names and answers", cls="qt"),
            f'<p class="note">Scores: the column {esc(part.part)} of <a href="../{MANUAL_CSV}">{MANUAL_CSV}</a> '
            f"(0 to {_score(per_part)}), merged with <code>{esc(runnable_command())} merge</code>.</p>"]
    return _page(f"{part.part} · {ctx.title}", "\n".join(body))


def manual_csv(ctx: _Ctx, students: list[Student]) -> str:
    """The sheet a TA fills in: an id, one empty score column per written part, a comment, then the answers."""
    parts = ctx.parts
    rows = [["id", *parts, "comment", *(f"{p} answer" for p in parts)]]
    for s in students:
        have = ctx.merged.get(s.id, {})
        rows.append([_text(s.id), *(_score(have[p]) if p in have else "" for p in parts), "",
                     *(_text(s.answers.get(p) or "") for p in parts)])
    return csv_text(rows)


def _other_suite(ctx: _Ctx, s: Student) -> str:
    """What the page says when the student's result was judged against another version of the suite ("" when
    it was judged against this one, or has no cases)."""
    if not s.result.cases or s.result.fingerprint == ctx.suite.fingerprint:
        return ""
    when = (f"suite {s.result.fingerprint}" if s.result.fingerprint
            else "a version of the suite that stored no fingerprint")
    return (f"Judged against another version of the tests ({when}; the current one is {ctx.suite.fingerprint}): "
            "the expected values shown are the ones stored with this result, the ones it was judged against. "
            "Grade the batch again to judge it against the current tests.")


def student_page(ctx: _Ctx, s: Student) -> str:
    rec = s.record
    cells, why = s.cells, s.code_problem
    tol = ctx.suite.config.tolerances
    by_id = {c["id"]: c for c in ctx.suite.cases}
    rel_tol = ctx.suite.config.milestone.rel_tol
    out = ['<p><a href="../index.html">← class report</a></p>', f"<h1>{esc(s.id)}</h1>",
           f'<p class="sub"><span class="status{"" if s.ran else " bad"}">{esc(s.status)}</span> · total '
           f"{_score(s.total)} / {_score(ctx.suite.auto_points)}" + _student_file(ctx, s) + "</p>"
           + _regrade(ctx)]
    if _other_suite(ctx, s):
        out.append(f'<p class="note stale">{esc(_other_suite(ctx, s))}</p>')
    notes = s.result.notes
    if notes:
        out.append("<h2>Notes from the grader</h2><ul class=\"notes\">"
                   + "".join(f"<li>{esc(_clip(x, 1000))}</li>" for x in notes) + "</ul>")
    rows = []
    for q in ctx.questions:
        lost = s.failed(q.id)
        name = f'<a href="#{esc(q.id)}">{esc(q.id)}</a>' if lost else esc(q.id)
        rows.append(f'<tr><td>{name}</td><td class="num{" lost" if lost else ""}">{_score(s.score(q.id))} / '
                    f'{_score(q.points)}</td><td class="num">{len(lost)}</td>'
                    f'<td>{esc(" ".join(s.labels(q)))}</td></tr>')
    for q in ctx.manual:
        value = merged_value(q, ctx.merged.get(s.id, {}))
        rows.append(f'<tr><td><a href="#written">{esc(q.id)}</a></td><td class="num">'
                    f'{"not graded yet" if value is None else _score(value)} / {_score(q.points)}</td>'
                    f'<td class="num"></td><td>graded by hand</td></tr>')
    out.append('<h2>Scores</h2><table class="scores"><tr><th>question</th><th class="num">score</th>'
               '<th class="num">failed cases</th><th>diagnoses</th></tr>' + "".join(rows) + "</table>")
    for q in ctx.questions:
        lost = s.failed(q.id)
        if not lost:
            continue
        part = [f'<section class="qsec"><h3 id="{esc(q.id)}">{esc(q.id)} <span class="meta">{esc(q.title)} · '
                f"{_score(s.score(q.id))} / {_score(q.points)}</span></h3>"]
        for c in lost:
            case = by_id.get(c.id, {})
            badges = (' <span class="badge">hidden</span>' if c.hidden else "") + (
                f' <span class="badge diag">{esc(c.diagnosis + _carried(ctx, c.diagnosis, q.id))}</span>'
                if c.diagnosis else "")
            blocked, alone = gate_of(ctx.suite, s.result, c)
            head = (f'<h3>{esc(c.id)}{badges} <span class="meta note">−{_score(float(c.max_points))} points'
                    f"</span></h3>")
            wait = " and ".join(f'<a href="#{esc(b)}">{esc(b)}</a>' for b in blocked)
            if blocked and alone is not None and alone.passed:
                part.append(f'<div class="case gated" id="{esc(c.id)}">{head}<p class="note">Not checked: it '
                            f"needs {wait} to pass first. Its own check passes on this submission's output; it "
                            "earns nothing while the values it depends on are wrong (the property alone also holds "
                            "of code that computes nothing).</p></div>")
                continue
            message, note = c.message, ""
            if blocked and alone is not None:  # the stored message is the gate's: show what its own check says
                message = alone.message
                note = f'<p class="note">It needs {wait} to pass first, and fails on its own:</p>'
            part.append(f'<div class="case" id="{esc(c.id)}">{head}{note}'
                        f"<pre>{esc(_clip(message, MESSAGE_CHARS))}</pre>"
                        + _detail(case, c.expected, c.received, atol=case.get("atol", tol.atol),
                                  rtol=case.get("rtol", tol.rtol), rel_tol=rel_tol,
                                  codec=ctx.suite.config.lesson.checks) + "</div>")
        picks = [d for d in s.wrong_picks(q)]
        if picks:
            part.append('<ul class="notes">' + "".join(f"<li>{esc(ctx.known.get(d, (q.id, d))[1])}</li>"
                                                         for d in picks) + "</ul>")
        part.append(question_code(cells, q, why))
        out.append("".join(part) + "</section>")
    if ctx.manual:
        blocks = []
        for q in ctx.manual:
            for p in q.written:
                answer = s.answers.get(p.part)
                text = (esc(answer) if answer else '<span class="note">' + (
                    "no answer cell in the notebook" if answer is None else "left as the template had it") + "</span>")
                score = ctx.merged.get(s.id, {}).get(p.part)
                blocks.append(f'<h3><a href="../written/{esc(quote(p.part))}.html">{esc(p.part)}</a> '
                              f'<span class="meta">{"" if score is None else _score(score) + " points · "}'
                              f"{esc(_clip(p.prompt, 200))}</span></h3><div class=\"answer\">{text}</div>"
                              f'<details><summary>model answer</summary><div class="answer model">{esc(p.answer)}'
                              f"</div></details>")
        out.append('<section class="qsec" id="written"><h3>Written answers</h3>' + "".join(blocks) + "</section>")
    stdout = str(rec.get("stdout") or "")
    if stdout.strip():
        out.append(f"<details><summary>notebook output ({len(stdout)} characters)</summary>"
                   f"<pre>{esc(_clip(stdout, 8000))}</pre></details>")
    return _page(f"{s.id} · {ctx.title}", "\n".join(out))


def report_csv(students: list[Student], questions: list[Question]) -> str:
    """One row per student for a gradebook: id, status, total, per-question scores and the diagnosis ids."""
    rows = [["id", "status", "total", *(q.id for q in questions), "diagnoses"]]
    rows += [[_text(s.id), _text(s.status), _score(s.total), *(_score(s.score(q.id)) for q in questions),
              _text(" ".join(s.diagnosis_ids(questions)))] for s in students]
    return csv_text(rows)


def _student_page_or_note(ctx: _Ctx, s: Student) -> str:
    """The student's page; when their stored result breaks it, a page saying so, and the student is marked
    "unusable result" so the index lists them with the reason."""
    try:
        return student_page(ctx, s)
    except Exception as exc:  # noqa: BLE001 - one record must never stop the class report
        why = f"the report could not show this result ({type(exc).__name__}: {_clip(_text(exc), 300)})"
        s.use(_unusable(s.id, why) | {"path": s.record.get("path")})
        s.cells = []
        return student_page(ctx, s)


def _written_page_or_note(ctx: _Ctx, q: Question, n: int, students: list[Student]) -> str:
    try:
        return written_page(ctx, q, n, students)
    except Exception as exc:  # noqa: BLE001 - the rest of the report is written all the same
        return _page(q.written[n].part, f'<p><a href="../index.html">← class report</a></p><p class="note">This page '
                     f"could not be built ({esc(type(exc).__name__)}: {esc(_clip(str(exc), 300))}); the answers are "
                     "on the students' pages.</p>")


def _plain_index(students: list[Student], exc: Exception, *, title: str) -> str:
    rows = "".join(f"<tr><td>{_link(s)}</td><td>{esc(s.status)}</td></tr>" for s in students)
    return _page(f"{title} failure report", f"<h1>{esc(title)} · failure report</h1><p class=\"note\">The summary "
                 f"could not be built ({esc(type(exc).__name__)}: {esc(_clip(str(exc), 300))}); the students' pages "
                 f"are below.</p><table>{rows}</table>")


