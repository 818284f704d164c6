"""The report knows no lesson: its code names nothing of Lesson 83, and the demo lesson's report is titled and
filled from the demo lesson alone (no sandbox: results judged in-process, as the grader stores them)."""

from __future__ import annotations

import json
import keyword
import re
from pathlib import Path

import pytest

from autograder.authoring.suite import Suite, reference_env
from autograder.config import runnable_command
from autograder.course import Course, course_of
from autograder.grading.judge import grade_namespace
from autograder.report import write_report
from autograder.report.model import lesson_title

REPORT = Path(__file__).resolve().parents[2] / "autograder" / "report"
DEMO_CONFIG = Path(__file__).resolve().parents[1] / "fixtures" / "lesson_demo" / "grading_config.yaml"


def lesson_words(suite: Suite) -> set[str]:
    """What a report written for one lesson only would name: the lesson's name and title, its question ids, the
    names its stubs and choices bind, its mistake ids, its milestone's case ids, schemes, model class and files."""
    lesson = suite.lesson
    title = lesson_title(suite)
    words = {lesson.name, title, title.split(":")[0]}
    words |= {q.id for q in suite.questions} | {n for q in suite.questions for n in q.solution}
    words |= {c.var for q in suite.questions for c in q.choices} | {m.id for m in lesson.mistakes}
    words |= {c.known_cause["id"] for c in suite.cases if c.known_cause}
    words |= {c.id for c in suite.checkpoint_cases}
    if lesson.checkpoint_dir.is_dir():
        words |= {p.name for p in lesson.checkpoint_dir.iterdir()}
    if lesson.trainer_file is not None:
        words |= set(getattr(lesson.trainer, "SCHEMES", ())) | {lesson.milestone_model.__name__}
    # a scheme named like a Python constant (`none`) is an ordinary word of the code, not the lesson's
    return {w for w in words if w and not keyword.iskeyword(w.capitalize())}


def test_the_report_code_names_nothing_of_the_default_lesson() -> None:
    words = lesson_words(course_of().suite)
    assert len(words) > 20  # the lesson's words were found (a scan for nothing would pass)
    found = []
    for path in sorted(p for p in REPORT.rglob("*") if p.is_file() and p.suffix in (".py", ".j2", ".css", ".js")):
        text = path.read_text(encoding="utf-8")
        for word in words:
            for m in re.finditer(r"(?<![\w.])" + re.escape(word) + r"(?!\w)", text):
                found.append(f"{path.relative_to(REPORT)}:{text.count(chr(10), 0, m.start()) + 1}: {word}")
    assert found == []


@pytest.fixture(scope="module")
def demo_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo lesson's report of two results stored as the grader stores them: the reference and a blank
    notebook (every stub left empty)."""
    suite = course_of(DEMO_CONFIG).suite
    grades = tmp_path_factory.mktemp("demo") / "grades"
    (grades / "results").mkdir(parents=True)
    for name, env in (("reference", reference_env(suite)), ("blank", {})):
        record = grade_namespace(suite, env, name=name).to_dict()
        (grades / "results" / f"{name}.json").write_text(json.dumps(record))
    write_report(grades, out=grades.parent / "report", course=Course.load(DEMO_CONFIG))
    return grades.parent / "report"


def test_the_demo_lessons_report_is_titled_from_the_demo_lesson(demo_report: Path) -> None:
    demo = course_of(DEMO_CONFIG).suite
    title = lesson_title(demo)
    assert title == next(q.title for q in demo.questions if q.kind == "prose")  # the lesson's own heading
    pages = {p.relative_to(demo_report).as_posix(): p.read_text(encoding="utf-8")
             for p in demo_report.rglob("*.html")}
    assert {"index.html", "students/reference.html", "students/blank.html"} <= set(pages)
    assert f"<h1>{title} · failure report</h1>" in pages["index.html"]
    for name, page in pages.items():
        assert re.search(r"<title>[^<]*" + re.escape(title) + "[^<]*</title>", page), name
    other = lesson_words(course_of().suite) - lesson_words(demo)
    shown = [page.replace(runnable_command(), "COMMAND") for page in pages.values()]  # the package's own name
    named = {w for w in other for page in shown if re.search(r"(?<![\w.])" + re.escape(w) + r"(?!\w)", page)}
    assert named == set()


def test_a_page_that_cannot_be_built_becomes_a_note_and_the_rest_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The index and a written part's page fall back to a plain page naming the error (escaped); the students'
    pages are written all the same."""
    from autograder.report import render, write

    def broken(*args: object, **kwargs: object) -> str:
        raise ValueError("<script>alert(1)</script>")

    monkeypatch.setattr(write, "index_page", broken)
    monkeypatch.setattr(render, "written_page", broken)
    suite = course_of(DEMO_CONFIG).suite
    grades = tmp_path / "grades"
    (grades / "results").mkdir(parents=True)
    (grades / "results" / "reference.json").write_text(
        json.dumps(grade_namespace(suite, reference_env(suite), name="reference").to_dict()))
    index = write_report(grades, out=tmp_path / "report", course=Course.load(DEMO_CONFIG)).read_text()
    title = lesson_title(suite)
    assert f"<h1>{title} · failure report</h1>" in index
    assert "The summary could not be built (ValueError: &lt;script&gt;alert(1)&lt;/script&gt;)" in index
    assert '<a href="students/reference.html">reference</a>' in index
    written = [p.read_text() for p in (tmp_path / "report" / "written").glob("*.html")]
    assert written and all("This page could not be built (ValueError: &lt;script&gt;" in w for w in written)
    assert "<script>alert" not in index + "".join(written)
    assert (tmp_path / "report" / "students" / "reference.html").is_file()
