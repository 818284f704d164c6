"""An honest notebook from every target we ship (student release, Otter, nbgrader) is graded, never flagged, by
`lesson83 grade`: the nbgrader release runs the shipped checks (check_case) in the student's process, and that fills
the checks module's table of local results, which is not tampering."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from autograder.authoring.questions import mc_answers
from autograder.authoring.suite import Suite
from autograder.course import Course
from autograder.grading.batch import grade_batch
from autograder.release.sample import filled_notebook

pytestmark = pytest.mark.sandbox  # the tiers are in pyproject.toml


def nbgrader_filled(release: Path, source: Path) -> nbformat.NotebookNode:
    """The nbgrader release notebook with every solution cell answered as the instructor's source answers it."""
    nb = nbformat.read(str(release), as_version=4)
    solved = {c.metadata["nbgrader"]["grade_id"]: c.source for c in nbformat.read(str(source), as_version=4).cells
              if c.metadata.get("nbgrader", {}).get("solution")}
    filled = 0
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution"):
            cell.source = solved[meta["grade_id"]]
            filled += 1
    assert filled > 5, "the nbgrader release has no solution cells to fill"
    return nb


@pytest.fixture(scope="module")
def graded(course: Course, fresh_build: dict[str, Path], suite: Suite,
           tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    tmp = tmp_path_factory.mktemp("targets")
    subs = tmp / "submissions"
    subs.mkdir()
    answers = mc_answers(list(suite.questions))
    nbgrader = fresh_build["nbgrader"]
    notebooks = {
        "student": filled_notebook(fresh_build["student"] / "lesson83.ipynb", answers=answers, lesson=suite.lesson),
        "otter": filled_notebook(fresh_build["otter"] / "student" / "lesson83.ipynb", answers=answers,
                                 lesson=suite.lesson),
        "nbgrader": nbgrader_filled(nbgrader / "release" / "lesson83" / "lesson83.ipynb",
                                    nbgrader / "source" / "lesson83" / "lesson83.ipynb"),
    }
    assert any("check_case(" in c.source for c in notebooks["nbgrader"].cells)  # its checks run when graded
    for name, nb in notebooks.items():
        nbformat.write(nb, str(subs / f"{name}.ipynb"))
    summary = grade_batch(subs, out=tmp / "out", progress=False, course=course)
    return {r["id"]: r for r in summary.rows}


@pytest.mark.parametrize("target", ["student", "otter", "nbgrader"])
def test_an_honest_notebook_from_every_target_is_graded_not_flagged(graded: dict[str, dict], target: str) -> None:
    row = graded[target]
    assert row["status"] == "graded", row
    assert float(row["total"]) == float(graded["student"]["total"]) > 0, row
