"""An opt-in record of where one grading process spends its wall time: with $LESSON83_PHASES set to a file, the
phases timed here (start-up, suite, sandbox start, the run, the checkpoint, writing ...) are written to it as JSON
when the process ends; unset (the default), timing records nothing and nothing is written (never into results)."""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

from autograder import env_name

PHASES_ENV = env_name("PHASES")  # a file to write the phases of this process to (benchmarks/upload.py reads it)
T = TypeVar("T")

_spans: list[dict[str, Any]] = []
_figures: dict[str, float] = {}
_lock = threading.Lock()


def _process_start() -> float:
    """This process's start on the time.monotonic() clock (Linux: /proc/self/stat), else the first call's time."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # seconds after boot
        return time.monotonic() - (time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    except (OSError, ValueError, IndexError, AttributeError):
        return time.monotonic()


def enabled() -> bool:
    return bool(os.environ.get(PHASES_ENV))


_START = _process_start() if enabled() else 0.0


def write_record() -> None:
    """Write the record now (at the process's end: atexit, or before an exit that skips it)."""
    target = os.environ.get(PHASES_ENV)
    if not target:
        return
    with _lock:
        data = {"spans": list(_spans), "figures": dict(_figures), "end": round(time.monotonic() - _START, 4)}
    try:
        Path(target).write_text(json.dumps(data, indent=1))
    except OSError:
        pass  # a timing record never fails a grading run


if enabled():
    atexit.register(write_record)


def span(name: str, start: float, end: float) -> None:
    """Record the phase `name` from `start` to `end` (time.monotonic()), when recording."""
    if enabled():
        with _lock:
            _spans.append({"phase": name, "start": round(start - _START, 4), "end": round(end - _START, 4)})


def started(name: str) -> None:
    """Record the phase `name` from this process's start until now (its start-up: the interpreter and imports)."""
    span(name, _START, time.monotonic())


def figure(name: str, value: float) -> None:
    """Record a figure (seconds of CPU a child reported, say), summed over calls, when recording."""
    if enabled():
        with _lock:
            _figures[name] = round(_figures.get(name, 0.0) + float(value), 4)


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Time the block as the phase `name` (when recording)."""
    t0 = time.monotonic()
    try:
        yield
    finally:
        span(name, t0, time.monotonic())


def timed(name: str, fn: Callable[..., T]) -> Callable[..., T]:
    """`fn`, each call timed as the phase `name` (when recording)."""
    @wraps(fn)
    def call(*args: Any, **kwargs: Any) -> T:
        with phase(name):
            return fn(*args, **kwargs)
    return call
