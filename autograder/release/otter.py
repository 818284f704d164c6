"""The Otter target: the master notebook (solutions and every test) that `otter assign` turns into the student
notebook, its public test files and the Otter autograder zip."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import nbformat
import yaml

from autograder.authoring.questions import Checkpoint, Question, checkpoint_of, shuffled
from autograder.authoring.suite import Suite
from autograder.config import command
from autograder.lesson import Lesson
from autograder.model import Case
from autograder.release.common import (
    TORCH_INDEX_URL,
    TORCH_VERSION,
    BuildError,
    CellWriter,
    Writing,
    case_json,
    choices_markdown,
    code_cell,
    example_question,
    grader_limits,
    md_cell,
    question_cells,
    raw_cell,
    run_tool,
    summary_parts,
    tool_path,
    write_code,
    write_markdown,
    write_nb,
)
from autograder.release.gradescope import gradescope_zip
from autograder.release.student import check_note, export_cell, submit_text

# Otter's grading environment (pip part of its environment.yml): the CPU build of torch and numpy. The local
# "+cpu" version of the CPU index sorts above PyPI's CUDA build of the same release, so pip takes it.
OTTER_REQUIREMENTS = (f"--extra-index-url {TORCH_INDEX_URL}", f"torch=={TORCH_VERSION}", "numpy==2.4.6")


def otter_test(case: Case, expected: dict[str, dict[str, Any]], cases: dict[str, Case], *, lesson: Lesson,
               limits: dict[str, float]) -> str:
    config = yaml.safe_dump({"hidden": case.hidden, "points": case.points}, sort_keys=True).strip()
    return (f'""" # BEGIN TEST CONFIG\n{config}\n""" # END TEST CONFIG\n'
            f"def test_{case.name}(env):\n"
            f"    from {lesson.checks_name} import check_case\n"
            f"    case = {case_json(case, expected, cases, lesson=lesson, limits=limits)!r}\n"
            f"    check_case(env, case)\n")


def _otter_summary_test(q: Question) -> str:
    """The question's last Otter case (0 points): it passes only when every public case passed, and then Otter
    prints its success message, which says what was checked and what is graded after submission (instead of
    a bare "All test cases passed!"); otherwise it fails (check_summary raises) with the count of public cases
    that did not pass."""
    line = q.lesson.checks.summary_line(public=sum(not c.hidden for c in q.cases),
                                        hidden=sum(c.hidden for c in q.cases), answers=bool(q.choices))
    config = yaml.safe_dump({"hidden": False, "points": 0, "success_message": line}, sort_keys=True, width=1000)
    public, args = summary_parts(q)
    return (f'""" # BEGIN TEST CONFIG\n{config.strip()}\n""" # END TEST CONFIG\n'
            f"def test_summary(env):\n"
            f"    from {q.lesson.checks_name} import check_summary\n"
            f"    public = {public}\n"
            f"    check_summary(public, {args})\n")


def _otter_open(w: Writing) -> list[Any]:
    """Otter's BEGIN QUESTION before a graded question's first answer cell (its cases' points, then the summary
    case's 0)."""
    if not w.q.graded or w.opened:
        return []
    w.opened = True
    points = [c.points for c in w.q.cases] + [0]
    return [raw_cell("# BEGIN QUESTION\n" + yaml.safe_dump({"name": w.q.id, "points": points}, sort_keys=False))]


def _otter_solution(w: Writing, cell: Any) -> list[Any]:
    return [*_otter_open(w), raw_cell("# BEGIN SOLUTION"), code_cell(cell.source), raw_cell("# END SOLUTION")]


def _otter_choices(w: Writing, cell: Any) -> list[Any]:
    return [*_otter_open(w), md_cell(choices_markdown(w.q)), raw_cell("# BEGIN SOLUTION"),
            code_cell(_choices_code(w.q)), raw_cell("# END SOLUTION")]


def _choices_code(q: Question) -> str:
    return "\n".join(f'{c.var} = "{shuffled(c)[1]}"  # SOLUTION' for c in q.choices)


def _otter_written(w: Writing, cell: Any) -> list[Any]:
    """Otter gives a manual question one answer cell, so each part is its own manual question."""
    out = []
    for part in w.q.written:
        qconf = {"name": part.part, "manual": True, "points": w.q.points / len(w.q.written)}
        out += [raw_cell("# BEGIN QUESTION\n" + yaml.safe_dump(qconf, sort_keys=False)),
                md_cell(f"**`{part.part}`.** {part.prompt}"),
                raw_cell("# BEGIN SOLUTION"), md_cell(part.answer), raw_cell("# END SOLUTION"),
                raw_cell("# END QUESTION")]
    return out


def _otter_tests(w: Writing, cell: Any) -> list[Any]:
    """The question's test cells and its summary case, which close the question."""
    w.opened = False
    tests = [code_cell(otter_test(c, w.expected, w.cases, lesson=w.q.lesson, limits=w.limits)) for c in w.q.cases]
    return [raw_cell("# BEGIN TESTS"), *tests, code_cell(_otter_summary_test(w.q)), raw_cell("# END TESTS"),
            raw_cell("# END QUESTION")]


# Cell kind -> its writer in the Otter master notebook.
WRITERS: dict[str, CellWriter] = {"markdown": write_markdown, "code": write_code, "solution": _otter_solution,
                                  "choices": _otter_choices, "written": _otter_written, "tests": _otter_tests}


def otter_master(questions: list[Question], expected: dict[str, dict[str, Any]], *,
                 name: str, lesson: Lesson, limits: dict[str, float]) -> nbformat.NotebookNode:
    """The Otter master notebook (solutions and all tests), in Otter Assign's v1 format."""
    config = {
        "name": name,
        "init_cell": True,
        "strip_solutions_from_all_cells": True,
        "check_all_cell": False,
        "run_tests": True,
        "solutions_pdf": False,
        "template_pdf": False,
        "files": [f.name for f in lesson.shipped_files],
        "tests": {"files": True, "ok_format": False},
        "export_cell": False,  # ours, at the end: it adds the milestone files when they exist
        "generate": {"pdf": False, "show_stdout": True, "show_hidden": False, "zips": False},
        "python_version": "3.11",
        "requirements": list(OTTER_REQUIREMENTS),
    }
    checkpoint = checkpoint_of(questions)
    files = checkpoint.files if checkpoint is not None else []
    note = check_note("otter", name=lesson.name, example=example_question(questions), files=files)
    cells = [raw_cell("# ASSIGNMENT CONFIG\n" + yaml.safe_dump(config, sort_keys=False)),
             *question_cells(questions, expected, writers=WRITERS, note=note, limits=limits),
             md_cell(submit_text("otter", files=files)),
             code_cell(export_cell(lesson.name, files=files), tags=["otter_ignore"], deletable=False, editable=False)]
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    return nb


def otter_checkpoint_note(*, notebook: float, points: float, checkpoint: Checkpoint, name: str) -> str:
    """What `otter run` and Gradescope show for the milestone checkpoint, which the Otter zip does not grade."""
    files = " and ".join(checkpoint.files)
    return (f"This Otter autograder grades the notebook's {notebook:g} points; the milestone checkpoint's "
            f"{points:g} ({files}) are not graded here. To add them, grade the same "
            f"submissions with `{command()} grade SUBMISSIONS/` (column {checkpoint.id} of grades.csv) or use "
            f"{gradescope_zip(name)}, which grades all {notebook + points:g}.")


def _add_otter_checkpoint_note(otter_zip: Path, *, notebook: float, points: float, checkpoint: Checkpoint,
                               name: str) -> None:
    """Add to Otter's autograder zip a 0-point test file that always passes and says what the zip leaves out, so
    that the summary of `otter run` (and Gradescope's list) has a row for the checkpoint's points."""
    import zipfile

    note = otter_checkpoint_note(notebook=notebook, points=points, checkpoint=checkpoint, name=name)
    title = f"{checkpoint.id} ({points:g} points): not graded by this zip"
    text = (f"from otter.test_files import test_case\n\nOK_FORMAT = False\n\nname = {title!r}\npoints = 0\n\n"
            f"@test_case(points=0, hidden=False, success_message={note!r})\n"
            f"def test_not_graded_here(env):\n    pass\n")
    info = zipfile.ZipInfo(f"tests/{checkpoint.id}.py", date_time=(2026, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o644 << 16
    with zipfile.ZipFile(otter_zip, "a") as zf:
        zf.writestr(info, text)


def build_otter(suite: Suite, work: Path) -> tuple[Path, Path]:
    """Run `otter assign` on the Otter master notebook in `work`: its output folder and its autograder zip (with
    a row for the milestone checkpoint, which that zip does not grade, when the checkpoint has points)."""
    config, questions = suite.config, suite.authored
    name, lesson = config.assignment, suite.lesson
    master_dir = work / "otter-master"
    write_nb(otter_master(questions, suite.expected, name=name, lesson=lesson,
                          limits=grader_limits(config)), master_dir / f"{name}.ipynb")
    for f in lesson.shipped_files:
        shutil.copy(f, master_dir / f.name)
    otter_out = work / "otter"
    run_tool([tool_path("otter"), "assign", f"{name}.ipynb", str(otter_out)], cwd=master_dir, what="otter assign")
    zips = sorted((otter_out / "autograder").glob("*.zip"))
    if len(zips) != 1:
        raise BuildError(f"otter assign produced {len(zips)} autograder zips in {otter_out / 'autograder'}")
    checkpoint = checkpoint_of(questions)
    if config.milestone.points and checkpoint is not None:
        _add_otter_checkpoint_note(zips[0], notebook=suite.notebook_points, points=config.milestone.points,
                                   checkpoint=checkpoint, name=name)
    return otter_out, zips[0]
