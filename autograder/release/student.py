"""The student's side of the release: what the notebook says about checking and submitting, the export cell, and
the student release itself (Otter's student output, marked as generated)."""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat

from autograder.release.common import banner, generated_key

# How to check and submit: the one part of the text that differs between the two targets; it comes right
# before the first code cell of the introduction.
CHECK_NOTE = {
    "otter": "**Checking and submitting.** Each check cell calls `grader.check(\"q2_sinusoidal_pe\")` (each "
             "question shows its own id): run it after your code, and it lists the checks that failed and why. "
             "When you are done, save the notebook and run the export cell at the end: it writes "
             "`{export_zip}` with this notebook and, when they are in this folder, `milestone.pt` and "
             "`milestone.json`, and prints what the zip holds. Upload that zip to Gradescope. More checks, "
             "hidden from you, run when your work is graded.",
    "nbgrader": "**Checking and submitting.** Each question ends with a check cell that runs its public checks: run "
                "it after your code; when a check fails it says what was expected, and the cell stops with an error. "
                "Before you submit, click **Validate** (in the notebook's toolbar or the Assignments tab), which runs "
                "the whole notebook and lists the check cells that fail. Keep `milestone.pt` and `milestone.json` in "
                "this folder, next to the notebook, then submit from the Assignments tab. More checks, hidden from "
                "you, run when your work is graded, on the grader's own copy of your notebook.",
}

MILESTONE_FILES = ("milestone.pt", "milestone.json")

SUBMIT_TEXT = {
    "otter": "## Submit\n\nSave the notebook, then run the cell below and upload the zip it writes to Gradescope.",
    "nbgrader": "## Submit\n\nSave the notebook, click **Validate**, then submit from the Assignments tab with "
                "`milestone.pt` and `milestone.json` in this folder.",
}


def export_zip(name: str) -> str:
    """What the export cell writes and the student uploads."""
    return f"{name}_submission.zip"


def export_cell(name: str) -> str:
    EXPORT_ZIP = export_zip(name)
    return f"""\
# Save the notebook first (File > Save), then run this cell: it zips the notebook together with
# milestone.pt and milestone.json (when they are in this folder) into {EXPORT_ZIP}: upload that zip.
import os
import zipfile

milestone_files = [f for f in {MILESTONE_FILES!r} if os.path.exists(f)]
grader.export("{name}.ipynb", export_path="{EXPORT_ZIP}", pdf=False, files=milestone_files)
if os.path.exists("{EXPORT_ZIP}"):
    print("{EXPORT_ZIP} holds:", ", ".join(zipfile.ZipFile("{EXPORT_ZIP}").namelist()))
if len(milestone_files) < 2:
    print("milestone.pt and milestone.json are not both in this folder: the milestone checkpoint earns no points")
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
