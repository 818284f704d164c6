"""The builder's rules for a lesson author's question files (autograder/authoring/questions.py, templating.py): a
template error names the line and the expression, a heading that states its own points is refused (the builder
appends them), and `diagnosis:` on a case whose check never reads it is a build error naming the case."""

from __future__ import annotations

from pathlib import Path

import pytest

from autograder.authoring.questions import ContentError, load_questions
from autograder.authoring.scaffold import scaffold
from autograder.authoring.templating import fmt
from autograder.course import Course


def _lesson(tmp_path: Path, old: str, new: str) -> tuple[Course, Path]:
    """A scaffolded lesson whose q1_double.md has `old` replaced by `new`."""
    config = scaffold("lesson_rules", into=tmp_path / "course")
    q1 = config.parent / "assignments" / "lesson_rules" / "q1_double.md"
    text = q1.read_text()
    assert old in text
    q1.write_text(text.replace(old, new))
    return Course.load(config), q1


def _line_of(path: Path, needle: str) -> int:
    return next(i + 1 for i, line in enumerate(path.read_text().splitlines()) if needle in line)


def test_the_scaffold_builds_as_written(tmp_path: Path) -> None:
    course, _ = _lesson(tmp_path, "Double a tensor", "Double a tensor")
    questions = load_questions(course.config, course.lesson)
    heading = next(c.source for c in questions[1].cells if "## Q1" in c.source).splitlines()[0]
    assert heading == "## Q1. Double a tensor (`q1_double`, 3 points)"


def test_a_template_error_names_the_line_and_the_expression(tmp_path: Path) -> None:
    bad = "{{ fmt(ref.double(torch.tensor([1.0, 2.0])).tolist()) }}"
    course, q1 = _lesson(tmp_path, "Write `double(x)`", f"Twice: {bad}.\n\nWrite `double(x)`")
    with pytest.raises(ContentError) as err:
        load_questions(course.config, course.lesson)
    message = str(err.value)
    assert message.startswith(f"{q1}:{_line_of(q1, 'Twice:')}: question q1_double: cannot render `{bad}`"), message
    assert "fmt takes one number, not a list of 2" in message, message


def test_a_syntax_error_and_an_unknown_name_name_their_line(tmp_path: Path) -> None:
    course, q1 = _lesson(tmp_path, "Write `double(x)`", "Write {{ refs.double }} `double(x)`")
    with pytest.raises(ContentError, match=rf"q1_double.md:{_line_of(q1, 'refs.double')}: .*`{{{{ refs.double }}}}`"
                       r".*'refs' is undefined"):
        load_questions(course.config, course.lesson)
    course, q1 = _lesson(tmp_path / "2", "Write `double(x)`", "\n\nWrite {{ ref.double( }} `double(x)`")
    with pytest.raises(ContentError, match=rf"q1_double.md:{_line_of(q1, 'ref.double(')}: .*TemplateSyntaxError"):
        load_questions(course.config, course.lesson)


def test_fmt_takes_one_number() -> None:
    import numpy as np
    import torch

    assert fmt(0.5) == "0.5000" and fmt(2, 1) == "2.0" and fmt(-0.00001) == "0.0000"
    assert fmt(np.float32(0.25), 2) == "0.25" and fmt(torch.tensor([[1.5]], requires_grad=True)) == "1.5000"
    with pytest.raises(TypeError, match=r"not an array of shape \[2\]"):
        fmt(np.array([1.0, 2.0]))


@pytest.mark.parametrize("heading", ["## Q1. Double a tensor (`q1_double`, 3 points)",
                                     "## Q1. Double a tensor (3 pts) (`q1_double`)",
                                     "## Q1. Double a tensor [1 point]"])
def test_a_heading_that_states_points_is_refused(tmp_path: Path, heading: str) -> None:
    course, q1 = _lesson(tmp_path, "## Q1. Double a tensor (`q1_double`)", heading)
    with pytest.raises(ContentError) as err:
        load_questions(course.config, course.lesson)
    assert str(err.value).startswith(f"{q1}:{_line_of(q1, '## Q1')}: question q1_double: the heading"), err.value
    assert "appends (3 points)" in str(err.value)


def test_diagnosis_on_a_value_case_is_refused(tmp_path: Path) -> None:
    course, q1 = _lesson(tmp_path, "    revisit: multiply every entry by 2.",
                         "    diagnosis: adds_two\n    revisit: multiply every entry by 2.")
    with pytest.raises(ContentError, match=r"q1_double.md: question q1_double: case small: `diagnosis:` has no "
                       r"effect here: its check 'close' never reads"):
        load_questions(course.config, course.lesson)


def test_diagnosis_on_a_property_case_whose_check_never_reads_it_is_refused(tmp_path: Path) -> None:
    from autograder.authoring.questions import reads_diagnosis

    course, _ = _lesson(tmp_path, "    revisit: multiply every entry by 2.", "    revisit: multiply every entry by 2.")
    checks = course.lesson.checks
    deaf = next(n for n, fn in checks.CHECKS.items() if n not in checks.USES_EXPECTED and not reads_diagnosis(fn))
    course, _ = _lesson(tmp_path / "again", "cases:\n", f"""cases:
  - name: prop
    weight: 1
    probe: raises
    args: {{fn: double, args: ["two"]}}
    check: {deaf}
    diagnosis: adds_two
    revisit: check the input's type.
""")
    with pytest.raises(ContentError, match=rf"case prop: `diagnosis:` has no effect here: its check '{deaf}'"):
        load_questions(course.config, course.lesson)


def test_diagnosis_on_a_property_case_whose_check_reads_it_builds(tmp_path: Path) -> None:
    course, _ = _lesson(tmp_path, "cases:\n", """cases:
  - name: raises_on_text
    weight: 1
    probe: raises
    args: {fn: double, args: ["two"]}
    check: raises_value_error
    diagnosis: adds_two
    revisit: check the input's type.
""")
    case = next(c for q in load_questions(course.config, course.lesson) for c in q.cases
                if c.id == "q1_double/raises_on_text")
    assert case.known_cause == {"id": "adds_two", "description": "2 is added instead of multiplied."}
