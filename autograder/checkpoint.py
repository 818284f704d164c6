"""The checkpoint engine: the contract of a lesson's milestone plug-in and its typed verdicts; the reader processes
that load and evaluate an uploaded checkpoint (autograder/sandbox/files.py) are re-exported for the plug-ins.

A lesson with a milestone declares its checkpoint in the milestone question's front matter (`checkpoint: {id,
title, files}`, autograder/authoring/questions.py) and provides a plug-in, assignments/NAME/NAME_checkpoint.py
(Lesson.plugin_file; graders only: it is never shipped to students). The engine imports it only when the lesson
grades a checkpoint (Lesson.plugin, the one loader; its typed contract is lesson.MilestonePlugin). A plug-in module
defines:

    PARTS: Sequence[str]         the graded parts, each a case of the checkpoint's question (equal shares)
    PROBLEMS: dict[str, str]     problem id -> what it means and what to do: the report's checkpoint section.
                                 It has UNREADABLE ("checkpoint_unreadable"): uploads the grader could not read,
                                 and MISSING ("checkpoint_missing"): nothing uploaded (the report counts these
                                 apart from the mistakes).
    UNVERIFIED: str              what to do when the checkpoint could not be verified at all (a judge's message)
    verify(files, *, rules, memory_mb) -> CheckpointVerdict
                                 the uploaded files (name -> bytes, as the question declares them) against the
                                 config's milestone section (rules); never raises for what the files hold
    reader_start() -> state      in a verifier process, once: imports and models set up before any child forks
    reader_evaluate(request, data, state) -> dict
                                 in the limited child: read the checkpoint's bytes and answer plain JSON data

A plug-in runs its evaluation through run_child (or a Verifier of its own file), so the bytes of a hostile file
are only ever read in a child confined as a notebook's is (bubblewrap, or an unprivileged uid, cgroups, rlimits,
a wall clock: autograder/sandbox/files.py): it can only ever give a verdict. This module imports the standard
library, numpy (through the sandbox's modules) and the engine's lesson module alone (no torch).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autograder import sandbox
from autograder.lesson import ENGINE_ROOT, Lesson, lesson_named_in
from autograder.model import (  # re-exported: the plug-ins build them from here
    CheckpointVerdict,
    PartVerdict,
    Verdict,  # the old name of CheckpointVerdict, for one release (autograder/model.py)
)
from autograder.sandbox import (  # the reader processes, for the plug-ins: checkpoint.run_child, ...
    STARTUP_TIMEOUT_S,
    VERIFY_SLOTS,
    ReaderFiles,
    VerifierError,
    reader_isolation,
    reader_limits_lowered,
)

__all__ = ["MISSING", "STARTUP_TIMEOUT_S", "UNREADABLE", "VERIFY_SLOTS", "CheckpointVerdict", "PartVerdict", "Verdict",
           "Verifier",
           "VerifierError", "main", "pool", "read_limited", "reader_pool", "reader_isolation", "reader_limits_lowered",
           "reader_files", "reader_lesson", "reads_checkpoint", "run_child"]
UNREADABLE = "checkpoint_unreadable"  # the problem of uploads that could not be read at all
MISSING = "checkpoint_missing"  # the problem of a submission that uploaded no checkpoint: not a mistake in its code


def reader_lesson(namespace: dict[str, Any]) -> Lesson:
    """A plug-in's lesson, from the plug-in module's own namespace (`globals()`): the one its loader handed it
    (Lesson.plugin binds LESSON: in the grader, the course's lesson); else the lesson of the folder the plug-in lies
    in, for the one process that is handed no course, the checkpoint reader (the sandbox reads no config: it stages
    the lesson's folders and imports the plug-in by its file)."""
    given = namespace.get("LESSON")
    if isinstance(given, Lesson):
        return given
    plugin = Path(namespace["__file__"]).resolve()
    return Lesson.load(plugin.parent.name, near=plugin.parents[2])


def reader_files(plugin: Path, *, shipped: Sequence[Path] = ()) -> ReaderFiles:
    """What a reader of this plug-in stages (the sandbox reads no course): the plug-in's assignment folder and the
    course's reference/ folder, of which only `shipped` (the files the lesson ships to students: its
    Lesson.shipped_files) stays once the reader has started; the course folder hidden from its children. A plug-in
    outside a course's assignments/NAME/ is staged alone."""
    plugin = Path(plugin).resolve()
    if plugin.parent.parent.name != "assignments":
        return ReaderFiles(folders={}, plugin=plugin.name, hide=(plugin.parent,))
    root, name = plugin.parents[2], plugin.parent.name
    folders = {f"assignments/{name}": root / "assignments" / name,
               **({"reference": root / "reference"} if (root / "reference").is_dir() else {})}
    kept = {p.resolve().relative_to(root).as_posix() for p in shipped if p.resolve().is_relative_to(root)}
    return ReaderFiles(folders=folders, plugin=f"assignments/{name}/{plugin.name}", shipped=frozenset(kept),
                       hide=(root,))


class Verifier(sandbox.Verifier):
    """A checkpoint reader of a plug-in file (autograder/sandbox/files.py), staged with the files reader_files gives
    (`shipped`: what its lesson ships to students, which stays readable once it has started)."""

    def __init__(self, *, plugin: Path, shipped: Sequence[Path] = (), **options: Any) -> None:
        super().__init__(plugin=plugin, files=reader_files(plugin, shipped=shipped), **options)


def reader_pool(plugin: Path, *, shipped: Sequence[Path] = ()) -> Any:
    """The process's pool of readers of one plug-in file (started when first needed, stopped at exit): the sandbox's
    reader_pool, its readers this module's Verifier."""
    return sandbox.reader_pool(plugin, make=lambda plugin: Verifier(plugin=plugin, shipped=shipped))


def warm_reader(plugin: Path, *, shipped: Sequence[Path] = ()) -> None:
    """Start a reader of `plugin` ahead of the first checkpoint it will read (the pool's warm): the grader calls it
    when an upload holds a checkpoint, beside the notebooks' sandbox start."""
    reader_pool(plugin, shipped=shipped).warm()


# The old name of reader_pool, kept for one release because it is part of the plug-in API (`checkpoint.pool(...)`;
# docs/checkpoint.md): use reader_pool. To be removed in the release after next.
pool = reader_pool


def run_child(data: bytes, request: dict[str, Any], *, plugin: Path, memory_mb: int, timeout_s: float,
              verifier: sandbox.Verifier | None = None, shipped: Sequence[Path] = ()) -> dict[str, Any]:
    """Read and evaluate a file's bytes in a limited child of a reader of `plugin` (the pool's unless one is given);
    any failure comes back as {"error": ...}."""
    return sandbox.run_child(data, request, memory_mb=memory_mb, timeout_s=timeout_s, verifier=verifier,
                             readers=None if verifier is not None else reader_pool(plugin, shipped=shipped))


def reads_checkpoint(files: Sequence[str], uploaded: dict[str, bytes]) -> bool:
    """Whether a submission's uploads give the reader a checkpoint to read: the first file a lesson declares
    is the one its reader loads."""
    return bool(files) and files[0] in uploaded


def read_limited(data: str | Path | bytes | None, name: str, limit: int) -> bytes:
    """A file's bytes (given as bytes or a path) when at most `limit` bytes; FileNotFoundError for None,
    ValueError when larger."""
    if data is None:
        raise FileNotFoundError(name)
    if isinstance(data, bytes):
        size = len(data)
    else:
        path = Path(data)
        size = path.stat().st_size
    if size > limit:
        raise ValueError(f"{name} is larger than {limit // 2**10:,} KB")
    return data if isinstance(data, bytes) else path.read_bytes()


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m autograder.checkpoint [--config PATH] ARGS...`: the command line of the lesson's plug-in (its
    main(ARGS): e.g. train or verify a checkpoint), the lesson of the grading config (default: the package's),
    read with PyYAML alone (a GPU image has no pydantic).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    config = ENGINE_ROOT / "grading_config.yaml"
    if args[:1] == ["--config"] and len(args) >= 2:
        config, args = Path(args[1]), args[2:]
    plugin = lesson_named_in(config).plugin
    return int(plugin.main(args))


if __name__ == "__main__":
    sys.exit(main())
