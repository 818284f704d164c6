"""The demo lesson as a course's only lesson: the layout of its own Gradescope bundle (the engine, the lesson's
grading_config.yaml, assignments/lesson_demo/ and reference/), where nothing of Lesson 83 exists. Every verb works
there, and the bundle grades a submission through its own run_autograder. The engine loads a lesson's milestone
plug-in only when the lesson grades a checkpoint (autograder/checkpoint.py), so none of this needs one.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from autograder.config import ROOT
from autograder.course import Course
from autograder.release.common import tool_env
from autograder.release.gradescope import gradescope_bundle

FIXTURE = ROOT / "tests" / "fixtures" / "lesson_demo"
SIM = ROOT.parent / "shared" / "tools" / "gradescope-sim"


def _env(course: Path) -> dict[str, str]:
    """The tools on PATH, and the course's own engine first on the path (never this repository's)."""
    return tool_env() | {"PYTHONPATH": str(course)}


def _run(course: Path, args: list[str], *, timeout: int = 900) -> subprocess.CompletedProcess[str]:
    """A command in the course folder, which must succeed."""
    proc = subprocess.run([sys.executable, *args], cwd=course, env=_env(course), capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def course(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo lesson's Gradescope bundle, unpacked: a course folder whose only lesson is lesson_demo."""
    tmp = tmp_path_factory.mktemp("demo-course")
    bundle = gradescope_bundle(tmp / "bundle.zip", course=Course.load(FIXTURE / "grading_config.yaml"))
    zipfile.ZipFile(bundle).extractall(tmp / "source")
    root = tmp / "source" / "lesson_demo"
    assert not [p for p in root.rglob("*") if "lesson83" in p.name]
    return root


@pytest.fixture(scope="module")
def released(course: Path) -> Path:
    """The course's release, built by the release package alone (it imports nothing of the milestone)."""
    code = ("from autograder.course import course_of; from autograder.release import release; "
            "r = release(course=course_of()); "
            "print(r.student_dir, r.gradescope_zip, sep='\\n')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=course, env=_env(course), capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == [str(course / "student_templates" / "lesson_demo"),
                                   str(course / "dist" / "lesson_demo-gradescope-autograder.zip")]
    return course


@pytest.mark.build
def test_the_release_of_the_only_lesson_names_no_other(released: Path) -> None:
    notebook = (released / "student_templates" / "lesson_demo" / "lesson_demo.ipynb").read_text()
    assert 'grader.check(\\"q1_center\\")' in notebook  # the lesson's own first question as the example
    assert "milestone" not in notebook.lower()  # no milestone: nothing to upload beside the notebook
    config = (released / "dist" / "nbgrader" / "nbgrader_config.py").read_text()
    assert "c.CourseDirectory.course_id = 'lesson_demo'" in config
    assert (released / "dist" / "samples" / "reference.ipynb").is_file()


def test_help_works(course: Path) -> None:
    proc = _run(course, ["-m", "autograder.cli", "--help"], timeout=300)
    assert "release" in proc.stdout and "grade" in proc.stdout


@pytest.mark.build
def test_release_verb_works(course: Path, tmp_path: Path) -> None:
    copy = tmp_path / "lesson_demo"
    shutil.copytree(course, copy, ignore=shutil.ignore_patterns("dist", "student_templates", "__pycache__"))
    _run(copy, ["-m", "autograder.cli", "release"])
    assert (copy / "student_templates" / "lesson_demo" / "lesson_demo.ipynb").is_file()


@pytest.mark.sandbox
def test_selfcheck_and_grade_work(released: Path) -> None:
    _run(released, ["-m", "autograder.cli", "selfcheck"])
    _run(released, ["-m", "autograder.cli", "grade", "dist/samples", "--out", "grades", "--quiet"])
    assert (released / "grades" / "grades.csv").is_file()


@pytest.mark.sandbox
@pytest.mark.skipif(not SIM.exists() or not shutil.which("bwrap"), reason="needs gradescope-sim and bubblewrap")
def test_its_bundle_grades_a_submission_through_its_own_run_autograder(released: Path, tmp_path: Path) -> None:
    sub = tmp_path / "submission"
    sub.mkdir()
    shutil.copy(released / "dist" / "samples" / "reference.ipynb", sub / "lesson_demo.ipynb")
    bundle = released / "dist" / "lesson_demo-gradescope-autograder.zip"
    env = {k: v for k, v in tool_env().items() if k != "PYTHONPATH"}  # the bundle's own engine only
    proc = subprocess.run(["bash", str(SIM), str(bundle), str(sub), str(tmp_path / "out")], capture_output=True,
                          text=True, env=env, timeout=900)
    stderr = (tmp_path / "out" / "stderr.txt").read_text() if (tmp_path / "out" / "stderr.txt").is_file() else ""
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:] + stderr[-2000:]
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["score"] == pytest.approx(7.0), results  # q1_center 5 and q2_pick 2; q3_explain by hand
