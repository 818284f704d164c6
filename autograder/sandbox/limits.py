"""Limits shared by the grader's modules, each defined once: the defaults of grading_config.yaml's limits
(autograder/config.py) and of a sandboxed run (Limits below); the 64 MiB cap comes from the package's root.

Imports only the standard library and the package's root: the sandbox runs with this module.
"""

from __future__ import annotations

import resource
from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any

from autograder import MIB, UPLOAD_CAP_MB  # the cap on anything a submission hands over in one piece

# One submission's run in the sandbox: defaults of grading_config.yaml's `execution` section and of Limits.
CELL_TIMEOUT_S = 20.0
PROBE_TIMEOUT_S = 5.0
QUESTION_TIMEOUT_S = 15.0
WALL_TIMEOUT_S = 60.0
CPU_TIMEOUT_S = 60
MEMORY_MB = 4096
MAX_PROCESSES = 64
MAX_OUTPUT_KB = 256

# The child process that loads and evaluates an uploaded checkpoint (submissions.checkpoint_memory_mb).
CHECKPOINT_MEMORY_MB = 1024

# How an operator's hard limit (ulimit) on a resource is named in the notes: what it limits, the ulimit flag that
# sets it, and the unit shown.
_RLIMIT_WORDS = {resource.RLIMIT_AS: ("address space", "ulimit -v", MIB, " MB"),
                 resource.RLIMIT_NOFILE: ("open files", "ulimit -n", 1, ""),
                 resource.RLIMIT_NPROC: ("processes", "ulimit -u", 1, ""),
                 resource.RLIMIT_FSIZE: ("file size", "ulimit -f", MIB, " MB"),
                 resource.RLIMIT_CPU: ("CPU time", "ulimit -t", 1, " s")}


def fit_hard(rlim: int, soft: int, hard: int | None = None) -> tuple[int, int]:
    """The limits (soft, hard; hard defaults to soft) for resource.setrlimit, each lowered to this process's hard
    limit of `rlim` where that is lower: a process may lower its limits, never raise them, so under an
    operator's ulimit (a shared server, a container) the lower value holds instead of a ValueError."""
    hard = soft if hard is None else hard
    ceiling = resource.getrlimit(rlim)[1]
    if ceiling == resource.RLIM_INFINITY:
        return soft, hard
    return min(soft, ceiling), min(hard, ceiling)


def lowered_limits(wanted: Iterable[tuple[int, int]], *, who: str, size: int = 0) -> list[str]:
    """One sentence per (rlim, configured hard value) in `wanted` that this process's hard limit lowers: which
    limit of `who` (the sandbox, the checkpoint reader), lowered to what, from what. size: the process's own
    size (bytes), which its address-space limit adds to the configured memory."""
    notes = []
    for rlim, value in wanted:
        got = fit_hard(rlim, value)[1]
        if got < value:
            name, flag, unit, suffix = _RLIMIT_WORDS[rlim]
            was = (f"{value // unit}{suffix} (its size, {size // MIB} MB, plus the configured {(value - size) // MIB}"
                   f" MB)" if rlim == resource.RLIMIT_AS and size else f"the configured {value // unit}{suffix}")
            notes.append(f"{who}: {name} lowered to {got // unit}{suffix} (the grader's hard limit, {flag}) from {was}")
    return notes


@dataclass(frozen=True)
class Limits:
    """Per-submission limits. A limit that grading_config.yaml's `execution` section sets has the config's name
    here (one name from the config to the sandbox: `configured` copies each by name, so a new limit is a field here
    and a Field of config.Execution with the same name); result_mb, scratch_mb and threads are the sandbox's own.

    memory_mb and max_processes hold for the submission as a whole (every process it starts); scratch_mb
    (the scratch tmpfs) and threads (torch/BLAS threads) are fixed when a pool starts. cell_timeout_s limits one
    cell; wall_timeout_s and cpu_timeout_s the whole notebook, cells and probes, in each run of it. probe_timeout_s
    limits one probe and question_timeout_s all the probes of one question together, over every run (the question's
    share of the checking time). Each time limit is in the student's CPU seconds, with a wall-clock backstop of
    three times it (cputime.py).
    """

    wall_timeout_s: float = WALL_TIMEOUT_S
    cell_timeout_s: float = CELL_TIMEOUT_S
    probe_timeout_s: float = PROBE_TIMEOUT_S
    question_timeout_s: float = QUESTION_TIMEOUT_S
    cpu_timeout_s: int = CPU_TIMEOUT_S
    memory_mb: int = MEMORY_MB
    max_processes: int = MAX_PROCESSES
    max_file_mb: int = UPLOAD_CAP_MB
    max_output_kb: int = MAX_OUTPUT_KB
    result_mb: int = UPLOAD_CAP_MB
    scratch_mb: int = 512
    threads: int = 1

    @classmethod
    def configured(cls, section: Any) -> Limits:
        """The limits a config section sets (grading_config.yaml's `execution`: an object with an attribute per
        key), each field of the section's name taken from it by that name, the others at their defaults."""
        return cls(**{f.name: getattr(section, f.name) for f in fields(cls) if hasattr(section, f.name)})

