"""A course's hidden seed: drawn once per release, kept beside its grading config in a file only the grader reads,
and the arguments a hidden case draws from it (`drawn:` in a question file).

A hidden case names the integer arguments it draws (say, the seed of the weights a module is filled with); the
reader replaces each by a number derived from the course's hidden seed, the case's id and the argument's name. The
seed is never shipped to students: the student release, the Otter student folder and the nbgrader release hold no
hidden case at all, and the grader-only outputs hold the drawn numbers (the Otter zip's static hidden cases), or,
in the Gradescope bundle, the seed file itself beside the config. The file is drawn when a course first needs it
(its first release, or its first grading) and kept: every later build, grading, reuse and resumed run reads the
same one, so their expected values agree; `release --new-seed` draws another one (a new term).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import tempfile
from pathlib import Path

from autograder import COMMAND
from autograder.config import ConfigError

SUFFIX = ".hidden_seed"  # grading_config.yaml -> grading_config.hidden_seed, beside it
SEED_BITS = 63  # a seed is a non-negative int below 2**63
DRAWN_BITS = 31  # a drawn argument is a non-negative int below 2**31 (any generator's seed takes it)

NOTE = (f"# The hidden seed of this course ({COMMAND}): hidden cases draw their arguments from it (`drawn:`).\n"
        "# Grader-only: never ship it to students. Kept for every later build and grading; deleting it\n"
        f"# (or `{COMMAND} release --new-seed`) draws another: every drawn case changes, and stored grades\n"
        "# are graded again.\n")


def seed_file(config_path: Path) -> Path:
    """Where the course of the grading config `config_path` keeps its hidden seed: beside it, named after it."""
    return config_path.with_name(config_path.stem + SUFFIX)


def read_seed(path: Path) -> int:
    """The seed a seed file holds (its one line that is not a comment); ConfigError when there is none."""
    lines = [s for s in (line.strip() for line in path.read_text().splitlines()) if s and not s.startswith("#")]
    try:
        (text,) = lines
        seed = int(text)
    except ValueError:
        raise ConfigError(f"{path}: a hidden seed file holds one integer (and # comments); delete it to draw "
                          "another") from None
    if not 0 <= seed < 2**SEED_BITS:
        raise ConfigError(f"{path}: the hidden seed must be a non-negative integer below 2**{SEED_BITS}")
    return seed


def write_seed(path: Path, seed: int, *, replace: bool = False) -> int:
    """Write `seed` to a new seed file at `path` (mode 0600, whole or not at all), or, when one is already there
    and not `replace`, keep that one (another process drew first). Returns the seed the file holds."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".hidden-seed-", suffix=".tmp")  # mode 0600
    try:
        with os.fdopen(fd, "w") as f:
            f.write(f"{NOTE}{seed}\n")
        if replace:
            os.replace(tmp, path)
            return seed
        try:
            os.link(tmp, path)  # atomic, and never over a seed another process wrote meanwhile
        except FileExistsError:
            return read_seed(path)
        return seed
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def course_seed(config_path: Path, *, fresh: bool = False) -> int:
    """The hidden seed of the course of `config_path`: read from its seed file, else (or when `fresh`) drawn now
    and kept there. ConfigError when it must be drawn where the course folder cannot be written."""
    path = seed_file(config_path)
    if path.is_file() and not fresh:
        return read_seed(path)
    try:
        return write_seed(path, secrets.randbits(SEED_BITS), replace=fresh)
    except OSError as exc:
        raise ConfigError(f"{path}: the course's hidden seed is missing and cannot be written here ({exc}); run "
                          f"`{COMMAND} release` where the course folder is writable, or copy the seed file of the "
                          "course's release beside its grading config") from None


def drawn(seed: int, case_id: str, name: str) -> int:
    """The value of argument `name` of hidden case `case_id` under hidden seed `seed`: a non-negative int below
    2**31, the same for the same three, and nothing about the seed or another case's value can be read from it."""
    digest = hashlib.sha256(f"{seed}\0{case_id}\0{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % 2**DRAWN_BITS


__all__ = ["SUFFIX", "seed_file", "read_seed", "write_seed", "course_seed", "drawn"]
