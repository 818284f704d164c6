"""TA failure report: a static HTML folder (index, one page per student) and report.csv from a graded batch."""

from __future__ import annotations

import ast
import base64
import hashlib
import html
import json
import os
import re
import shlex
import shutil
import tempfile
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np

from autograder.authoring.questions import LETTERS, Choice, Question, shuffled
from autograder.authoring.suite import Suite, load_suite
from autograder.batch import MergeError, merged_scores, merged_value
from autograder.config import DEFAULT_CONFIG, ROOT, command, runnable_command
from autograder.execute import SKIP_TAGS
from autograder.results import CaseResult, Status, SubmissionResult, csv_text, full_marks
from autograder.submissions import read_cells, read_regular

UNRECOGNISED = "unrecognised"
UNFINISHED = "unfinished"
UNDIAGNOSED = (UNFINISHED, UNRECOGNISED)
STUB_WORDS = "the stub is not filled in yet"  # what the probes say when a stub returned None or ...
MARKER = ".autograder-report"  # only a folder holding this file is ever replaced by a new report
GRID = 8  # at most GRID x GRID values of an array are shown
CODE_CHARS = 20_000  # per cell
MESSAGE_CHARS = 4_000
MAX_RECORD_MB = 128  # a stored result larger than this is not read
INVALID = "invalid"  # the label of a multiple-choice answer that is not one of the letters
ANSWER_PLACEHOLDERS = ("_Type your answer here, replacing this text._", "YOUR ANSWER HERE")
MANUAL_CSV = "manual_scores.csv"  # the written-answer scores a TA fills in, for `merge`

CSS = """
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1f2328;background:#f6f7f9;margin:0}
main{max-width:1220px;margin:0 auto;padding:18px 24px 40px}
h1{font-size:22px;margin:0 0 2px;overflow-wrap:anywhere}
h2{font-size:17px;margin:26px 0 8px}h3{font-size:15px;margin:14px 0 6px}
a{color:#0b57d0;text-decoration:none}a:hover{text-decoration:underline}
.sub{color:#59636e;margin:0 0 12px}
table{border-collapse:collapse;background:#fff}
th,td{padding:4px 8px;border-bottom:1px solid #e3e6ea;text-align:left;vertical-align:top}
th{font-weight:600;color:#59636e;font-size:12px;text-transform:uppercase;letter-spacing:.03em}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
.qt{width:100%}.qt td{padding:6px 8px}
.qtitle{color:#59636e;font-size:12px}
.bar{display:inline-block;width:90px;height:8px;background:#e3e6ea;border-radius:4px;vertical-align:middle;margin-left:6px}
.bar i{display:block;height:8px;border-radius:4px;background:#2da44e}
.bar i.mid{background:#d4a72c}.bar i.low{background:#cf222e}
.chip{display:inline-block;border-radius:10px;padding:0 8px;margin:1px 4px 1px 0;font-size:12px;background:#eef1f4;
white-space:nowrap}
.chip b{font-weight:700;margin-right:4px}
.cl{margin:1px 0;line-height:1.7}
.chip.diag{background:#ffebe9;color:#82071e}.chip.lead{background:#cf222e;color:#fff}
.chip.unk{background:#fff8c5;color:#6a5400}.chip.fin{background:#eef1f4;color:#59636e}
.who{font-size:12px;overflow-wrap:anywhere}
.qsec{background:#fff;border:1px solid #e3e6ea;border-radius:8px;padding:4px 14px 10px;margin:12px 0}
.qsec h3 .meta{font-weight:400;color:#59636e;font-size:13px}
.cluster{border-left:4px solid #cf222e;padding:4px 10px;margin:8px 0;background:#fffafa}
.cluster.unk{border-left-color:#d4a72c;background:#fffdf0}
.cluster .head{font-weight:600}
.count{display:inline-block;min-width:26px;text-align:center;background:#cf222e;color:#fff;border-radius:10px;
padding:0 7px;margin-right:6px}
.cluster.unk .count{background:#9a6700}
.cluster.fin{border-left-color:#8c959f;background:#f6f8fa}.cluster.fin .count{background:#6e7781}
.desc{margin:2px 0}
code,pre{font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
pre{background:#f6f8fa;border:1px solid #e3e6ea;border-radius:6px;padding:8px;overflow:auto;white-space:pre-wrap;
overflow-wrap:anywhere;margin:4px 0}
pre.ex{max-height:10em;margin-bottom:6px}
details summary{cursor:pointer;color:#59636e;font-size:12px}
.status{display:inline-block;border-radius:10px;padding:0 8px;font-size:12px;background:#dafbe1;color:#116329}
.status.bad{background:#ffebe9;color:#82071e}
.case{border-top:1px solid #e3e6ea;padding:6px 0}
.case.gated h3{color:#59636e}
.badge{font-size:11px;border-radius:8px;padding:0 6px;background:#eef1f4;color:#59636e;margin-left:6px;font-weight:400}
.badge.diag{background:#ffebe9;color:#82071e}
.cmp{display:flex;gap:18px;flex-wrap:wrap;margin:6px 0}
.grid td{font:12px ui-monospace,Menlo,Consolas,monospace;text-align:right;border:1px solid #eaeef2;padding:2px 6px}
.grid caption{caption-side:top;text-align:left;font-size:12px;color:#59636e;padding:2px 0}
td.bad,tr.bad td{background:#ffd7d5;color:#82071e;font-weight:600}
.kv td{font:12px ui-monospace,Menlo,Consolas,monospace;overflow-wrap:anywhere}
.scores td.lost{background:#fff1f0}
.note{color:#59636e;font-size:12px}
ul.notes{margin:4px 0;padding-left:18px}
.answer{background:#fff;border:1px solid #e3e6ea;border-radius:6px;padding:6px 8px;white-space:pre-wrap;
overflow-wrap:anywhere;margin:4px 0}
.model{background:#f0f7ff;border-color:#b6d4fe}
td.answer{border-radius:0;margin:0;max-width:720px}
ul.rebound{background:#fff8c5;border:1px solid #d4a72c;border-radius:6px;padding:6px 8px 6px 26px}
mark{background:#fff1b8;color:inherit}
.opt td.right{color:#116329;font-weight:600}
.roster{max-height:60vh;overflow-y:auto}
td>a,.scores td:last-child{overflow-wrap:anywhere}
.roster thead th{position:sticky;top:0;background:#fff;z-index:1}
input.filter{font:inherit;padding:3px 8px;margin:4px 0 6px;width:320px;border:1px solid #c8ced5;border-radius:6px}
table.sortable thead th{cursor:pointer;user-select:none}
th[aria-sort=ascending]::after{content:" \\25B2"}th[aria-sort=descending]::after{content:" \\25BC"}
"""

# The only script of the report, allowed by its hash in each page's Content-Security-Policy (nothing a student
# wrote can run). It sorts a table.sortable when a header is clicked and filters the rows of the table an
# input.filter names. With scripts off the tables stay complete, in their default order, and the filter box stays
# hidden. Hook for tests and bookmarks: ?sort=<table id>:<column>[:desc] and ?q=<table id>:<text>.
SCRIPT = """(function(){
function key(c,num){var v=c?(c.getAttribute("data-v")!==null?c.getAttribute("data-v"):c.textContent.trim()):"";
if(!num)return v.toLowerCase();var f=parseFloat(v);return isNaN(f)?-Infinity:f;}
function sort(th){var t=th.closest("table"),b=t.tBodies[0],i=th.cellIndex,num=th.classList.contains("num");
var d=th.getAttribute("aria-sort")==="ascending"?"descending":"ascending",s=d==="ascending"?1:-1;
t.querySelectorAll("thead th").forEach(function(h){h.removeAttribute("aria-sort");});th.setAttribute("aria-sort",d);
var rows=Array.prototype.map.call(b.rows,function(r,n){return [r,key(r.cells[i],num),n];});
rows.sort(function(x,y){return x[1]<y[1]?-s:x[1]>y[1]?s:x[2]-y[2];});rows.forEach(function(r){b.appendChild(r[0]);});}
function filter(t,text){text=text.toLowerCase();var n=0;Array.prototype.forEach.call(t.tBodies[0].rows,function(r){
r.hidden=text!==""&&r.textContent.toLowerCase().indexOf(text)<0;if(!r.hidden)n++;});t.setAttribute("data-shown",n);}
document.querySelectorAll("table.sortable thead th").forEach(function(th){th.tabIndex=0;
th.addEventListener("click",function(){sort(th);});
th.addEventListener("keydown",function(e){if(e.key==="Enter")sort(th);});});
document.querySelectorAll("input.filter").forEach(function(f){
var t=document.getElementById(f.getAttribute("data-table"));if(!t)return;f.hidden=false;
f.addEventListener("input",function(){filter(t,f.value);});});
var p=new URLSearchParams(location.search);
p.getAll("sort").forEach(function(v){var a=v.split(":"),t=document.getElementById(a[0]);if(!t)return;
var th=t.querySelector('thead th[data-col="'+(a[1]||"").replace(/["\\\\]/g,"")+'"]');if(!th)return;
sort(th);if(a[2]==="desc")sort(th);});
p.getAll("q").forEach(function(v){var k=v.indexOf(":"),id=v.slice(0,k),t=document.getElementById(id),
f=document.querySelector('input.filter[data-table="'+id.replace(/["\\\\]/g,"")+'"]');if(!t||!f)return;
f.value=v.slice(k+1);filter(t,f.value);});
})();"""
SCRIPT_HASH = base64.b64encode(hashlib.sha256(SCRIPT.encode("utf-8")).digest()).decode("ascii")


# --------------------------------------------------------------------------- data


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
        if any(stubs.values()) or (not found and any(STUB_WORDS in c.message for c in failed)):
            return [*found, UNFINISHED]
        return found or [UNRECOGNISED]

    def pick(self, q: Question, choice: Choice) -> str:
        """The letter this student chose for a multiple-choice item, INVALID when it is not a letter, "" when
        the item was never judged (the notebook stopped before it)."""
        case_id = next((c["id"] for c in q.cases if c.get("check") == "choice_correct"
                        and c.get("args", {}).get("names") == [choice.var]), None)
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


def _text(value: Any) -> str:
    """str(value) that can be written as UTF-8: lone surrogates become escapes."""
    return str(value).encode("utf-8", "backslashreplace").decode("utf-8")


def _finite(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and abs(v) < 1e300 and v == v


_CASE_TYPES = {"id": str, "question": str, "passed": bool, "hidden": bool, "message": str,
               "diagnosis": (str, type(None))}


def record_problem(record: Any) -> str:
    """Why the report cannot use a stored result ("" when it can): the fields it reads, with their types."""
    if not isinstance(record, dict):
        return f"the stored result is {type(record).__name__}, not an object"
    if not isinstance(record.get("status"), str):
        return "its status is not text"
    if not _finite(record.get("total")):
        return "its total is not a number"
    questions = record.get("questions")
    if not isinstance(questions, dict) or not all(isinstance(k, str) and _finite(v) for k, v in questions.items()):
        return "its per-question scores are not numbers"
    for key in ("notes", "student_notes"):
        notes = record.get(key, [])
        if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
            return f"its {key.replace('_', ' ')} are not a list of text"
    for key in ("path", "stdout", "fingerprint"):
        if not isinstance(record.get(key), str | None):
            return f"its {key} is not text"
    cases = record.get("cases")
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


def _unusable(sid: str, why: str) -> dict[str, Any]:
    return {"submission": sid, "status": Status.UNUSABLE, "cases": [], "questions": {}, "total": 0, "notes": [why]}


def _read_record(path: Path) -> dict[str, Any]:
    """A stored result read as data (a regular file under the cap), or an "unusable result" saying why not."""
    try:
        raw = read_regular(path, limit=MAX_RECORD_MB * 2**20, label=f"results/{path.name}")
        record = json.loads(raw.decode("utf-8", "replace"))
    except (OSError, ValueError, RecursionError) as exc:
        return _unusable(path.stem, f"results/{_text(path.name)} could not be read: {_text(exc)[:300]}")
    why = record_problem(record)
    return _unusable(path.stem, f"results/{_text(path.name)}: {why}") if why else record


def _batch_rows(grades: Path) -> list[tuple[str, str | None, dict[str, Any]]]:
    """(id, result file, summary row) of the batch, in its order: summary.json's rows, else every stored result."""
    try:
        rows = json.loads((grades / "summary.json").read_text(encoding="utf-8"))["rows"]
        out = [(_text(r["id"]), r.get("result"), r) for r in rows]
        if all(isinstance(f, str | None) for _, f, _ in out):
            return out
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        pass
    return [(_text(p.stem), p.name, {}) for p in sorted((grades / "results").glob("*.json"))]


def load_students(grades: Path, *, limits: Any = None, parts: list[str] | None = None) -> list[Student]:
    """The results of the batch, in the order of the batch (summary.json), else every stored result.

    Never raises for what a stored result holds: a result the report cannot use becomes a student whose
    status is "unusable result" and whose note says why; a submission the grader left "not graded" keeps
    the grader's message.
    """
    results = grades / "results"
    if not results.is_dir() and not (grades / "summary.json").exists():
        raise FileNotFoundError(f"{grades}: no results/ folder; run `{command()} grade` first")
    students = []
    for sid, name, row in _batch_rows(grades):
        if not isinstance(name, str) or "/" in name or name.startswith("."):
            message = _text(row.get("message") or "no stored result")
            record = {"submission": sid, "status": _text(row.get("status") or Status.UNUSABLE), "cases": [],
                      "questions": {}, "total": 0, "notes": [message]}
        else:
            record = _read_record(results / name)
        try:
            student = Student(sid, record, _page_name(sid))
        except Exception as exc:  # noqa: BLE001 - a record record_problem let through but the results object refuses
            record = _unusable(sid, f"results/{_text(name)}: not a stored result ({_text(exc)[:300]})")
            student = Student(sid, record, _page_name(sid))
        if student.status not in (Status.UNREADABLE, Status.UNUSABLE) and record.get("path"):
            cells, student.code_problem = read_notebook(record.get("path"), grades, limits=limits)
            student.cells = code_cells(cells)
            student.answers = written_answers(cells, parts or []) if cells else {}
        students.append(student)
    pages = [s.page.lower() for s in students]
    for s in students:  # Alice and alice must not share a page on a case-insensitive disk
        if pages.count(s.page.lower()) > 1:
            s.page = f"{s.page[:-5]}-{_digest(s.id)}.html"
    return students


def catalogue(suite: Suite) -> dict[str, tuple[str, str]]:
    """Every diagnosis id the judge can give: (the question it belongs to, its description with the fix)."""
    from autograder.milestone import PROBLEMS
    known = {c["known_cause"]["id"]: (c["question"], c["known_cause"]["description"])
             for c in suite.cases if c.get("known_cause")}
    checkpoint = {k: (suite.checkpoint_question, v) for k, v in PROBLEMS.items()}
    return known | {m.id: (m.question, m.description) for m in suite.config.lesson.mistakes} | checkpoint


def clusters(students: list[Student], questions: list[Question]) -> dict[str, list[Cluster]]:
    """Per question: students who lost points there, grouped by diagnosis, largest group first.

    A student goes into every diagnosis found on the failed cases of that question; when none has one,
    into "unfinished" (a stub was left as it was) or else "unrecognised". Submissions that did not run
    normally (timed out, crashed, ...) are left out: the status section lists them.
    """
    out: dict[str, list[Cluster]] = {}
    for q in questions:
        groups: dict[str, Cluster] = {}
        for s in students:
            for d in s.labels(q):
                groups.setdefault(d, Cluster(q.id, d)).students.append(s)
        out[q.id] = sorted(groups.values(), key=lambda c: (c.diagnosis in UNDIAGNOSED, c.diagnosis == UNFINISHED,
                                                           -len(c.students),
                                                           c.diagnosis))
    return out


# --------------------------------------------------------------------------- html helpers


def esc(value: Any) -> str:
    return html.escape(_text(value), quote=True)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n… ({len(text) - limit} more characters)"


def _num(v: Any) -> str:
    if isinstance(v, bool | np.bool_):
        return str(bool(v))
    if isinstance(v, int | np.integer):
        return str(int(v))
    f = float(v)
    if not np.isfinite(f):
        return str(f)
    return f"{f:.4f}" if abs(f) < 1e5 else f"{f:.4g}"


def _score(v: float) -> str:
    return f"{v:.2f}".rstrip("0").rstrip(".") if v % 1 else f"{v:g}"


def _page(title: str, body: str) -> str:
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width,initial-scale=1">'
            f'<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; style-src \'unsafe-inline\'; '
            f"script-src 'sha256-{SCRIPT_HASH}'\">"
            f"<title>{esc(title)}</title><style>{CSS}</style></head>\n<body><main>\n{body}\n</main>"
            f"<script>{SCRIPT}</script></body></html>\n")


def _link(s: Student, prefix: str = "students/") -> str:
    return f'<a href="{esc(prefix + quote(s.page))}">{esc(s.id)}</a>'


def _bar(frac: float) -> str:
    cls = "" if frac >= 0.8 else "mid" if frac >= 0.5 else "low"
    return f'<span class="bar"><i class="{cls}" style="width:{max(0.0, min(frac, 1.0)) * 100:.0f}%"></i></span>'


# --------------------------------------------------------------------------- expected versus received


def _window(n: int, at: int) -> range:
    start = min(max(0, at - 2), max(0, n - GRID))
    return range(start, min(n, start + GRID))


def _plane(arr: np.ndarray, at: tuple[int, ...]) -> tuple[np.ndarray, tuple[int, ...], int, int]:
    """The 2-D slice of `arr` that holds index `at`: (slice, leading index, row, column)."""
    if arr.ndim == 0:
        return arr.reshape(1, 1), (), 0, 0
    if arr.ndim == 1:
        return arr.reshape(1, -1), (), 0, at[0]
    return arr[at[:-2]], at[:-2], at[-2], at[-1]


def _grid(arr: np.ndarray, bad: np.ndarray | None, at: tuple[int, ...], caption: str) -> str:
    """A GRID x GRID window of `arr` around index `at`, cells where `bad` is true marked `bad` (red)."""
    if arr.size == 0:
        return f'<table class="grid"><caption>{esc(caption)}: empty, shape {esc(list(arr.shape))}</caption></table>'
    plane, _, row, col = _plane(arr, at)
    plane_bad = None if bad is None else _plane(bad, at)[0]
    body = []
    for i in _window(plane.shape[0], row):
        cells = "".join(f'<td{" class=bad" if plane_bad is not None and plane_bad[i, j] else ""}>'
                        f"{esc(_num(plane[i, j]))}</td>" for j in _window(plane.shape[1], col))
        body.append(f"<tr>{cells}</tr>")
    return f'<table class="grid"><caption>{esc(caption)}</caption>{"".join(body)}</table>'


def _span(r: range, n: int, what: str) -> str:
    return f"{what} {r.start}–{r.stop - 1} of {n}" if len(r) < n else f"all {n} {what}"


def _compare_arrays(key: str, want: np.ndarray, got: np.ndarray, atol: float, rtol: float) -> str:
    if want.shape != got.shape:
        return (f'<table class="kv"><tr><th>{esc(key)}</th><th>expected</th><th>received</th></tr>'
                f'<tr class="bad"><td>shape</td><td>{esc(list(want.shape))}</td><td>{esc(list(got.shape))}</td></tr>'
                f'</table><div class="cmp">{_grid(want, None, (0,) * want.ndim, "expected " + key)}'
                f'{_grid(got, None, (0,) * got.ndim, "received " + key)}</div>')
    with np.errstate(invalid="ignore", over="ignore"):
        bad = ~np.isclose(got.astype(np.float64), want.astype(np.float64), atol=atol, rtol=rtol)
    if want.size == 0:
        return f'<div class="note"><b>{esc(key)}</b> · empty arrays of shape {esc(list(want.shape))}</div>'
    at = tuple(int(i) for i in np.argwhere(bad)[0]) if bad.any() else (0,) * want.ndim
    plane, lead, row, col = _plane(want, at)
    shown = [_span(_window(plane.shape[0], row), plane.shape[0], "rows")] if want.ndim >= 2 else []
    shown.append(_span(_window(plane.shape[1], col), plane.shape[1], "columns" if want.ndim >= 2 else "values"))
    name = f"{key}[{', '.join(map(str, lead))}, :, :]" if lead else key
    summary = f"{int(bad.sum())} of {bad.size} values differ (atol {atol:g}, rtol {rtol:g})"
    if bad.any():
        summary += f"; first at index {list(at)}"
    return (f'<div class="note"><b>{esc(name)}</b> · shape {esc(list(want.shape))} · showing {esc(", ".join(shown))}'
            f" · {esc(summary)}</div>"
            f'<div class="cmp">{_grid(want, bad, at, "expected")}{_grid(got, bad, at, "received")}</div>')


class _Missing:
    def __repr__(self) -> str:
        return "(not returned)"


_MISSING = _Missing()


def _short(value: Any, codec: Any) -> str:
    if value is _MISSING:
        return repr(value)
    if isinstance(value, np.ndarray):
        return f"array {list(value.shape)} {value.dtype}"
    if isinstance(value, dict) and set(value) >= {"type", "message"}:
        where = f" ({value['where']})" if value.get("where") else ""
        return f"{value['type']}: {value['message']}{where}"
    try:
        text = json.dumps(codec.to_plain(_arrays_named(value)))
    except (TypeError, ValueError, RecursionError):
        text = repr(value)
    return _clip(text, 300)


def _arrays_named(value: Any) -> Any:
    """`value` with each array inside it replaced by its shape and dtype (its bytes say nothing to a reader)."""
    if isinstance(value, np.ndarray):
        return f"array {list(value.shape)} {value.dtype}"
    if isinstance(value, dict):
        return {k: _arrays_named(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_arrays_named(v) for v in value]
    return value


def _same(a: Any, b: Any, atol: float, rtol: float, codec: Any) -> bool:
    numbers = (float, int)
    if isinstance(a, numbers) and isinstance(b, numbers) and not isinstance(a, bool) and not isinstance(b, bool):
        return bool(np.isclose(float(b), float(a), atol=atol, rtol=rtol))
    if a is _MISSING or b is _MISSING:
        return False
    try:
        return codec.dumps(a) == codec.dumps(b)
    except TypeError:
        return False


def compare(case: dict[str, Any], expected: Any, received: Any, *, atol: float, rtol: float, codec: Any) -> str:
    """Expected-versus-received HTML for one failed case: array windows and key rows, wrong cells marked
    (`codec`: the lesson's checks module, whose to_plain/from_plain/dumps stored the values)."""
    if received is None:
        return '<p class="note">No output was recorded for this case (the submission stopped before it ran).</p>'
    try:
        got = codec.from_plain(received)
    except (TypeError, ValueError, KeyError) as exc:
        return f'<p class="note">The stored output could not be decoded: {esc(exc)}</p>'
    if not isinstance(expected, dict) or not isinstance(got, dict):
        expected, got = {"value": expected}, {"value": got}
    if set(got) == {"error"}:
        return ""  # nothing came back but the exception, shown on its own below
    labels = {"first": case.get("first"), "second": case.get("second")}
    parts, rows = [], []
    for key in [*expected, *(k for k in got if k not in expected)]:
        want, have = expected.get(key), got.get(key, _MISSING)
        name = f"{key} — {labels[key]}" if labels.get(key) else key
        if isinstance(want, np.ndarray) and isinstance(have, np.ndarray):
            parts.append(_compare_arrays(name, want, have, atol, rtol))
            continue
        if key == "error" and want is None:
            rows.append((name, "no error", _short(have, codec), True))
            continue
        rows.append((name, _short(want, codec) if key in expected else "(not expected)", _short(have, codec),
                     not _same(want, have, atol, rtol, codec)))
    table = ""
    if rows:
        body = "".join(f'<tr{" class=bad" if wrong else ""}><td>{esc(k)}</td><td>{esc(w)}</td><td>{esc(h)}</td></tr>'
                       for k, w, h, wrong in rows)
        table = f'<table class="kv"><tr><th>key</th><th>expected</th><th>received</th></tr>{body}</table>'
    return table + "".join(parts)


def checkpoint_table(received: Any, *, rel_tol: float) -> str:
    """Per context: the re-evaluated perplexity, the one in milestone.json and the bound (failures marked)."""
    if not isinstance(received, dict) or not received.get("ppl"):
        return ""
    ppl, claimed, bound = (received.get(k) or {} for k in ("ppl", "claimed", "thresholds"))
    rows = []
    for c, value in ppl.items():
        said, limit = claimed.get(c), bound.get(c)
        bad = (limit is not None and not value <= limit) or (said is not None and abs(value - said) > rel_tol * said)
        cells = [c, f"{value:.2f}", "—" if said is None else f"{said:.2f}", "—" if limit is None else f"{limit:g}"]
        rows.append(f'<tr{" class=bad" if bad else ""}>' + "".join(f"<td>{esc(x)}</td>" for x in cells) + "</tr>")
    return ('<table class="kv"><tr><th>context</th><th>re-evaluated</th><th>milestone.json</th><th>bound</th></tr>'
            + "".join(rows) + "</table>")


def gate_of(suite: Suite, result: SubmissionResult, c: CaseResult) -> tuple[list[str], Any]:
    """Why a failed case failed, when it is gated: the cases it requires that failed (their ids), and the
    verdict of its own check on its stored output against its stored expected value (None when that cannot be
    judged: no output, no stored expected value). ([], None) for a case that waits for nothing."""
    case = next((x for x in suite.cases if x["id"] == c.id), None)
    if case is None or not case.get("requires"):
        return [], None
    failed = {x.id for x in result.failed()}
    blocked = [rid for r in case["requires"] if (rid := f"{case['question']}/{r}") in failed]
    checks = suite.config.lesson.checks
    if not blocked or c.received is None or (c.expected is None and case["check"] in checks.USES_EXPECTED):
        return blocked, None
    try:
        expected = {"value": None if c.expected is None else checks.from_plain(c.expected), "variants": []}
        return blocked, checks.judge(case, checks.from_plain(c.received), expected)
    except Exception:  # noqa: BLE001 - stored data of any shape: the case is shown as stored
        return blocked, None

def _detail(case: dict[str, Any], expected: Any, received: Any, *, atol: float, rtol: float, rel_tol: float,
            codec: Any) -> str:
    """Expected versus received and the traceback of one failed case; a note when the stored data cannot be shown.

    `expected` is the reference value stored with the result (plain data), the one the case was judged against;
    a result stored without it (by an older grader) shows a note instead: the report never recomputes it.
    """
    try:
        if not case:
            shown = checkpoint_table(received, rel_tol=rel_tol)
        elif expected is None and received is not None:
            shown = ('<p class="note">The expected value was not stored with this result (it was graded by an older '
                     "version of the grader); grade the batch again to see it.</p>")
        else:
            shown = compare(case, codec.from_plain(expected), received, atol=atol, rtol=rtol,
                            codec=codec)
        return shown + _traceback(received)
    except Exception as exc:  # noqa: BLE001 - stored data of any shape: the page is written all the same
        return f'<p class="note">The stored output of this case could not be shown ({esc(type(exc).__name__)}: ' \
               f"{esc(_clip(str(exc), 300))}).</p>"


def _traceback(received: Any) -> str:
    err = received.get("error") if isinstance(received, dict) else None
    if not isinstance(err, dict):
        return ""
    where = f"\n  at {err.get('where')}" if err.get("where") else ""
    return (f'<div class="note">Your code raised:</div>'
            f"<pre>{esc(err.get('type', '?'))}: {esc(_clip(str(err.get('message', '')), 1000))}{esc(where)}</pre>")


# --------------------------------------------------------------------------- student code


def _resolve(path: str | None, grades: Path) -> Path | None:
    if not path:
        return None
    p = Path(path)
    candidates = [p] if p.is_absolute() else [Path.cwd() / p, ROOT / p, grades.parent / p]
    return next((c for c in candidates if os.path.lexists(c)), None)


def read_notebook(path: str | None, grades: Path, *, limits: Any = None) -> tuple[list[dict[str, Any]], str]:
    """The cells of a submission's notebook, read as data only (never run), or why there are none.

    Read with the grader's own reader (regular files only, never a link, under the same caps).
    """
    file = _resolve(path, grades)
    if file is None:
        return [], f"the submission file {path!r} was not found" if path else "the result does not name its file"
    return read_cells(file, limits=limits)


def _source(cell: dict[str, Any]) -> str:
    src = cell.get("source", "")
    return "".join(str(s) for s in src) if isinstance(src, list) else str(src)


def code_cells(cells: list[dict[str, Any]]) -> list[tuple[int, str]]:
    """The code cells the grader runs (index in the notebook, source): not those tagged to be skipped."""
    def tags(c: dict[str, Any]) -> list[Any]:
        meta = c.get("metadata")
        found = meta.get("tags") if isinstance(meta, dict) else None
        return found if isinstance(found, list) else []

    return [(n, _source(c)) for n, c in enumerate(cells)
            if c.get("cell_type") == "code" and not set(SKIP_TAGS) & {t for t in tags(c) if isinstance(t, str)}]


def _prompt_marker(part: str) -> str:
    return f"**`{part}`.**"  # how the builder heads each written part (Otter and nbgrader alike)


def written_answers(cells: list[dict[str, Any]], parts: list[str]) -> dict[str, str | None]:
    """Each written part's answer as the student left it ("" when left as the template had it; None when the
    notebook has no answer cell for it): the nbgrader cell with that grade_id, else the cells after the part's
    prompt, up to the next locked cell, prompt or heading."""
    out: dict[str, str | None] = {}
    markers = [_prompt_marker(p) for p in parts]
    for part in parts:
        meta = [c for c in cells if isinstance(c.get("metadata"), dict) and isinstance(c["metadata"].get("nbgrader"),
                                                                                     dict)
                and c["metadata"]["nbgrader"].get("grade_id") == part]
        found: list[str] | None = [_source(c) for c in meta] if meta else None
        if found is None:
            start = next((n for n, c in enumerate(cells) if _prompt_marker(part) in _source(c)), None)
            if start is not None:
                found = []
                for c in cells[start + 1:]:
                    text = _source(c)
                    meta_c = c.get("metadata") if isinstance(c.get("metadata"), dict) else {}
                    if (meta_c.get("editable") is False or any(m in text for m in markers)
                            or "<!-- END QUESTION -->" in text or text.lstrip().startswith("## ")):
                        break
                    found.append(text)
        if found is None:
            out[part] = None
            continue
        text = "\n\n".join(t.strip() for t in found if t.strip())
        for marker in ("# BEGIN SOLUTION", "# END SOLUTION", *ANSWER_PLACEHOLDERS):
            text = text.replace(marker, "")
        out[part] = text.strip()
    return out


@lru_cache(maxsize=4096)
def _tree(source: str) -> ast.Module | None:
    """The parsed cell (never run), or None when it is not plain Python (a syntax error, too big). Lines that
    IPython runs as magics or shell commands (%, %%, !) are read as blank lines."""
    for text in (source, re.sub(r"^[ \t]*[%!].*$", "", source, flags=re.M)):
        try:
            return ast.parse(text[:200_000])
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
    return None


DYNAMIC = "*"  # the name of a binding that cannot be read statically (exec, globals() with a computed key, import *)


@dataclass(frozen=True)
class Binding:
    """One statement of a code cell that binds a name of the notebook's global namespace, read without running it.

    `seq` orders every binding of the notebook as the grader runs them (cell by cell, line by line); `alias` is the
    other name a plain `name = other` binds it to; `node` the statement (None when the cell could not be parsed)."""

    name: str
    cell: int
    line: int
    end: int
    kind: str
    seq: int
    alias: str | None = None
    node: ast.AST | None = field(default=None, compare=False, repr=False)

    @property
    def where(self) -> str:
        lines = f"line {self.line}" if self.end <= self.line else f"lines {self.line}–{self.end}"
        return f"cell {self.cell}, {lines}"


def _names_in(target: ast.AST) -> list[str]:
    """The names an assignment target binds (`a`, `a, (b, *c)`); attributes and subscripts bind none."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, ast.Starred):
        return _names_in(target.value)
    if isinstance(target, ast.Tuple | ast.List):
        return [n for t in target.elts for n in _names_in(t)]
    return []


def _is_globals_call(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("globals", "vars")
            and not node.args)


def _expression_bindings(stmt: ast.stmt) -> list[tuple[str, str]]:
    """(name, kind) bound by the expressions of one statement, outside nested functions: `name := ...`, and the
    run-time ways (exec, eval, globals().update(...), setattr on the module)."""
    found: list[tuple[str, str]] = []
    todo: list[ast.AST] = [v for f, v in ast.iter_fields(stmt) if f not in ("body", "orelse", "finalbody", "handlers",
                                                                             "cases")
                           for v in (v if isinstance(v, list) else [v]) if isinstance(v, ast.AST)]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Lambda | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        if isinstance(node, ast.NamedExpr) and isinstance(node.target, ast.Name):
            found.append((node.target.id, "assignment expression"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("exec", "eval",
                                                                                                "setattr"):
            found.append((DYNAMIC, f"{node.func.id}(...)"))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("update", "setdefault", "__setitem__") and _is_globals_call(node.func.value)):
            found.append((DYNAMIC, f"globals().{node.func.attr}(...)"))
        todo.extend(ast.iter_child_nodes(node))
    return found


def _statement_bindings(body: list[ast.stmt], only: set[str] | None = None
                        ) -> list[tuple[str, str, ast.stmt, str | None]]:
    """(name, kind, statement, alias) of every global binding in `body`, in order, nested blocks included (if,
    for, with, try, match); inside a function only the names it declares `global` (`only`)."""
    out: list[tuple[str, str, ast.stmt, str | None]] = []

    def add(names: list[str], kind: str, stmt: ast.stmt, alias: str | None = None, *, anywhere: bool = False) -> None:
        out.extend((n, kind, stmt, alias) for n in names if only is None or n in only or n == DYNAMIC or anywhere)

    for stmt in body:
        for name, kind in _expression_bindings(stmt):
            add([name], kind, stmt)
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            add([stmt.name], "class" if isinstance(stmt, ast.ClassDef) else "def", stmt)
            # a body runs later (when called, or as the class is made), but what it binds globally counts then
            declared = set() if isinstance(stmt, ast.ClassDef) else {
                n for g in ast.walk(stmt) if isinstance(g, ast.Global) for n in g.names}
            out.extend((n, f"{k} in {stmt.name} (bound when it runs)", s, a)
                       for n, k, s, a in _statement_bindings(stmt.body, declared))
            continue
        if isinstance(stmt, ast.Assign):
            alias = stmt.value.id if isinstance(stmt.value, ast.Name) else None
            for t in stmt.targets:
                add(_names_in(t), "assignment", stmt, alias)
                if isinstance(t, ast.Subscript) and _is_globals_call(t.value):
                    key = t.slice.value if isinstance(t.slice, ast.Constant) else None
                    add([key if isinstance(key, str) else DYNAMIC], "globals()[...] assignment", stmt, anywhere=True)
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            add(_names_in(stmt.target), "assignment", stmt, stmt.value.id if isinstance(stmt.value, ast.Name) else None)
        elif isinstance(stmt, ast.AugAssign):
            add(_names_in(stmt.target), "augmented assignment", stmt)
        elif isinstance(stmt, ast.Import | ast.ImportFrom):
            for a in stmt.names:
                add([DYNAMIC if a.name == "*" else a.asname or a.name.split(".")[0]], "import", stmt)
        elif isinstance(stmt, ast.Delete):
            add([n for t in stmt.targets for n in _names_in(t)], "del", stmt)
        elif isinstance(stmt, ast.For | ast.AsyncFor):
            add(_names_in(stmt.target), "for loop", stmt)
        elif isinstance(stmt, ast.With | ast.AsyncWith):
            add([n for item in stmt.items if item.optional_vars for n in _names_in(item.optional_vars)], "with",
                stmt)
        for block in ("body", "orelse", "finalbody"):
            inner = getattr(stmt, block, None)
            if isinstance(inner, list) and not isinstance(stmt, ast.ClassDef):
                out.extend(_statement_bindings(inner, only))
        for handler in getattr(stmt, "handlers", []):
            if handler.name:
                add([handler.name], "except ... as", stmt)
            out.extend(_statement_bindings(handler.body, only))
        for case in getattr(stmt, "cases", []):
            out.extend(_statement_bindings(case.body, only))
    return out


_FALLBACK = re.compile(r"^(?:(?:async\s+)?def|class)\s+([A-Za-z_]\w*)|^([A-Za-z_]\w*)\s*(?::[^=\n]*)?=(?!=)", re.M)


def bindings(cells: list[tuple[int, str]]) -> list[Binding]:
    """`cell_bindings` of the cells, read once per notebook (the report asks for each question)."""
    return list(_bindings(tuple(cells)))


@lru_cache(maxsize=64)
def _bindings(cells: tuple[tuple[int, str], ...]) -> tuple[Binding, ...]:
    return tuple(cell_bindings(list(cells)))


def cell_bindings(cells: list[tuple[int, str]]) -> list[Binding]:
    """Every binding of a global name in the cells (index, source), in the order the grader runs them: def,
    class, assignment (plain, augmented, annotated, :=, globals()[...]), import, for, with, except ... as and del,
    in nested blocks too, and inside functions for names they declare global. A cell that does not parse is read
    line by line (top-level def, class and `name =`); exec, eval, setattr, globals().update and `import *` are
    recorded under DYNAMIC: what they bind is only known when they run."""
    out: list[Binding] = []
    for n, src in cells:
        tree = _tree(src)
        if tree is None:
            for m in _FALLBACK.finditer(src):
                line = src.count("\n", 0, m.start()) + 1
                out.append(Binding(m.group(1) or m.group(2), n, line, line, "definition (cell not parsed)", len(out)))
            continue
        for name, kind, stmt, alias in _statement_bindings(tree.body):
            out.append(Binding(name, n, stmt.lineno, stmt.end_lineno or stmt.lineno, kind, len(out), alias, stmt))
    return out


def in_effect(found: list[Binding], name: str, *, before: int | None = None) -> Binding | None:
    """The binding of `name` in effect when the notebook ended (or just before binding number `before`)."""
    return next((b for b in reversed(found) if b.name == name and (before is None or b.seq < before)), None)


def _is_stub(node: ast.AST | None) -> bool:
    """A definition still as the template left it: a body of only a docstring and `...` (or pass)."""
    if isinstance(node, ast.ClassDef):
        return any(_is_stub(n) for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        body = [n for n in node.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)
                                             and isinstance(n.value.value, str))]
        return all(isinstance(n, ast.Pass) or (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)
                                               and n.value.value is Ellipsis) for n in body)
    if isinstance(node, ast.Assign):
        return isinstance(node.value, ast.Constant) and node.value.value in (Ellipsis, None)
    return False


def stub_state(cells: list[tuple[int, str]], names: set[str]) -> dict[str, bool]:
    """For each of `names` the cells bind: whether the binding in effect at the end is a stub."""
    found = bindings(cells)
    last = {name: in_effect(found, name) for name in names}
    return {name: b.kind in ("def", "class", "assignment") and _is_stub(b.node) for name, b in last.items() if b}


def graded_bindings(found: list[Binding], name: str) -> list[Binding]:
    """The bindings that made `name` what the grader probed: the one in effect at the end, then, while it is a
    plain `name = other`, the binding of `other` in effect at that point (at most five steps)."""
    chain: list[Binding] = []
    b = in_effect(found, name)
    while b is not None and b not in chain and len(chain) < 5:
        chain.append(b)
        b = in_effect(found, b.alias, before=b.seq) if b.alias else None
    return chain


def _marked(src: str, lines: set[int]) -> str:
    """A cell's source as HTML, escaped, with `lines` (1-based) marked."""
    text = _clip(src, CODE_CHARS)
    return "\n".join(f"<mark>{esc(line)}</mark>" if n in lines else esc(line)
                     for n, line in enumerate(text.split("\n"), start=1))


def _first_line(src: str, b: Binding) -> str:
    lines = src.split("\n")
    return _clip(lines[b.line - 1].strip(), 120) if 0 < b.line <= len(lines) else ""


def question_code(cells: list[tuple[int, str]], q: Question, why: str = "") -> str:
    """The student's code for question `q`, as the grader probed it: for each name the question grades, the
    statement bound to it when the notebook ended (the last binding in the order the cells run, following
    `name = other` to the code of `other`), its cell shown with those lines marked; a warning when a name was
    bound more than once or when a later cell may rebind names at run time (exec, globals()); the cells of the
    bindings that were replaced, folded."""
    names = list(q.solution) or [c.var for c in q.choices]
    if not names:
        return f'<p class="note">The notebook could not be shown: {esc(why)}.</p>' if why else ""
    found = bindings(cells)
    source = dict(cells)
    marks: dict[int, set[int]] = {}
    labels: dict[int, list[str]] = {}
    warnings, missing, replaced = [], [], set()
    for name in names:
        chain = graded_bindings(found, name)
        if not chain or chain[0].kind == "del":
            missing.append(name if not chain else f"{name} (deleted in {chain[0].where})")
            continue
        for b in chain:
            marks.setdefault(b.cell, set()).update(range(b.line, b.end + 1))
            labels.setdefault(b.cell, []).append(f"{b.name} ({b.kind}, {b.where.split(', ')[1]})")
        every = [b for b in found if b.name == name]
        replaced |= {b.cell for b in every if b not in chain}
        via = "".join(f"; it is `{_first_line(source[b.cell], b)}`, so the code is that of {b.alias}, bound in "
                      f"{chain[i + 1].where}" for i, b in enumerate(chain[:-1]))
        if len(every) > 1:
            warnings.append(f"{name} is bound {len(every)} times (" + "; ".join(f"{b.where}: {b.kind}" for b in every)
                            + f"): the grader probed the last one, in {chain[0].where}{via}.")
        elif via:
            warnings.append(f"{name} is bound in {chain[0].where}{via}.")
        late = [d for d in found if d.name == DYNAMIC and d.seq > chain[0].seq]
        if late:
            warnings.append(f"After that, {', '.join(f'{d.where} ({d.kind})' for d in late[:3])} may rebind "
                            f"{name} at run time: read {'it' if len(late) == 1 else 'them'}.")
            for d in late[:3]:
                marks.setdefault(d.cell, set()).update(range(d.line, d.end + 1))
                labels.setdefault(d.cell, []).append(f"{d.kind}, {d.where.split(', ')[1]}")
    out = []
    if warnings:
        out.append('<ul class="notes rebound">' + "".join(f"<li>{esc(w)}</li>" for w in dict.fromkeys(warnings))
                   + "</ul>")
    blocks = "".join(f'<div class="note">cell {n} · binds {esc("; ".join(dict.fromkeys(labels[n])))}</div>'
                     f"<pre>{_marked(source[n], marks[n])}</pre>" for n in sorted(marks))
    if blocks:
        out.append(f"<details open><summary>student code for {esc(q.id)}: what each name was bound to when the "
                   f"notebook ended (marked)</summary>{blocks}</details>")
    old = [n for n in sorted(replaced) if n not in marks]
    if old:
        out.append("<details><summary>earlier bindings, replaced before the notebook ended (not what was graded)"
                   "</summary>" + "".join(f'<div class="note">cell {n}</div><pre>{esc(_clip(source[n], CODE_CHARS))}'
                                          "</pre>" for n in old) + "</details>")
    if missing:
        out.append(f'<p class="note">No cell of the notebook that the grader runs binds {esc(", ".join(missing))}'
                   f"{': ' + esc(why) if why else ''}.</p>")
    return "".join(out)


# --------------------------------------------------------------------------- pages


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
    def parts(self) -> list[str]:
        return [p.part for q in self.manual for p in q.written]


_KIND = {UNRECOGNISED: "unk", UNFINISHED: "fin"}


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
    """A short, distinct column heading per question: its number (q5), or its whole id where numbers repeat
    (m1_tinycharlm and m1_checkpoint)."""
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
    out = ["<h1>Lesson 83 · failure report</h1>",
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

    return _page("Lesson 83 failure report", "\n".join(out))


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
    return _page(f"{part.part} · Lesson 83", "\n".join(body))


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
    return _page(f"{s.id} · Lesson 83", "\n".join(out))


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


def _plain_index(students: list[Student], exc: Exception) -> str:
    rows = "".join(f"<tr><td>{_link(s)}</td><td>{esc(s.status)}</td></tr>" for s in students)
    return _page("Lesson 83 failure report", f"<h1>Lesson 83 · failure report</h1><p class=\"note\">The summary "
                 f"could not be built ({esc(type(exc).__name__)}: {esc(_clip(str(exc), 300))}); the students' pages "
                 f"are below.</p><table>{rows}</table>")


# --------------------------------------------------------------------------- entry point


def _check_replaceable(dest: Path) -> None:
    if dest.exists() and (not dest.is_dir() or (any(dest.iterdir()) and not (dest / MARKER).exists())):
        raise FileExistsError(f"{dest} exists and is not a report written by `{command()} report`; "
                              "choose another --out")


def _swap_in(new: Path, dest: Path) -> None:
    from autograder.release.common import replace_dir

    _check_replaceable(dest)
    replace_dir(new, dest)


def regrade_command(students: list[Student], *, grades: Path, out: Path, config_path: Path) -> str:
    """The commands that grade this batch again (from the folder most submissions came from) and rewrite
    the report."""
    folders = [str(Path(p).parent) for s in students if isinstance(p := s.record.get("path"), str) and p]
    subs = max(set(folders), key=folders.count) if folders else "SUBMISSIONS"
    default = Path(config_path).resolve() == DEFAULT_CONFIG.resolve()
    config = "" if default else f" --config {shlex.quote(str(Path(config_path).resolve()))}"
    run = runnable_command()
    return (f"{run}{config} grade {shlex.quote(subs)} --out {shlex.quote(str(grades))}\n"
            f"{run}{config} report {shlex.quote(str(grades))} --out {shlex.quote(str(out))}")


def write_report(grades: Path, *, out: Path = Path("report"), config_path: Path = DEFAULT_CONFIG) -> Path:
    """Write the report of the batch graded into `grades` to the folder `out`; returns out/index.html.

    Built in a temporary folder beside `out` and renamed into place, so `out` is never half-written. `out`
    defaults to ./report in the current folder (like `grade`'s ./grades), never inside the installed package.
    """
    suite = load_suite(config_path)
    questions = [q for q in suite.questions if q.graded and not q.manual]
    manual = [q for q in suite.questions if q.graded and q.manual]
    parts = [p.part for q in manual for p in q.written]
    students = load_students(grades, limits=suite.config.submissions, parts=parts)
    try:
        merged = merged_scores(grades)
    except MergeError:
        merged = {}  # the grade table says why; the report is written all the same
    out = out.resolve()
    ctx = _Ctx(suite, questions, catalogue(suite) | choice_catalogue(questions), grades.resolve(), merged,
               regrade_command(students, grades=grades.resolve(), out=out, config_path=config_path))
    pages = {s.page: _student_page_or_note(ctx, s) for s in students}  # first: a page that fails marks its student
    groups = clusters(students, questions)
    try:
        index = index_page(ctx, students, groups)
    except Exception as exc:  # noqa: BLE001 - last resort: a plain list of students, so the report is written
        index = _plain_index(students, exc)
    written = {p.part: _written_page_or_note(ctx, q, n, students) for q in manual for n, p in enumerate(q.written)}
    _check_replaceable(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    try:
        (tmp / "students").mkdir()
        (tmp / "written").mkdir()
        (tmp / "index.html").write_text(index, encoding="utf-8", errors="backslashreplace")
        for name, page in pages.items():
            (tmp / "students" / name).write_text(page, encoding="utf-8", errors="backslashreplace")
        for name, page in written.items():
            (tmp / "written" / f"{name}.html").write_text(page, encoding="utf-8", errors="backslashreplace")
        (tmp / "report.csv").write_text(report_csv(students, questions), encoding="utf-8", errors="backslashreplace")
        (tmp / MANUAL_CSV).write_text(manual_csv(ctx, students), encoding="utf-8", errors="backslashreplace")
        (tmp / MARKER).write_text(f"written by `{command()} report`; the whole folder is replaced on the next run\n")
        tmp.chmod(0o755)
        _swap_in(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out / "index.html"
