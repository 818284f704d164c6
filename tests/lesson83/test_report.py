"""The report of a graded Lesson 83 class: its diagnoses in report.csv, its code, facts and milestone columns on
the pages, its multiple-choice misconceptions, gate-only failures, and the report in headless Chromium. The report's
engine behaviour (escaping, written answers, merged scores, regrade commands, stored expected values, any result
held) is tested on the demo lesson: tests/engine/test_report_engine.py."""

from __future__ import annotations

import csv
import html as html_module
import json
import os
import re
import shutil
import struct
import subprocess
import zipfile
from pathlib import Path

import nbformat
import pytest

from autograder.authoring.questions import mc_answers, shuffled
from autograder.authoring.suite import Suite
from autograder.config import DEFAULT_CONFIG, ROOT
from autograder.course import Course, course_of
from autograder.grading.batch import grade_batch
from autograder.release.sample import filled_notebook
from autograder.report import (
    UNFINISHED,
    UNRECOGNISED,
    plain_math,
    write_report,
)
from autograder.report.model import lesson_title
from reference.lesson83_mistakes import MISTAKES

TEMPLATE = ROOT / "student_templates" / "lesson83" / "lesson83.ipynb"
ARTIFACTS = ROOT / "dist" / "test-artifacts"  # dist/ is not committed; CI keeps the screenshots from here
MISTAKE = {m.id: m for m in MISTAKES}
SCRIPT = "</pre><script>alert(1)</script>"
# a file name a student chose: every character here must be escaped, and its 90 characters without a break must
# not widen any table or heading of the report
HOSTILE_ID = "mallory<b>&'\"" + "-without-spaces" * 6
RAISER = f'def sinusoidal_pe(max_len, d):\n    raise ValueError("{SCRIPT}")'
HOSTILE_ANSWER = "A buffer moves with .to() but is not trained. </div><script>alert(2)</script> & =1+1"
# a written answer that would recolour a terminal printing the CSV (ESC), hide a line (CR), ring (BEL), reorder
# what a spreadsheet shows (bidirectional overrides, isolates and marks) and start a formula
BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"
CONTROL_ANSWER = f'=HYPERLINK("http://x.test")\x1b[2J\x1b[31mred\x1b[0m\rhidden\x07\x00\x7f\x85 {BIDI} exe.txt'
# a table three times too large (no genuine attempt: far from the reference, yet every relative-position property
# holds of it) and zeros for an odd d (no ValueError)
REBIND = """def _table(max_len, d):
    if d % 2:
        return np.zeros((max_len, d))
    pos = np.arange(max_len)[:, None]
    ang = pos / 10000 ** (np.arange(0, d, 2)[None, :] / d)
    pe = np.zeros((max_len, d))
    pe[:, 0::2], pe[:, 1::2] = 3 * np.sin(ang), 3 * np.cos(ang)
    return pe


if True:
    sinusoidal_pe = _table"""


def _answer(nb: nbformat.NotebookNode, part: str, text: str) -> nbformat.NotebookNode:
    """Type `text` into the answer cell of a written part, as a student would (the cell after its prompt)."""
    at = next(n for n, c in enumerate(nb.cells) if f"**`{part}`.**" in c.source)
    nb.cells[at + 1].source = text
    return nb


def _wrong_letter(suite: Suite, var: str) -> tuple[str, str]:
    """A wrong option of a multiple-choice item, and the option's source index (0 is the right one)."""
    choice = next(c for q in suite.questions for c in q.choices if c.var == var)
    shown, right = shuffled(choice)
    letter = next(x for x in "ABCD" if x != right)
    return letter, choice.options.index(shown["ABCD".index(letter)])


def _with_mistake(mistake_id: str, answers: dict[str, str], *, tail: str = "") -> nbformat.NotebookNode:
    m = MISTAKE[mistake_id]
    target = re.search(r"^(?:def|class) (\w+)", m.code, re.M).group(1)
    return filled_notebook(TEMPLATE, extra={target: m.code + tail}, answers=answers, lesson=course_of().lesson)


@pytest.fixture(scope="module")
def suite() -> Suite:
    return course_of(DEFAULT_CONFIG).suite  # the cache entry grade_batch and write_report use: computed once


@pytest.fixture(scope="module")
def report(course: Course, tmp_path_factory: pytest.TempPathFactory, suite: Suite) -> dict[str, Path]:
    """Seven students graded for real, then reported: ids map to what each submission holds."""
    tmp = tmp_path_factory.mktemp("report")
    subs = tmp / "submissions"
    subs.mkdir()
    answers = mc_answers(list(suite.questions))
    nbformat.write(filled_notebook(TEMPLATE, answers=answers, lesson=suite.lesson), str(subs / "reference.ipynb"))
    shutil.copy(TEMPLATE, subs / "blank.ipynb")
    buf = nbformat.writes(_with_mistake("rope_interleaved", answers))
    with zipfile.ZipFile(subs / "alice.zip", "w") as zf:  # a zip upload: the report reads its code in memory
        zf.writestr("lesson83.ipynb", buf)
    nbformat.write(_with_mistake("rope_interleaved", answers, tail=f"\n\n# {SCRIPT}\n"),
                   str(subs / f"{HOSTILE_ID}.ipynb"))
    nbformat.write(_with_mistake("rope_rotates_v", answers), str(subs / "carol.ipynb"))
    nbformat.write(_with_mistake("alibi_sign_flipped", answers), str(subs / "dave.ipynb"))
    nbformat.write(filled_notebook(TEMPLATE, extra={"sinusoidal_pe": RAISER}, answers=answers, lesson=suite.lesson),
                   str(subs / "erin.ipynb"))
    # frank: all code right, one wrong multiple-choice answer, and written answers (one of them hostile)
    frank = filled_notebook(TEMPLATE, answers=answers | {"q8_pe_value": _wrong_letter(suite, "q8_pe_value")[0]},
                            lesson=suite.lesson)
    _answer(frank, "q9_buffer", HOSTILE_ANSWER)
    _answer(frank, "q9_alibi", "No table: the bias is a formula for every distance.")
    _answer(frank, "q9_rope_v", CONTROL_ANSWER)
    nbformat.write(frank, str(subs / "frank.ipynb"))
    # grace: a clean `def sinusoidal_pe`, then a later cell binds the name to another function (what is graded)
    grace = filled_notebook(TEMPLATE, answers=answers, lesson=suite.lesson)
    grace.cells.append(nbformat.v4.new_code_cell(REBIND))
    nbformat.write(grace, str(subs / "grace.ipynb"))
    grades = tmp / "grades"
    summary = grade_batch(subs, out=grades, progress=False, course=course)
    assert summary.counts() == {"graded": 9}
    out = tmp / "report"
    index = write_report(grades, out=out, course=course)
    return {"grades": grades, "out": out, "index": index, "tmp": tmp}


def _page(out: Path, sid: str) -> str:
    """The HTML of a student's page, found through the link the index gives for them."""
    index = (out / "index.html").read_text()
    import html

    href = re.search(r'<a href="(students/[^"]+)">' + re.escape(html.escape(sid, quote=True)) + "</a>", index)
    assert href, f"no link to {sid} in index.html"
    from urllib.parse import unquote

    return (out / unquote(html.unescape(href.group(1)))).read_text()


@pytest.mark.sandbox
def test_report_csv_rows_and_diagnoses(report: dict[str, Path], suite: Suite) -> None:
    with (report["out"] / "report.csv").open(newline="") as f:
        rows = {r["id"]: r for r in csv.DictReader(f)}
    assert set(rows) == {"reference", "blank", "alice", HOSTILE_ID, "carol", "dave", "erin", "frank", "grace"}
    auto = [q.id for q in suite.questions if q.graded and not q.manual]
    assert list(next(iter(rows.values()))) == ["id", "status", "total", *auto, "diagnoses"]
    assert all(r["status"] == "graded" for r in rows.values())
    # Nobody in this class uploaded a milestone checkpoint: report.csv keeps that id (the index counts it apart).
    assert all("checkpoint_missing" in r["diagnoses"].split() for r in rows.values())
    diagnoses = {sid: [d for d in r["diagnoses"].split() if d != "checkpoint_missing"] for sid, r in rows.items()}
    assert float(rows["reference"]["total"]) == suite.notebook_points and diagnoses["reference"] == []
    points = {q.id: q.points for q in suite.questions}
    assert float(rows["blank"]["total"]) == 0
    for sid in ("alice", HOSTILE_ID):
        assert "rope_interleaved" in diagnoses[sid]
        assert float(rows[sid]["q5_rope"]) < points["q5_rope"]
        assert float(rows[sid]["q1_equivariance"]) == points["q1_equivariance"]
    assert diagnoses["carol"] == ["rope_rotates_v"]
    assert diagnoses["dave"] == ["alibi_sign_flipped"]
    assert float(rows["erin"]["q2_sinusoidal_pe"]) < points["q2_sinusoidal_pe"]


@pytest.mark.sandbox
def test_lesson83_pages_show_its_code_its_facts_and_its_milestone_columns(report: dict[str, Path]) -> None:
    """Lesson 83's class on its pages (the escaping, the regrade commands and the written answers are the
    engine's: tests/engine/test_report_engine.py): the RoPE code of a student, the expected-versus-received grid
    of a RoPE case, the facts of a blank notebook as key rows, and the milestone's two columns named apart."""
    out = report["out"]
    mallory = _page(out, HOSTILE_ID)
    assert "def apply_rope(x, cos, sin):" in mallory
    alice = _page(out, "alice")  # code read from inside the zip, expected-versus-received with wrong cells
    assert "x1, x2 = x[..., 0::2], x[..., 1::2]" in alice
    assert 'class="grid"' in alice and "<td class=bad>" in alice and "q5_rope/scores_seed42" in alice
    blank = _page(out, "blank")  # facts as key rows, the wrong ones marked
    assert "<tr class=bad><td>buffers</td>" in blank
    index = (out / "index.html").read_text()
    head = re.search(r'<table class="sortable scores" id="students"><thead><tr>(.*?)</tr>', index).group(1)
    labels = re.findall(r">([^<]+)</th>", head)
    assert len(labels) == len(set(labels)) and "m1_tinycharlm" in labels and "m1_checkpoint" in labels, labels


def html_escape(text: str) -> str:
    import html

    return html.escape(text, quote=True)


@pytest.mark.sandbox
def test_multiple_choice_counts_each_option_and_names_its_misconception(report: dict[str, Path],
                                                                        suite: Suite) -> None:
    index = (report["out"] / "index.html").read_text()
    q8 = next(q for q in suite.questions if q.choices)
    choice = next(c for c in q8.choices if c.var == "q8_pe_value")
    shown, right = shuffled(choice)
    wrong, source_index = _wrong_letter(suite, "q8_pe_value")

    def row(letter: str) -> str:
        found = re.search(rf'<tr id="q8_checks--q8_pe_value:{letter}">(.*?)</tr>', index, re.S)
        assert found, f"no row for option {letter}"
        return found.group(1)

    # the right option: 7 students (all but blank and frank), its reason; frank's option: 1, its misconception
    assert re.search(r'<td class="num">7<span class="bar">', row(right)) and html_escape(choice.why) in row(right)
    assert re.search(r'<td class="num">1<span class="bar">', row(wrong)) and ">frank</a>" in row(wrong)
    assert html_escape(choice.misconceptions[source_index - 1]) in row(wrong)
    assert html_escape(plain_math(shown["ABCD".index(wrong)])) in row(wrong)  # rendered text, numbers included
    assert re.search(r"≈ [0-9.]+<", row(wrong))
    assert re.search(r'<td class="num">1<span class="bar">', row("invalid")) and ">blank</a>" in row("invalid")
    assert "{{" not in index
    assert f'href="#q8_checks--q8_pe_value:{wrong}"' in index  # the overview links to the option
    section = re.search(r'<h3 id="q8_checks">.*?</section>', index, re.S).group(0)
    assert UNRECOGNISED not in section  # a wrong answer is no longer "unrecognised"


@pytest.mark.sandbox  # the class graded by the report fixture
def test_gate_only_failures_say_so_instead_of_an_error_diff(report: dict[str, Path]) -> None:
    """grace's table, three times too large, fails q2's value cases; the relative-position identity holds of it,
    so it failed only by its gate: the page says it was not checked, with no message or expected-versus-received
    table. The odd-d case fails on its own too: it shows what its own check says, not the gate's words."""
    page = _page(report["out"], "grace")
    gated = re.search(r'<div class="case gated" id="q2_sinusoidal_pe/relative_identity_d4">(.*?)</div>', page,
                      re.S)
    assert gated, "relative_identity_d4 is not shown as a gate-only failure"
    assert "Not checked: it needs" in gated.group(1) and 'href="#q2_sinusoidal_pe/table_d4"' in gated.group(1)
    assert "<pre>" not in gated.group(1) and "class=bad" not in gated.group(1)
    odd = re.search(r'<div class="case" id="q2_sinusoidal_pe/odd_d_raises">(.*?)</pre>', page, re.S).group(1)
    assert "and fails on its own" in odd and "it should raise ValueError" in odd and "earns its points only" not in odd


def _rows(html: str, table: str) -> list[tuple[str, bool]]:
    """(student id, hidden) of each row of a sortable table in a dumped DOM, in order."""
    body = re.search(rf'<table class="sortable[^"]*" id="{table}"[^>]*>.*?<tbody>(.*?)</tbody>', html, re.S).group(1)
    rows = re.findall(r"<tr( hidden=\"\")?[^>]*><td[^>]*><a [^>]*>([^<]*)</a>", body)

    return [(html_module.unescape(sid), bool(hidden)) for hidden, sid in rows]


@pytest.mark.sandbox
@pytest.mark.browser
def test_tables_sort_and_search_in_chromium_and_stay_whole_without_scripts(report: dict[str, Path]) -> None:
    exe = _chromium()
    url = report["index"].as_uri()
    default = _rows(report["index"].read_text(), "students")
    assert len(default) == 9 and not any(h for _, h in default)
    with (report["grades"] / "grades.csv").open(newline="") as f:
        totals = {r["id"]: float(r["total"]) for r in csv.DictReader(f)}

    runs = iter(range(100))

    def dump(query: str, *flags: str, page: str = url) -> str:
        return _live_dom(exe, report["tmp"] / f"profile-live-{next(runs)}", f"{page}?{query}", *flags)

    on = dump("sort=students:total:desc")
    order = [sid for sid, _ in _rows(on, "students")]
    assert sorted(order) == sorted(totals) and [totals[s] for s in order] == sorted(totals.values(), reverse=True)
    assert 'data-col="total" class="num" tabindex="0" aria-sort="descending"' in on
    found = dump("q=students:rope_interleaved")
    shown = [sid for sid, hidden in _rows(found, "students") if not hidden]
    assert sorted(shown) == sorted(["alice", HOSTILE_ID]) and 'data-shown="2"' in found
    off = dump("sort=students:total:desc&q=students:rope_interleaved", "--blink-settings=scriptEnabled=false")
    assert _rows(off, "students") == default  # every row, in the batch's order
    assert re.search(r'<input class="filter" type="search" hidden=""', off)
    written = report["out"] / "written" / "q9_buffer.html"
    answers = dump("q=answers:script", page=written.as_uri())
    assert [sid for sid, hidden in _rows(answers, "answers") if not hidden] == ["frank"]
    assert "<script>alert(2)" not in answers  # the student's text stays text in the live DOM


LAYOUT = """(() => {
  const f = document.querySelector('input.filter[data-table="students"]'), r = f && f.getBoundingClientRect();
  return {size: [innerWidth, innerHeight], scrolled: scrollY,
          search: f && !f.hidden ? [r.top, r.bottom, r.left, r.right] : null,
          over: Array.from(document.querySelectorAll('*')).filter(e => e.scrollWidth > e.clientWidth)
            .map(e => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') + ' ' + e.scrollWidth + '>' + e.clientWidth)};
})()"""


@pytest.mark.sandbox
@pytest.mark.browser
def test_first_screen_has_the_search_and_nothing_overflows_at_1280x800(report: dict[str, Path]) -> None:
    """In a 1280 x 800 window: the index's student search is on the first screen, and on every page of the
    report no element is wider inside than its box (scrollWidth > clientWidth: a cut-off column, a table or
    code running off the page)."""
    exe = _chromium()
    out = report["out"]
    pages = [out / "index.html", *sorted((out / "students").glob("*.html")), *sorted((out / "written").glob("*"))]
    browser = _Browser(exe, report["tmp"] / "profile-layout")
    try:
        for page in pages:
            seen = browser.evaluate(browser.open(page.as_uri(), size=(1280, 800)), LAYOUT)
            assert seen["size"] == [1280, 800] and seen["over"] == [], (page.name, seen)
            if page.name == "index.html":
                assert seen["search"] and seen["scrolled"] == 0, seen
                top, bottom, left, right = seen["search"]
                assert 0 <= top < bottom <= 800 and 0 <= left < right <= 1280, seen
    finally:
        browser.close()


FIRST_SCREEN = """(() => {
  const box = e => { const r = e.getBoundingClientRect(); return [r.top, r.bottom]; };
  const q = document.getElementById('questions'), s = document.getElementById('students');
  return {size: [innerWidth, innerHeight], scrolled: scrollY, questions: box(q), students: box(s),
          heading: box(document.getElementById('questions-list')),
          rows: Array.from(q.tBodies[0].rows).map(r => ({id: r.cells[0].getAttribute('data-v'), box: box(r),
            mistakes: r.querySelector('td.mistakes').innerText,
            apart: Array.from(r.querySelectorAll('td.apart .chip'),
                              c => [c.firstChild.innerText, c.lastChild.textContent]),
            top: Array.from(r.querySelectorAll('td.mistakes .cl')).map(cl => [
              cl.querySelector('.chip b').innerText, cl.querySelector('.chip').lastChild.textContent,
              Array.from(cl.querySelectorAll('.who a'), a => a.innerText)])}))};
})()"""


@pytest.mark.sandbox
@pytest.mark.browser
def test_first_screen_says_what_most_students_got_wrong_and_who_at_1280x800(report: dict[str, Path]) -> None:
    """Issue 33, finding 6: in a 1280 x 800 window the index opens on each question's most common mistakes, with
    their counts and students, above the students table; the checkpoint nobody uploaded is counted apart (a
    count of its own), never as a mistake beside the code mistakes."""
    exe = _chromium()
    browser = _Browser(exe, report["tmp"] / "profile-first-screen")
    try:
        seen = browser.evaluate(browser.open(report["index"].as_uri(), size=(1280, 800)), FIRST_SCREEN)
    finally:
        browser.close()
    assert seen["size"] == [1280, 800] and seen["scrolled"] == 0, seen
    assert 0 < seen["heading"][0] < seen["questions"][0] < 400 < seen["questions"][1] <= seen["students"][0], seen
    rows = {r["id"]: r for r in seen["rows"]}
    with_mistakes = [r for r in seen["rows"] if r["mistakes"].strip() != "none"]
    assert {"q5_rope", "q6_rope_attention", "q7_alibi"} <= {r["id"] for r in with_mistakes}, rows
    for r in with_mistakes:  # every question's mistakes, and who made them, are on the first screen
        assert r["box"][1] <= 800, (r["id"], r["box"])
    top = {qid: [(int(n), label, sorted(who)) for n, label, who in r["top"]] for qid, r in rows.items()}
    assert top["q5_rope"] == [(2, "rope_interleaved", sorted(["alice", HOSTILE_ID]))], top  # count, mistake, who
    assert top["q6_rope_attention"] == [(1, "rope_rotates_v", ["carol"])], top
    assert top["q7_alibi"] == [(1, "alibi_sign_flipped", ["dave"])], top
    assert top["m1_tinycharlm"][0] == (2, "rope_interleaved ← q5", sorted(["alice", HOSTILE_ID])), top
    # nobody in this class uploaded a checkpoint: a count apart, not a mistake
    assert not [r["id"] for r in seen["rows"] if "checkpoint_missing" in r["mistakes"] or "uploaded" in r["mistakes"]]
    assert rows["m1_checkpoint"]["apart"] == [["9", "not uploaded"]], rows["m1_checkpoint"]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "report-first-screen.png"
    shot.unlink(missing_ok=True)
    res = _run_chromium(exe, report["tmp"] / "profile-first-screen-shot", f"--screenshot={shot}",
                        "--window-size=1280,800", "--hide-scrollbars", report["index"].as_uri())
    assert res.returncode == 0 and _png_size(shot) == (1280, 800), res.stderr[-2000:]


def _chromium() -> str:
    exe = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
    if exe is None:
        message = "headless Chromium is needed (Debian packages chromium and chromium-driver; `make setup`)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return exe


def _run_chromium(exe: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
           f"--user-data-dir={profile}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


class _Browser:
    """Headless Chromium driven over the DevTools protocol through --remote-debugging-pipe: requests on fd 3,
    answers on fd 4, each a JSON message ended by a NUL byte."""

    def __init__(self, exe: str, profile: Path, *flags: str) -> None:
        import fcntl

        to_r, self.to_w = os.pipe()
        self.from_r, from_w = os.pipe()

        def pipes_to_3_and_4() -> None:
            a, b = fcntl.fcntl(to_r, fcntl.F_DUPFD, 10), fcntl.fcntl(from_w, fcntl.F_DUPFD, 10)
            os.dup2(a, 3)
            os.dup2(b, 4)

        cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--no-first-run", f"--user-data-dir={profile}", "--remote-debugging-pipe", *flags, "about:blank"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=False,
                                     preexec_fn=pipes_to_3_and_4)
        os.close(to_r)
        os.close(from_w)
        self.pending, self.events, self.calls = b"", [], 0

    def call(self, method: str, session: str | None = None, **params: object) -> dict:
        self.calls += 1
        message = {"id": self.calls, "method": method, "params": params} | ({"sessionId": session} if session else {})
        os.write(self.to_w, json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in self.pending:
                chunk = os.read(self.from_r, 1 << 20)
                assert chunk, "chromium closed the DevTools pipe"
                self.pending += chunk
            raw, self.pending = self.pending.split(b"\0", 1)
            reply = json.loads(raw)
            self.events.append(reply.get("method"))
            if reply.get("id") == self.calls:
                assert "error" not in reply, reply
                return reply["result"]

    def open(self, url: str, *, size: tuple[int, int] | None = None, timeout: float = 60.0) -> str:
        """A new tab (`size`: its viewport, CSS pixels) showing `url` once loaded; returns its session."""
        import time

        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Page.enable", session)
        if size:
            self.call("Emulation.setDeviceMetricsOverride", session, width=size[0], height=size[1],
                      deviceScaleFactor=1, mobile=False)
        self.events.clear()
        self.call("Page.navigate", session, url=url)
        end = time.monotonic() + timeout
        while "Page.loadEventFired" not in self.events:
            assert time.monotonic() < end, f"{url} did not load in {timeout:g} s"
            self.call("Browser.getVersion")
            time.sleep(0.1)
        return session

    def evaluate(self, session: str, expression: str) -> object:
        reply = self.call("Runtime.evaluate", session, expression=expression, returnByValue=True)
        assert "exceptionDetails" not in reply, reply
        return reply["result"].get("value")

    def close(self) -> None:
        try:
            self.call("Browser.close")
            self.proc.wait(timeout=30)
        except (AssertionError, OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        os.close(self.to_w)
        os.close(self.from_r)


def _live_dom(exe: str, profile: Path, url: str, *flags: str, timeout: float = 60.0) -> str:
    """The page's DOM once loaded (after its scripts, if they may run), read over the DevTools protocol
    (`--dump-dom` prints nothing when scripts are off, so this asks the browser itself: DOM.getOuterHTML)."""
    browser = _Browser(exe, profile, *flags)
    try:
        session = browser.open(url, timeout=timeout)
        root = browser.call("DOM.getDocument", session, depth=0)["root"]
        return browser.call("DOM.getOuterHTML", session, nodeId=root["nodeId"])["outerHTML"]
    finally:
        browser.close()


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()[:24]
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


@pytest.mark.sandbox
@pytest.mark.browser
def test_index_renders_in_headless_chromium(report: dict[str, Path], suite: Suite) -> None:
    exe = _chromium()
    url = report["index"].as_uri()
    dom = _run_chromium(exe, report["tmp"] / "profile-dom", "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert f"{lesson_title(suite)} · failure report" in html and "q5_rope" in html
    # the RoPE cluster: two students, both named and linked to their pages
    block = re.search(r'<div class="cluster" id="q5_rope--rope_interleaved">.*?(?=<div class="cluster|</section>)',
                      html, re.S)
    assert block, "no rope_interleaved cluster on q5_rope"
    text = block.group(0)
    assert '<span class="count">2</span>' in text
    dumped = HOSTILE_ID.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")  # as the DOM dump writes it
    assert ">alice</a>" in text and f">{dumped}</a>" in text
    assert re.search(r'id="q6_rope_attention--rope_rotates_v".*?<span class="count">1</span>.*?>carol</a>', html, re.S)
    assert re.search(r'id="q7_alibi--alibi_sign_flipped".*?<span class="count">1</span>.*?>dave</a>', html, re.S)
    assert re.search(f'id="q5_rope--{UNFINISHED}".*?>blank</a>', html, re.S)  # stubs left as they were
    assert re.search(f'id="q2_sinusoidal_pe--{UNRECOGNISED}".*?>erin</a>', html, re.S)  # no known cause
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for name, target in (("report-index.png", url), ("report-student.png", _student_url(report["out"], "alice"))):
        shot = ARTIFACTS / name
        shot.unlink(missing_ok=True)
        res = _run_chromium(exe, report["tmp"] / f"profile-{name}", f"--screenshot={shot}", "--window-size=1280,1600",
                            "--hide-scrollbars", target)
        assert res.returncode == 0 and shot.exists(), res.stderr[-2000:]
        assert _png_size(shot) == (1280, 1600) and shot.stat().st_size > 20_000


def _student_url(out: Path, sid: str) -> str:
    return next(p for p in (out / "students").glob("*.html") if p.stem == sid).as_uri()


def test_misconceptions_stay_out_of_the_student_release(suite: Suite) -> None:
    """Each wrong option's misconception (for TAs) would mark it wrong: none is in any file students get."""
    texts = [m for q in suite.questions for c in q.choices for m in c.misconceptions]
    assert len(texts) == 3 * sum(len(q.choices) for q in suite.questions)
    for path in (ROOT / "student_templates").rglob("*"):
        if path.is_file():
            content = path.read_text(errors="replace")
            assert not [m for m in texts if m in content or json.dumps(m)[1:-1] in content], path
