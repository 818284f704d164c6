"""The nbgrader target: the source notebook (solutions, one grade cell per question, no hidden case), the public
cases shipped beside it, the course's nbgrader_config.py and the release that `nbgrader generate_assignment` makes."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import nbformat

from autograder.authoring.questions import Checkpoint, Question, checkpoint_of, shuffled
from autograder.authoring.suite import Suite
from autograder.config import command
from autograder.lesson import Lesson
from autograder.release.common import (
    BuildError,
    CellWriter,
    Writing,
    banner,
    case_json,
    choices_markdown,
    code_cell,
    example_question,
    grader_limits,
    md_cell,
    question_cells,
    replace_dir,
    run_tool,
    summary_parts,
    tool_path,
    write_code,
    write_markdown,
    write_nb,
)
from autograder.release.keep import gradebook_cells, submissions_of
from autograder.release.student import check_note, submit_text


def public_cases_file(name: str) -> str:
    """nbgrader: the public cases of every question, shipped beside the notebook (no hidden case is in it)."""
    return f"{name}_public_cases.json"


def nbgrader_public_cases(questions: list[Question], expected: dict[str, dict[str, Any]], *,
                          lesson: Lesson, limits: dict[str, float]) -> dict[str, list[Any]]:
    """PUBLIC_CASES: question id -> its public cases as their tests carry them (with their gates), in order."""
    cases = {c.id: c for q in questions for c in q.cases}
    return {q.id: [json.loads(case_json(c, expected, cases, lesson=lesson, limits=limits))
                   for c in q.cases if not c.hidden] for q in questions if q.cases}


def _nbgrader_check(q: Question) -> str:
    """A question's one grade cell (worth the question's points): in the student's kernel it runs the public checks
    with the data of PUBLIC_CASES and fails when one fails (so Validate lists it); at grading time nothing of it
    runs: the `nbgrader-autograde` verb writes the sandboxed grader's verdicts and score as its output."""
    public, args = summary_parts(q)
    PUBLIC_CASES, checks = public_cases_file(q.lesson.name), q.lesson.checks_name
    hidden = sum(c.hidden for c in q.cases)
    return (f"# {q.id} ({q.points:g} points): the public checks (their data is in {PUBLIC_CASES}). After you submit, "
            f"the grader\n# runs them{f' and {hidden} hidden ones' if hidden else ''} on its own copy of your "
            f"notebook; this cell then shows its verdicts.\n"
            f"import json as _json\n"
            f"from {checks} import check_case as _check_case, public_summary as _public_summary\n"
            f"_failed_checks = []\n"
            f"with open({PUBLIC_CASES!r}) as _file:\n"
            f"    _cases = _json.load(_file)[{q.id!r}]\n"
            f"for _case in _cases:\n"
            f"    try:\n"
            f"        _check_case(globals(), _json.dumps(_case))\n"
            f"    except AssertionError as _error:\n"
            f"        _failed_checks.append(_case[\"id\"])\n"
            f"        print(_error, end=\"\\n\\n\")\n"
            f"print({q.id + ': '!r} + _public_summary({public}, {args}))\n"
            f"assert not _failed_checks, f\"public checks that failed: {{', '.join(_failed_checks)}}\"")


def _nbgrader_checkpoint(points: float, checkpoint: Checkpoint) -> str:
    """The milestone checkpoint's grade cell: the student's kernel only checks that the files are there; the grader
    re-evaluates them after submission."""
    files = " and ".join(checkpoint.files)
    every = "both" if len(checkpoint.files) == 2 else "all"
    return (f"# {checkpoint.id} ({points:g} points): graded after you submit: the grader re-evaluates {files}\n"
            f"# next to this notebook and compares them with the bounds above. Here, only that {every} "
            f"{'files are' if len(checkpoint.files) > 1 else 'file is'} there.\n"
            f"import os as _os\n"
            f"assert all(_os.path.exists(_f) for _f in {tuple(checkpoint.files)!r}), "
            f"\"put {files} next to this notebook\"")


def _nbgrader_meta(grade_id: str, *, solution: bool, grade: bool, points: float = 0) -> dict[str, Any]:
    m = {"grade_id": grade_id, "solution": solution, "grade": grade, "locked": not solution, "schema_version": 3}
    if grade:
        m["points"] = points
    return {"nbgrader": m}


def _nbgrader_solution(w: Writing, cell: Any) -> list[Any]:
    return [code_cell(cell.source, **_nbgrader_meta(f"{w.q.id}-solution", solution=True, grade=False))]


def _nbgrader_choices(w: Writing, cell: Any) -> list[Any]:
    src = "\n".join(f'{c.var} = "{shuffled(c)[1]}"' for c in w.q.choices)
    return [md_cell(choices_markdown(w.q)), code_cell(f"# BEGIN SOLUTION\n{src}\n# END SOLUTION",
                                               **_nbgrader_meta(f"{w.q.id}-answers", solution=True, grade=False))]


def _nbgrader_written(w: Writing, cell: Any) -> list[Any]:
    per_part = w.q.points / len(w.q.written)
    return [c for part in w.q.written for c in (
        md_cell(f"**`{part.part}`.** {part.prompt}"),
        md_cell(f"# BEGIN SOLUTION\n{part.answer}\n# END SOLUTION",
            **_nbgrader_meta(part.part, solution=True, grade=True, points=per_part)))]


def _nbgrader_tests(w: Writing, cell: Any) -> list[Any]:
    """One grade cell per question (its points; the public checks run in it) and, after the milestone, the
    checkpoint's. No case data and no hidden case is in the notebook: the sandboxed grader fills these cells in."""
    q = w.q
    meta = _nbgrader_meta(f"{q.id}-tests", solution=False, grade=True, points=q.points)
    out = [code_cell(_nbgrader_check(q), **meta)]
    if q.checkpoint is not None and w.checkpoint_points:
        out.append(code_cell(_nbgrader_checkpoint(w.checkpoint_points, q.checkpoint),
                             **_nbgrader_meta(q.checkpoint.id, solution=False, grade=True, points=w.checkpoint_points)))
    return out


# Cell kind -> its writer in the nbgrader source notebook.
WRITERS: dict[str, CellWriter] = {"markdown": write_markdown, "code": write_code, "solution": _nbgrader_solution,
                                  "choices": _nbgrader_choices, "written": _nbgrader_written,
                                  "tests": _nbgrader_tests}


def nbgrader_source(questions: list[Question], expected: dict[str, dict[str, Any]], *, lesson: Lesson,
                    checkpoint_points: float = 0) -> nbformat.NotebookNode:
    """The nbgrader source notebook: solution cells, autograder test cells (hidden ones without their expected
    values), manually graded answers and, after the milestone, the checkpoint's hidden tests."""
    checkpoint = checkpoint_of(questions)
    files = checkpoint.files if checkpoint is not None else []
    note = check_note("nbgrader", name=lesson.name, example=example_question(questions), files=files)
    cells = [*question_cells(questions, expected, writers=WRITERS, note=note, checkpoint_points=checkpoint_points),
             md_cell(submit_text("nbgrader", files=files))]
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def nbgrader_config(name: str) -> str:
    BANNER = banner(name)
    return f"""\
# {BANNER}
# Student code never runs in a kernel that nbgrader starts here: `{command()} nbgrader-autograde .` grades
# submitted/ with the sandboxed grader and then runs `nbgrader autograde`, whose EngineVerdicts step (in place of
# Execute) writes each grade cell's verdicts and score from the grader's results. A plain `nbgrader autograde`
# refuses as it loads this file, before nbgrader touches autograded/ or the gradebook (formgrader's autograde
# button: as its converter starts). No hidden case, expected value or answer is in this folder.
from nbconvert.preprocessors import ClearMetadataPreprocessor, CSSHTMLHeaderPreprocessor
from nbgrader.preprocessors import (AssignLatePenalties, CheckCellMetadata, ClearHiddenTests, GetGrades,
                                    LimitOutput, SaveAutoGrades)

from autograder.grading.feedback_html import FeedbackExporter
from autograder.grading.nbgrader import (FEEDBACK_FILE, FEEDBACK_TEMPLATE, TEMPLATE_DIRS, EngineOnlyExporter,
                                         EngineVerdicts, refuse_plain_autograde)

refuse_plain_autograde()
c = get_config()  # noqa: F821
c.CourseDirectory.root = '.'
c.CourseDirectory.course_id = '{name}'
c.ClearSolutions.code_stub = {{'python': '# YOUR CODE HERE\\nraise NotImplementedError()'}}
c.Autograde.exporter_class = EngineOnlyExporter
c.Autograde.autograde_preprocessors = [EngineVerdicts, ClearMetadataPreprocessor, LimitOutput, SaveAutoGrades,
                                       AssignLatePenalties, CheckCellMetadata]
c.GenerateFeedback.preprocessors = [GetGrades, ClearHiddenTests, CSSHTMLHeaderPreprocessor]
c.GenerateFeedback.exporter_class = FeedbackExporter  # the maths as MathML: readable offline, no MathJax
c.HTMLExporter.template_name = FEEDBACK_TEMPLATE  # nbgrader's feedback page without its 117 KB of Bootstrap
c.HTMLExporter.template_file = FEEDBACK_FILE
c.HTMLExporter.extra_template_basedirs = TEMPLATE_DIRS
"""


def _answer_stubs(release_nb: Path, stubs: dict[str, str]) -> None:
    """nbgrader turns the multiple-choice answer cell into `raise NotImplementedError()`: give it back its
    `q8_... = ...` lines (`stubs`: grade id -> source)."""
    nb = nbformat.read(str(release_nb), as_version=4)
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in stubs:
            cell.source = stubs[grade_id]
    nbformat.write(nb, str(release_nb))


def _stubs_of(questions: list[Question]) -> dict[str, str]:
    return {f"{q.id}-answers": "\n".join(f'{c.var} = ...  # "A", "B", "C" or "D"' for c in q.choices)
            for q in questions if q.choices}


def _generate(course: Path, name: str, *options: str) -> None:
    run_tool([tool_path("nbgrader"), "generate_assignment", name, "--force", *options,
              f"--CourseDirectory.db_assignments=[{{'name': '{name}'}}]"], cwd=course,
             what="nbgrader generate_assignment")


def build_nbgrader(suite: Suite, work: Path) -> Path:
    """The nbgrader course folder in `work` (source/, release/ by `nbgrader generate_assignment`,
    nbgrader_config.py)."""
    config, questions, expected = suite.config, suite.authored, suite.expected
    name, lesson = config.assignment, suite.lesson
    course = work / "nbgrader"
    src = course / "source" / name
    write_nb(nbgrader_source(questions, expected, lesson=lesson, checkpoint_points=config.milestone.points),
             src / f"{name}.ipynb")
    for f in lesson.shipped_files:
        shutil.copy(f, src / f.name)
    (src / public_cases_file(name)).write_text(json.dumps(nbgrader_public_cases(questions, expected, lesson=lesson,
                                                                                limits=grader_limits(config)),
                                                          sort_keys=True, separators=(",", ":")) + "\n")
    (course / "nbgrader_config.py").write_text(nbgrader_config(name))
    _generate(course, name)
    _answer_stubs(course / "release" / name / f"{name}.ipynb", _stubs_of(questions))
    return course


def grade_cells(notebook: Path) -> dict[str, float]:
    """A notebook's nbgrader grade cells: grade id -> points."""
    nb = nbformat.read(str(notebook), as_version=4)
    return {str(m["grade_id"]): float(m.get("points", 0)) for c in nb.cells
            if (m := c.get("metadata", {}).get("nbgrader", {})).get("grade")}


def _cell_changes(old: dict[str, float], new: dict[str, float]) -> list[str]:
    return ([f"{g} removed" for g in old if g not in new] + [f"{g} added" for g in new if g not in old]
            + [f"{g} from {old[g]:g} to {new[g]:g} points" for g in old if g in new and old[g] != new[g]])


def check_course(fresh: Path, course: Path, name: str) -> None:
    """Raise BuildError when the fresh build would change the grade cells (ids or points) of the existing course
    `course` under work students have in it (submissions, autograded or feedback folders, gradebook rows)."""
    students = submissions_of(course, name)
    old = gradebook_cells(course, name)
    old_nb = course / "source" / name / f"{name}.ipynb"
    if old is None and old_nb.is_file():
        old = grade_cells(old_nb)
    if not students or old is None:
        return
    changes = _cell_changes(old, grade_cells(fresh / "source" / name / f"{name}.ipynb"))
    if changes:
        who = ", ".join(students[:5]) + (f" and {len(students) - 5} more" if len(students) > 5 else "")
        raise BuildError(
            f"{course}: refusing to rebuild the nbgrader course: {len(students)} student(s) have work on {name} "
            f"in it ({who}), and this build would change the grade cells their grades belong to: "
            f"{'; '.join(changes)}. Nothing was replaced. Keep the questions' ids and points while the course "
            f"runs, or move {course.name}/ (and {course.name}-grades/) aside to start a new course and release again.")


def update_course(fresh: Path, course: Path, name: str) -> None:
    """Bring the existing course `course` up to the fresh build `fresh`: `nbgrader generate_assignment` runs inside
    it (so the gradebook keeps its students, submissions, grades and comments), and only source/NAME,
    release/NAME and nbgrader_config.py are replaced, each by a rename; on a failure the old ones stay."""
    staged = {kind: course / f".build-{kind}" for kind in ("source", "release")}
    for folder in staged.values():
        shutil.rmtree(folder, ignore_errors=True)
    config, new_config = course / "nbgrader_config.py", course / ".build-nbgrader_config.py"
    old_config = config.read_bytes() if config.is_file() else None
    try:
        shutil.copytree(fresh / "source" / name, staged["source"] / name)
        new_config.write_bytes((fresh / "nbgrader_config.py").read_bytes())
        os.replace(new_config, config)  # generate_assignment reads the new config
        _generate(course, name, f"--CourseDirectory.source_directory={staged['source'].name}",
                  f"--CourseDirectory.release_directory={staged['release'].name}")
        fresh_nb = nbformat.read(str(fresh / "release" / name / f"{name}.ipynb"), as_version=4)
        _answer_stubs(staged["release"] / name / f"{name}.ipynb",
                      {str(c.metadata["nbgrader"]["grade_id"]): c.source for c in fresh_nb.cells
                       if str(c.get("metadata", {}).get("nbgrader", {}).get("grade_id", "")).endswith("-answers")})
    except BaseException:
        if old_config is not None:
            config.write_bytes(old_config)
        raise
    finally:
        new_config.unlink(missing_ok=True)
    try:
        for kind, folder in staged.items():
            replace_dir(folder / name, course / kind / name)
    finally:
        for folder in staged.values():
            shutil.rmtree(folder, ignore_errors=True)
