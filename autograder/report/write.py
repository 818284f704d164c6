"""Writing the report folder: load the batch, build every page, write them to a temporary folder and swap it in
atomically (only over a folder an earlier report wrote); the commands that regrade the batch."""

from __future__ import annotations

import shlex
import shutil
import tempfile
from pathlib import Path

from autograder.config import command, runnable_command
from autograder.course import Course
from autograder.grading.gradebook import Gradebook
from autograder.grading.tables import merged_or_problem
from autograder.report.extras import class_pages, guarded, link_pages
from autograder.report.model import Student, catalogue, choice_catalogue, clusters, load_students
from autograder.report.moved import compare_page, read_run
from autograder.report.render import (
    MANUAL_CSV,
    RenderContext,
    index_page,
    manual_csv,
    plain_index,
    report_csv,
    student_page_or_note,
    written_page_or_note,
)

MARKER = ".autograder-report"  # only a folder holding this file is ever replaced by a new report

def _check_replaceable(dest: Path) -> None:
    if dest.exists() and (not dest.is_dir() or (any(dest.iterdir()) and not (dest / MARKER).exists())):
        raise FileExistsError(f"{dest} exists and is not a report written by `{command()} report`; "
                              "choose another --out")


def _swap_in(new: Path, dest: Path) -> None:
    from autograder.release.common import replace_dir

    _check_replaceable(dest)
    replace_dir(new, dest)


def regrade_command(students: list[Student], *, grades: Path, out: Path, course: Course) -> str:
    """The commands that grade this batch again (from the folder most submissions came from) and rewrite
    the report."""
    folders = [str(Path(p).parent) for s in students if isinstance(p := s.record.get("path"), str) and p]
    subs = max(set(folders), key=folders.count) if folders else "SUBMISSIONS"
    config = "" if course.is_default else f" --config {shlex.quote(str(course.path))}"
    run = runnable_command()
    return (f"{run}{config} grade {shlex.quote(subs)} --out {shlex.quote(str(grades))}\n"
            f"{run}{config} report {shlex.quote(str(grades))} --out {shlex.quote(str(out))}")


def write_report(grades: Path, *, out: Path = Path("report"), course: Course,
                 roster: Path | None = None, compare: Path | None = None) -> Path:
    """Write the report of the batch graded into `grades` to the folder `out`; returns out/index.html.

    Built in a temporary folder beside `out` and renamed into place, so `out` is never half-written. `out`
    defaults to ./report in the current folder (like `grade`'s ./grades), never inside the installed package.
    roster: the leaderboard's roster file (id, pseudonym, opt_out) for the page to post; default:
    grades/leaderboard_roster.csv when it exists. compare: an earlier run's grades folder; the report then holds
    compare.html, what moved from that run to this one (moved.py); NotGrades when it is not a grades folder.
    """
    earlier = read_run(compare) if compare is not None else None  # a folder that is not one fails here, first
    suite = course.suite
    questions = [q for q in suite.questions if q.graded and not q.manual]
    manual = [q for q in suite.questions if q.graded and q.manual]
    parts = [p.part for q in manual for p in q.written]
    students = load_students(grades, limits=suite.config.submissions, parts=parts, stub=suite.lesson.runtime.STUB)
    merged, _ = merged_or_problem(Gradebook(grades))  # when unreadable the grade table says why; written all the same
    out = out.resolve()
    ctx = RenderContext(suite, questions, catalogue(suite) | choice_catalogue(questions), grades.resolve(), merged,
               regrade_command(students, grades=grades.resolve(), out=out, course=course))
    pages = {s.page: student_page_or_note(ctx, s) for s in students}  # first: a page that fails marks its student
    groups = clusters(students, questions)
    try:
        index = index_page(ctx, students, groups)
    except Exception as exc:  # noqa: BLE001 - last resort: a plain list of students, so the report is written
        index = plain_index(students, exc, title=ctx.title)
    written = {p.part: written_page_or_note(ctx, q, n, students) for q in manual for n, p in enumerate(q.written)}
    extra = class_pages(suite, students, grades=grades.resolve(), title=ctx.title, roster=roster)
    if compare is not None and earlier is not None:
        extra |= guarded("compare.html", f"{ctx.title}: before and after",
                         lambda: compare_page(compare, earlier, students, [q.id for q in questions],
                                              grades=grades.resolve(), title=ctx.title))
    index = link_pages(index, extra)  # leaderboard, page to post, similarity: linked from the index's top
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
        for name, page in extra.items():
            (tmp / name).write_text(page, encoding="utf-8", errors="backslashreplace")
        (tmp / "report.csv").write_text(report_csv(students, questions), encoding="utf-8", errors="backslashreplace")
        (tmp / MANUAL_CSV).write_text(manual_csv(ctx, students), encoding="utf-8", errors="backslashreplace")
        (tmp / MARKER).write_text(f"written by `{command()} report`; the whole folder is replaced on the next run\n")
        tmp.chmod(0o755)
        _swap_in(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out / "index.html"
