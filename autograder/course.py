"""The course a command works on, the one root every stage starts from: its grading_config.yaml read once, with the
file it came from, its lesson and (computed on first use) its suite; cli.py builds one and every stage takes it as
`course=`, and takes config, lesson and suite from it, never finding them again."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path

from autograder.authoring.suite import Suite, read_suite
from autograder.config import DEFAULT_CONFIG, ConfigError, GradingConfig, load_config
from autograder.lesson import Lesson, LessonError


@dataclass(frozen=True, eq=False)
class Course:
    """One grading config, parsed once, and its lesson. A stage in another process (a cluster worker, Gradescope's
    run_autograder, nbgrader's converter) loads its own from `path`, once, at its entry."""

    path: Path  # the grading_config.yaml it was read from, resolved
    config: GradingConfig
    lesson: Lesson  # the config's `assignment`, found near `path` (autograder/lesson.py)

    @classmethod
    def load(cls, path: Path = DEFAULT_CONFIG) -> Course:
        """Read and validate `path` and find its lesson (errors name the file and the key: config.ConfigError)."""
        path = Path(path).resolve()
        config = load_config(path)
        try:
            lesson = Lesson.load(config.assignment, near=path.parent)
        except LessonError as exc:
            raise ConfigError(f"{path}: invalid grading config:\n  assignment: {exc}") from None
        return cls(path, config, lesson)

    @cached_property
    def suite(self) -> Suite:
        """Every graded case with its reference values and the milestone's rules (validated by the lesson's plug-in:
        the config alone never imports it nor the trainer), read from the lesson's sources the first time it is
        asked for."""
        return self.read_suite()

    def read_suite(self, *, assignments: Path | None = None, reference_file: Path | None = None) -> Suite:
        """This course's suite read afresh, from the lesson's sources or from a copy of them (`assignments`,
        `reference_file`)."""
        return read_suite(self.path, self.config, self.lesson, assignments=assignments, reference_file=reference_file)

    @property
    def is_default(self) -> bool:
        """Whether this is the package's own grading_config.yaml (commands then need no --config)."""
        return self.path == DEFAULT_CONFIG.resolve()


def course_of(path: Path = DEFAULT_CONFIG) -> Course:
    """The course of a config file, read once per resolved path in this process (the entry of a process that is
    handed a path: a cluster worker, nbgrader's converter; and the command line's default: a stage has no default
    course, it is always given one)."""
    return _course(Path(path).resolve())


@cache
def _course(path: Path) -> Course:
    return Course.load(path)

