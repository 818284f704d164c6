"""The guide's walk-through lesson (tests/fixtures/lesson_guide, docs/authoring.md "A lesson step by step"): written
from the guide alone, started with the scaffold, it releases and self-checks by its folder (`--lesson FOLDER`), and
the guide shows each of its files as they are."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from autograder.authoring.questions import load_questions
from autograder.config import ROOT
from autograder.course import Course
from autograder.release.common import tool_env

FIXTURE = ROOT / "tests" / "fixtures" / "lesson_guide"
GUIDE = ROOT / "docs" / "authoring.md"


def _cli(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "autograder.cli", *args], cwd=ROOT, env=tool_env(),
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout


def test_the_guide_shows_the_lesson_as_it_is() -> None:
    """Each question file's front matter and each probe and check of the walk-through appear in the guide verbatim."""
    guide = GUIDE.read_text()
    folder = FIXTURE / "assignments" / "lesson_guide"
    for name in ("q1_clip_rows.md", "q2_gain.md"):
        front = (folder / name).read_text().split("---\n")[1]
        assert front in guide, f"docs/authoring.md does not show {name}'s front matter as it is"
    checks = (folder / "lesson_guide_checks.py").read_text()
    for block in checks.split("\n\n\n")[1:]:
        if block.lstrip().startswith("@"):
            assert block.strip() in guide, f"docs/authoring.md does not show:\n{block}"


def test_the_walk_through_builds() -> None:
    course = Course.load(FIXTURE / "grading_config.yaml")
    questions = {q.id: q for q in load_questions(course.config, course.lesson)}
    text = "\n".join(c.source for c in questions["q1_clip_rows"].cells)
    assert "## Q1. Clip the norm of each row (`q1_clip_rows`, 4 points)" in text
    assert "| [3, 4] | 0.6000 | 0.8000 |" in text and "The first row now has norm 1.00." in text
    cases = {c.id: c for q in questions.values() for c in q.cases}
    assert cases["q2_gain/weight_trains"].known_cause == {
        "id": "gain_buffer", "description": "the weight is registered as a buffer: it is saved and moved, but never "
                                            "trained."}


@pytest.mark.build
@pytest.mark.sandbox
def test_the_walk_through_releases_and_self_checks(tmp_path: Path) -> None:
    course = tmp_path / "lesson_guide"
    shutil.copytree(FIXTURE, course)
    _cli("--lesson", str(course), "release")
    nb = nbformat.read(course / "student_templates" / "lesson_guide" / "lesson_guide.ipynb", as_version=4)
    assert "def clip_rows(x, max_norm):" in "\n".join(c.source for c in nb.cells)
    out = _cli("selfcheck", "--lesson", str(course))
    assert "self-check passed" in out, out


def test_the_guide_shows_the_config_and_states_the_authors_rules() -> None:
    guide = GUIDE.read_text()
    config = "\n".join(line for line in (FIXTURE / "grading_config.yaml").read_text().splitlines()
                       if not line.startswith("#"))
    assert config.strip() in guide
    for rule in ("`fmt(x, digits=4)`", "A list or a larger array is an error", "never the points. The builder appends",
                 "cannot render `{{", "`diagnosis`", "the build fails naming the file and the case",
                 "--lesson FOLDER", "rendered from the config's `execution:`", "[kit.md](kit.md)"):
        assert rule in guide, rule
