"""The report command on the demo lesson (tests/conftest.py: demo_course): a small class graded for real, one row per
submission in report.csv, escaping of hostile input, written answers and their merged scores, multiple-choice
counts, the regrade commands, what each name was bound to, stored expected values, and a report written whatever
the results hold. Lesson 83's own report content is in tests/lesson83/test_report.py."""

from __future__ import annotations

import base64
import copy
import csv
import html
import json
import os
import random
import re
import shlex
import shutil
import subprocess
import unicodedata
import zipfile
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import nbformat
import numpy as np
import pytest

from autograder.authoring import suite as suite_module
from autograder.authoring.questions import mc_answers, shuffled
from autograder.authoring.suite import Suite, reference_env
from autograder.cli import main as cli_main
from autograder.config import ROOT
from autograder.course import Course
from autograder.grading.batch import grade_batch
from autograder.grading.judge import grade_namespace
from autograder.model import Status, csv_text, spreadsheet_text
from autograder.release.sample import filled_notebook
from autograder.report import MANUAL_CSV, MARKER, SCRIPT_HASH, record_problem, write_report
from autograder.report import SCRIPT as REPORT_SCRIPT

DEMO_CONFIG = ROOT / "tests" / "fixtures" / "lesson_demo" / "grading_config.yaml"
SCRIPT = "</pre><script>alert(1)</script>"
# a file name a student chose: every character here must be escaped
HOSTILE_ID = "mallory<b>&'\"" + "-without-spaces" * 6
RAISER = f'def center(x):\n    raise ValueError("{SCRIPT}")'
HOSTILE_ANSWER = "Centering removes the offset. </div><script>alert(2)</script> & =1+1"
ESCAPED_ANSWER = "&lt;/div&gt;&lt;script&gt;alert(2)&lt;/script&gt; &amp; =1+1"
# a written answer that would recolour a terminal printing the CSV (ESC), hide a line (CR), ring (BEL), reorder
# what a spreadsheet shows (bidirectional overrides, isolates and marks) and start a formula
BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"
CONTROL_ANSWER = f'=HYPERLINK("http://x.test")\x1b[2J\x1b[31mred\x1b[0m\rhidden\x07\x00\x7f\x85 {BIDI} exe.txt'
REBIND = "def _table(x):\n    return np.zeros(np.shape(x))\n\n\nif True:\n    center = _table"
IDS = {"reference", "blank", "alice", HOSTILE_ID, "carol", "erin", "frank", "grace", "heidi"}
MC = "q2_column_sum"  # the demo lesson's multiple-choice item
WRITTEN = "q3_why"  # its written part


def _answer(nb: nbformat.NotebookNode, part: str, text: str) -> nbformat.NotebookNode:
    """Type `text` into the answer cell of a written part, as a student would (the cell after its prompt)."""
    at = next(n for n, c in enumerate(nb.cells) if f"**`{part}`.**" in c.source)
    nb.cells[at + 1].source = text
    return nb


def _wrong_letter(suite: Suite, var: str) -> str:
    """A wrong option of a multiple-choice item."""
    choice = next(c for q in suite.questions for c in q.choices if c.var == var)
    return next(x for x in "ABCD" if x != shuffled(choice)[1])


def html_escape(text: str) -> str:
    return html.escape(text, quote=True)


@pytest.fixture(scope="module")
def demo(demo_course: Course) -> Course:
    """The demo course, released (its student notebook is the class's template)."""
    return demo_course


@pytest.fixture(scope="module")
def unreleased() -> Course:
    """The demo course as committed, for the tests that need its suite and config only (the quick tier)."""
    return Course.load(DEMO_CONFIG)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory, demo: Course) -> dict[str, Path]:
    """Nine students of the demo lesson graded for real, then reported: ids map to what each submission holds."""
    suite, lesson = demo.suite, demo.lesson
    template = lesson.student_dir / f"{lesson.name}.ipynb"
    mistake = next(m for m in lesson.mistakes if m.id == "center_rows")
    tmp = tmp_path_factory.mktemp("report")
    subs = tmp / "submissions"
    subs.mkdir()
    answers = mc_answers(list(suite.questions))

    def filled(*, extra: dict[str, str] | None = None, picks: dict[str, str] = answers) -> nbformat.NotebookNode:
        return filled_notebook(template, extra=extra, answers=picks, lesson=lesson)

    nbformat.write(filled(), str(subs / "reference.ipynb"))
    shutil.copy(template, subs / "blank.ipynb")
    with zipfile.ZipFile(subs / "alice.zip", "w") as zf:  # a zip upload: the report reads its code in memory
        zf.writestr(template.name, nbformat.writes(filled(extra={"center": mistake.code})))
    nbformat.write(filled(extra={"center": mistake.code + f"\n\n# {SCRIPT}\n"}), str(subs / f"{HOSTILE_ID}.ipynb"))
    nbformat.write(filled(extra={"center": mistake.code}), str(subs / "carol.ipynb"))
    nbformat.write(filled(extra={"center": RAISER}), str(subs / "erin.ipynb"))
    # frank: all code right, one wrong multiple-choice answer and a hostile written answer; heidi: a written answer
    # full of control characters
    frank = filled(picks=answers | {MC: _wrong_letter(suite, MC)})
    nbformat.write(_answer(frank, WRITTEN, HOSTILE_ANSWER), str(subs / "frank.ipynb"))
    nbformat.write(_answer(filled(), WRITTEN, CONTROL_ANSWER), str(subs / "heidi.ipynb"))
    # grace: a clean `def center`, then a later cell binds the name to another function (what is graded)
    grace = filled()
    grace.cells.append(nbformat.v4.new_code_cell(REBIND))
    nbformat.write(grace, str(subs / "grace.ipynb"))
    grades = tmp / "grades"
    summary = grade_batch(subs, out=grades, course=demo, progress=False)
    assert summary.counts() == {"graded": len(IDS)}
    out = tmp / "report"
    index = write_report(grades, out=out, course=demo)
    return {"grades": grades, "out": out, "index": index, "tmp": tmp}


def _page(out: Path, sid: str) -> str:
    """The HTML of a student's page, found through the link the index gives for them."""
    index = (out / "index.html").read_text()
    href = re.search(r'<a href="(students/[^"]+)">' + re.escape(html_escape(sid)) + "</a>", index)
    assert href, f"no link to {sid} in index.html"
    return (out / unquote(html.unescape(href.group(1)))).read_text()


@pytest.mark.sandbox
@pytest.mark.build
def test_report_csv_has_a_row_per_submission_with_its_diagnoses(report: dict[str, Path], demo: Course) -> None:
    suite = demo.suite
    with (report["out"] / "report.csv").open(newline="") as f:
        rows = {r["id"]: r for r in csv.DictReader(f)}
    assert set(rows) == IDS
    auto = [q.id for q in suite.questions if q.graded and not q.manual]
    assert auto == ["q1_center", "q2_pick"]
    assert list(next(iter(rows.values()))) == ["id", "status", "total", *auto, "diagnoses"]
    assert all(r["status"] == "graded" for r in rows.values())
    points = {q.id: q.points for q in suite.questions}
    assert float(rows["reference"]["total"]) == suite.notebook_points and rows["reference"]["diagnoses"] == ""
    assert float(rows["blank"]["total"]) == 0
    for sid in ("alice", HOSTILE_ID, "carol"):
        assert rows[sid]["diagnoses"].split() == ["center_rows"], rows[sid]
        assert float(rows[sid]["q1_center"]) < points["q1_center"]
        assert float(rows[sid]["q2_pick"]) == points["q2_pick"]
    assert float(rows["erin"]["q1_center"]) == 0 and "center_rows" not in rows["erin"]["diagnoses"]
    assert float(rows["frank"]["q1_center"]) == points["q1_center"] and float(rows["frank"]["q2_pick"]) == 0


@pytest.mark.sandbox
@pytest.mark.build
def test_student_pages_escape_hostile_input(report: dict[str, Path]) -> None:
    out = report["out"]
    pages = [out / "index.html", *sorted((out / "students").glob("*.html")), *sorted((out / "written").glob("*"))]
    assert len(pages) == 1 + len(IDS) + 1 and (out / MARKER).exists()
    for page in pages:  # one script, the report's own, allowed by its hash: nothing a student wrote can run
        text = page.read_text()
        assert text.lower().count("<script") == 1 and f"<script>{REPORT_SCRIPT}</script>" in text, page.name
        assert f"script-src 'sha256-{SCRIPT_HASH}'" in text and "script-src 'unsafe-inline'" not in text, page.name
        assert "No cell of the notebook defines ." not in text, page.name  # no empty names in messages
    mallory = _page(out, HOSTILE_ID)
    assert "# &lt;/pre&gt;&lt;script&gt;alert(1)&lt;/script&gt;" in mallory  # their code cell, escaped
    assert "def center(x):" in mallory and f"<h1>{html_escape(HOSTILE_ID)}</h1>" in mallory
    erin = _page(out, "erin")  # an exception message the student wrote, escaped too
    assert "ValueError: &lt;/pre&gt;&lt;script&gt;alert(1)&lt;/script&gt;" in erin
    alice = _page(out, "alice")  # code read from inside the zip, expected-versus-received with wrong cells
    assert "x.mean(axis=1, keepdims=True)" in alice
    assert 'class="grid"' in alice and "<td class=bad>" in alice and "q1_center/small" in alice


@pytest.mark.sandbox
@pytest.mark.build
def test_written_answers_have_pages_a_sheet_and_a_place_on_the_student_page(report: dict[str, Path],
                                                                             demo: Course) -> None:
    out = report["out"]
    written = next(q for q in demo.suite.questions if q.manual).written
    assert [p.part for p in written] == [WRITTEN]
    index = (out / "index.html").read_text()
    assert f'href="written/{WRITTEN}.html"' in index
    page = (out / "written" / f"{WRITTEN}.html").read_text()
    assert html_escape(written[0].answer) in page and html_escape(written[0].prompt) in page
    # frank's answer, escaped, in the row that links to his page; the others say they left the template as it was
    row = re.search(r'<tr><td><a href="../students/frank.html">frank</a></td>.*?</tr>', page, re.S)
    assert row and ESCAPED_ANSWER in row.group(0), page[-3000:]
    assert re.search(r'<a href="../students/carol.html">carol</a></td>.*?left as the template had it', page, re.S)
    frank = _page(out, "frank")
    assert ESCAPED_ANSWER in frank and html_escape(written[0].answer) in frank  # the model answer beside it
    with (out / MANUAL_CSV).open(newline="") as f:
        sheet = {r["id"]: r for r in csv.DictReader(f)}
    assert list(next(iter(sheet.values())))[:3] == ["id", WRITTEN, "comment"]
    assert sheet["frank"][f"{WRITTEN} answer"] == HOSTILE_ANSWER and sheet["frank"][WRITTEN] == ""
    assert HOSTILE_ID in sheet and sheet["blank"][f"{WRITTEN} answer"] == ""


@pytest.mark.sandbox
@pytest.mark.build
def test_merged_written_scores_show_in_the_report(report: dict[str, Path], demo: Course, tmp_path: Path) -> None:
    grades = tmp_path / "grades"
    shutil.copytree(report["grades"], grades)
    sheet = (report["out"] / MANUAL_CSV).read_text()
    filled = re.sub(r"^frank,,", "frank,2.5,", sheet, flags=re.M)
    assert filled != sheet
    (tmp_path / "scores.csv").write_text(filled)
    assert cli_main(["--config", str(demo.path), "merge", str(grades), str(tmp_path / "scores.csv")]) == 0
    index = write_report(grades, out=tmp_path / "report", course=demo)
    row = re.search(r'<tr><td><a href="students/frank.html">frank</a>.*?</tr>', index.read_text(), re.S).group(0)
    assert '<td class="num">2.5</td>' in row
    assert "2.5 / 3" in _page(tmp_path / "report", "frank")


@pytest.mark.sandbox
@pytest.mark.build
def test_multiple_choice_counts_each_option(report: dict[str, Path], demo: Course) -> None:
    index = (report["out"] / "index.html").read_text()
    question = next(q for q in demo.suite.questions if q.choices)
    choice = next(c for c in question.choices if c.var == MC)
    shown, right = shuffled(choice)
    wrong = _wrong_letter(demo.suite, MC)

    def row(letter: str) -> str:
        found = re.search(rf'<tr id="{question.id}--{MC}:{letter}">(.*?)</tr>', index, re.S)
        assert found, f"no row for option {letter}"
        return found.group(1)

    # the right option: everyone but blank (no answer) and frank (the wrong one), with its reason
    assert re.search(rf'<td class="num">{len(IDS) - 2}<span class="bar">', row(right))
    assert html_escape(choice.why) in row(right)
    assert re.search(r'<td class="num">1<span class="bar">', row(wrong)) and ">frank</a>" in row(wrong)
    assert re.search(r'<td class="num">1<span class="bar">', row("invalid")) and ">blank</a>" in row("invalid")
    assert "{{" not in index
    assert f'href="#{question.id}--{MC}:{wrong}"' in index  # the overview links to the option


@pytest.mark.sandbox
@pytest.mark.build
def test_index_links_files_prints_the_regrade_command_and_names_columns(report: dict[str, Path],
                                                                       demo: Course) -> None:
    out, grades = report["out"], report["grades"]
    index = (out / "index.html").read_text()
    # runnable as printed, the virtual environment active or not: the console script by its full path, with the
    # course's config (not the package's own)
    commands = html.unescape(re.search(r'id="regrade">.*?<pre>(.*?)</pre>', index, re.S).group(1))
    grade, again = [shlex.split(line) for line in commands.splitlines()]
    assert grade[1:] == ["--config", str(demo.path), "grade", str(report["tmp"] / "submissions"), "--out", str(grades)]
    assert again[1:] == ["--config", str(demo.path), "report", str(grades), "--out", str(out)]
    assert grade[0] == again[0] and Path(grade[0]).is_absolute() and os.access(grade[0], os.X_OK), grade[0]
    head = re.search(r'<table class="sortable scores" id="students"><thead><tr>(.*?)</tr>', index).group(1)
    columns = re.findall(r'<th data-col="([^"]+)"[^>]*>([^<]+)</th>', head)  # each question by its short name
    assert columns == [("student", "student"), ("status", "status"), ("total", "total"), ("q1_center", "q1"),
                       ("q2_pick", "q2"), ("q3_explain", "q3 (by hand)"), ("diagnoses", "diagnoses")], columns
    alice = _page(out, "alice")
    assert f'href="{(report["tmp"] / "submissions" / "alice.zip").as_uri()}"' in alice
    assert f"{shlex.quote(grade[0])} --config {shlex.quote(str(demo.path))} grade" in alice


@pytest.mark.sandbox
@pytest.mark.build
def test_every_csv_escapes_control_and_bidirectional_characters_and_formulas(report: dict[str, Path]) -> None:
    """report.csv, manual_scores.csv and grades.csv: no raw control (but newline and tab) or bidirectional
    character anywhere, no cell that a spreadsheet would read as a formula; heidi's hostile answer is there,
    escaped."""
    files = [report["out"] / "report.csv", report["out"] / MANUAL_CSV, report["grades"] / "grades.csv"]
    for path in files:
        text = path.read_text(encoding="utf-8")
        raw = sorted({hex(ord(c)) for c in text if c in BIDI or (unicodedata.category(c) == "Cc" and c not in "\n\t")})
        assert not raw, (path.name, raw)
        with path.open(newline="", encoding="utf-8") as f:
            cells = [c for row in csv.reader(f) for c in row]
        assert not [c for c in cells if c[:1] in ("=", "+", "-", "@", "\t", "\r")], path.name
    with (report["out"] / MANUAL_CSV).open(newline="", encoding="utf-8") as f:
        sheet = {r["id"]: r for r in csv.DictReader(f)}
    shown = sheet["heidi"][f"{WRITTEN} answer"]
    assert shown == spreadsheet_text(CONTROL_ANSWER) and shown.startswith("'=HYPERLINK(")
    assert "\\x1b[2J\\x1b[31mred\\x1b[0m\\x0dhidden\\x07\\x00\\x7f\\x85" in shown
    assert "\\u202a\\u202b\\u202c\\u202d\\u202e\\u2066\\u2067\\u2068\\u2069\\u200e\\u200f\\u061c" in shown


def test_spreadsheet_text_keeps_plain_text_and_escapes_the_rest() -> None:
    plain = "two\nlines\tand a tab, ünïcödé, 名前, עברית"
    assert spreadsheet_text(plain) == plain
    assert spreadsheet_text("-1") == "'-1" and spreadsheet_text("\r=1") == "\\x0d=1"  # escaped: no longer a formula
    for c in BIDI:
        assert spreadsheet_text(f"a{c}b") == f"a\\u{ord(c):04x}b"
    assert csv_text([["id", "x"], ["=1+1", 2.5]]) == "id,x\n'=1+1,2.5\n"


@pytest.mark.sandbox
@pytest.mark.build
def test_student_page_shows_what_each_name_was_bound_to_when_the_notebook_ended(report: dict[str, Path]) -> None:
    """grace's notebook has the reference's clean `def center`; a later cell binds the name to a function that
    returns zeros. Her page shows that cell, the lines marked, says the name was rebound, and folds the clean def
    away as replaced."""
    page = _page(report["out"], "grace")
    q1 = re.search(r'<h3 id="q1_center">.*?</section>', page, re.S).group(0)
    assert re.search(r"center is bound 2 times \(cell \d+, lines 1–\d+: def; cell (\d+), line 6: assignment\)"
                     r": the grader probed the last one, in cell \1, line 6; it is `center = _table`, so the "
                     r"code is that of _table, bound in cell \1, lines 1–2", q1), q1
    graded, replaced = re.search(r"<details open>(.*?)</details><details>(.*?)</details>", q1, re.S).groups()
    assert "<mark>    center = _table</mark>" in graded and "<mark>def _table(x):</mark>" in graded
    assert "def center" not in graded
    assert "earlier bindings, replaced before the notebook ended" in replaced and "def center" in replaced
    frank = _page(report["out"], "frank")  # q2: each answer bound once, nothing to warn about
    assert "student code for q2_pick" in frank and "is bound" not in frank


def test_grade_and_report_write_here_and_print_a_command_that_runs_as_printed(
        tmp_path: Path, unreleased: Course, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`grade` without --out writes ./grades in the current folder (never into the package), and prints the
    report command with the full path of the executable, the course's config and the report's folder beside the
    grades: it runs as printed from another folder, without the virtual environment on PATH, and writes the report
    beside the grades, not into whatever folder the user is in (issue 42, finding 8)."""
    subs, course, elsewhere = tmp_path / "subs", tmp_path / "course", tmp_path / "elsewhere"
    for folder in (subs, course, elsewhere):
        folder.mkdir()
    monkeypatch.chdir(course)
    assert cli_main(["--config", str(unreleased.path), "grade", str(subs), "--quiet"]) == 0
    assert (course / "grades" / "grades.csv").is_file() and (course / "grades" / "summary.json").is_file()
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("TA report: "))
    argv = shlex.split(line.removeprefix("TA report: "))
    assert argv[1:] == ["--config", str(unreleased.path), "report", str(course / "grades"), "--out",
                        str(course / "report")], argv
    assert Path(argv[0]).is_absolute(), argv
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"} | {"PATH": "/usr/bin:/bin"}
    done = subprocess.run(argv, cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == str(course / "report" / "index.html")
    assert list(elsewhere.iterdir()) == []


@pytest.mark.sandbox
@pytest.mark.build
def test_report_replaces_itself_but_nothing_else(report: dict[str, Path], demo: Course,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    config = ["--config", str(demo.path)]
    assert cli_main([*config, "report", str(report["grades"]), "--out", str(report["out"])]) == 0
    assert capsys.readouterr().out.strip() == str(report["index"])
    other = report["tmp"] / "not-a-report"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    assert cli_main([*config, "report", str(report["grades"]), "--out", str(other)]) == 2
    assert (other / "keep.txt").read_text() == "mine" and sorted(p.name for p in other.iterdir()) == ["keep.txt"]
    assert not [p for p in report["tmp"].iterdir() if ".tmp-" in p.name]  # no temporary folder left behind


@pytest.mark.sandbox
@pytest.mark.build
def test_results_store_what_they_were_judged_against(report: dict[str, Path], demo: Course) -> None:
    """Each result keeps the suite's fingerprint, and each failed case that ran the reference value it was
    judged against (the report shows those, never values recomputed at report time)."""
    suite, checks = demo.suite, demo.lesson.checks
    record = json.loads((report["grades"] / "results" / "carol.json").read_text())
    assert record["fingerprint"] == suite.fingerprint
    shown = [c for c in record["cases"] if not c["passed"] and c["received"] is not None]
    assert shown and all(c["expected"] == checks.to_plain(suite.expected[c["id"]]["value"]) for c in shown)
    assert all(c["expected"] is None for c in record["cases"] if c["passed"])


def _fill_arrays(plain: object, value: float, checks: Any) -> object:
    """Plain probe data with every array's values replaced by `value` (same shape and dtype)."""
    if isinstance(plain, dict) and "__ndarray__" in plain:
        return checks.to_plain(np.full_like(checks.from_plain(plain), value))
    if isinstance(plain, dict):
        return {k: _fill_arrays(v, value, checks) for k, v in plain.items()}
    if isinstance(plain, list):
        return [_fill_arrays(v, value, checks) for v in plain]
    return plain


@pytest.mark.sandbox
@pytest.mark.build
def test_report_shows_the_stored_expected_values_and_says_when_the_suite_changed(
        report: dict[str, Path], demo: Course, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A result judged against another version of the tests: its page shows the expected values stored with
    it (here made up, 4242.5 everywhere) and says so; a result of an older grader, stored without them, says
    that instead; the report never computes the reference values."""
    grades = tmp_path / "grades"
    shutil.copytree(report["grades"], grades)
    carol = json.loads((grades / "results" / "carol.json").read_text())
    carol["fingerprint"] = "0123456789abcdef"
    for c in carol["cases"]:
        c["expected"] = _fill_arrays(c["expected"], 4242.5, demo.lesson.checks)
    (grades / "results" / "carol.json").write_text(json.dumps(carol))
    grace = json.loads((grades / "results" / "grace.json").read_text())
    grace.pop("fingerprint")
    for c in grace["cases"]:
        c.pop("expected")
    (grades / "results" / "grace.json").write_text(json.dumps(grace))
    fresh = Course.load(demo.path)  # nothing computed yet: the report must not ask for the reference values
    monkeypatch.setattr(suite_module, "expected_values", lambda questions: pytest.fail("recomputed expected values"))
    write_report(grades, out=tmp_path / "report", course=fresh)
    index = (tmp_path / "report" / "index.html").read_text()
    assert "2 results were judged against another version of the tests" in index
    page = _page(tmp_path / "report", "carol")
    assert "Judged against another version of the tests (suite 0123456789abcdef" in page
    assert "4242.5000" in page and "4242.5000" not in _page(report["out"], "carol")
    page = _page(tmp_path / "report", "grace")
    assert "a version of the suite that stored no fingerprint" in page
    assert "The expected value was not stored with this result" in page
    assert "Judged against another version" not in _page(tmp_path / "report", "alice")


def _random_json(rng: random.Random, depth: int = 0) -> object:
    """A seeded random JSON value, hostile on purpose: lone surrogates, NaN, huge numbers, odd arrays."""
    kind = rng.choice(["none", "bool", "int", "float", "str", "str", "array"] + (["list", "dict"] if depth < 3 else []))
    if kind == "none":
        return None
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "int":
        return rng.choice([0, -1, 10**400, rng.randint(-10**9, 10**9)])
    if kind == "float":
        return rng.choice([0.0, float("nan"), float("inf"), -float("inf"), 1e308, rng.random()])
    if kind == "str":
        return rng.choice(["", "\ud800", "<script>alert(1)</script>", "=1+1", "x" * rng.randint(0, 20_000),
                           "".join(chr(rng.randint(1, 0x10FFFF)) for _ in range(20))])
    if kind == "array":
        return {"__ndarray__": rng.choice([base64.b64encode(rng.randbytes(rng.choice([0, 8, 48]))).decode(), "!!", 7]),
                "dtype": rng.choice(["<f8", "<i4", "|b1", "<U3", "O", "zz", 5]),
                "shape": rng.choice([[0, 3, 2], [1] * 70, [2, -1], [], "x", [10**12, 0], [6], [2, 3]])}
    if kind == "list":
        return [_random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {rng.choice(["value", "error", "type", "message", "ppl", "claimed", "128"]): _random_json(rng, depth + 1)
            for _ in range(rng.randint(0, 4))}


@pytest.fixture(scope="module")
def base_record(unreleased: Course) -> dict:
    """A real result whose q1 cases failed with a zero-size 3-D array (no sandbox: the reference, patched)."""
    env = reference_env(unreleased.suite) | {"center": lambda x: np.zeros((0, 3, 2))}
    record = grade_namespace(unreleased.suite, env, name="base").to_dict()
    assert any(not c["passed"] and c["received"] for c in record["cases"])
    return json.loads(json.dumps(record))


def _mutant(rng: random.Random, base: dict) -> object:
    record = copy.deepcopy(base)
    for _ in range(rng.randint(1, 3)):
        failed = [c for c in record.get("cases", []) if isinstance(c, dict) and not c.get("passed")] \
            if isinstance(record.get("cases"), list) else []
        where = rng.choice(["top", "case", "received"] if failed else ["top"])
        if where == "top":
            record[rng.choice([*base, "extra"])] = _random_json(rng)
        elif where == "case":
            rng.choice(failed)[rng.choice(["id", "question", "passed", "hidden", "message", "diagnosis", "received",
                                           "points", "max_points"])] = _random_json(rng)
        else:
            case = rng.choice(failed)
            if isinstance(case.get("received"), dict) and case["received"]:
                case["received"][rng.choice(list(case["received"]))] = _random_json(rng)
            else:
                case["received"] = _random_json(rng)
    return record


def test_report_is_written_whatever_the_results_hold(tmp_path: Path, unreleased: Course,
                                                     base_record: dict) -> None:
    rng = random.Random(83)
    lone = copy.deepcopy(base_record)
    next(c for c in lone["cases"] if not c["passed"])["message"] = "half a character: \ud800"
    many = copy.deepcopy(base_record)
    next(c for c in many["cases"] if not c["passed"])["received"] = {
        "value": {"__ndarray__": "", "dtype": "<f8", "shape": [1] * 40 + [0]}}
    records: list[object] = [base_record, lone, many, [], None, "text", {"status": 5},
                             *(_mutant(rng, base_record) for _ in range(80))]
    grades = tmp_path / "grades"
    (grades / "results").mkdir(parents=True)
    rows = []
    for n, record in enumerate(records):
        name = f"s{n:03d}.json"
        (grades / "results" / name).write_text(json.dumps(record))
        rows.append({"id": f"s{n:03d}", "result": name, "status": "graded", "message": ""})
    (grades / "results" / "broken.json").write_bytes(b'{"status": "graded", "cases": [' * 50_000)
    rows += [{"id": "broken", "result": "broken.json"},
             {"id": "left", "result": None, "status": "not graded", "message": "the sandbox failed; run it again"}]
    (grades / "summary.json").write_text(json.dumps({"rows": rows}))
    index = write_report(grades, out=tmp_path / "report", course=unreleased)
    text = index.read_text()
    assert len(list((tmp_path / "report" / "students").glob("*.html"))) == len(rows)
    unusable = [n for n, r in enumerate(records) if record_problem(r)]
    assert 10 < len(unusable) < len(records) - 3  # the fuzz reaches both kinds
    for n in [*unusable, "broken"]:
        sid = f"s{n:03d}" if isinstance(n, int) else n
        shown = rf'<span class="status bad">{Status.UNUSABLE}</span></td><td><a href="[^"]+">{sid}</a>'
        assert re.search(shown, text), sid
    assert re.search(r'<span class="status bad">not graded</span></td><td><a href="[^"]+">left</a>', text)
    assert "empty, shape [0, 3, 2]" in _page(tmp_path / "report", "s000")  # the zero-size array, shown as such
    assert "half a character: \\ud800" in _page(tmp_path / "report", "s001")
