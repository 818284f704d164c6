"""The release: one source -> the student release, the Otter master notebook and `otter assign`, the nbgrader
source and release, the Gradescope bundle and the sample class (one module per target)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# nbformat validates with jsonschema, whose import builds rfc3987_syntax's IRI grammar (2-3 s of CPU, a third of
# the engine's import) for a format checker that nbformat never turns on. A None entry makes that optional import
# fail, so jsonschema leaves the checker out; only where nothing imported it yet (the CLI imports this package
# first).
sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]

import json  # noqa: E402

from autograder.authoring.questions import mc_answers  # noqa: E402
from autograder.config import ROOT, command  # noqa: E402
from autograder.course import Course  # noqa: E402
from autograder.release.common import BuildError, diff_trees, replace_dir, tool_env  # noqa: E402
from autograder.release.gradescope import gradescope_bundle, gradescope_zip  # noqa: E402
from autograder.release.keep import course_work  # noqa: E402
from autograder.release.nbgrader import build_nbgrader, check_course, update_course  # noqa: E402
from autograder.release.otter import build_otter  # noqa: E402
from autograder.release.sample import filled_notebook, write_samples  # noqa: E402
from autograder.release.student import normalise_student  # noqa: E402

__all__ = ["BuildError", "Release", "build", "diff_trees", "filled_notebook", "gradescope_bundle", "release",
           "stale_files", "tool_env", "write_samples"]


@dataclass
class Release:
    """Paths of a finished build."""

    student_dir: Path
    gradescope_zip: Path
    otter_zip: Path
    otter_dir: Path
    nbgrader_dir: Path


def build(*, course: Course, assignments: Path | None = None,
          reference_file: Path | None = None, work: Path) -> dict[str, Path]:
    """Build everything under `work` (a fresh folder); returns the paths of the parts (by default from the
    course's lesson's sources; `assignments` and `reference_file` stand in for a copy of them)."""
    own = assignments is not None or reference_file is not None  # a copy of the sources: read afresh
    suite = course.read_suite(assignments=assignments, reference_file=reference_file) if own else course.suite
    config, questions = suite.config, suite.authored
    suite.computed_expected()  # a release never builds from cached values (and it refreshes the cache)
    name, lesson = config.assignment, suite.lesson
    otter_out, otter_zip = build_otter(suite, work)
    nbgrader_course = build_nbgrader(suite, work)

    student = work / "student" / name
    normalise_student(otter_out / "student", student)
    manifest = {"questions": {q.id: q.points for q in questions if q.graded},
                "cases": [{"id": c.id, "question": c.question, "points": c.points, "hidden": c.hidden}
                          for q in questions for c in q.cases]}
    (work / "manifest.json").write_text(json.dumps(manifest, indent=1))
    write_samples(student / f"{name}.ipynb", work / "samples", answers=mc_answers(questions), lesson=lesson,
                  checkpoint_files=suite.checkpoint_files)
    return {"student": student, "otter": otter_out, "otter_zip": otter_zip, "nbgrader": nbgrader_course,
            "manifest": work / "manifest.json", "samples": work / "samples"}


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)


def _plan(replaced: list[Path], course: Path, *, existing: bool, name: str, dist: Path) -> str:
    """What a release replaces (and, of an existing nbgrader course and dist/, what it keeps), in words."""
    lines = [f"{command()} release replaces what it builds, each by a rename:"]
    lines += [f"  {_shown(path)}" for path in replaced]
    if existing:
        held = course_work(course)
        lines.append(f"  {_shown(course)}: only source/{name}, release/{name} and nbgrader_config.py (nbgrader "
                     "generate_assignment runs in the course); kept: " + (", ".join(held) or "everything else"))
    else:
        lines.append(f"  {_shown(course)}: a new nbgrader course")
    others = sorted(p.name for p in dist.iterdir() if p not in replaced and p != course) if dist.is_dir() else []
    if others:
        lines.append(f"kept in {_shown(dist)}: {', '.join(others)}")
    return "\n".join(lines)


def release(*, course: Course, assignments: Path | None = None,
            reference_file: Path | None = None, dist: Path | None = None,
            templates: Path | None = None, say: Callable[[str], None] | None = None) -> Release:
    """Build the release in a temporary folder, then put each output in place by a rename (by default in the
    lesson's course folder): the student release in student_templates/; otter/, samples/, the zips and
    manifest.json in dist/. An nbgrader course already in dist/nbgrader is updated in place (update_course): its
    submitted/, autograded/, feedback/ and gradebook stay, as does every other file of dist/ (the grades folders).
    `say` gets what will be replaced before anything is. Raises BuildError, replacing nothing, when the build fails
    or would change the grade cells under the course's submissions."""
    lesson = course.lesson
    dist, templates = dist or lesson.root / "dist", templates or lesson.student_dir.parent
    dist.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dist.parent, prefix=".build-") as tmp:
        work = Path(tmp)
        parts = build(course=course, assignments=assignments, reference_file=reference_file, work=work / "out")
        staged = work / "dist"
        staged.mkdir()
        os.replace(parts["otter"], staged / "otter")
        zip_name = f"{lesson.name}-otter-autograder.zip"
        shutil.copy(staged / "otter" / "autograder" / parts["otter_zip"].name, staged / zip_name)
        gradescope_bundle(staged / gradescope_zip(lesson.name), course=course)
        os.replace(parts["manifest"], staged / "manifest.json")
        os.replace(parts["samples"], staged / "samples")
        name = parts["student"].name
        nbgrader_dir = dist / "nbgrader"
        existing = nbgrader_dir.exists()
        if existing:
            check_course(parts["nbgrader"], nbgrader_dir, name)
        outputs = sorted(staged.iterdir())
        if say is not None:
            say(_plan([templates / name, *(dist / p.name for p in outputs)], nbgrader_dir, existing=existing,
                      name=name, dist=dist))
        dist.mkdir(exist_ok=True)
        if existing:
            update_course(parts["nbgrader"], nbgrader_dir, name)
        else:
            replace_dir(parts["nbgrader"], nbgrader_dir)
        replace_dir(parts["student"], templates / name)
        for path in outputs:
            replace_dir(path, dist / path.name)
    return Release(templates / name, dist / gradescope_zip(lesson.name), dist / zip_name, dist / "otter",
                   nbgrader_dir)


def stale_files(*, course: Course, templates: Path | None = None) -> list[str]:
    """Files of the committed student release that differ from a fresh build (empty when up to date)."""
    templates = templates or course.lesson.student_dir.parent
    with tempfile.TemporaryDirectory(prefix="release-check-") as tmp:
        parts = build(course=course, work=Path(tmp))
        return diff_trees(parts["student"], templates / parts["student"].name)
