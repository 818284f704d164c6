"""A compiled course: what a release computed of its suite (the questions as read, the expected values), shipped
beside its config in a release bundle so that reading its suite parses no question file, imports no torch (the
milestone rules, checked when compiled, are parsed when first asked for) and computes nothing; used only where it
was compiled from the same files."""

from __future__ import annotations

import hashlib
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autograder.lesson import Lesson

if TYPE_CHECKING:
    from autograder.authoring.questions import Question

COMPILED_DIR = "compiled"  # beside a compiled course's config (graders only: the sandbox never shows the course)
COMPILED_FILE = "suite.pickle"


@dataclass
class Compiled:
    """What the release computed of a suite; valid where the files it was compiled from are unchanged (`fingerprint`,
    the suite's, and `texts`, the question files' own hash: their prose too, which the fingerprint leaves out)."""

    fingerprint: str
    texts: str
    versions: dict[str, str]  # torch's and numpy's, which the expected values depend on
    questions: list[Question]  # the authored questions as read (their lesson left out and their files relative to
    # its root: the reader's own lesson is bound)
    expected: dict[str, Any]  # the expected values in their plain form (as the cache keeps them)
    parts: tuple[str, ...] = ()  # the milestone plug-in's PARTS when the checkpoint has points (read without it)


def compiled_file(config_path: Path) -> Path:
    """Where a compiled course keeps its Compiled, beside its config."""
    return config_path.parent / COMPILED_DIR / COMPILED_FILE


def versions() -> dict[str, str]:
    """The versions of torch and numpy that expected values depend on, read without importing either."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("torch", "numpy"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = ""
    return found


def texts_hash(lesson: Lesson) -> str:
    """The hash of the lesson's question files, whole."""
    h = hashlib.sha256()
    for f in lesson.question_files:
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def load_compiled(config_path: Path, lesson: Lesson) -> Compiled | None:
    """The Compiled beside `config_path`, its questions bound to `lesson`, when its question files are the ones it
    was compiled from (the caller checks the fingerprint); None when there is none or it cannot be read."""
    path = compiled_file(config_path)
    if not path.is_file():
        return None
    try:
        compiled = pickle.loads(path.read_bytes())  # noqa: S301 - the release's own file, beside the engine's code
    except Exception:  # noqa: BLE001 - unreadable (another engine's): the suite is read from its sources
        return None
    if not isinstance(compiled, Compiled) or compiled.texts != texts_hash(lesson):
        return None
    for q in compiled.questions:
        q.lesson, q.path = lesson, lesson.root / q.path  # (an absolute path stays as it is)
    return compiled
