"""The grading config is parsed once per command (autograder/course.py): cli.py reads it into a Course and every
stage takes that object; a stage given a Course reads no config file at all."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from autograder import cli
from autograder import course as course_module
from autograder.authoring.suite import reference_env
from autograder.config import DEFAULT_CONFIG, ROOT, GradingConfig
from autograder.course import Course
from autograder.grading.batch import grade_batch
from autograder.grading.judge import grade_namespace
from autograder.release import release
from autograder.report import write_report
from autograder.selfcheck import selfcheck

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "lesson_demo"


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every grading config validated from now on (load_config's one way in)."""
    seen: list[object] = []
    validate = GradingConfig.model_validate

    def counted(obj: object, **kwargs: object) -> GradingConfig:
        seen.append(obj)
        return validate(obj, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(GradingConfig, "model_validate", counted)
    return seen


@pytest.fixture
def no_package_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """The package's own grading_config.yaml cannot be read, and no stage may fall back to the package's course."""
    package = DEFAULT_CONFIG.resolve()
    for name in ("read_text", "read_bytes", "open"):
        real = getattr(Path, name)

        def guarded(self: Path, *args: object, _real: object = real, **kwargs: object) -> object:
            if self.resolve() == package:
                raise AssertionError(f"a stage read the package's own {package.name}")
            return _real(self, *args, **kwargs)  # type: ignore[operator]

        monkeypatch.setattr(Path, name, guarded)

    def no_default(*_: object, **__: object) -> Course:
        raise AssertionError("a stage looked for the package's own course")

    monkeypatch.setattr(course_module, "course_of", no_default)


def _graded(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the demo course (its config not yet read in this process) and a grades folder of the
    reference's result, judged in-process as the grader stores it."""
    course = tmp_path / "course"
    shutil.copytree(FIXTURE, course)
    suite = Course.load(course / "grading_config.yaml").suite
    grades = tmp_path / "grades"
    (grades / "results").mkdir(parents=True)
    record = grade_namespace(suite, reference_env(suite), name="reference").to_dict()
    (grades / "results" / "reference.json").write_text(json.dumps(record))
    return course / "grading_config.yaml", grades


def test_a_command_parses_its_config_once(tmp_path: Path, parses: list[object],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    config, grades = _graded(tmp_path)
    parses.clear()
    assert cli.main(["--config", str(config), "report", str(grades), "--out", str(tmp_path / "report")]) == 0
    assert (tmp_path / "report" / "index.html").is_file(), capsys.readouterr()
    assert len(parses) == 1, parses  # the report's suite, its fingerprint and lesson: all from one parse


def test_a_stage_given_a_course_reads_no_config(tmp_path: Path, parses: list[object]) -> None:
    config, grades = _graded(tmp_path)
    course = Course.load(config)
    parses.clear()
    write_report(grades, out=tmp_path / "report", course=course)
    assert parses == []


def test_the_course_is_the_one_root(tmp_path: Path) -> None:
    """Config, lesson and suite come from the course: the suite's lesson is the course's (one object), and the
    config alone knows no lesson (parsing it finds no lesson folder and imports no trainer)."""
    course = Course.load(FIXTURE / "grading_config.yaml")
    assert course.suite.lesson is course.lesson and course.suite.config is course.config
    assert not hasattr(course.config, "lesson")


def test_the_suite_module_never_imports_the_course() -> None:
    import ast

    from autograder.authoring import suite

    tree = ast.parse(Path(suite.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "autograder.course" not in imported and not hasattr(suite, "load_suite")


def _stages(tmp: Path) -> dict[str, tuple[object, tuple[object, ...], dict[str, object]]]:
    """Each stage function with the arguments it needs besides its course (nothing is read before binding fails)."""
    from autograder.grading.gradescope import grade_gradescope
    from autograder.grading.merge import merge_scores
    from autograder.grading.nbgrader import course_submissions, nbgrader_autograde
    from autograder.release import build, gradescope_bundle, stale_files

    return {"release": (release, (), {}), "build": (build, (), {"work": tmp / "work"}),
            "stale_files": (stale_files, (), {}), "gradescope_bundle": (gradescope_bundle, (tmp / "a.zip",), {}),
            "selfcheck": (selfcheck, (), {}), "grade_batch": (grade_batch, (tmp,), {"out": tmp / "grades"}),
            "grade_gradescope": (grade_gradescope, (tmp, tmp / "results.json"), {}),
            "write_report": (write_report, (tmp,), {"out": tmp / "report"}),
            "merge_scores": (merge_scores, (tmp, []), {}),
            "course_submissions": (course_submissions, (tmp, "lesson"), {}),
            "nbgrader_autograde": (nbgrader_autograde, (tmp,), {})}


def test_no_stage_runs_without_a_course(tmp_path: Path) -> None:
    """A missing course is an error in the engine (the package's own course is the command line's default only):
    each stage called without `course=` refuses before it reads or writes anything, and `course` is a required
    keyword of every function of the engine that takes one."""
    import ast
    import inspect

    for name, (stage, args, kwargs) in _stages(tmp_path).items():
        assert inspect.signature(stage).parameters["course"].kind is inspect.Parameter.KEYWORD_ONLY, name
        with pytest.raises(TypeError, match="course"):
            stage(*args, **kwargs)  # type: ignore[operator]
    assert list(tmp_path.iterdir()) == []
    assert not hasattr(course_module, "default_course")
    defaulted = []
    for path in sorted((ROOT / "autograder").rglob("*.py")):
        for fn in ast.walk(ast.parse(path.read_text())):
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                a = fn.args
                pairs = [*zip(a.args[len(a.args) - len(a.defaults):], a.defaults, strict=True),
                         *zip(a.kwonlyargs, a.kw_defaults, strict=True)]
                defaulted += [f"{path.name}:{fn.name}" for arg, d in pairs if arg.arg == "course" and d is not None]
    assert defaulted == [], f"a stage with a default course: {defaulted}"


# The processes that are handed no course, each with why: the only ones left. The checkpoint reader (a sandboxed
# process that stages the lesson's folders, not its config, and imports the plug-in by its file) finds the lesson
# of the folder the plug-in lies in (checkpoint.reader_lesson; everywhere else a plug-in's LESSON is the one its
# loader, Lesson.plugin, hands it: the course's); the plug-in's command line, checkpoint.main, runs on a bare PyTorch
# image without pydantic, and a command line may default (as cli.py's does).
LESSON_FINDERS_WITHOUT_A_COURSE = {
    ("autograder/checkpoint.py", "reader_lesson", "Lesson.load"),
    ("autograder/checkpoint.py", "main", "lesson_named_in"),
}


def lesson_finders() -> set[tuple[str, str, str]]:
    """(file, function, what) of every call outside lesson.py (which defines them) and course.py that constructs a
    Lesson or finds one: Lesson(...), Lesson.load(...), lesson_named_in(...), in autograder/ and assignments/."""
    import ast

    found = set()
    for path in sorted([*(ROOT / "autograder").rglob("*.py"), *(ROOT / "assignments").rglob("*.py")]):
        name = path.relative_to(ROOT).as_posix()
        if name in ("autograder/lesson.py", "autograder/course.py"):
            continue
        tree = ast.parse(path.read_text())
        scopes = {id(n): f.name for f in ast.walk(tree) if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
                  for n in ast.walk(f)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            what = ast.unparse(node.func)
            if what in ("Lesson", "Lesson.load", "lesson_named_in") or what.endswith(".lesson_named_in"):
                found.add((name, scopes.get(id(node), "<module>"), what))
    return found


def test_the_lesson_is_reached_through_the_course() -> None:
    """No module but course.py finds a lesson (Course.load): a stage takes `course.lesson`, the sample class and
    the filled notebooks are given theirs; only the processes that cannot read a course find it otherwise."""
    assert lesson_finders() == LESSON_FINDERS_WITHOUT_A_COURSE
    from autograder.release.sample import filled_notebook

    with pytest.raises(TypeError, match="lesson"):
        filled_notebook(ROOT / "student_templates" / "lesson83" / "lesson83.ipynb")  # type: ignore[call-arg]


def test_a_plug_in_is_handed_its_lesson_by_the_course(tmp_path: Path) -> None:
    """A milestone plug-in loaded through its course's lesson (Lesson.plugin) uses that very lesson: it finds no
    other; loaded by its file alone (as the checkpoint reader loads it), it finds the lesson of its folder."""
    from autograder.checkpoint import reader_lesson

    course = Course.load(ROOT / "grading_config.yaml")
    assert course.lesson.plugin.LESSON is course.lesson
    alone = reader_lesson({"__file__": str(course.lesson.plugin_file)})
    assert (alone.name, alone.root) == (course.lesson.name, course.lesson.root)


def test_the_report_of_a_course_never_reads_the_package_config(tmp_path: Path, no_package_config: None) -> None:
    """A course built from the demo lesson's config: its suite, judging and report never read the package's
    grading_config.yaml nor fall back to the package's course."""
    config, grades = _graded(tmp_path)
    write_report(grades, out=tmp_path / "report", course=Course.load(config))
    assert (tmp_path / "report" / "index.html").is_file()


@pytest.mark.sandbox
@pytest.mark.build
def test_release_selfcheck_and_grade_of_a_course_never_read_the_package_config(tmp_path: Path,
                                                                                no_package_config: None) -> None:
    """Release, self-check, then grade the sample class, of a course built from the demo lesson's config: the
    sandbox's pool is built from the course (grading/runner.py), and nothing reads the package's
    grading_config.yaml."""
    config, _ = _graded(tmp_path)
    course = Course.load(config)
    release(course=course)
    assert selfcheck(course=course).passed
    summary = grade_batch(course.lesson.root / "dist" / "samples", out=tmp_path / "grades", course=course,
                          progress=False)
    totals = {r["id"]: r["total"] for r in summary.rows}
    assert totals["reference"] == course.suite.auto_points and totals["blank"] == 0, totals


def test_parsing_the_config_imports_no_trainer() -> None:
    """Loading a course (the package's: Lesson 83 with its milestone) imports neither the lesson's milestone
    trainer nor torch: the milestone's rules are the plug-in's, read with the suite."""
    code = ("import sys; from autograder.course import Course; Course.load(); "
            "print(sorted(m for m in sys.modules if m.endswith(('_milestone', '_checkpoint')) or m == 'torch'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout
    assert out.strip() == "[]", out
