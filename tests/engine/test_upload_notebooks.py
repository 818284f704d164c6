"""A zip or folder holding several notebooks (a Jupyter folder zipped with a scratch `executed.ipynb`) is graded on
the one the release names when it is there, and says which it graded and which it left; otherwise the message
names every notebook found (issue 42, finding 6: "could not be read: holds 2 notebooks", naming none). The same
for a per-student folder, a Gradescope upload folder and nbgrader's submitted/<student>/<assignment>/."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from autograder.config import ROOT
from autograder.course import Course
from autograder.grading.gradebook import record_key as result_key
from autograder.grading.judge import judge_submission
from autograder.grading.nbgrader import course_submissions
from autograder.grading.submissions import find_submissions, read_entry
from autograder.model import Status

CONFIG = ROOT / "tests" / "fixtures" / "lesson_demo" / "grading_config.yaml"
WANTED = "lesson_demo.ipynb"
MINE, SCRATCH = b'{"mine": 1}', b'{"scratch": 1}'


@pytest.fixture(scope="module")
def demo() -> Course:
    return Course.load(CONFIG)


def _put(root: Path, files: dict[str, bytes], *, zipped: bool) -> Path:
    if zipped:
        root = root.with_suffix(".zip")
        with zipfile.ZipFile(root, "w") as zf:
            for name, data in files.items():
                zf.writestr(name, data)
        return root
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


@pytest.mark.parametrize("zipped", [True, False])
def test_the_release_notebook_is_graded_and_the_others_named(tmp_path: Path, zipped: bool) -> None:
    entry = _put(tmp_path / "alice", {WANTED: MINE, "executed.ipynb": SCRATCH, "old/try.ipynb": SCRATCH},
                 zipped=zipped)
    sub = read_entry(entry, notebook=WANTED)
    assert sub.problem == "" and sub.source == MINE, sub.problem
    assert sub.picked == (f"alice{'.zip' if zipped else '/'} holds 3 notebooks: graded {WANTED}, the notebook the "
                          "assignment names; left executed.ipynb, old/try.ipynb"), sub.picked


@pytest.mark.parametrize("zipped", [True, False])
def test_without_the_release_notebook_every_notebook_is_named(tmp_path: Path, zipped: bool) -> None:
    names = ["executed.ipynb", "mine.ipynb", "sub/more.ipynb"]
    sub = read_entry(_put(tmp_path / "bob", dict.fromkeys(names, MINE), zipped=zipped), notebook=WANTED)
    assert sub.source is None and "holds 3 notebooks (.ipynb)" in sub.problem, sub.problem
    assert all(n in sub.problem for n in names) and f"none is named {WANTED}" in sub.problem, sub.problem
    # two notebooks of the release's name at one depth: neither is guessed
    twice = read_entry(_put(tmp_path / "cy", {f"a/{WANTED}": MINE, f"b/{WANTED}": MINE}, zipped=zipped),
                       notebook=WANTED)
    assert twice.source is None and f"a/{WANTED}" in twice.problem and f"b/{WANTED}" in twice.problem
    # the shallowest of them is the one
    nested = read_entry(_put(tmp_path / "di", {WANTED: MINE, f"backup/{WANTED}": SCRATCH}, zipped=zipped),
                        notebook=WANTED)
    assert nested.source == MINE and f"backup/{WANTED}" in nested.picked


def test_one_notebook_is_graded_whatever_its_name(tmp_path: Path) -> None:
    sub = read_entry(_put(tmp_path / "eve", {"homework.ipynb": MINE}, zipped=True), notebook=WANTED)
    assert sub.source == MINE and sub.picked == ""


def test_the_class_folder_and_nbgrader_read_the_same_way(tmp_path: Path, demo: Course) -> None:
    klass = tmp_path / "class"
    _put(klass / "alice", {WANTED: MINE, "executed.ipynb": SCRATCH}, zipped=False)
    _put(klass / "bob", {"x.ipynb": MINE, "y.ipynb": MINE}, zipped=True)
    got = {s.id: s for s in find_submissions(klass, notebook=WANTED)}
    assert got["alice"].source == MINE and "executed.ipynb" in got["alice"].picked
    assert "bob.zip holds 2 notebooks (.ipynb): x.ipynb, y.ipynb" in got["bob"].problem
    course = tmp_path / "course"
    _put(course / "submitted" / "alice" / demo.config.assignment, {WANTED: MINE, "executed.ipynb": SCRATCH},
         zipped=False)
    (nb,) = course_submissions(course, demo.config.assignment, course=demo)
    assert nb.source == MINE and "executed.ipynb" in nb.picked


def test_the_student_and_the_ta_are_told_which_was_graded(tmp_path: Path, demo: Course) -> None:
    sub = read_entry(_put(tmp_path / "alice", {WANTED: MINE, "executed.ipynb": SCRATCH}, zipped=True),
                     notebook=WANTED)
    result = judge_submission(demo.suite, sub, Status.GRADED, {}, ["a note"])
    assert sub.picked in result.notes and sub.picked in result.student_notes
    assert sub.picked in result.gradescope(revisit={})["output"]
    alone = read_entry(_put(tmp_path / "bob", {WANTED: MINE}, zipped=True), notebook=WANTED)
    assert alone.source == sub.source
    assert result_key(sub, "f", ()) != result_key(alone, "f", ())  # told again when what was left changes
