"""The small torch lesson (tests/fixtures/lesson_torch) as a course's only lesson: it uses the engine's kit
(autograder/runtime/torch_kit.py, torch_trace.py, generic_checks.py) with a checks module of its own under 200 lines,
and every verb works on its Gradescope bundle's layout: release ships the kit modules it imports (and only those),
self-check passes, grading in the sandbox takes points from a wrong implementation and keeps full marks for a
correct alternative, and the report is written. docs/authoring.md shows every rule on this lesson.
"""

from __future__ import annotations

import csv
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest

from autograder.authoring.questions import mc_answers
from autograder.config import ROOT
from autograder.course import Course
from autograder.lesson import Lesson
from autograder.release.common import tool_env
from autograder.release.gradescope import gradescope_bundle
from autograder.release.sample import filled_notebook
from autograder.runtime import runtime_files

FIXTURE = ROOT / "tests" / "fixtures" / "lesson_torch"
KIT = ["plain_codec", "checks_runtime", "generic_checks", "torch_kit", "torch_trace"]

# Not in the lesson's catalogue of mistakes: the mean over every axis, not the last one.
WRONG = """
def rms_norm(x, eps=1e-6):
    return x / torch.sqrt(x.pow(2).mean() + eps)
"""
# Correct, written otherwise: rsqrt, and the table built from a column and a row.
ALTERNATIVE_FN = """
def rms_norm(x, eps=1e-6):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps)
"""
ALTERNATIVE_CLS = """
class Offset(nn.Module):
    def __init__(self, d_model, max_len=16):
        super().__init__()
        rows = torch.arange(max_len, dtype=torch.float32)[:, None] * d_model
        table = torch.sin((rows + torch.arange(d_model, dtype=torch.float32)) / d_model)
        self.register_buffer("table", table, persistent=True)

    def forward(self, x):
        T = x.size(-2)
        return x + self.table[:T, :]
"""


def _run(course: Path, args: list[str], *, timeout: int = 900) -> subprocess.CompletedProcess[str]:
    """A command in the course folder, with the course's own engine first on the path; it must succeed."""
    proc = subprocess.run([sys.executable, *args], cwd=course, env=tool_env() | {"PYTHONPATH": str(course)},
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


def test_the_lesson_uses_the_kit_with_a_short_checks_module() -> None:
    lesson = Lesson.load("lesson_torch", near=FIXTURE)
    assert len(lesson.checks_file.read_text().splitlines()) <= 200
    assert list(lesson.runtime_modules) == KIT  # the codec and the core, then the kit its checks import
    assert lesson.runtime_modules == {name: runtime_files()[name] for name in KIT}
    assert lesson.checks.LETTERS == ("A", "B", "C", "D")  # the multiple-choice trio comes from the kit
    assert set(lesson.runtime.CHECKS) >= {"close", "pair_equal", "choices_valid", "choice_correct", "kept_as_buffer"}


def test_each_lesson_binds_its_own_copy_of_the_kit_never_a_students_file(tmp_path: Path) -> None:
    """Two lessons in one process get their own copies of the kit, each bound to that lesson's runtime (their
    registries never mix), and a torch_kit.py (or any runtime module) in the working folder is never imported."""
    fake = "import pathlib\npathlib.Path(__file__).with_name('FAKE_IMPORTED').write_text('yes')\nraise ImportError\n"
    for name in runtime_files():
        (tmp_path / f"{name}.py").write_text(fake)
    code = (f"import sys; sys.path.insert(0, {str(tmp_path)!r}); sys.path.insert(0, {str(ROOT)!r})\n"
            "from pathlib import Path\nfrom autograder.course import course_of\nfrom autograder.lesson import Lesson\n"
            f"mine, other = Lesson.load('lesson_torch', near=Path({str(FIXTURE)!r})), course_of().lesson\n"
            "a, b = mine.checks, other.checks\n"
            "kit = mine.runtime_copies['generic_checks']\n"
            "print(kit is not other.runtime_copies['generic_checks'], kit.check.__module__ == mine.runtime.__name__,"
            " 'kept_as_buffer' in mine.runtime.CHECKS, 'kept_as_buffer' in other.runtime.CHECKS,"
            " 'lm_names' in mine.runtime.CHECKS, a.close is kit.close)")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["True", "True", "True", "False", "False", "True"], done.stdout
    assert not (tmp_path / "FAKE_IMPORTED").exists()


@pytest.fixture(scope="module")
def released(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The lesson's Gradescope bundle unpacked (a course folder whose only lesson is lesson_torch), released there."""
    tmp = tmp_path_factory.mktemp("torch-course")
    bundle = gradescope_bundle(tmp / "bundle.zip", course=Course.load(FIXTURE / "grading_config.yaml"))
    zipfile.ZipFile(bundle).extractall(tmp / "source")
    course = tmp / "source" / "lesson_torch"
    assert not [p for p in course.rglob("*") if "lesson83" in p.name]
    _run(course, ["-m", "autograder.cli", "release"])
    return course


@pytest.mark.build
def test_the_release_ships_the_kit_beside_the_checks(released: Path) -> None:
    student = released / "student_templates" / "lesson_torch"
    shipped = sorted(p.name for p in student.iterdir() if p.is_file())
    assert shipped == sorted([*(f"{m}.py" for m in KIT), "lesson_torch.ipynb", "lesson_torch_checks.py"])
    otter = zipfile.ZipFile(released / "dist" / "lesson_torch-otter-autograder.zip").namelist()
    assert {f"{m}.py" for m in KIT} <= {n.rsplit("/", 1)[-1] for n in otter}, otter


@pytest.fixture(scope="module")
def graded(released: Path) -> dict[str, dict[str, str]]:
    """The release's sample class, with a wrong implementation and a correct alternative, graded in the sandbox."""
    course = Course.load(released / "grading_config.yaml")
    answers = mc_answers(list(course.suite.questions))
    subs = released / "class"
    shutil.copytree(released / "dist" / "samples", subs)
    for name, extra in (("wrong", {"rms_norm": WRONG}),
                        ("alternative", {"rms_norm": ALTERNATIVE_FN, "Offset": ALTERNATIVE_CLS})):
        nb = filled_notebook(course.lesson.notebook, extra=extra, answers=answers, lesson=course.lesson)
        nbformat.write(nb, str(subs / f"{name}.ipynb"))
    _run(released, ["-m", "autograder.cli", "grade", "class", "--out", "grades", "--quiet"])
    return {r["id"]: r for r in csv.DictReader((released / "grades" / "grades.csv").open())}


@pytest.mark.sandbox
def test_selfcheck_passes(released: Path) -> None:
    out = _run(released, ["-m", "autograder.cli", "selfcheck"]).stdout
    assert "self-check passed" in out, out


@pytest.mark.sandbox
def test_grading_takes_points_from_mistakes_and_keeps_correct_alternatives(graded: dict[str, dict[str, str]]) -> None:
    scores = {sid: {k: float(v) for k, v in row.items() if k.startswith(("q", "total")) and v}
              for sid, row in graded.items()}
    full = {"total": 10.0, "q1_rms_norm": 4.0, "q2_offset": 4.0, "q3_pick": 2.0}
    assert scores["reference"] == full and scores["alternative"] == full, (scores["reference"], scores["alternative"])
    assert scores["blank"]["total"] == 0.0
    assert scores["wrong"]["q1_rms_norm"] < 4.0 and scores["wrong"]["q2_offset"] == 4.0, scores["wrong"]
    assert scores["mistake_rms_sum"]["q1_rms_norm"] < 4.0, scores["mistake_rms_sum"]
    # a table kept as a plain attribute: its value cases pass, the buffer and device cases do not
    lost = scores["mistake_table_attribute"]
    assert lost["q1_rms_norm"] == 4.0 and 0.0 < lost["q2_offset"] < 4.0, lost
    assert "plain attribute" in graded["mistake_table_attribute"]["message"]


@pytest.mark.sandbox
def test_the_report_is_written(released: Path, graded: dict[str, dict[str, str]]) -> None:
    _run(released, ["-m", "autograder.cli", "report", "grades", "--out", "report"])
    page = (released / "report" / "index.html").read_text()
    assert "q2_offset" in page and "wrong" in page
