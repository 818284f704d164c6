"""The student's side of the release: what the notebook says about checking and submitting, the export cell, and
the student release itself (Otter's student output, marked as generated)."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import nbformat

from autograder.release.common import banner, generated_key


def _listed(files: Sequence[str]) -> str:
    """`a` and `b` (each file name in backticks)."""
    return " and ".join(f"`{f}`" for f in files)


def check_note(target: str, *, name: str, example: str, files: Sequence[str]) -> str:
    """How to check and submit, the one part of the text that differs between the targets ("otter", "nbgrader"); it
    comes right before the first code cell of the introduction. `example` is a question id to show, `files` the
    milestone checkpoint's files (none when the lesson has no checkpoint)."""
    if target == "otter":
        with_files = f" and, when they are in this folder, {_listed(files)}," if files else ""
        return (f"**Checking and submitting.** Each check cell calls `grader.check(\"{example}\")` (each "
                "question shows its own id): run it after your code, and it lists the checks that failed and why. "
                "When you are done, save the notebook and run the export cell at the end: it writes "
                f"`{export_zip(name)}` with this notebook{with_files} and prints what the zip holds. Upload that zip "
                "to Gradescope. More checks, hidden from you, run when your work is graded.")
    keep = f"Keep {_listed(files)} in this folder, next to the notebook, then submit" if files else "Then submit"
    return ("**Checking and submitting.** Each question ends with a check cell that runs its public checks: run "
            "it after your code; when a check fails it says what was expected, and the cell stops with an error. "
            "Before you submit, click **Validate** (in the notebook's toolbar or the Assignments tab), which runs "
            f"the whole notebook and lists the check cells that fail. {keep} from the Assignments tab. More checks, "
            "hidden from you, run when your work is graded, on the grader's own copy of your notebook.")


def submit_text(target: str, *, files: Sequence[str]) -> str:
    """The notebook's closing "Submit" section for a target."""
    if target == "otter":
        return "## Submit\n\nSave the notebook, then run the cell below and upload the zip it writes to Gradescope."
    with_files = f" with {_listed(files)} in this folder" if files else ""
    return f"## Submit\n\nSave the notebook, click **Validate**, then submit from the Assignments tab{with_files}."


def export_zip(name: str) -> str:
    """What the export cell writes and the student uploads."""
    return f"{name}_submission.zip"


def export_cell(name: str, *, files: Sequence[str]) -> str:
    """The Otter notebook's last cell: it zips the notebook with the checkpoint's files (when they are there)."""
    EXPORT_ZIP = export_zip(name)
    if not files:
        return f"""\
# Save the notebook first (File > Save), then run this cell: it zips the notebook into {EXPORT_ZIP}: upload that zip.
import os
import zipfile

grader.export("{name}.ipynb", export_path="{EXPORT_ZIP}", pdf=False)
if os.path.exists("{EXPORT_ZIP}"):
    print("{EXPORT_ZIP} holds:", ", ".join(zipfile.ZipFile("{EXPORT_ZIP}").namelist()))
"""
    plain, every = " and ".join(files), "both" if len(files) == 2 else "all"
    return f"""\
# Save the notebook first (File > Save), then run this cell: it zips the notebook together with
# {plain} (when they are in this folder) into {EXPORT_ZIP}: upload that zip.
import os
import zipfile

milestone_files = [f for f in {tuple(files)!r} if os.path.exists(f)]
grader.export("{name}.ipynb", export_path="{EXPORT_ZIP}", pdf=False, files=milestone_files)
if os.path.exists("{EXPORT_ZIP}"):
    print("{EXPORT_ZIP} holds:", ", ".join(zipfile.ZipFile("{EXPORT_ZIP}").namelist()))
if len(milestone_files) < {len(files)}:
    print("{plain} are not {every} in this folder: the milestone checkpoint earns no points")
"""


def normalise_student(src: Path, dest: Path) -> None:
    """Copy Otter's student output, mark every file as generated and make cell ids stable."""
    shutil.copytree(src, dest)
    for nb_path in dest.glob("*.ipynb"):
        nb = nbformat.read(str(nb_path), as_version=4)
        for n, cell in enumerate(nb.cells):
            cell["id"] = f"cell-{n:03d}"
        nb.metadata[generated_key(dest.name)] = banner(dest.name)
        nbformat.write(nb, str(nb_path))
    for py in dest.rglob("*.py"):
        py.write_text(f"# {banner(dest.name)}\n{py.read_text()}")
