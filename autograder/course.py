"""The course a command works on: its grading_config.yaml read once, with the file it came from, its lesson and
(computed on first use) its suite; cli.py builds one and every stage takes it as `course=`."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from autograder.config import DEFAULT_CONFIG, GradingConfig, load_config
from autograder.lesson import Lesson

if TYPE_CHECKING:
    from autograder.authoring.suite import Suite


@dataclass(frozen=True, eq=False)
class Course:
    """One grading config, parsed once. A stage in another process (a cluster worker, Gradescope's
    run_autograder) loads its own from `path`, once, at its entry."""

    path: Path  # the grading_config.yaml it was read from, resolved
    config: GradingConfig

    @classmethod
    def load(cls, path: Path = DEFAULT_CONFIG) -> Course:
        """Read and validate `path` (errors name the file and the key: config.ConfigError)."""
        return cls(Path(path).resolve(), load_config(Path(path)))

    @cached_property
    def lesson(self) -> Lesson:
        """The lesson the config grades."""
        return self.config.lesson

    @cached_property
    def suite(self) -> Suite:
        """Every graded case with its reference values, read from the lesson's sources the first time it is asked
        for."""
        from autograder.authoring.suite import read_suite

        return read_suite(self)

    @property
    def is_default(self) -> bool:
        """Whether this is the package's own grading_config.yaml (commands then need no --config)."""
        return self.path == DEFAULT_CONFIG.resolve()


def course_of(path: Path = DEFAULT_CONFIG) -> Course:
    """The course of a config file, read once per resolved path in this process (the default of every stage)."""
    return _course(Path(path).resolve())


@cache
def _course(path: Path) -> Course:
    return Course.load(path)


def default_course(course: Course | None) -> Course:
    """`course`, or the package's own (grading_config.yaml beside autograder/) when none is given."""
    return course if course is not None else course_of(DEFAULT_CONFIG)
