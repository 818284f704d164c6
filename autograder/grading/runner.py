"""The sandboxed runs of a course: the one place a WorkerPool is built from a Course (the local run and each Dask
worker share it), with the limits and the probe order it runs."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from autograder.authoring.suite import Suite
from autograder.config import GradingConfig
from autograder.course import Course
from autograder.sandbox import SANDBOX_ENV, SKIP_TAGS, Limits, WorkerPool


def sandbox_limits(config: GradingConfig) -> Limits:
    """The sandbox's limits from the config's execution section (each by its one name: Limits.configured)."""
    return Limits.configured(config.execution)


def probe_order(suite: Suite) -> list[tuple[Any, ...]]:
    """The probes of a run, visible cases first: what a student sees never comes from a process that has run a
    hidden probe."""
    return [(c.id, c.probe, c.args, c.hidden)
            for c in sorted(suite.cases, key=lambda c: c.hidden)]


def make_pool(course: Course, *, size: int, hide: Iterable[str | Path] = (),
              allow_unsandboxed: bool | None = None) -> WorkerPool:
    """A pool of `size` warm sandboxed workers for `course`: everything the sandbox runs comes from here (the
    config's limits, the lesson's checks module and the modules staged beside it, the folders shown empty, the
    isolation chosen by the operator's environment); the sandbox reads no config of its own."""
    lesson = course.lesson
    return WorkerPool(size, limits=sandbox_limits(course.config), probe_module=lesson.checks_name,
                      modules=lesson.sandbox_modules, skip_tags=SKIP_TAGS, hide=tuple(hide),
                      sandbox=os.environ.get(SANDBOX_ENV) or "auto", allow_unsandboxed=allow_unsandboxed)
