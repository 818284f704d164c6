"""A student's zip is read as its folder is: what Jupyter and macOS put beside the work (.ipynb_checkpoints/,
__MACOSX/) is skipped inside a zip as the folder walk skips it (issue 32, finding 11)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from autograder.grading.submissions import find_submissions, read_entry

NOTEBOOK = b'{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}'
CHECKPOINT = b'{"cells": [{"cell_type": "code", "source": "old"}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}'

# A Jupyter folder as students zip it: the notebook, Jupyter's autosave copy, a macOS resource fork, and the
# uploaded file beside an autosaved copy of it.
JUPYTER_FOLDER = {
    "work.ipynb": NOTEBOOK,
    ".ipynb_checkpoints/work-checkpoint.ipynb": CHECKPOINT,
    "sub/.ipynb_checkpoints/work-checkpoint.ipynb": CHECKPOINT,
    "__MACOSX/._work.ipynb": b"\0\5\26\7",
    "fit.json": b'{"new": 1}',
    ".ipynb_checkpoints/fit.json": b'{"old": 1}',
}


def _as_folder(path: Path) -> Path:
    for name, data in JUPYTER_FOLDER.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_bytes(data)
    return path


def _as_zip(path: Path, *, prefix: str = "") -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in JUPYTER_FOLDER.items():
            zf.writestr(prefix + name, data)
    return path


@pytest.mark.parametrize("prefix", ["", "alice/"])  # zipped from inside the folder, or the folder itself
def test_a_zip_of_a_jupyter_folder_reads_as_the_folder_does(tmp_path: Path, prefix: str) -> None:
    folder = read_entry(_as_folder(tmp_path / "alice"), files=["fit.json"])
    zipped = read_entry(_as_zip(tmp_path / "alice.zip", prefix=prefix), files=["fit.json"])
    assert folder.problem == "" and folder.source == NOTEBOOK, folder.problem
    assert zipped.problem == "", zipped.problem  # today: "alice.zip holds 3 notebooks (.ipynb)"
    assert zipped.source == folder.source == NOTEBOOK
    assert zipped.files == folder.files == {"fit.json": b'{"new": 1}'}
    assert zipped.file_problems == folder.file_problems == []


def test_a_class_folder_of_such_zips_has_no_unreadable_row(tmp_path: Path) -> None:
    subs = tmp_path / "class"
    subs.mkdir()
    _as_zip(subs / "alice.zip")
    _as_folder(subs / "bob")
    got = {s.id: (s.source, s.problem) for s in find_submissions(subs)}
    assert got == {"alice": (NOTEBOOK, ""), "bob": (NOTEBOOK, "")}


def test_a_notebook_only_inside_a_skipped_folder_is_still_no_notebook(tmp_path: Path) -> None:
    """Skipping is the same both ways: a zip whose one notebook is Jupyter's autosave copy has none."""
    with zipfile.ZipFile(tmp_path / "carl.zip", "w") as zf:
        zf.writestr(".ipynb_checkpoints/work-checkpoint.ipynb", CHECKPOINT)
    (tmp_path / "carl" / ".ipynb_checkpoints").mkdir(parents=True)
    (tmp_path / "carl" / ".ipynb_checkpoints" / "work-checkpoint.ipynb").write_bytes(CHECKPOINT)
    zipped, folder = read_entry(tmp_path / "carl.zip"), read_entry(tmp_path / "carl")
    assert zipped.source is None and "holds 0 notebooks" in zipped.problem
    assert folder.source is None and "holds 0 notebooks" in folder.problem
