"""Self-check of the release: the reference earns full marks and the committed blank template earns none."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from autograder.authoring.suite import reference_env
from autograder.course import Course
from autograder.grading.judge import grade_namespace, notebook_env
from autograder.grading.summaries import text_table


@dataclass
class SelfCheck:
    """Per-question points of the reference and of the blank template, and whether the check passed."""

    rows: list[list[str]]  # question, points, reference, blank (a header first, the notebook's total last)
    failures: list[str]  # the messages of the reference's failed cases
    passed: bool

    def text(self) -> str:
        verdict = ("self-check passed: the reference earns full marks and the blank template earns none."
                   if self.passed else "SELF-CHECK FAILED")
        return "\n".join([text_table(self.rows), *(f"reference fails {m}" for m in self.failures), verdict])


def selfcheck(*, course: Course, templates: Path | None = None) -> SelfCheck:
    """Grade the reference solution and the committed blank student template in this process (`templates`: the
    folder of student releases, by default the lesson's student_templates/)."""
    suite = course.suite
    lesson = suite.lesson
    template = lesson.notebook if templates is None else templates / lesson.name / lesson.notebook.name
    ref = grade_namespace(suite, reference_env(suite), name="reference")
    env, _ = notebook_env(template)
    blank = grade_namespace(suite, env, name="blank template")
    rs, bs = ref.question_scores(), blank.question_scores()
    rows = [["question", "points", "reference", "blank"]]
    for q in suite.questions:
        if not q.cells:  # the milestone checkpoint: graded from uploaded files, not from the notebook
            rows.append([q.id, f"{q.points:g}", "(files)", "(files)"])
        elif q.graded and not q.manual:
            rows.append([q.id, f"{q.points:g}", f"{rs.get(q.id, 0):g}", f"{bs.get(q.id, 0):g}"])
        elif q.manual:
            rows.append([q.id, f"{q.points:g}", "manual", "manual"])
    rows.append(["total (notebook)", f"{suite.notebook_points:g}", f"{ref.total:g}", f"{blank.total:g}"])
    return SelfCheck(rows, [c.message for c in ref.cases if not c.passed],
                     passed=ref.total == suite.notebook_points and blank.total == 0)
