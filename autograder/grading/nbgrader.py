"""nbgrader graded by the sandboxed engine: the `nbgrader-autograde COURSE` verb and its EngineVerdicts step.

nbgrader runs its test cells in the student's own kernel, where student code can read and patch whatever the
tests use. Here no student code ever runs in a kernel that nbgrader starts: the engine (batch.grade_batch, in the
sandbox, judged in this process against expected values it computes from reference/) grades each
`submitted/<student>/<assignment>/` folder, then `nbgrader autograde` runs with EngineVerdicts in place of its
Execute step. EngineVerdicts writes each grade cell's verdicts (the student's view of the result: public messages,
hidden cases by name only) and its score as the cell's output, from which nbgrader's own SaveAutoGrades stores the
score, so formgrader, manual grading and `generate_feedback` work as usual. A submission that is not plainly
`graded` (tampering, time-out, ...) or that was graded without a sandbox is flagged in the gradebook, with a
comment on its first answer cell.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nbconvert.exporters import NotebookExporter
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Unicode

from autograder.config import DEFAULT_CONFIG, command
from autograder.course import Course, course_of
from autograder.model import STUDENT_HELP, Status, row_question, shown, without_ids

# The feedback page: nbgrader's own template with a few lines of CSS in place of Bootstrap (117 KB on every page).
FEEDBACK_TEMPLATE, FEEDBACK_FILE = "compact_feedback", "compact.html.j2"  # it extends nbgrader's index.html.j2
TEMPLATE_DIRS = [str(Path(__import__("nbgrader").__file__).parent / "server_extensions" / "formgrader" / "templates"),
                 str(Path(__file__).parent / "nbgrader_feedback")]
# A question's grade cell is "<question>-tests"; the checkpoint's is its id (Suite.checkpoint_question).
TESTS_SUFFIX = "-tests"
ALLOW_FLAG = "--allow-unsandboxed"


class NbgraderGradingError(RuntimeError):
    """Grading the nbgrader course could not start or finish; the message says what to do."""


GRADES_OPTION = "--EngineVerdicts.grades"  # how the `nbgrader-autograde` verb hands nbgrader the grader's results


def _plain_autograde_refusal() -> str:
    return (f"refusing: this course is graded by the {command()} grader. Run `{command()} nbgrader-autograde .` in "
            "the course folder: it grades submitted/ in the sandbox, then runs nbgrader autograde with the results "
            "(a plain `nbgrader autograde` would run student code in a kernel here). Nothing was changed: no "
            "autograded/ folder, no gradebook row.")


def refuse_plain_autograde(argv: list[str] | None = None) -> None:
    """Called by the course's nbgrader_config.py while nbgrader loads it: an `nbgrader autograde` command line that
    does not give the grader's results stops here (SystemExit, which nbgrader does not catch as a config error),
    before the autograde app starts, so no autograded/ folder or gradebook row is touched (nbgrader's own clean-up
    of a failed submission deletes its autograded/ folder). Every other nbgrader command loads the config as
    usual."""
    args = sys.argv[1:] if argv is None else argv
    words = [a for a in args if not a.startswith("-")]
    if not words or words[0] != "autograde" or {"-h", "--help", "--help-all"} & set(args):
        return
    given = [a.partition("=")[2] for a in args if a.startswith(GRADES_OPTION + "=")]
    given += [args[i + 1] for i, a in enumerate(args[:-1]) if a == GRADES_OPTION]
    if not any(given):
        raise SystemExit(_plain_autograde_refusal())


class EngineOnlyExporter(NotebookExporter):
    """The exporter of nbgrader's Autograde (nbgrader_config.py): made as the converter starts, before it removes or
    writes any folder or gradebook row, it refuses where no grader results were given (formgrader's autograde
    button, nbgrader's Python API: paths that load the config without a command line)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not self.config.get("EngineVerdicts", {}).get("grades"):
            raise NbgraderGradingError(_plain_autograde_refusal())


def isolation_here() -> str:
    """The isolation the grader's workers would get on this machine: "bubblewrap", "unprivileged uid" or "none"
    (fallback.choose_isolation: the one choice every entry point shares, made before anything starts)."""
    from autograder.sandbox import WorkerError, choose_isolation

    try:
        return choose_isolation().kind
    except WorkerError:  # bubblewrap forced, and it does not work
        return "none"


def course_submissions(folder: Path, assignment: str, *, course: Course) -> list[Any]:
    """Each `submitted/<student>/<assignment>/` folder of the nbgrader course `folder`, read under the caps as
    `grade` reads a per-student folder; its id is the nbgrader student id."""
    from autograder.grading.submissions import read_entry, result_file_name

    limits, files = course.config.submissions, course.suite.checkpoint_files
    submitted = folder / "submitted"
    subs = []
    for student in sorted(submitted.iterdir() if submitted.is_dir() else (), key=lambda p: os.fsencode(p.name)):
        folder = student / assignment
        if student.name.startswith(".") or not folder.is_dir() or folder.is_symlink():
            continue
        sub = read_entry(folder, limits=limits, files=files, notebook=f"{assignment}.ipynb")
        sub.id, sub.name = student.name, student.name
        sub.result_name = result_file_name(student.name, sub.raw_name)
        subs.append(sub)
    return subs


def _stored_record(grades: Path, folder: Path, student: str, assignment: str, course: Course) -> dict[str, Any]:
    """The engine's stored result for this student's current submission in the nbgrader course `folder`; raises
    when there is none, or when it belongs to another version of the submission or of the tests."""
    from autograder.grading.gradebook import Gradebook, record_key
    from autograder.grading.submissions import read_entry, result_file_name

    files = course.suite.checkpoint_files
    sub = read_entry(folder / "submitted" / student / assignment, limits=course.config.submissions, files=files,
                     notebook=f"{assignment}.ipynb")
    sub.name = student
    book, name = Gradebook(grades), result_file_name(student, sub.raw_name)
    path = book.record_path(name)
    stored = book.stored_record(name, record_key(sub, course.suite.fingerprint, files))
    if stored is None:
        raise NbgraderGradingError(
            f"{student}: no result of the {command()} grader for this submission in {path} (never graded, or graded "
            f"before it or the tests changed). Grade with `{command()} nbgrader-autograde .` in the course folder: "
            "plain `nbgrader autograde` never runs student code here.")
    return stored.to_json()


def cell_text(record: dict[str, Any], question: str, points: float) -> tuple[str, float]:
    """What a question's grade cell shows (the student's view: public messages, hidden cases by name and the idea
    to revisit) and its score."""
    score = float(record.get("questions", {}).get(question, 0.0))
    status = str(record.get("status", ""))
    lines = []
    if status != Status.GRADED:
        lines.append(f"status: {status}. {STUDENT_HELP.get(status, '')}".strip())
    if record.get("isolation") == "none":
        lines.append("graded without a sandbox on the instructor's machine")
    lines.append(f"{question}: {shown(score)} of {shown(points)} points (graded by the {command()} grader after "
                 "submission)")
    questions = {str(c.get("question", "")) for c in record.get("cases", []) if isinstance(c, dict)} | {question}
    lines += [without_ids(str(n), questions) for n in record.get("student_notes", [])  # a time limit it ran into
              if f"{question} " in str(n) or f"{question}/" in str(n)]
    for test in record.get("gradescope", {}).get("tests", []):
        if row_question(str(test.get("name", ""))) == question:
            ok = test.get("status", "passed") == "passed" and test["score"] >= test["max_score"] - 1e-9
            mark = "passed" if ok else "FAILED"
            output = str(test.get("output") or "")
            lines.append(f"- {mark} {test['name']} ({shown(test['score'])} of {shown(test['max_score'])})"
                         + ("" if output == "passed" else ":\n  " + output.replace("\n", "\n  ")))
    return "\n".join(lines) + "\n", score


class EngineVerdicts(NbGraderPreprocessor):
    """nbgrader's autograde step in place of Execute: fills each grade cell with the engine's verdicts and score
    (an execute_result, nbgrader's partial credit) from the stored result of this submission; runs no code."""

    grades = Unicode("", help="folder written by the `nbgrader-autograde` verb (the engine's results/)"
                     ).tag(config=True)
    course = Unicode(".", help="the course folder (submitted/ is read to check the result is current)"
                     ).tag(config=True)
    config_path = Unicode(str(DEFAULT_CONFIG), help="the lesson's grading_config.yaml").tag(config=True)

    def preprocess(self, nb: Any, resources: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        import nbformat

        info = resources["nbgrader"]
        if not self.grades:
            raise NbgraderGradingError(
                f"{info['student']}: this course is graded by the {command()} grader: run `{command()} "
                "nbgrader-autograde .` in the course folder (plain `nbgrader autograde` never runs student code here)")
        record = _stored_record(Path(self.grades), Path(self.course), info["student"], info["assignment"],
                                course_of(Path(self.config_path)))  # nbgrader's process: the config read once
        for cell in nb.cells:
            meta = cell.get("metadata", {}).get("nbgrader", {})
            grade_id = str(meta.get("grade_id", ""))
            if cell.cell_type != "code" or not meta.get("grade") or meta.get("solution"):
                continue
            question = grade_id.removesuffix(TESTS_SUFFIX) if grade_id.endswith(TESTS_SUFFIX) else grade_id
            text, score = cell_text(record, question, float(meta.get("points", 0)))
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=text),
                            nbformat.v4.new_output("execute_result", data={"text/plain": repr(score)},
                                                   execution_count=None)]
        return nb, resources


@dataclass
class NbgraderRun:
    """What `nbgrader_autograde` did: the engine's batch, the isolation it had, the flagged students."""

    summary: Any  # batch.BatchSummary
    isolation: str
    flagged: dict[str, str] = field(default_factory=dict)  # student -> why
    problem: str = ""  # what `nbgrader autograde` said when it failed (for some students), else ''
    log: str = ""  # everything `nbgrader autograde` printed
    unrecorded: dict[str, str] = field(default_factory=dict)  # student -> why nbgrader cannot show their total


def flag_note(record: dict[str, Any]) -> str:
    """Why a submission is flagged for a TA (and its student: nbgrader's feedback shows comments), or ''."""
    status = str(record.get("status", ""))
    parts = []
    if status != Status.GRADED:
        parts.append(f"{command()} grader: status {status}. {STUDENT_HELP.get(status, '')}".strip())
    if record.get("isolation") == "none":
        parts.append(f"{command()} grader: graded without a sandbox (student code ran as the instructor's user)")
    return " ".join(parts)


def _first_answer_cell(course: Path, assignment: str) -> str | None:
    import nbformat

    nb = nbformat.read(str(course / "source" / assignment / f"{assignment}.ipynb"), as_version=4)
    return next((c.metadata["nbgrader"]["grade_id"] for c in nb.cells
                 if c.get("metadata", {}).get("nbgrader", {}).get("solution")), None)


def _mark_gradebook(course: Path, assignment: str, subs: list[Any], records: dict[str, Any]) -> dict[str, str]:
    """Flag each submission whose result is not plainly `graded` (or was graded without a sandbox) and put why as
    the comment of its first answer cell; returns student -> why."""
    from nbgrader.api import Gradebook, MissingEntry

    first = _first_answer_cell(course, assignment)
    flagged = {}
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        for sub in subs:
            record = records.get(sub.id)  # the batch's records (batch.BatchSummary.tables), as it stored them
            try:
                notebook = gb.find_submission_notebook(assignment, assignment, sub.id)
            except MissingEntry:
                continue
            if record is None:
                continue
            note = flag_note(record.to_json())
            if not note:
                continue
            flagged[sub.id] = note
            notebook.flagged = True
            if first is not None:
                gb.find_comment(first, assignment, assignment, sub.id).auto_comment = note
        gb.db.commit()
    return flagged


def record_scores(course: Path, assignment: str, subs: list[Any], records: dict[str, Any]) -> dict[str, str]:
    """Write the engine's score of every question into the gradebook's grade of each student (its `auto_score`),
    whatever form the submitted notebook came in (Otter's, metadata stripped by an editor, renamed): nbgrader then
    shows the engine's total in the gradebook, `nbgrader export` and its feedback. Returns student -> what stops
    nbgrader from showing it (no submission in the gradebook, a total that does not read back, no notebook under
    the name nbgrader reads), each with what to do."""
    from nbgrader.api import Gradebook, MissingEntry

    problems: dict[str, str] = {}
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        for sub in subs:
            record = records.get(sub.id)
            if record is None:  # the engine failed on it: grades.csv says why, and a re-run grades it
                problems[sub.id] = "the grader could not grade it (grades.csv says why); run nbgrader-autograde again"
                continue
            scores = record.result.question_scores()
            try:
                notebook = gb.find_submission_notebook(assignment, assignment, sub.id)
            except MissingEntry:
                problems[sub.id] = (f"nbgrader holds no submission of {assignment} for it; check "
                                    f"submitted/{sub.id}/{assignment}/ and run nbgrader-autograde again")
                continue
            for grade in notebook.grades:
                question = grade.name.removesuffix(TESTS_SUFFIX)
                if question in scores:
                    grade.auto_score = min(float(scores[question]), float(grade.max_score))
        gb.db.commit()
        for sub in subs:
            if sub.id in problems:
                continue
            scores = records[sub.id].result.question_scores()
            notebook = gb.find_submission_notebook(assignment, assignment, sub.id)
            shown = sum(g.auto_score or 0.0 for g in notebook.grades if g.name.removesuffix(TESTS_SUFFIX) in scores)
            if abs(shown - sum(scores.values())) > 1e-6:
                problems[sub.id] = (f"the gradebook shows {shown:g} automatic points, the grader gave "
                                    f"{sum(scores.values()):g}: a question has no grade cell in the course's source "
                                    "notebook; release the course again")
            elif not (course / "autograded" / sub.id / assignment / f"{assignment}.ipynb").is_file():
                problems[sub.id] = (f"its total is in the gradebook, but nbgrader found no {assignment}.ipynb in "
                                    f"submitted/{sub.id}/{assignment}/ for its feedback page: rename the notebook to "
                                    f"{assignment}.ipynb and run nbgrader-autograde again")
    return problems


def nbgrader_autograde(folder: Path, *, out: Path | None = None, force: bool = False, workers: int | None = None,
                       allow_unsandboxed: bool = False, course: Course,
                       progress: bool = True) -> NbgraderRun:
    """Grade an nbgrader course's submissions with the engine into `out` (default: COURSE-grades beside the course
    folder, never inside it: the results hold reference values), then run `nbgrader autograde` with EngineVerdicts
    and flag what a TA must look at. Refuses to start where student code would run unsandboxed (no bubblewrap, not
    root), unless `allow_unsandboxed`; every row then says so."""
    from autograder.grading.batch import grade_batch
    from autograder.release.common import tool_env, tool_path

    assignment = course.config.assignment
    folder = folder.resolve()
    if not (folder / "nbgrader_config.py").is_file() or not (folder / "source" / assignment).is_dir():
        raise NbgraderGradingError(f"{folder}: not an nbgrader course of {assignment} (no nbgrader_config.py or "
                                   f"source/{assignment}/); pass the folder `{command()} release` wrote "
                                   "(dist/nbgrader)")
    out = (out or folder.with_name(f"{folder.name}-grades")).resolve()
    if out == folder or out.is_relative_to(folder):
        raise NbgraderGradingError(f"{out}: keep the grades outside the course folder {folder}: they hold the "
                                   "reference's values of hidden cases, and students' kernels may read the course")
    isolation = isolation_here()
    if isolation == "none" and not allow_unsandboxed:
        from autograder.sandbox import choose_isolation

        raise NbgraderGradingError(choose_isolation().refusal() or (
            "refusing to grade: neither bubblewrap nor the uid drop (root, with a Python every user may read) "
            "confines student code here. Install bubblewrap or run as root; or pass "
            f"{ALLOW_FLAG} to grade anyway (every row of grades.csv then says so)"))
    subs = course_submissions(folder, assignment, course=course)
    if not subs:
        raise NbgraderGradingError(f"{folder / 'submitted'}: no submitted/<student>/{assignment}/ folder to grade")
    out.mkdir(parents=True, exist_ok=True)
    out.chmod(0o700)
    summary = grade_batch(folder / "submitted", out=out, force=force, workers=workers, course=course,
                          progress=progress, entries=subs, allow_unsandboxed=allow_unsandboxed)
    proc = subprocess.run([tool_path("nbgrader"), "autograde", assignment, "--force", f"{GRADES_OPTION}={out}",
                           f"--EngineVerdicts.course={folder}", f"--EngineVerdicts.config_path={course.path}"],
                          cwd=folder, env=tool_env(), capture_output=True, text=True)
    problem = ""
    if proc.returncode != 0:
        errors = [line for line in (proc.stdout + proc.stderr).splitlines() if "ERROR" in line or "Error" in line]
        problem = f"nbgrader autograde failed (exit {proc.returncode}):\n" + "\n".join(errors[-20:])
    records = summary.tables.records
    flagged = _mark_gradebook(folder, assignment, subs, records)
    return NbgraderRun(summary, isolation, flagged, problem, proc.stdout + proc.stderr,
                       record_scores(folder, assignment, subs, records))
