"""Bad input to the release builder stops with a clear message and writes nothing half-built."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml

from autograder.authoring.questions import ContentError, load_questions, shuffled
from autograder.config import ROOT, ConfigError, load_config
from autograder.course import Course, course_of
from autograder.release import release

CONFIG = ROOT / "grading_config.yaml"
LESSON = Course.load(CONFIG).lesson
ASSIGNMENT_DIR, REFERENCE_FILE = LESSON.assignment_dir, LESSON.reference_file


def _config(tmp_path: Path, old: str, new: str) -> Path:
    path = tmp_path / "grading_config.yaml"
    text = CONFIG.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    return path


def test_unknown_config_key_is_named(tmp_path: Path) -> None:
    path = _config(tmp_path, "tolerances:\n  atol", "tolerances:\n  atoll: 1\n  atol")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in str(info.value) and "tolerances.atoll" in str(info.value)
    assert "unknown key" in str(info.value)


def test_points_that_do_not_add_up(tmp_path: Path) -> None:
    path = _config(tmp_path, "q2_sinusoidal_pe: {points: 12}", "q2_sinusoidal_pe: {points: 13}")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "do not add up" in str(info.value) and "q2_sinusoidal_pe 13" in str(info.value)
    assert "milestone 8" in str(info.value)  # the checkpoint's points count towards the total


def test_milestone_rules_are_checked(tmp_path: Path) -> None:
    path = _config(tmp_path, "        rope: {128: 6.0}", "        rope: {1024: 6.0}\n        relative: {128: 1}")
    course = Course.load(path)  # parsing the config imports no trainer: the course checks the presets with its suite
    with pytest.raises(ConfigError) as info:
        course.suite  # noqa: B018
    assert "milestone.presets.full.thresholds" in str(info.value) and "1024" in str(info.value)


def _assignments(tmp_path: Path) -> Path:
    dest = tmp_path / "assignments"
    shutil.copytree(ASSIGNMENT_DIR, dest)
    return dest


def test_question_without_tests(tmp_path: Path) -> None:
    src = _assignments(tmp_path)
    q2 = src / "q2_sinusoidal_pe.md"
    text = q2.read_text()
    front, body = text.split("\n---\n", 1)
    q2.write_text(front.split("\ncases:")[0] + "\n---\n" + body)
    with pytest.raises(ContentError) as info:
        load_questions(course_of().config, course_of().lesson, src)
    assert "q2_sinusoidal_pe.md" in str(info.value) and "has no tests" in str(info.value)


@pytest.mark.parametrize(("field", "name"), [("probe", "call"), ("check", "close")])
def test_unknown_probe_or_check_is_named(tmp_path: Path, field: str, name: str) -> None:
    src = _assignments(tmp_path)
    q2 = src / "q2_sinusoidal_pe.md"
    q2.write_text(q2.read_text().replace(f"    {field}: {name}\n", f"    {field}: no_such_{field}\n", 1))
    with pytest.raises(ContentError) as info:
        load_questions(course_of().config, course_of().lesson, src)
    msg = str(info.value)
    assert "q2_sinusoidal_pe.md" in msg and f"unknown {field} 'no_such_{field}'" in msg and name in msg


def test_solution_marker_left_open(tmp_path: Path) -> None:
    ref = tmp_path / "lesson83.py"
    text = REFERENCE_FILE.read_text()
    cut = text.index("def rope_cache")
    ref.write_text(text[:cut] + text[cut:].replace("    # END SOLUTION\n", "", 1))
    with pytest.raises(ContentError) as info:
        load_questions(course_of().config, course_of().lesson, ASSIGNMENT_DIR, ref)
    msg = str(info.value)
    assert str(ref) in msg and "q5_rope" in msg and "never closed" in msg


def test_failed_build_leaves_previous_release_untouched(course: Course, tmp_path: Path) -> None:
    dist, templates = tmp_path / "dist", tmp_path / "templates"
    (dist / "otter").mkdir(parents=True)
    (dist / "otter" / "keep.txt").write_text("old")
    (templates / "lesson83").mkdir(parents=True)
    (templates / "lesson83" / "keep.txt").write_text("old")
    src = _assignments(tmp_path)
    (src / "q3_sinusoidal_module.md").write_text(
        (src / "q3_sinusoidal_module.md").read_text().replace("<!-- tests -->", ""))
    with pytest.raises(ContentError) as info:
        release(assignments=src, dist=dist, templates=templates, course=course)
    assert "q3_sinusoidal_module" in str(info.value)
    assert (dist / "otter" / "keep.txt").read_text() == "old"
    assert (templates / "lesson83" / "keep.txt").read_text() == "old"
    assert not list(tmp_path.glob(".build-*"))


def test_numbers_in_prose_are_computed_not_typed() -> None:
    for path in ASSIGNMENT_DIR.glob("*.md"):
        front, body = path.read_text().split("\n---\n", 1)
        meta = yaml.safe_load(front.removeprefix("---\n"))
        prose = [body] + [str(v) for key in ("choices", "written") for item in meta.get(key, [])
                          for v in item.values()]
        text = re.sub(r"\{\{.*?\}\}", "", "\n".join(prose), flags=re.S)
        typed = re.findall(r"(?<![\w.])-?\d+\.\d+", text)
        assert typed == [], f"{path}: typed numbers {typed}: compute them from reference/ with {{{{ }}}}"


def test_multiple_choice_answers_are_shuffled() -> None:
    questions = load_questions(course_of().config, course_of().lesson)
    letters = [shuffled(c)[1] for q in questions for c in q.choices]
    assert len(letters) == 5 and len(set(letters)) >= 3


def _with_requires(tmp_path: Path, case: str, requires: str) -> Path:
    """A copy of the assignments where case `case` of Q2 requires `requires`."""
    src = _assignments(tmp_path)
    q2 = src / "q2_sinusoidal_pe.md"
    text = q2.read_text()
    anchor = f"  - name: {case}\n"
    head, tail = text.split(anchor)
    block, rest = tail.split("\n  - name: ", 1)
    block = "\n".join(line for line in block.splitlines() if not line.startswith("    requires:"))
    q2.write_text(f"{head}{anchor}    requires: {requires}\n{block}\n  - name: {rest}")
    return src


@pytest.mark.parametrize(("case", "requires", "words"), [
    ("odd_d_raises", "[table_d5]", ["odd_d_raises", "'table_d5'", "not a case of this question"]),
    ("odd_d_raises", "[table_q4]", ["not a case of this question"]),
    ("odd_d_raises", "[hidden_table_d6]", ["odd_d_raises", "hidden", "public case"]),
    ("table_d4", "[relative_identity_d4]", ["cycle", "table_d4 -> relative_identity_d4 -> table_d4"]),
    ("table_d4", "[table_d4]", ["cycle", "table_d4 -> table_d4"]),
])
def test_requires_names_cases_of_the_same_question_without_cycles(tmp_path: Path, case: str, requires: str,
                                                                  words: list[str]) -> None:
    src = _with_requires(tmp_path, case, requires)
    with pytest.raises(ContentError) as info:
        load_questions(course_of().config, course_of().lesson, src)
    msg = str(info.value)
    assert "q2_sinusoidal_pe.md" in msg and "question q2_sinusoidal_pe" in msg
    for word in words:
        assert word in msg, msg


def test_every_property_case_is_gated_on_a_value_case() -> None:
    """A check that judges a property of the output alone must wait for a value case of its question."""
    USES_EXPECTED = LESSON.checks.USES_EXPECTED
    properties = {"pair_equal", "pair_differ", "raises_value_error", "buffer_not_parameter", "follows_to",
                  "learned_table", "grad_rows", "shape", "lm_names", "tied_head", "lm_same_device", "fn_same_device"}
    for q in load_questions(course_of().config, course_of().lesson):
        for case in q.cases:
            if case.check in properties:
                assert case.requires, f"{case.id} ({case.check}) has no `requires:`"
                assert all(f"{q.id}/{r}" != case.id for r in case.requires)
                assert {c.check for c in q.cases if c.name in case.requires} <= USES_EXPECTED


def test_submission_limits_are_checked(tmp_path: Path) -> None:
    assert load_config(CONFIG).submissions.cap("notebook") == 20 * 2**20  # the shipped caps, in bytes
    path = _config(tmp_path, "  max_notebook_mb: 20\n  max_checkpoint_mb: 64",
                   "  max_notebook_mb: 100\n  max_checkpoint_mb: 0\n  max_files: 3")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    text = str(info.value)
    assert "submissions.max_notebook_mb" in text and "less than or equal to 64" in text
    assert "submissions.max_checkpoint_mb" in text and "greater than 0" in text
    assert "submissions.max_files: unknown key" in text


def test_the_milestone_checkpoint_is_declared_by_its_question(tmp_path: Path) -> None:
    """The checkpoint's id, title and files come from the milestone question's front matter: without that
    declaration a config that gives the checkpoint points is refused, and no other kind may declare one."""
    questions = load_questions(course_of().config, course_of().lesson)
    milestone = next(q for q in questions if q.kind == "milestone")
    assert milestone.checkpoint is not None and milestone.checkpoint.files  # what the release and grader use
    src = _assignments(tmp_path)
    m1 = src / milestone.path.name
    text = m1.read_text()
    declaration = re.search(r"\ncheckpoint:\n(  .*\n)+", text)
    assert declaration is not None
    m1.write_text(text.replace(declaration.group(), "\n"))
    with pytest.raises(ContentError, match=r"milestone.points .* add `checkpoint: \{id, title, files\}`"):
        load_questions(course_of().config, course_of().lesson, src)
    m1.write_text(text.replace("kind: milestone", "kind: cases"))
    with pytest.raises(ContentError, match="only a question of kind milestone declares a `checkpoint:`"):
        load_questions(course_of().config, course_of().lesson, src)
    m1.write_text(text.replace("files: [milestone.pt,", "files: [../milestone.pt,"))
    with pytest.raises(ContentError, match="a checkpoint file is a plain file name"):
        load_questions(course_of().config, course_of().lesson, src)
