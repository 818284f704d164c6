"""The lesson scaffold (autograder/authoring/scaffold.py): a new lesson written from the template folder releases and
self-checks with no change, names only the lesson it was given, and never overwrites a course."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from autograder.authoring.scaffold import scaffold
from autograder.config import ROOT
from autograder.lesson import Lesson
from autograder.release.common import tool_env


def _cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "autograder.cli", "--config", str(config), *args], cwd=ROOT,
                          env=tool_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


def test_the_scaffold_writes_one_lesson_of_the_given_name(tmp_path: Path) -> None:
    config = scaffold("lesson_new", into=tmp_path / "course")
    files = sorted(str(p.relative_to(tmp_path / "course")) for p in (tmp_path / "course").rglob("*") if p.is_file())
    assert files == ["assignments/lesson_new/00_intro.md", "assignments/lesson_new/lesson_new_checks.py",
                     "assignments/lesson_new/q1_double.md", "assignments/lesson_new/q2_pick.md",
                     "grading_config.yaml", "reference/lesson_new.py", "reference/lesson_new_mistakes.py"]
    assert not [f for f in files if "__LESSON__" in (tmp_path / "course" / f).read_text()]
    lesson = Lesson.load("lesson_new", near=config.parent)
    assert lesson.root == config.parent and lesson.kinds == {"00_intro": "prose", "q1_double": "cases",
                                                             "q2_pick": "choices"}
    assert list(lesson.runtime_modules) == ["plain_codec", "checks_runtime", "generic_checks", "torch_kit"]
    with pytest.raises(FileExistsError):
        scaffold("lesson_other", into=tmp_path / "course")
    with pytest.raises(ValueError, match="lesson name"):
        scaffold("Lesson-New", into=tmp_path / "other")


@pytest.mark.build
@pytest.mark.sandbox
def test_a_scaffolded_lesson_releases_and_self_checks(tmp_path: Path) -> None:
    config = scaffold("lesson_new", into=tmp_path / "course")
    _cli(config, "release")
    assert (tmp_path / "course" / "student_templates" / "lesson_new" / "lesson_new.ipynb").is_file()
    out = _cli(config, "selfcheck").stdout
    assert "self-check passed" in out, out


def test_the_scaffold_notebook_states_the_time_limits_of_its_config(tmp_path: Path) -> None:
    from autograder.authoring.questions import load_questions
    from autograder.course import Course

    config = scaffold("lesson_new", into=tmp_path / "course")
    text = config.read_text()
    limits = {"cell_timeout_s": 37, "probe_timeout_s": 3.5, "question_timeout_s": 11, "wall_timeout_s": 123,
              "cpu_timeout_s": 131}
    for key in ("cell_timeout_s", "wall_timeout_s", "cpu_timeout_s"):
        text = "\n".join(line for line in text.splitlines() if not line.strip().startswith(key))
    config.write_text(text.replace("execution:\n", "execution:\n" + "".join(f"  {k}: {v}\n" for k, v in
                                                                             limits.items())))
    course = Course.load(config)
    intro = " ".join(c.source for c in load_questions(course.config, course.lesson)[0].cells)
    assert "**Time limits when grading.**" in intro
    for phrase in ("A single cell may run for at most 37 s", "may run for at most 3.5 s",
                   "the checks of one question for at most 11 s together",
                   "at most 131 s of CPU time and 369 s on the clock"):
        assert phrase in intro, intro
