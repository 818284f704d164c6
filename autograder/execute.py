"""Execution stage: run student notebooks in a sandbox, call probes inside them and return plain data.

Layout. A WorkerPool starts one warm *zygote* per worker, inside bubblewrap when it works: a Python process
with numpy, torch, IPython, the probe module and the lesson's other shipped modules imported (lesson-level
code, nothing of any job). Per submission the grader creates the child's channels itself (a socketpair for the
job and the result frames, a pipe for stdout/stderr) and hands only the child's ends to the zygote over a Unix
control socket (SCM_RIGHTS). The zygote forks a child, closes its copies and only *watches* it: exit status,
wall clock, CPU, memory of the submission as a whole; then it kills the child's process tree, wipes the
scratch folder, /dev/shm and System V IPC objects, and replies with a small header of facts. The child drops
to an unprivileged uid (when the grader runs as root), applies the limits, receives its cells from the grader,
runs them in-process with IPython's InteractiveShell and answers the grader's probe requests in order, one
framed wire message (never a pickle) per answer. The grader reads stdout (capped) and the frames itself;
judging happens in the grader.

Time. Each run of a notebook gets the whole-notebook limits (wall clock, enforced by the zygote; CPU, by
RLIMIT_CPU). The grader times each cell from the frames (a cell starts when the previous one reports) and,
when one runs past the per-cell limit, has the zygote kill the child: only a killed process reliably stops a
long C call inside torch. It then runs the notebook again in a fresh child (fresh channels) without that
cell. When a whole-notebook limit stops a cell, the cells before it run again and the probes still run.
Probes are only ever sent to the last child. A forged cell frame can change which cell is left out, never
what the probes find.

Threat model. Student code is hostile and runs with the child's privileges.
- Copying between submissions: the zygote never holds a job's cells, outputs, streams or results (not
  even freed: only fds and small headers pass through it), so a child forked for the next submission
  cannot find them in its memory. What a submission leaves behind (processes, scratch files, /dev/shm,
  System V shared memory, semaphores and message queues, POSIX message queues) is removed before the next
  one starts: inside bubblewrap the worker's own IPC namespace is emptied (every System V object, and the
  sandbox's own /dev/mqueue); without it, as root, each child unshares an IPC namespace of its own before any
  student code runs. Each job runs under its own uid (as root), so per-uid kernel state is not shared
  either, and its scratch folder's name does not count the jobs. A re-run after the per-cell limit is a
  new job like any other: a fresh child that sees nothing of the killed attempt.
- Sandbox: no network (own net namespace); the system is read-only; /tmp, /root, /home, the repository
  (so reference/ and hidden tests), every non-system top-level folder and any `hide` path are empty
  tmpfs. Only the Python installation is bound back in at its own path, and the virtual environment's
  site-packages at a neutral path (/tmp/site/N), never the checkout around it. cwd and $HOME are a fresh
  scratch dir on a size-capped tmpfs; /proc shows only the sandbox. Without bubblewrap (it cannot start,
  or LESSON83_SANDBOX=none) only the limits, the scratch dir and, as root, the uid drop remain, said once
  in the log: the job's uid reads and writes only what any other user may (so the grader's own files must
  be closed to others: the Gradescope bundle's run_autograder runs `chmod o=` on the source and results
  folders), and after each job whatever that uid left in the folders anyone may write to (/tmp, /var/tmp,
  /dev/shm ...) is removed. Where the uid cannot be dropped (not root, or the interpreter is not readable
  by others) student code runs as the grader's user. ExecResult.isolation says which held: "bubblewrap",
  "unprivileged uid" or "none".
- Limits: the submission as a whole is limited in memory and processes by a cgroup (v1 memory and pids
  controllers, one group per worker, created outside the sandbox and bound writable into it; the child
  joins it before dropping privileges) or, where cgroups are not writable, by a watchdog in the zygote
  that sums the memory of the child's process tree every 50 ms and kills the tree when it is over;
  ExecResult.memory_guard says which held. Per process: RLIMIT_AS (a clean MemoryError for one huge
  allocation), RLIMIT_CPU, RLIMIT_NPROC (as root the child gets its own uid, since root ignores it),
  RLIMIT_FSIZE, RLIMIT_CORE. Wall clock is enforced by the zygote, captured output by the grader (the
  rest is read and discarded).
- Forgery: the protocol is grader-driven and strict. The grader sends the cells, waits for one frame
  per cell and the end-of-cells frame, then sends the public probe requests in one frame and the hidden
  ones in a second frame only once every public one is answered (so no hidden argument is in the child
  while it computes a public output), and accepts exactly one answer per request, in order, for that
  key. Any other frame (unknown, duplicate, out of order, for another key, malformed, oversized, absurd
  array shapes) voids the case it names and flags the submission ("tampering") without ever raising;
  a malformed stream ends the conversation (the remaining probes return nothing). stdout/stderr go to a
  separate pipe, so nothing printed can become a result. A forged answer is no stronger than a
  hard-coded return value: the grader computes the expected values itself. What the zygote reports
  (exit status, signal, timeout, CPU time, memory) comes from outside the child and cannot be forged.
  The zygote is not dumpable, so the child cannot open its fds through /proc.
- Tampering: identities of the comparison and core functions the probes use (numpy, torch, math,
  operator, torch.Tensor and nn.Module methods, json's encoder), builtins, sys.modules entries and the
  globals (and function code) of the probe, wire and execute modules are recorded before student code
  runs; changes are reported as facts and undone after every cell and probe, so the harness keeps
  working. A torch function or dispatch mode left active (or torch functions left disabled) is reported
  and popped. Probe outputs that are not plain arrays (ndarray or Tensor subclasses, objects with
  __array__) earn nothing and are reported too.
- The child's own report. Inside one process gc and ctypes reach everything, so nothing relies on hiding:
  frames are encoded by wire.trusted_encoder, made in the zygote from C functions and methods of built-in
  types only (a patched json.JSONEncoder, base64 or os changes nothing), and its code and closure are
  checked before every frame. The grader sends a nonce with each frame of probe requests; the guard must
  report it as a changed entry of its own record after every probe, so a guard switched off or emptied
  (found with gc) or a rewritten report voids that case and flags the submission. The probes read a
  module's storage, parameters and structure from nn.Module's own tables with functions taken before
  student code ran (the probe module's own), never through methods a student class or a patch of
  nn.Module overrides. Tables the probe module names in UNGUARDED (its local checks' results, filled
  when an nbgrader notebook runs its checks) are not read as tampering.
- Infrastructure: a worker that fails for reasons that are not the student's (zygote killed, out of
  fds, job not sent) is restarted and the submission retried once; a second failure is the student's
  ("crashed"). When no worker can be started at all, run() raises WorkerError.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import ctypes
import fcntl
import importlib
import importlib.util
import io
import itertools
import json
import logging
import operator
import os
import queue
import resource
import secrets
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from autograder import wire
from autograder.limits import (
    CELL_TIMEOUT_S,
    CPU_TIMEOUT_S,
    MAX_OUTPUT_KB,
    MAX_PROCESSES,
    MEMORY_MB,
    MIB,
    UPLOAD_CAP_MB,
    WALL_TIMEOUT_S,
    fit_hard,
    lowered_limits,
)

log = logging.getLogger(__name__)

STATUSES = ("ok", "timeout", "oom", "unreadable", "crashed", "tampering")
MEMORY_GUARDS = ("cgroup", "watchdog")
MEMORY_GUARD_ENV = "LESSON83_MEMORY_GUARD"  # "watchdog" forces the watchdog where "auto" would pick a cgroup
SANDBOX_ENV = "LESSON83_SANDBOX"  # "none" forces the fallback (no bubblewrap) where "auto" would pick bwrap
SKIP_TAGS = ("long-running", "milestone-train")
CGROUP_PREFIX = "grader-cgroup-"  # one memory and one pids group per worker: PREFIX<pid>-<slot>
PRELOAD = ("numpy", "torch", "torch._dynamo", "IPython.core.interactiveshell", "IPython.core.logger", "bdb")
# torch._dynamo wraps torch.manual_seed when first imported: loaded before the guard records identities, so honest
# code that triggers it (fused attention, torch.compile) is not reported as tampering. IPython imports its logger
# and bdb at the first cell it runs: every child would import them again.
MAX_NOTEBOOK_BYTES = UPLOAD_CAP_MB * MIB
Probe = tuple[Any, ...]  # (case key, probe name, args) or (case key, probe name, args, hidden)

_WARNED: set[str] = set()
_VISIBLE_ROOTS = {"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/dev", "/proc", "/sys"}
_SANDBOX_STAGE = "/tmp/grader"
_SANDBOX_SCRATCH = "/tmp/scratch"
_SANDBOX_SITE = "/tmp/site"
_UID_BASE = 1_500_000_000
_UIDS_PER_WORKER = 1024  # each job of a worker runs under the next uid of its block
_UID_BLOCKS = 2000 * 64  # blocks above _UID_BASE; a worker holds one, reserved by a lock no other grader can take
UID_LOCKS_ENV = "LESSON83_UID_LOCKS"  # folder of the uid-block locks (default /run/lock/autograder-uid-blocks)
# Without bubblewrap, the folders where a job's uid may leave files (anyone may write there); swept after each job.
_SHARED_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm", "/dev/mqueue", "/run/lock", "/var/lock")
_JOB_FD = 3
_SETUP_FAILED, _HARNESS_FAILED = 70, 71
_LEN = struct.Struct(">Q")
_CTL_BYTES = 1 << 16
_SHM_MB = 64  # the sandbox's own /dev/shm
_WATCH_S = 0.05
_MAX_TIME_STOPS = 3  # cells left out for the per-cell limit; one more too slow cell ends the notebook there
_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE, _PR_SET_CHILD_SUBREAPER, _PR_SET_NO_NEW_PRIVS = 1, 4, 36, 38
_IPC_RMID = 0
_OOM_TYPES = ("MemoryError", "_ArrayMemoryError", "OutOfMemoryError")
_CANARY = "guard check mark"  # the fact the guard reports for the grader's nonce after every probe (see _Guard)
_CLONE_NEWIPC = 0x08000000
_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER")
_GUARDED = (
    ("numpy", "allclose"), ("numpy", "isclose"), ("numpy", "array_equal"), ("numpy", "ndarray"),
    ("numpy", "asarray"), ("numpy", "array"), ("numpy", "ascontiguousarray"), ("numpy", "frombuffer"),
    ("numpy", "abs"), ("numpy", "isnan"), ("numpy", "isfinite"), ("numpy", "concatenate"),
    ("numpy", "diagonal"), ("numpy", "empty"), ("numpy", "arange"), ("numpy", "sin"), ("numpy", "cos"),
    ("numpy", "dtype"), ("numpy", "generic"), ("numpy.linalg", "norm"),
    ("numpy.testing", "assert_allclose"), ("numpy.testing", "assert_array_equal"),
    ("numpy.testing", "assert_array_almost_equal"), ("numpy.testing", "assert_equal"),
    ("torch", "allclose"), ("torch", "isclose"), ("torch", "equal"), ("torch", "Tensor"),
    ("torch", "tensor"), ("torch", "randn"), ("torch", "randint"), ("torch", "randperm"),
    ("torch", "zeros"), ("torch", "zeros_like"), ("torch", "arange"), ("torch", "manual_seed"),
    ("torch", "Generator"), ("torch", "no_grad"), ("torch", "float64"), ("torch", "float32"),
    ("torch.testing", "assert_close"), ("torch", "Tensor.__eq__"), ("torch", "Tensor.allclose"),
    *(("torch", f"Tensor.{m}") for m in ("detach", "cpu", "clone", "numpy", "float", "to", "norm", "pow",
                                          "sum", "backward", "__matmul__", "__getitem__", "__array__")),
    ("torch.nn", "Parameter"), ("torch.nn", "Embedding"), ("torch.nn", "Module"),
    *(("torch.nn", f"Module.{m}") for m in ("__call__", "_call_impl", "parameters", "named_parameters",
                                             "named_buffers", "buffers", "modules", "state_dict", "to",
                                             "eval", "__getattr__", "__setattr__")),
    *(("torch.nn", f"Module.{m}") for m in ("_apply", "named_modules", "children", "named_children",
                                             "__getattribute__", "_save_to_state_dict")),
    ("json", "dumps"), ("json", "loads"), ("base64", "b64encode"), ("base64", "b64decode"),
    ("json", "JSONEncoder.encode"), ("json", "JSONEncoder.iterencode"), ("json", "JSONEncoder.default"),
    ("json.encoder", "c_make_encoder"), ("json.encoder", "encode_basestring_ascii"),
    ("json.encoder", "c_encode_basestring_ascii"), ("_json", "make_encoder.__call__"),
    ("_json", "encode_basestring_ascii"), ("binascii", "b2a_base64"),
    ("os", "write"), ("os", "read"), ("os", "_exit"),
)
_GUARDED_WHOLE = ("math", "operator")  # every attribute of these modules is recorded
_GUARDED_MODULES = ("builtins", "sys", "os", "json", "json.encoder", "_json", "base64", "binascii", "math",
                    "operator", "numpy", "numpy.testing", "numpy.linalg", "torch", "torch.testing", "torch.nn",
                    "autograder.wire", "autograder.execute")
RUNTIME_MODULE = "checks_runtime"  # the checks runtime the probe module imports (autograder/lesson.py RUNTIME_NAME)


@dataclass(frozen=True)
class Limits:
    """Per-submission limits, as in grading_config.yaml's `execution` section (wall_timeout_s: wall_s...).

    memory_mb and processes hold for the submission as a whole (every process it starts); scratch_mb
    (the scratch tmpfs) and threads (torch/BLAS threads) are fixed when a pool starts. cell_s limits one
    cell (cell_timeout_s); wall_s and cpu_s the whole notebook, cells and probes, in each run of it.
    """

    wall_s: float = WALL_TIMEOUT_S
    cell_s: float = CELL_TIMEOUT_S
    cpu_s: int = CPU_TIMEOUT_S
    memory_mb: int = MEMORY_MB
    processes: int = MAX_PROCESSES
    file_mb: int = UPLOAD_CAP_MB
    output_kb: int = MAX_OUTPUT_KB
    result_mb: int = UPLOAD_CAP_MB
    scratch_mb: int = 512
    threads: int = 1


@dataclass
class ExecResult:
    """What happened to one submission: a status, the probe outputs (plain data) and short notes."""

    status: str
    outputs: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    skipped_cells: list[int] = field(default_factory=list)
    stopped_cells: list[int] = field(default_factory=list)  # stopped by a time limit, then left out
    student_notes: list[str] = field(default_factory=list)  # the grader's own words (no sandbox text)
    tampering: list[str] = field(default_factory=list)
    stdout: str = ""
    wall_s: float = 0.0
    cpu_s: float = 0.0
    # the child's own CPU seconds (as it reports them; informative only, never judged): "setup" (fork, cgroup,
    # limits), "cells", "probes" {case key: s}, "rest" (cpu_s less those: start and exit, frames, wait4's view)
    timing: dict[str, Any] = field(default_factory=dict)
    sandbox: str = ""
    memory_guard: str = ""  # "cgroup" or "watchdog": what limited the submission's memory as a whole
    isolation: str = ""  # "bubblewrap", "unprivileged uid" (no bubblewrap, as root) or "none" (limits only)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class NotebookError(ValueError):
    """A submission that cannot be read as a Jupyter notebook."""


class WorkerError(RuntimeError):
    """A zygote that failed to start or stopped answering (infrastructure, not the student)."""


# --------------------------------------------------------------------------- grader side


def read_notebook(source: bytes, *,
                  skip_tags: Iterable[str] = SKIP_TAGS) -> tuple[list[tuple[int, str]], list[int]]:
    """Code cells to run as (cell index, source), and the indices of cells skipped for their tags."""
    if type(source) is not bytes:
        raise NotebookError(f"expected the notebook's bytes, got {type(source).__name__}")
    if not source.strip():
        raise NotebookError("the file is empty")
    if len(source) > MAX_NOTEBOOK_BYTES:
        raise NotebookError(f"the file is {len(source)} bytes, over the {MAX_NOTEBOOK_BYTES} byte cap")
    try:
        nb = json.loads(source.decode("utf-8-sig"))
    except UnicodeDecodeError:
        raise NotebookError("not a notebook: the file is not UTF-8 text (a zip, pickle or binary?)") from None
    except (ValueError, RecursionError) as exc:
        raise NotebookError(f"not a notebook: the file is not valid JSON ({str(exc)[:120]})") from None
    if type(nb) is not dict or type(nb.get("cells")) is not list:
        if type(nb) is dict and "worksheets" in nb:
            raise NotebookError("notebook format 3 is not supported: open and save it in Jupyter first")
        raise NotebookError("not a notebook: valid JSON, but without a list of cells")
    skip = set(skip_tags)
    cells: list[tuple[int, str]] = []
    skipped: list[int] = []
    for i, cell in enumerate(nb["cells"]):
        if type(cell) is not dict:
            raise NotebookError(f"not a notebook: cell {i} is not an object")
        if cell.get("cell_type") != "code":
            continue
        src = cell.get("source", "")
        if type(src) is list and all(type(s) is str for s in src):
            src = "".join(src)
        meta = cell.get("metadata", {})
        tags = meta.get("tags", []) if type(meta) is dict else []
        if type(src) is not str or type(tags) is not list:
            raise NotebookError(f"not a notebook: cell {i} has a malformed source or tags")
        if skip.intersection(t for t in tags if type(t) is str):
            skipped.append(i)
        else:
            cells.append((i, src))
    return cells, skipped


class WorkerPool:
    """Warm sandboxed zygotes that run submissions in parallel, one at a time per worker."""

    def __init__(self, size: int = 1, *, limits: Limits = Limits(), probe_module: str | None = None,
                 modules: Mapping[str, Path] | None = None, skip_tags: Iterable[str] = SKIP_TAGS,
                 hide: Iterable[str | Path] = (),
                 sandbox: str = "auto", preload: Iterable[str] = PRELOAD, start_timeout_s: float = 180.0,
                 memory_guard: str = "auto"):
        if sandbox == "auto" and os.environ.get(SANDBOX_ENV):
            sandbox = os.environ[SANDBOX_ENV]
        if sandbox not in ("auto", "bwrap", "none"):
            raise ValueError(f"sandbox ({SANDBOX_ENV}) must be 'auto', 'bwrap' or 'none', got {sandbox!r}")
        if memory_guard not in ("auto", *MEMORY_GUARDS):
            raise ValueError(f"memory_guard must be 'auto', 'cgroup' or 'watchdog', got {memory_guard!r}")
        if probe_module is None:  # the lesson of grading_config.yaml
            from autograder.lesson import default_lesson

            lesson = default_lesson()
            probe_module, modules = lesson.checks_name, lesson.sandbox_modules
        self.limits, self.probe_module, self.skip_tags = limits, probe_module, tuple(skip_tags)
        self.lesson_modules = tuple(m for m in (modules or {}) if m != probe_module)  # imported by each zygote
        self._closed = False
        self._cgroups: list[str] = []
        self._tmp = Path(tempfile.mkdtemp(prefix="grader-"))
        self._tmp.chmod(0o755)
        stage = self._tmp / "stage"
        size = max(1, size)
        self._slots = [next(_SLOTS) % 64 for _ in range(size)]  # this process's workers, all pools together
        try:
            _stage_modules(stage, probe_module, modules or {})
            self.sandbox, why = _choose_sandbox(sandbox)
            groups, guard_why = self._make_cgroups(size, memory_guard)
        except BaseException:
            self.close()
            raise
        self.memory_guard = "cgroup" if groups else "watchdog"
        drop = os.geteuid() == 0
        if self.sandbox == "none":
            problem = uid_drop_problem(scratch=self._tmp)
            drop = not problem
            repo = Path(__file__).resolve().parent.parent  # reference/ and the hidden cases
            open_ = [str(h) for h in (repo, *hide) if drop and _others_can_enter(str(h))]
            why += (f"; student code runs as an unprivileged uid, which can read {', '.join(open_)} (chmod o= them)"
                    if open_ else "; student code runs as an unprivileged uid" if drop
                    else f"; student code runs as this process's user, with its file access: {problem}")
        self.isolation = "bubblewrap" if self.sandbox == "bwrap" else "unprivileged uid" if drop else "none"
        for msg in (why, guard_why):
            if msg and msg not in _WARNED:
                _WARNED.add(msg)
                log.warning("%s", msg)
        workers = []
        self._uid_locks: list[int] = []
        for i in range(size):
            uid = None
            if drop:
                try:
                    block, fd = _reserve_uid_block((os.getpid() % 2000) * 64 + self._slots[i])
                except BaseException:
                    self.close()
                    raise
                self._uid_locks.append(fd)
                uid = _UID_BASE + block * _UIDS_PER_WORKER
            workers.append(_Worker(i, self, stage, uid, tuple(hide), tuple(preload), start_timeout_s,
                                   groups[i] if groups else {}))
        self._workers = workers
        self.drops_privileges = workers[0].uid is not None
        self._idle: queue.Queue[_Worker] = queue.Queue()
        errors = []
        threads = [threading.Thread(target=lambda w=w: errors.append(w.start())) for w in workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        failed = [e for e in errors if e]
        if failed:
            self.close()
            raise WorkerError(failed[0])
        for w in workers:
            self._idle.put(w)
        # An operator's lower hard limits (ulimit) hold for every child instead of the configured ones: said here,
        # in the log, and in each result's notes.
        base = 1 if self.drops_privileges else _count_tasks(os.getuid())
        vm = _vm_size(workers[0].zygote_pid or "self")
        self.limits_lowered = lowered_limits([(rlim, hard) for rlim, _, hard in _rlimits(limits, vm=vm, base=base)],
                                             who="the sandbox", size=vm)
        for msg in self.limits_lowered:
            if msg not in _WARNED:
                _WARNED.add(msg)
                log.warning("%s", msg)

    def _make_cgroups(self, size: int, wanted: str) -> tuple[list[dict[str, str]], str]:
        """One memory and one pids cgroup (v1) per worker, or none and why (then the watchdog holds)."""
        if wanted == "auto" and os.environ.get(MEMORY_GUARD_ENV, "") in MEMORY_GUARDS:
            wanted = os.environ[MEMORY_GUARD_ENV]
        if wanted == "watchdog":
            return [], ""
        groups: list[dict[str, str]] = []
        try:
            roots = {c: _own_cgroup(c) for c in ("memory", "pids")}
            for root in roots.values():
                _remove_stale_cgroups(root)
            for i in range(size):
                made = {}
                for ctrl, root in roots.items():
                    path = os.path.join(root, f"{CGROUP_PREFIX}{os.getpid()}-{self._slots[i]}")
                    os.mkdir(path, 0o755)
                    self._cgroups.append(path)
                    made[ctrl] = path
                limit = str(self.limits.memory_mb * MIB)
                _write(os.path.join(made["memory"], "memory.limit_in_bytes"), limit)
                with contextlib.suppress(OSError):  # no swap accounting: no memsw file
                    _write(os.path.join(made["memory"], "memory.memsw.limit_in_bytes"), limit)
                _write(os.path.join(made["pids"], "pids.max"), str(self.limits.processes + 1))
                groups.append(made)
        except OSError as exc:
            for path in reversed(self._cgroups):
                with contextlib.suppress(OSError):
                    os.rmdir(path)
            self._cgroups = []
            msg = f"memory: cgroup v1 memory/pids controllers are not usable ({exc})"
            if wanted == "cgroup":
                raise WorkerError(msg) from exc
            return [], msg + "; a watchdog in each worker limits the memory of each submission instead"
        return groups, ""

    def worker_pids(self) -> list[int]:
        """Process ids (in this process's namespace) of the zygotes, for monitoring and tests."""
        return [w.zygote_pid for w in self._workers if w.zygote_pid]

    def run(self, source: bytes, *, probes: list[Probe]) -> ExecResult:
        """Run one notebook and its probes; never raises for anything the submission does.

        Probes run in list order, except that hidden ones (a true fourth element) come after every
        public one. A worker that fails (not the student's doing) is restarted and the submission
        retried once; WorkerError is raised only when no worker can be started.
        """
        if self._closed:
            raise RuntimeError("the worker pool is closed")
        start = time.monotonic()
        ordered, public = _order_probes(probes)
        try:
            cells, skipped = read_notebook(source, skip_tags=self.skip_tags)
        except NotebookError as exc:
            return ExecResult("unreadable", notes=[str(exc)], wall_s=time.monotonic() - start,
                              sandbox=self.sandbox, memory_guard=self.memory_guard, isolation=self.isolation)
        try:  # the cells travel as one frame straight to the child; JSON escapes may make it larger
            _cells_job(cells)
        except wire.WireError as exc:
            return ExecResult("unreadable", notes=[f"the notebook's code cells cannot be sent: {exc}"],
                              wall_s=time.monotonic() - start, sandbox=self.sandbox,
                              memory_guard=self.memory_guard, isolation=self.isolation)
        worker = self._idle.get()
        try:
            result = self._run_timed(worker, cells, ordered, public)
        finally:
            self._idle.put(worker)
        result.skipped_cells = skipped
        if skipped:
            result.notes.insert(0, f"skipped cells {skipped} (tagged {' or '.join(self.skip_tags)})")
        result.wall_s = time.monotonic() - start
        result.sandbox = self.sandbox
        result.memory_guard = self.memory_guard
        result.isolation = self.isolation
        result.notes.extend(self.limits_lowered)
        return result

    def _run_timed(self, worker: _Worker, cells: list[tuple[int, str]],
                   probes: list[tuple[str, str, dict[str, Any]]], public: int) -> ExecResult:
        """Run the notebook; when a time limit stops it in a cell, run it again in a fresh child without that cell.

        A cell over the per-cell limit is left out and everything else runs (at most _MAX_TIME_STOPS such
        cells). When a whole-notebook limit stops a cell, or one more cell is too slow, only the cells before
        it run again, then the probes. A run is only repeated when it stopped among the cells, before any
        probe was sent, so every probe, public or hidden, goes to the final child alone.
        """
        limits, source = self.limits, dict(cells)
        stopped: list[int] = []
        cut: tuple[int, str] | None = None  # (cell, limit): only the cells before it run
        facts: list[str] = []
        cpu = 0.0
        for attempt in range(_MAX_TIME_STOPS + 2):
            todo = [(i, s) for i, s in cells if i not in stopped and (cut is None or i < cut[0])]
            raw = self._attempt(worker, _cells_job(todo), todo, probes, public)
            if isinstance(raw, ExecResult):
                return raw
            header, _, _, t = raw
            cpu += float(header.get("cpu_s", 0.0))
            over, limit = t.cell_over, "cell"
            if over is None and t.running is not None and (header.get("timed_out") or header.get("cpu_exceeded")):
                over, limit = t.running, "wall" if header.get("timed_out") else "cpu"
            if over is None or attempt == _MAX_TIME_STOPS + 1:
                break
            facts += [f for f in t.tampering if f not in facts]
            if limit == "cell" and len(stopped) < _MAX_TIME_STOPS:
                stopped.append(over)
            else:
                cut = (over, limit)
        res = _classify(*raw, probes, limits, self.memory_guard)
        said = [_time_note(i, "cell", source[i], limits) for i in stopped]
        if cut is not None:
            said.append(_time_note(cut[0], cut[1], source[cut[0]], limits, cut=True, stops=len(stopped)))
            if res.status == "ok":
                res.status = "timeout"
        res.tampering = facts + [f for f in res.tampering if f not in facts]
        if res.status == "ok" and res.tampering:
            res.status = "tampering"
        if over is not None:  # the last run was stopped too: the grader gives up there
            said.append(f"{_cell_name(over, source[over], word='Cell')} was stopped by a time limit in the "
                        f"grader's last run of the notebook ({attempt + 1} runs in all): no check could run")
        res.stopped_cells = stopped + ([cut[0]] if cut else [])
        res.notes[:0] = said
        res.student_notes = said
        res.cpu_s = cpu
        steps = raw[3].cpu
        own = steps["setup"] + steps["cells"] + sum(steps["probes"].values())
        res.timing = {**steps, "rest": max(0.0, cpu - own)}  # earlier runs of a stopped notebook count as rest
        return res

    def _attempt(self, worker: _Worker, job: bytes, cells: list[tuple[int, str]],
                 probes: list[tuple[str, str, dict[str, Any]]], public: int) -> tuple[Any, ...] | ExecResult:
        """One run of the cells in a fresh child: what the worker returned, or "crashed" when it failed twice.

        A worker that fails (not the student's doing) is restarted and the run retried once.
        """
        failures: list[str] = []
        while True:
            if not worker.alive():
                err = worker.restart()
                if err:
                    raise WorkerError(err)
            try:
                return worker.run(job, cells, probes, public)
            except (WorkerError, OSError) as exc:
                failures.append(str(exc)[:300])
                log.warning("worker %d failed (%s); restarting it", worker.index, exc)
                worker.kill()
                if len(failures) == 2:
                    return ExecResult("crashed", notes=[
                        f"the sandbox worker failed twice on this submission: {failures[0]}; then {failures[1]}"])

    def run_many(self, items: Iterable[tuple[str, bytes]], *,
                 probes: list[Probe]) -> Iterator[tuple[str, ExecResult]]:
        """Run (id, notebook bytes) pairs in parallel; yields (id, result) as each finishes."""
        with ThreadPoolExecutor(max_workers=len(self._workers)) as ex:
            futures = {ex.submit(self.run, src, probes=probes): key for key, src in items}
            for fut in as_completed(futures):
                yield futures[fut], fut.result()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for w in getattr(self, "_workers", []):
            w.stop()
        for path in reversed(self._cgroups):
            _remove_cgroup(path)
        self._cgroups = []
        for fd in getattr(self, "_uid_locks", []):  # the uid blocks are free again once the zygotes are stopped
            os.close(fd)
        self._uid_locks = []
        shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_POOLS: dict[tuple[Any, ...], WorkerPool] = {}
_SLOTS = itertools.count()
_POOLS_LOCK = threading.Lock()


def execute_submission(source: bytes, *, probes: list[Probe], limits: Limits = Limits(),
                       skip_tags: Iterable[str] = SKIP_TAGS, probe_module: str | None = None,
                       modules: Mapping[str, Path] | None = None,
                       hide: Iterable[str | Path] = ()) -> ExecResult:
    """Run one notebook on a warm one-worker pool kept for these options until the process exits."""
    key = (limits, tuple(skip_tags), probe_module, tuple(sorted((modules or {}).items())), tuple(map(str, hide)))
    with _POOLS_LOCK:
        if key not in _POOLS:
            _POOLS[key] = WorkerPool(1, limits=limits, probe_module=probe_module, modules=modules,
                                     skip_tags=skip_tags, hide=hide)
        pool = _POOLS[key]
    return pool.run(source, probes=probes)


def execute_batch(items: Iterable[tuple[str, bytes]], *, probes: list[Probe], limits: Limits = Limits(),
                  skip_tags: Iterable[str] = SKIP_TAGS, probe_module: str | None = None,
                  modules: Mapping[str, Path] | None = None, workers: int | None = None,
                  hide: Iterable[str | Path] = ()) -> Iterator[tuple[str, ExecResult]]:
    """Run many (id, notebook bytes) pairs on a fresh pool (one worker per core by default)."""
    with WorkerPool(workers or os.cpu_count() or 1, limits=limits, probe_module=probe_module, modules=modules,
                    skip_tags=skip_tags, hide=hide) as pool:
        yield from pool.run_many(items, probes=probes)


@atexit.register
def _close_pools() -> None:
    for pool in _POOLS.values():
        pool.close()


def _cells_job(cells: list[tuple[int, str]]) -> bytes:
    """The frame that carries the cells to run to the child (WireError when it is over the cap)."""
    return wire.encode({"t": "cells", "cells": [[i, s] for i, s in cells]}, max_bytes=4 * MAX_NOTEBOOK_BYTES)


def _first_line(src: str) -> str:
    line = next((ln.strip() for ln in src.splitlines() if ln.strip()), "")
    return line if len(line) <= 60 else line[:57] + "..."


def _cell_name(i: int, src: str, *, word: str = "cell") -> str:
    return f"{word} {i} (the one that starts `{_first_line(src)}`)" if _first_line(src) else f"{word} {i}"


def _time_note(i: int, limit: str, src: str, limits: Limits, *, cut: bool = False, stops: int = 0) -> str:
    """In plain words: which cell a time limit stopped, its first line, the limit and what the grader did."""
    cell = _cell_name(i, src)
    if limit == "cell" and not cut:
        return (f"{_cell_name(i, src, word='Cell')} was still running after {limits.cell_s:g} s, the time limit "
                "for one cell: the grader stopped it and graded the rest of the notebook without it")
    if limit == "cell":
        what = (f"{cell} was still running after {limits.cell_s:g} s, the time limit for one cell, and "
                f"{stops} cells had been stopped already")
    elif limit == "wall":
        what = f"the whole notebook reached its wall-clock limit of {limits.wall_s:g} s in {cell}"
    else:
        what = f"the whole notebook reached its CPU-time limit of {limits.cpu_s:g} s in {cell}"
    return (f"{what[0].upper()}{what[1:]}: the grader graded what the cells before it define; cell {i} and "
            "the cells after it did not run")


def _order_probes(probes: list[Probe]) -> tuple[list[tuple[str, str, dict[str, Any]]], int]:
    """(key, name, args) with public probes first and hidden ones last, each group in list order; and how
    many are public."""
    keys = [p[0] for p in probes]
    if len(set(keys)) != len(keys) or not all(len(p) in (3, 4) and type(p[0]) is str and type(p[1]) is str
                                              for p in probes):
        raise ValueError("probes must be (case_key, probe_name, args[, hidden]) with unique str keys")
    public = [tuple(p[:3]) for p in probes if not (len(p) == 4 and p[3])]
    hidden = [tuple(p[:3]) for p in probes if len(p) == 4 and p[3]]
    return public + hidden, len(public)  # type: ignore[return-value]


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _own_cgroup(controller: str) -> str:
    """This process's cgroup folder for a v1 controller, if it is mounted and writable by us."""
    mount = f"/sys/fs/cgroup/{controller}"
    if not os.path.isfile(os.path.join(mount, "cgroup.procs")):
        raise OSError(f"no cgroup v1 {controller} controller at {mount}")
    with open("/proc/self/cgroup") as f:
        rel = next((line.rstrip("\n").split(":", 2)[2] for line in f
                    if controller in line.split(":", 2)[1].split(",")), None)
    path = os.path.join(mount, (rel or "/").lstrip("/"))
    if not os.path.isdir(path):
        path = mount  # inside a cgroup namespace the path may not resolve; the root is still ours to use
    if not os.access(path, os.W_OK):
        raise OSError(f"{path} is not writable")
    return path


def _remove_stale_cgroups(root: str) -> None:
    """Empty groups left by a grader that was killed (SIGKILL skips close())."""
    for name in os.listdir(root):
        parts = name.split("-")
        if name.startswith(CGROUP_PREFIX) and len(parts) == 4 and parts[2].isdigit():
            try:
                os.kill(int(parts[2]), 0)
            except ProcessLookupError:
                with contextlib.suppress(OSError):
                    os.rmdir(os.path.join(root, name))  # fails while a process is still in it
            except OSError:
                pass


def _remove_cgroup(path: str) -> None:
    for _ in range(50):
        try:
            with open(os.path.join(path, "cgroup.procs")) as f:
                pids = [int(p) for p in f.read().split()]
        except OSError:
            return
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        try:
            os.rmdir(path)
            return
        except OSError:
            time.sleep(0.02)
    log.warning("could not remove cgroup %s", path)


def _choose_sandbox(wanted: str) -> tuple[str, str]:
    if wanted == "none":
        return "none", f"sandbox: none requested (sandbox='none' or {SANDBOX_ENV}=none): resource limits only, no " \
                       "network isolation"
    exe = shutil.which("bwrap")
    if exe is None:
        msg = "bubblewrap (bwrap) is not installed"
    else:
        argv = [exe, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-net",
                "--unshare-pid", "true"]
        probe = subprocess.run(argv, capture_output=True, text=True)
        if probe.returncode == 0:
            return "bwrap", ""
        msg = f"bubblewrap does not work here: {probe.stderr.strip()[:200]}"
    if wanted == "bwrap":
        raise WorkerError(msg)
    return "none", f"sandbox: {msg}; falling back to resource limits only (no network isolation)"


def _stage_modules(stage: Path, probe_module: str, modules: Mapping[str, Path]) -> None:
    """Copy only this module, wire.py, limits.py and the lesson's shipped modules (`modules`: top-level name ->
    file; the probe module is one of them, or found on sys.path) into a folder the sandbox sees read-only: the child
    imports the same files under the same names as the student's notebook does."""
    here = Path(__file__).resolve().parent
    files = {"autograder/__init__.py": "", "autograder/execute.py": Path(__file__).read_text(),
             **{f"autograder/{m}": (here / m).read_text() for m in ("wire.py", "limits.py")}}
    for name, path in modules.items():
        if not name.isidentifier():
            raise WorkerError(f"cannot ship {path} as module {name!r}: not a top-level module name")
        files[f"{name}.py"] = Path(path).read_text()
    if probe_module not in modules:
        spec = importlib.util.find_spec(probe_module)
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            raise WorkerError(f"cannot find the source of probe module {probe_module!r}")
        parts = probe_module.split(".")
        for n in range(1, len(parts)):
            files.setdefault("/".join(parts[:n]) + "/__init__.py", "")
        files["/".join(parts) + ".py"] = Path(spec.origin).read_text()
    for rel, text in files.items():
        path = stage / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for path in [stage, *stage.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)


def _world_readable(path: str) -> bool:
    p = Path(path).resolve()
    return all(os.stat(d).st_mode & 0o005 == 0o005 for d in [p, *p.parents])


def _others_can_enter(path: str) -> bool:
    p = Path(path).resolve()
    with contextlib.suppress(OSError):
        return all(os.stat(d).st_mode & 0o001 for d in [p, *p.parents])
    return False


def uid_drop_problem(*, scratch: str | Path | None = None) -> str:
    """Why student code cannot run as an unprivileged uid without bubblewrap here, or '' when it can: the
    grader is not root, or a folder the child reads (the interpreter, the venv, `scratch`) is closed to others."""
    if os.geteuid() != 0:
        return "the grader is not root, so it cannot switch student code to another uid"
    needed = [sys.prefix, sys.base_prefix, *(p for p in sys.path if p and _under(p, sys.prefix) and os.path.isdir(p))]
    for path in dict.fromkeys([*needed, *([str(scratch)] if scratch else [])]):
        if not _world_readable(path):
            return f"{path} is not readable by other users (chmod -R o+rX it, and o+rx on its parents)"
    return ""


def _reserve_uid_block(start: int) -> tuple[int, int]:
    """A block of uids that no other worker on this host holds, and the descriptor that holds it: the first block
    from `start` on whose lock file (one per block, in a folder only this user may write to) an exclusive flock
    can take. The kernel releases the lock when the descriptor closes or the process dies, even by SIGKILL, so
    several grading processes on one host (Dask workers, two classes at once) never share a uid."""
    chosen = os.environ.get(UID_LOCKS_ENV)
    for folder in [chosen] if chosen else [os.path.join(d, "autograder-uid-blocks")
                                           for d in ("/run/lock", tempfile.gettempdir())]:
        try:  # /run/lock may be missing or read-only (a container image): then the temporary folder
            os.makedirs(folder, mode=0o700, exist_ok=True)
        except OSError:
            if chosen:
                raise
            continue
        if chosen or os.access(folder, os.W_OK):
            break
    st = os.lstat(folder)
    if not os.path.isdir(folder) or os.path.islink(folder) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise WorkerError(f"{folder}: the uid-block locks need a folder of this user that nobody else may write "
                          f"to; remove it, or set {UID_LOCKS_ENV} to another folder")
    for i in range(_UID_BLOCKS):
        block = (start + i) % _UID_BLOCKS
        fd = os.open(os.path.join(folder, str(block)), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return block, fd
    raise WorkerError(f"all {_UID_BLOCKS} uid blocks are held by other graders on this host (locks in {folder})")


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _bwrap_argv(stage: Path, hide: tuple[str | Path, ...], limits: Limits,
                cgroups: dict[str, str]) -> tuple[list[str], list[str], str]:
    """bubblewrap arguments, the sys.path the zygote should use inside, and the interpreter to run.

    Allow-list: only the system folders stay visible; every other top-level folder (/work, /srv, /opt,
    other checkouts ...) is an empty tmpfs. The base Python installation is bound back in at its own
    path; a virtual environment's site-packages folders at /tmp/site/N, so nothing of the checkout
    around a venv (its name, its neighbours) is ever visible.
    """
    repo = str(Path(__file__).resolve().parent.parent)
    exe = os.path.realpath(getattr(sys, "_base_executable", "") or sys.executable)
    base = sorted({os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix)})
    venv = os.path.realpath(sys.prefix)
    others = [os.path.join("/", d) for d in os.listdir("/") if os.path.join("/", d) not in _VISIBLE_ROOTS]
    hidden = sorted({os.path.realpath(p) for p in ("/tmp", "/root", "/home", repo, *others, *hide)
                     if os.path.isdir(p) and not os.path.islink(p)}, key=len)
    top = [h for h in hidden if not any(h != o and _under(h, o) for o in hidden)]
    path: list[str] = []
    site: list[tuple[str, str]] = []
    for p in dict.fromkeys(os.path.realpath(p) for p in sys.path if p and os.path.isdir(p)):
        if any(_under(p, b) for b in base) and not (venv not in base and _under(p, venv)):
            path.append(p)
        elif _under(p, venv) and venv not in base:
            inside = f"{_SANDBOX_SITE}/{len(site)}"
            site.append((p, inside))
            path.append(inside)
        elif not any(_under(p, h) for h in top):
            path.append(p)
    argv = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
            "--perms", "1777", "--size", str(_SHM_MB * MIB), "--tmpfs", "/dev/shm", "--mqueue", "/dev/mqueue",
            "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--new-session"]
    for h in top:
        argv += ["--tmpfs", h]
        for p in base:
            if _under(p, h) and p != h:
                parents = [str(d) for d in reversed(Path(p).parents) if _under(str(d), h) and str(d) != h]
                argv += [a for d in parents for a in ("--perms", "0755", "--dir", d)] + ["--ro-bind", p, p]
        if h == "/tmp":
            argv += ["--ro-bind", str(stage), _SANDBOX_STAGE,
                     "--perms", "0755", "--size", str(limits.scratch_mb * MIB), "--tmpfs", _SANDBOX_SCRATCH]
            if site:
                argv += ["--perms", "0755", "--dir", _SANDBOX_SITE]
            argv += [a for src, dst in site for a in ("--ro-bind", src, dst)]
        argv += ["--remount-ro", h]
    for folder in cgroups.values():
        argv += ["--bind", folder, folder]
    if os.geteuid() == 0:
        argv += ["--cap-drop", "ALL"] + [a for c in _CAPS for a in ("--cap-add", c)]
    return argv, path, exe


def _zygote_host_pid(root: int, nspid: int) -> int:
    """The pid, in our namespace, of the process below `root` whose innermost pid is `nspid`."""
    kids: dict[int, list[int]] = collections.defaultdict(list)
    inner: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        pid = int(name)
        kids[int(fields.get("PPid", "0").strip() or 0)].append(pid)
        ns = fields.get("NSpid", name).split()
        inner[pid] = int(ns[-1]) if ns else pid
    todo = [root]
    while todo:
        pid = todo.pop()
        if inner.get(pid) == nspid and (pid != root or pid == nspid):
            return pid
        todo += kids.get(pid, [])
    return 0


class _Worker:
    """One zygote process and the control socket to it."""

    def __init__(self, index: int, pool: WorkerPool, stage: Path, uid: int | None,
                 hide: tuple[str | Path, ...], preload: tuple[str, ...], start_timeout_s: float,
                 cgroups: dict[str, str]):
        self.index, self.pool, self.stage, self.uid = index, pool, stage, uid
        self.hide, self.preload, self.start_timeout_s, self.cgroups = hide, preload, start_timeout_s, cgroups
        self.proc: subprocess.Popen[bytes] | None = None
        self.ctl: socket.socket | None = None
        self.zygote_pid = 0
        self.log_path = pool._tmp / f"worker{index}.log"

    def start(self) -> str:
        """Start the zygote and wait until it is warm; returns an error message, or '' when ready."""
        limits = self.pool.limits
        threads = str(limits.threads)
        env = {"PATH": f"{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
               "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "OPENBLAS_NUM_THREADS": threads,
               "MPLBACKEND": "Agg", "PYTHONDONTWRITEBYTECODE": "1",
               # torch backs allocations of 2 MB and more with huge pages: each job is a fresh fork, so every large
               # tensor (a long ALiBi bias, a model's tables) is first-touched page by page otherwise
               "THP_MEM_ALLOC_ENABLE": "1"}
        if self.pool.sandbox == "bwrap":
            prefix, path, exe = _bwrap_argv(self.stage, self.hide, limits, self.cgroups)
            stage, scratch, wipe = _SANDBOX_STAGE, _SANDBOX_SCRATCH, [_SANDBOX_SCRATCH, "/dev/shm", "/dev/mqueue"]
            own_ipc = True
        else:
            prefix, path, exe = [], [p for p in sys.path if p and os.path.isdir(p)], sys.executable
            stage, scratch = str(self.stage), str(self.pool._tmp / f"scratch{self.index}")
            wipe, own_ipc = [scratch], False
            os.makedirs(scratch, mode=0o711, exist_ok=True)
        env.update(HOME=scratch, TMPDIR=scratch)
        cfg = {"path": [stage, *path], "probe_module": self.pool.probe_module, "preload": list(self.preload),
               "lesson_modules": list(self.pool.lesson_modules),
               "scratch": scratch, "wipe": wipe, "uid": self.uid, "uids": _UIDS_PER_WORKER,
               "limits": asdict(limits), "cgroups": self.cgroups, "own_ipc": own_ipc,
               "sweep": [] if own_ipc or self.uid is None else _shared_writable()}
        code = "import sys; sys.path[:] = __import__('json').loads(sys.argv[1])['path']; " \
               "import autograder.execute as e; e._zygote_main(sys.argv[1])"
        argv = [*prefix, exe, "-I", "-c", code, json.dumps(cfg)]
        try:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        except OSError as exc:
            return f"worker {self.index} did not start: {exc}"
        try:
            with open(self.log_path, "ab") as err:
                self.proc = subprocess.Popen(argv, stdin=theirs.fileno(), stdout=subprocess.DEVNULL, stderr=err,
                                             env=env, cwd="/", start_new_session=True)
        except OSError as exc:
            ours.close()
            return f"worker {self.index} did not start: {exc}"
        finally:
            theirs.close()
        self.ctl = ours
        try:
            ready = self._recv(time.monotonic() + self.start_timeout_s)
        except WorkerError as exc:
            self.kill()
            return f"worker {self.index} did not start: {exc}; log: {self._log_tail()}"
        if ready.get("ready") is not True or type(ready.get("pid")) is not int:
            self.kill()
            return f"worker {self.index} did not start: {str(ready)[:3000]}"
        self.zygote_pid = (self.proc.pid if self.pool.sandbox == "none"
                           else _zygote_host_pid(self.proc.pid, ready["pid"]))
        return ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and self.ctl is not None

    def run(self, job: bytes, cells: list[tuple[int, str]], probes: list[tuple[str, str, dict[str, Any]]],
            public: int) -> tuple[dict[str, Any], bytes, int, _Transcript]:
        """One job: make the child's channels, hand them over, talk to the child, collect the facts."""
        if not self.alive():
            raise WorkerError("the worker is not running")
        assert self.ctl is not None
        try:
            job_g, job_c = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        except OSError as exc:
            raise WorkerError(f"cannot create the job channel: {exc}") from exc
        try:
            try:
                out_r, out_w = os.pipe()
            except OSError as exc:
                job_c.close()
                raise WorkerError(f"cannot create the output pipe: {exc}") from exc
            try:
                socket.send_fds(self.ctl, [wire.encode({"t": "job"})], [job_c.fileno(), out_w])
            except OSError as exc:
                os.close(out_r)
                raise WorkerError(f"cannot send the job: {exc}") from exc
            finally:
                job_c.close()
                os.close(out_w)
            talk = _Conversation(self, job_g, out_r, job, cells, probes, public)
            try:
                return talk.run()
            finally:
                os.close(out_r)
        finally:
            job_g.close()

    def _recv(self, deadline: float) -> dict[str, Any]:
        """One message from the zygote, or WorkerError when it died, went silent or spoke nonsense."""
        assert self.ctl is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self.ctl, selectors.EVENT_READ)
            while not sel.select(max(0.0, deadline - time.monotonic())):
                if time.monotonic() >= deadline:
                    raise WorkerError("the worker did not answer in time")
        return self._read_ctl()

    def _read_ctl(self) -> dict[str, Any]:
        assert self.ctl is not None
        try:
            data = self.ctl.recv(_CTL_BYTES)
        except OSError as exc:
            raise WorkerError(f"the worker's control socket failed: {exc}") from exc
        if not data:
            raise WorkerError("the worker exited")
        try:
            msg = wire.decode(data, max_bytes=_CTL_BYTES)
        except wire.WireError as exc:
            raise WorkerError(f"malformed message from the worker: {exc}") from exc
        if type(msg) is not dict:
            raise WorkerError("malformed message from the worker")
        if "error" in msg:
            raise WorkerError(f"the worker failed: {str(msg['error'])[:300]}")
        return msg

    def restart(self) -> str:
        self.kill()
        err = self.start()
        if err:
            log.error("%s", err)
        return err

    def kill(self) -> None:
        """Kill the worker; a zygote inside bubblewrap exits as its control socket closes."""
        if self.ctl is not None:
            self.ctl.close()
            self.ctl = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.zygote_pid = 0

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.ctl is not None:
            with contextlib.suppress(OSError):
                self.ctl.shutdown(socket.SHUT_RDWR)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self.kill()

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-1500:].strip() or "(empty)"
        except OSError:
            return "(no log)"


@dataclass
class _Transcript:
    """What the grader learned from the child's frames."""

    outputs: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    tampering: list[str] = field(default_factory=list)
    where: str = "while starting"
    running: int | None = None  # the cell the child was running (None once the cells are done)
    cell_over: int | None = None  # the cell the grader stopped for running past the per-cell limit
    oom: str = ""  # where the child reported running out of memory (a MemoryError it caught)
    exited: str = ""  # a cell called sys.exit() or exit()
    finished: bool = False  # every probe was answered
    overflow: bool = False  # more result bytes than the cap
    violated: bool = False  # a frame out of protocol
    cpu: dict[str, Any] = field(default_factory=lambda: {"setup": 0.0, "cells": 0.0, "probes": {}})


_CELL_FRAME = {"t": (str,), "i": (int,), "note": (str, type(None)), "oom": (bool,), "tamper": (list,),
               "exit": (str, type(None))}
_OUT_FRAME = {"t": (str,), "key": (str,), "value": None, "oom": (bool,), "tamper": (list,)}


def _fits(msg: dict[str, Any], shape: dict[str, Any]) -> bool:
    """Whether msg has exactly shape's keys (and optionally "cpu", a number the child reports about itself)."""
    keys = msg.keys() - {"cpu"} if type(msg.get("cpu")) in (float, int) else msg.keys()
    return keys == shape.keys() and all(kinds is None or type(msg[k]) in kinds for k, kinds in shape.items())


def _cpu_of(msg: dict[str, Any]) -> float:
    """The CPU seconds a frame says its step took (0 when absent): for the benchmark's split, never judged."""
    value = msg.get("cpu")
    return float(value) if type(value) in (float, int) and 0 <= value < 1e6 else 0.0


class _Conversation:
    """The grader's side of one job: send the cells, then the public probe requests in one frame and, once
    every public answer is in, the hidden ones in another; one answer per request, strictly in order."""

    def __init__(self, worker: _Worker, sock: socket.socket, out_r: int, job: bytes, cells: list[tuple[int, str]],
                 probes: list[tuple[str, str, dict[str, Any]]], public: int):
        limits = worker.pool.limits
        self.worker, self.sock, self.out_r, self.job, self.cells, self.probes = worker, sock, out_r, job, cells, probes
        self.out_cap, self.res_cap = limits.output_kb * 1024, limits.result_mb * MIB
        self.output, self.total = bytearray(), 0
        self.buf, self.received = bytearray(), 0
        self.t = _Transcript()
        self.phase, self.cell, self.probe = "cells", 0, 0
        self.public, self.asked = public, 0  # probes[:asked] have been sent to the child
        self.wanted = {k for k, _, _ in probes}
        self.void: set[str] = set()
        self.nonce = ""  # sent with the latest probe requests; the guard's report of each answer must carry it
        self.deadline = time.monotonic() + limits.wall_s + 30
        self.cell_s, self.cell_deadline = limits.cell_s, float("inf")
        self.sel = selectors.DefaultSelector()

    def run(self) -> tuple[dict[str, Any], bytes, int, _Transcript]:
        assert self.worker.ctl is not None
        sel, header = self.sel, None
        try:
            sel.register(self.sock, selectors.EVENT_READ)
            sel.register(self.out_r, selectors.EVENT_READ)
            sel.register(self.worker.ctl, selectors.EVENT_READ)
            self._where()
            self._send_bytes(self.job)
            while header is None:
                now = time.monotonic()
                left = self.deadline - now
                if left <= 0:
                    raise WorkerError("the worker did not report on the job in time")
                if now >= self.cell_deadline:  # only a killed process reliably stops a long C call
                    self.t.cell_over, self.cell_deadline = self.t.running, float("inf")
                    self._hang_up()
                for key, _ in sel.select(min(left, max(0.0, self.cell_deadline - now))):
                    if key.fileobj is self.worker.ctl:
                        header = self.worker._read_ctl()
                    elif key.fileobj == self.out_r:
                        self._pump_output()
                    elif key.fileobj is self.sock:
                        self._pump_frames()
            sel.unregister(self.worker.ctl)
            until = time.monotonic() + 2  # the child's tree is dead: read what it left in the channels
            while sel.get_map() and time.monotonic() < until:
                for key, _ in sel.select(0.1):
                    if key.fileobj == self.out_r:
                        self._pump_output()
                    else:
                        self._pump_frames()
        finally:
            sel.close()
        return header, bytes(self.output), self.total, self.t

    def _pump_output(self) -> None:
        chunk = os.read(self.out_r, 1 << 16)
        if not chunk:
            self.sel.unregister(self.out_r)
            return
        self.total += len(chunk)
        self.output.extend(chunk[: max(0, self.out_cap - len(self.output))])

    def _pump_frames(self) -> None:
        try:
            chunk = self.sock.recv(1 << 16)
        except OSError:
            chunk = b""
        if not chunk:
            self.sel.unregister(self.sock)
            return
        self.received += len(chunk)
        if self.received > self.res_cap:
            self.t.overflow = True
            self._hang_up()
            return
        self.buf += chunk
        while len(self.buf) >= _LEN.size:
            (n,) = _LEN.unpack_from(self.buf)
            if n > self.res_cap:
                return self._break(f"a frame of {n} bytes")
            if len(self.buf) < _LEN.size + n:
                return
            data = bytes(self.buf[_LEN.size:_LEN.size + n])
            del self.buf[:_LEN.size + n]
            try:
                msg = wire.decode(data, max_bytes=self.res_cap)
            except wire.WireError as exc:
                return self._break(f"a malformed frame ({str(exc)[:120]})")
            if type(msg) is not dict:
                return self._break("a frame that is not an object")
            self._handle(msg)

    def _handle(self, msg: dict[str, Any]) -> None:
        kind, t = msg.get("t"), self.t
        if kind == "cell" and self.phase == "cells" and self.cell < len(self.cells) and _fits(msg, _CELL_FRAME) \
                and msg["i"] == self.cells[self.cell][0]:
            self.cell += 1
            t.cpu["cells"] += _cpu_of(msg)
            self._facts(msg["tamper"])
            if msg["note"] and len(t.notes) < 50:
                t.notes.append(msg["note"][:500])
            if msg["oom"]:
                t.oom = t.oom or f"in cell {msg['i']}"
            if msg["exit"]:
                t.exited, self.phase = msg["exit"][:300], "over"
            self._where()
        elif kind == "cells_done" and self.phase == "cells" and self.cell == len(self.cells) \
                and _fits(msg, {"t": (str,)}):
            t.cpu["setup"] = _cpu_of(msg)
            self.phase = "probes"
            self._next_probe()
        elif kind == "out" and self.phase == "probes" and _fits(msg, _OUT_FRAME) \
                and msg["key"] == self.probes[self.probe][0]:
            key = msg["key"]
            mark = f"{_CANARY} {self.nonce}"
            facts = [f for f in msg["tamper"] if not (type(f) is str and f.startswith(_CANARY))]
            if mark not in msg["tamper"] or len(facts) != len(msg["tamper"]) - 1:
                facts.append(f"the guard's report for {key!r} came back without the grader's check mark (the guard "
                             "was switched off or its report rewritten): the case earns nothing")
                self.void.add(key)
            self._facts(facts)
            t.cpu["probes"][key] = _cpu_of(msg)
            if msg["oom"]:
                t.oom = t.oom or f"in probe {key!r}"
            if key not in self.void:
                t.outputs[key] = msg["value"]
            self.probe += 1
            self._next_probe()
        elif kind == "fail" and self.phase != "over" and type(msg.get("text")) is str and len(msg) == 2:
            t.notes.append(msg["text"][:500])
            self.phase = "over"
        else:
            key = msg.get("key")
            named = [key] if kind == "out" and type(key) is str and key in self.wanted else []
            if self.phase == "probes":  # the case being answered when the frame came earns nothing either
                named.append(self.probes[self.probe][0])
            for k in named:  # a second, early or stray answer: the case earns nothing
                self.void.add(k)
                t.outputs.pop(k, None)
            name = f"{str(kind)[:20]!r} frame" + (f" for {str(key)[:60]!r}" if key is not None else "")
            self._violation(f"{name} {t.where}")

    def _next_probe(self) -> None:
        if self.probe == len(self.probes):
            self.phase, self.t.finished = "ended", True
            self._send({"t": "end"})
        elif self.probe == self.asked:  # every request so far is answered: the public group, then the hidden
            end = self.public if self.asked < self.public else len(self.probes)
            batch, self.asked = self.probes[self.asked:end], end
            self.nonce = secrets.token_hex(8)
            self._send({"t": "probes", "probes": [list(p) for p in batch], "nonce": self.nonce})
        self._where()

    def _where(self) -> None:
        """Say where the child is; a cell that starts now (the previous one reported) starts its clock."""
        self.t.running, self.cell_deadline = None, float("inf")
        if self.phase == "cells":
            self.t.where = f"in cell {self.cells[self.cell][0]}" if self.cell < len(self.cells) else "after the cells"
            if self.cell < len(self.cells):
                self.t.running, self.cell_deadline = self.cells[self.cell][0], time.monotonic() + self.cell_s
        elif self.phase == "probes":
            self.t.where = f"in probe {self.probes[self.probe][0]!r}"
        elif self.phase == "ended":
            self.t.where = "after the probes"

    def _facts(self, facts: list[Any]) -> None:
        for f in facts:
            if type(f) is str and f[:200] not in self.t.tampering and len(self.t.tampering) < 50:
                self.t.tampering.append(f[:200])

    def _violation(self, what: str) -> None:
        self.t.violated = True
        self._facts([f"forged or out-of-order result frame: {what}"])

    def _break(self, what: str) -> None:
        """The stream cannot be read on: flag it, stop the child; the remaining probes return nothing."""
        self._violation(what)
        self._hang_up()

    def _hang_up(self) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(self.sock)
        self.phase = "over"
        assert self.worker.ctl is not None
        with contextlib.suppress(OSError):
            self.worker.ctl.send(wire.encode({"t": "kill"}))

    def _send(self, msg: dict[str, Any]) -> None:
        self._send_bytes(wire.encode(msg, max_bytes=4 * MAX_NOTEBOOK_BYTES))

    def _send_bytes(self, data: bytes) -> None:
        if self.phase == "over":
            return
        try:
            self.sock.settimeout(max(0.1, self.deadline - time.monotonic()))
            self.sock.sendall(_LEN.pack(len(data)) + data)
        except OSError:  # the child is gone, or does not read: what the zygote reports tells why
            self._hang_up()


def _classify(header: dict[str, Any], output: bytes, total: int, t: _Transcript,
              probes: list[tuple[str, str, dict[str, Any]]], limits: Limits, guard: str) -> ExecResult:
    """Turn the zygote's facts and the grader's transcript of the conversation into an ExecResult."""
    res = ExecResult("ok", outputs=t.outputs, notes=list(t.notes), tampering=list(t.tampering),
                     cpu_s=float(header.get("cpu_s", 0.0)))
    res.stdout = output[: limits.output_kb * 1024].decode("utf-8", errors="replace")
    if total > len(output):
        res.notes.append(f"output truncated: kept {len(output)} of {total} bytes")
    sig, code, where = header.get("signal"), header.get("exit_code"), t.where
    if t.cell_over is not None:
        res.status = "timeout"
        res.notes.append(f"per-cell time limit of {limits.cell_s:g} s reached in cell {t.cell_over}")
    elif header.get("timed_out"):
        res.status = "timeout"
        res.notes.append(f"wall-clock limit of {limits.wall_s:g} s reached {where}")
    elif header.get("cpu_exceeded"):
        res.status = "timeout"
        res.notes.append(f"CPU-time limit of {limits.cpu_s} s reached {where}")
    elif header.get("memory") in MEMORY_GUARDS:
        res.status = "oom"
        how = ("the cgroup memory limit" if header["memory"] == "cgroup"
               else "the watchdog that sums the memory of its processes")
        res.notes.append(f"out of memory: the submission as a whole (all its processes) went over "
                         f"{limits.memory_mb} MB {where}; stopped by {how}")
    elif t.oom:
        res.status = "oom"
        res.notes.append(f"out of memory (limit {limits.memory_mb} MB) {t.oom}")
    elif sig == signal.SIGKILL and not header.get("killed"):
        res.status = "oom"
        res.notes.append(f"killed by SIGKILL {where}: most likely out of memory ({limits.memory_mb} MB, "
                         f"{guard})")
    elif t.violated:
        res.status = "tampering"
        res.notes.append("the result channel held forged or out-of-order frames; the cases they name "
                         "earn nothing")
    elif t.exited:
        res.status = "crashed"
        res.notes.append(f"{t.exited}; the notebook stopped there and no probe ran")
    elif t.overflow:
        res.status = "crashed"
        res.notes.append(f"the results were over the {limits.result_mb} MB cap")
    elif sig is not None:
        res.status = "crashed"
        res.notes.append(f"the process was killed by signal {_signame(sig)} {where}")
    elif code in (_SETUP_FAILED, _HARNESS_FAILED):
        res.status = "crashed"
        res.notes.append(f"the harness inside the sandbox failed {where} (were its channels broken?)")
    elif not t.finished or code != 0:
        res.status = "crashed"
        res.notes.append(f"the process exited with code {code} {where} (sys.exit or os._exit?)")
    elif res.tampering:
        res.status = "tampering"
    missing = [k for k, _, _ in probes if k not in res.outputs]
    if missing and not t.exited:
        res.notes.append(f"{len(missing)} of {len(probes)} probes returned nothing")
    return res


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return str(sig)


# --------------------------------------------------------------------------- sandbox side: zygote


def _prctl(option: int, arg: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")


def _recv_exact(fd: int, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, min(n - len(buf), 1 << 20))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _zygote_main(config_text: str) -> None:
    """Entry point inside the sandbox: import everything once, then fork and watch one child per job.

    The zygote only ever sees the child's fds and small control messages, never a job's cells or
    results, so nothing of one submission is in the memory the next child is forked from.
    """
    cfg = json.loads(config_text)
    ctl = socket.socket(fileno=os.dup(0))
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    _prctl(_PR_SET_DUMPABLE, 0)
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    try:
        for name in cfg["preload"]:
            importlib.import_module(name)
        probes = importlib.import_module(cfg["probe_module"])
        for name in cfg["lesson_modules"]:  # the notebook imports them (the trainer): once here, not in every child
            with contextlib.suppress(Exception):  # one that fails to import fails in the child, as before
                importlib.import_module(name)
        _install_otter_stub()
        shell = _make_shell()
        unguarded = getattr(probes, "UNGUARDED", ())
        guard = _Guard([*_GUARDED_MODULES, RUNTIME_MODULE, cfg["probe_module"]],
                       unguarded=[n for n in unguarded if type(n) is str] if type(unguarded) is tuple else [])
        suspicious = getattr(probes, "SUSPICIOUS", None)
        limits = Limits(**cfg["limits"])
        memory = _MemoryWatch(cfg, limits)
    except BaseException:  # noqa: BLE001 - report any start-up failure to the grader
        ctl.send(wire.encode({"ready": False, "error": traceback.format_exc()[-3000:]}))
        return
    ctl.send(wire.encode({"ready": True, "pid": os.getpid()}))
    jobs = 0
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(ctl, _CTL_BYTES, 4)
        except OSError:
            break
        if not data:
            for fd in fds:
                os.close(fd)
            break
        if len(fds) != 2:  # a late "kill" for a child that already ended, or a malformed request
            for fd in fds:
                os.close(fd)
            if len(fds):
                ctl.send(wire.encode({"error": f"a job needs 2 fds, got {len(fds)}"}))
            continue
        jobs += 1
        header = _run_job(fds, shell, guard, probes.run_probe, suspicious if type(suspicious) is list else None,
                          cfg, limits, jobs, ctl, memory)
        ctl.send(wire.encode(header))
    os._exit(0)  # skip interpreter teardown (seconds with torch loaded)


def _run_job(fds: list[int], shell: Any, guard: _Guard, run_probe: Any, suspicious: list[str] | None,
             cfg: dict[str, Any], limits: Limits, n: int, ctl: socket.socket,
             memory: _MemoryWatch) -> dict[str, Any]:
    uid = None if cfg["uid"] is None else cfg["uid"] + n % cfg["uids"]  # a fresh uid per job
    since = time.time()
    try:
        scratch = tempfile.mkdtemp(prefix="job-", dir=cfg["scratch"])  # a name that does not count the jobs
        if uid is not None:
            os.chown(scratch, uid, uid)
        memory.begin()
        start = time.monotonic()
        pid = os.fork()
    except OSError as exc:
        for fd in fds:
            os.close(fd)
        return {"error": f"cannot start the job: {exc}"}
    if pid == 0:
        _child(fds, limits, shell, guard, run_probe, suspicious, scratch, uid, cfg["cgroups"])
    for fd in fds:  # the child's ends are not ours to keep
        os.close(fd)
    header = _watch(pid, ctl, limits, start, memory)
    for folder in cfg["wipe"]:  # nothing a submission leaves behind may reach the next one
        for name in os.listdir(folder):
            path = os.path.join(folder, name)
            if os.path.isdir(path) and not os.path.islink(path):
                _rmtree(path)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(path)
    _remove_ipc(uid, since, everything=cfg["own_ipc"])
    if uid is not None and cfg.get("sweep"):
        _remove_owned(uid, cfg["sweep"])
    return header


def _watch(pid: int, ctl: socket.socket, limits: Limits, start: float, memory: _MemoryWatch) -> dict[str, Any]:
    """Wait for the child to exit or a limit to be hit; then kill its tree and return the facts.

    Any message from the grader during a job asks to stop the child; the control socket closing means
    the grader went away: then the child's tree is killed and the zygote exits (which ends the sandbox).
    """
    status, rusage, over = None, None, ""
    timed_out = killed = False
    sel = selectors.DefaultSelector()
    pidfd = os.pidfd_open(pid)
    sel.register(pidfd, selectors.EVENT_READ)
    sel.register(ctl, selectors.EVENT_READ)
    deadline = start + limits.wall_s
    while status is None and not killed:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        for key, _ in sel.select(min(left, _WATCH_S)):
            if key.fileobj == pidfd:
                _, status, rusage = os.wait4(pid, 0)
            else:
                try:
                    msg = ctl.recv(_CTL_BYTES)
                except OSError:
                    msg = b""
                if not msg:
                    _kill_tree(pid)
                    _kill_descendants()
                    os._exit(0)
                killed = True
        if status is None and not killed and memory.over():
            over = memory.kind
            break
    if status is None:
        _kill_tree(pid)
        _, status, rusage = os.wait4(pid, 0)
    _kill_descendants()
    if not over and memory.kind == "cgroup" and memory.over():  # a process of the tree was OOM-killed
        over = memory.kind
    sel.close()
    os.close(pidfd)
    cpu = rusage.ru_utime + rusage.ru_stime if rusage else 0.0
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    forced = killed or bool(over) or timed_out
    return {"exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None, "signal": sig,
            "timed_out": timed_out, "killed": forced, "memory": over or None, "cpu_s": cpu,
            "cpu_exceeded": sig == signal.SIGXCPU or (sig == signal.SIGKILL and not forced
                                                       and cpu >= limits.cpu_s - 0.5),
            "wall_s": time.monotonic() - start}


def _kill_tree(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)


def _children() -> dict[int, list[int]]:
    """Parent pid -> child pids, for every process this one can see."""
    kids: dict[int, list[int]] = collections.defaultdict(list)
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            kids[int(stat[stat.rindex(b")") + 2:].split()[1])].append(int(name))
    return kids


def _descendants(root: int) -> list[int]:
    kids, out, todo = _children(), [], [root]
    while todo:
        for kid in kids.get(todo.pop(), []):
            out.append(kid)
            todo.append(kid)
    return out


def _kill_descendants() -> None:
    """SIGKILL every process left below the zygote (it is a subreaper, so orphans come back to it)."""
    me = os.getpid()
    for _ in range(500):
        kids = _children().get(me, [])
        if not kids:
            return
        for kid in kids:
            with contextlib.suppress(OSError):
                os.kill(kid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        time.sleep(0.005)


class _MemoryWatch:
    """Memory of a submission as a whole: a cgroup's OOM-kill count, or a watchdog's sum over its processes."""

    def __init__(self, cfg: dict[str, Any], limits: Limits):
        self.kind = "cgroup" if cfg["cgroups"] else "watchdog"
        self.limit = limits.memory_mb * MIB
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.oom_file = os.path.join(cfg["cgroups"]["memory"], "memory.oom_control") if cfg["cgroups"] else ""
        self.base = 0

    def begin(self) -> None:
        """Before a fork: the cgroup's OOM kills so far, or the zygote's own private memory (which a
        child shares until it writes to it, so the watchdog does not count it)."""
        self.base = self._oom_kills() if self.kind == "cgroup" else self._private(os.getpid())

    def over(self) -> bool:
        if self.kind == "cgroup":
            return self._oom_kills() > self.base
        total = 0
        for pid in _descendants(os.getpid()):
            total += max(0, self._private(pid) - self.base)
        return total > self.limit

    def _oom_kills(self) -> int:
        try:
            with open(self.oom_file) as f:
                return next((int(line.split()[1]) for line in f if line.startswith("oom_kill ")), 0)
        except (OSError, ValueError):
            return 0

    def _private(self, pid: int) -> int:
        try:
            with open(f"/proc/{pid}/statm") as f:
                fields = f.read().split()
            return (int(fields[1]) - int(fields[2])) * self.page  # resident minus file-backed/shared
        except (OSError, ValueError, IndexError):
            return 0


def _remove_ipc(uid: int | None, since: float, *, everything: bool) -> None:
    """Remove System V shared memory, semaphores and message queues a submission left behind.

    everything: the sandbox's own IPC namespace, where all that is visible is the student's; otherwise
    those owned by the job's uid, or (without a uid of its own) by ours and created during the job.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    removers = (("shm", "shmid", lambda i: libc.shmctl(i, _IPC_RMID, None)),
                ("sem", "semid", lambda i: libc.semctl(i, 0, _IPC_RMID)),
                ("msg", "msqid", lambda i: libc.msgctl(i, _IPC_RMID, None)))
    me = os.geteuid()
    for table, id_col, remove in removers:
        try:
            with open(f"/proc/sysvipc/{table}") as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        cols = lines[0].split() if lines else []
        for line in lines[1:]:
            row = dict(zip(cols, line.split()))
            try:
                ident, owner, creator, ctime = (int(row[k]) for k in (id_col, "uid", "cuid", "ctime"))
            except (KeyError, ValueError):
                continue
            if not (everything or (uid is not None and uid in (owner, creator))
                    or (uid is None and me in (owner, creator) and ctime >= int(since) - 1)):
                continue
            if remove(ident) != 0 and me == 0 and owner != 0:  # IPC_RMID needs the owner (or CAP_SYS_ADMIN)
                try:
                    os.seteuid(owner)
                    remove(ident)
                finally:
                    os.seteuid(0)


def _shared_writable() -> list[str]:
    """The folders (of _SHARED_WRITABLE and TMPDIR) that exist here and that others may write to."""
    found = [os.path.realpath(p) for p in (*_SHARED_WRITABLE, tempfile.gettempdir())]
    return [p for p in dict.fromkeys(found) if os.path.isdir(p) and os.stat(p).st_mode & 0o003 == 0o003]


def _remove_owned(uid: int, roots: list[str]) -> None:
    """Remove every entry owned by `uid` in these folders and in the folders below them that others may write
    to (outside its scratch folder a job's uid can create files nowhere else)."""
    todo = list(roots)
    while todo:
        folder = todo.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            is_dir = entry.is_dir(follow_symlinks=False)
            if st.st_uid == uid and is_dir:
                _rmtree(entry.path)
            elif st.st_uid == uid:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
            elif is_dir and st.st_mode & 0o003 == 0o003:
                todo.append(entry.path)


def _rmtree(path: str) -> None:
    def fix(func: Any, p: str, _exc: Any) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
            func(p)

    shutil.rmtree(path, onerror=fix)


# --------------------------------------------------------------------------- sandbox side: child


class _Guard:
    """Identities of what a cheat would patch, recorded in the zygote before any student code runs.

    Besides module attributes, builtins, sys.modules and the harness modules' globals, the guard holds the frame
    encoder (wire.trusted_encoder, made here) with the code and closure it was made with, and the torch
    function/dispatch mode stacks. `unguarded` names tables of the probe module that only its local checks fill
    (never read by a probe: a notebook that runs its checks is honest). The guard lives in the child's memory, so
    student code can reach it with gc: what it reports is cross-checked by the grader with a check mark (`plant`),
    and the probes read module state through functions of their own, taken before student code ran.
    """

    _MISSING = object()

    def __init__(self, modules: list[str], *, unguarded: Iterable[str] = ()):
        self.attrs: list[tuple[Any, str, str, Any]] = []
        for mod, dotted in _GUARDED:
            try:
                owner: Any = importlib.import_module(mod)
            except ImportError:
                continue
            *path, attr = dotted.split(".")
            for part in path:
                owner = getattr(owner, part, None)
            if owner is not None:
                self.attrs.append((owner, attr, f"{mod}.{dotted}", owner.__dict__.get(attr, self._MISSING)))
        for mod in _GUARDED_WHOLE:
            module = importlib.import_module(mod)
            self.attrs += [(module, k, f"{mod}.{k}", v) for k, v in vars(module).items() if not k.startswith("__")]
        self.mark = _Mark()
        self.attrs.append((self.mark, "nonce", _CANARY, self._MISSING))
        self.modules = {m: sys.modules[m] for m in modules if m in sys.modules}
        self.builtins = vars(self.modules["builtins"])
        self.builtins_snap = dict(self.builtins)
        self.globals = [(vars(self.modules[m]), m, dict(vars(self.modules[m])))
                        for m in ("autograder.wire", "autograder.execute", RUNTIME_MODULE, modules[-1])
                        if m in self.modules]
        # the classes these modules define (the probes' helpers, the guard's own): their tables, and their methods'
        self.classes = [(c, len(vars(c)), tuple(vars(c).values()), dict(vars(c))) for _, name, snap in self.globals
                        for c in snap.values() if type(c) is type and c.__module__ == name]
        functions = [f for _, _, snap in self.globals for f in snap.values()]
        functions += [f for c, _, _, table in self.classes for f in table.values()]
        self.code = {id(f): (f, f.__code__, f.__defaults__, f.__kwdefaults__)
                     for f in functions if type(f) is type(_make_shell)}
        self.is_ = operator.is_
        # the same, as tuples for a check that loops in C (most sweeps find nothing changed)
        self.code_parts = [(operator.attrgetter(a), tuple(e[i] for e in self.code.values()))
                           for i, a in enumerate(("", "__code__", "__defaults__", "__kwdefaults__")) if i]
        self.functions = tuple(e[0] for e in self.code.values())
        skip = {id(snap[k]) for k in unguarded for _, _, snap in self.globals[-1:] if k in snap}
        self.tables = {id(d): (d, dict(d)) for _, _, snap in self.globals
                       for d in snap.values() if type(d) is dict and id(d) not in skip}
        self.encode = wire.trusted_encoder()
        self.encoder_parts = _function_parts(self.encode)
        self.modes = _ModeStacks()
        # keys and values of each snapshot as tuples, for checks that loop in C (most sweeps find nothing changed)
        self.builtins_kv = (tuple(self.builtins_snap), tuple(self.builtins_snap.values()))
        self.globals_kv = [(tuple(snap), tuple(snap.values())) for _, _, snap in self.globals]
        self.tables_kv = {i: (tuple(snap), tuple(snap.values())) for i, (_, snap) in self.tables.items()}
        groups: dict[int, tuple[Any, list[str], list[Any]]] = {}
        self.absent = []
        for owner, attr, _, value in self.attrs:
            if value is self._MISSING:
                self.absent.append((owner.__dict__, attr))
            else:
                group = groups.setdefault(id(owner), (owner.__dict__, [], []))
                group[1].append(attr)
                group[2].append(value)
        self.attr_groups = [(d, tuple(keys), tuple(values)) for d, keys, values in groups.values()]
        # Every table above as one flat (table, key, value) sequence and every table whose size counts: the sweep
        # checks them all in one loop in C and repairs only when something changed (one sweep runs after every
        # cell and probe; the check mark is left out: it changes before every sweep and is checked on its own).
        mark_dict = id(self.mark.__dict__)
        flat = [(ns, k, v) for ns, keys, values in ((self.builtins, *self.builtins_kv),
                                                    *((ns, *kv) for (ns, _, _), kv in zip(self.globals,
                                                                                         self.globals_kv,
                                                                                         strict=True)),
                                                    *((d, *self.tables_kv[i]) for i, (d, _) in self.tables.items()),
                                                    *((vars(c), tuple(table), values) for c, _, values, table
                                                      in self.classes),
                                                    *(g for g in self.attr_groups if id(g[0]) != mark_dict))
                for k, v in zip(keys, values, strict=True)]
        self.flat = (tuple(e[0] for e in flat), tuple(e[1] for e in flat), tuple(e[2] for e in flat))
        self.sized = tuple([d for d, _ in self.tables.values()] + [vars(c) for c, _, _, _ in self.classes])
        self.sizes = tuple([len(snap) for _, snap in self.tables.values()] + [n for _, n, _, _ in self.classes])
        self.module_kv = (tuple(self.modules), tuple(self.modules.values()))
        self.absent_quiet = tuple((d, a) for d, a in self.absent if id(d) != mark_dict)
        self.getitem = operator.getitem

    def plant(self, nonce: str) -> None:
        """A change only the grader can predict (its nonce): a sweep that does not report it was switched off."""
        self.mark.nonce = nonce

    def check_encoder(self) -> list[str]:
        """Say whether the frame encoder's code or closure changed since the zygote made it, and restore it."""
        changed = False
        for fn, code, cells in self.encoder_parts:
            if fn.__code__ is not code:
                fn.__code__, changed = code, True
            for cell, value in cells:
                if cell.cell_contents is not value:
                    cell.cell_contents, changed = value, True
        return ["the grader's frame encoder was changed"] if changed else []

    def sweep(self) -> list[str]:
        """Say what changed since the snapshot and undo it all, builtins first so the rest can run.

        Most sweeps find nothing changed: one loop in C over every table says so (`_quiet`), and only then is
        each part compared and repaired one by one (`_repair`)."""
        return self._repair() if not self._quiet() else self._mark_and_code() + self.check_encoder() + \
            self.modes.sweep()

    def _quiet(self) -> bool:
        """Whether every recorded table holds what it held at the snapshot (the check mark aside)."""
        dicts, keys, values = self.flat
        try:
            same = all(map(self.is_, map(self.getitem, dicts, keys), values))
        except Exception:  # noqa: BLE001 - a key gone (KeyError), or a table that no longer answers
            return False
        return (same and tuple(map(len, self.sized)) == self.sizes and not any(a in d for d, a in self.absent_quiet)
                and _unchanged(sys.modules, *self.module_kv))

    def _mark_and_code(self) -> list[str]:
        """The check mark's report (see plant) and the guarded functions' code and defaults, repaired."""
        facts, mark = [], self.mark
        if mark.__dict__.get("nonce", self._MISSING) is not self._MISSING:
            facts.append(f"{_CANARY} {mark.nonce}")
            with contextlib.suppress(AttributeError, TypeError):
                delattr(mark, "nonce")
        same = all(all(map(self.is_, map(get, self.functions), values)) for get, values in self.code_parts)
        for f, code, defaults, kwdefaults in () if same else self.code.values():
            if f.__code__ is not code or f.__defaults__ is not defaults or f.__kwdefaults__ is not kwdefaults:
                facts.append(f"{f.__module__}.{f.__qualname__} was replaced (its code or defaults)")
                f.__code__, f.__defaults__, f.__kwdefaults__ = code, defaults, kwdefaults
        return facts

    def _repair(self) -> list[str]:
        """sweep's slow path: each part compared with its snapshot, every change reported and undone."""
        ns, snap, missing = self.builtins, self.builtins_snap, self._MISSING
        facts = []
        if not _unchanged(ns, *self.builtins_kv):
            facts += [f"builtins.{k} was replaced" for k, v in snap.items() if ns.get(k, missing) is not v]
            ns.update(snap)
        same = all(_unchanged(d, k, v) for d, k, v in self.attr_groups) and not any(a in d for d, a in self.absent)
        for owner, attr, name, value in () if same else self.attrs:
            if owner.__dict__.get(attr, missing) is not value:
                facts.append(f"{name} was replaced" if owner is not self.mark else f"{name} {self.mark.nonce}")
                with contextlib.suppress(AttributeError, TypeError):
                    if value is missing:
                        delattr(owner, attr)
                    else:
                        setattr(owner, attr, value)
        for name, mod in self.modules.items():
            if sys.modules.get(name) is not mod:
                facts.append(f"sys.modules[{name!r}] was replaced")
                sys.modules[name] = mod
        for (ns, name, snap), kv in zip(self.globals, self.globals_kv, strict=True):
            if not _unchanged(ns, *kv):
                facts += [f"{name}.{k} was replaced" for k, v in snap.items() if ns.get(k, missing) is not v]
                ns.update(snap)
        for cls, n, values, table in self.classes:
            now = vars(cls)
            if len(now) == n and all(map(self.is_, now.values(), values)):
                continue
            changed = [k for k, v in table.items() if now.get(k, missing) is not v]
            changed += [k for k in now if k not in table and k != "__slotnames__"]  # copy/pickle caches slot names
            if changed:
                facts.append(f"{cls.__module__}.{cls.__qualname__} was changed ({', '.join(changed[:3])})")
            for k in changed:
                with contextlib.suppress(AttributeError, TypeError):
                    if k in table:
                        setattr(cls, k, table[k])
                    else:
                        delattr(cls, k)
        same = all(all(map(self.is_, map(get, self.functions), values)) for get, values in self.code_parts)
        for f, code, defaults, kwdefaults in () if same else self.code.values():
            if f.__code__ is not code or f.__defaults__ is not defaults or f.__kwdefaults__ is not kwdefaults:
                facts.append(f"{f.__module__}.{f.__qualname__} was replaced (its code or defaults)")
                f.__code__, f.__defaults__, f.__kwdefaults__ = code, defaults, kwdefaults
        for i, (d, snap) in self.tables.items():
            if len(d) == len(snap) and _unchanged(d, *self.tables_kv[i]):
                continue
            if d.keys() != snap.keys() or any(d[k] is not v for k, v in snap.items()):
                facts.append(f"a table of the grader's modules was changed (keys {sorted(snap)[:3]})")
                d.clear()
                d.update(snap)
        return facts + self.check_encoder() + self.modes.sweep()


def _unchanged(table: Any, keys: tuple[Any, ...], values: tuple[Any, ...], is_: Any = operator.is_) -> bool:
    """Whether table[k] is v for every k, v of keys, values (a loop in C; False when a key is gone)."""
    try:
        return all(map(is_, map(table.__getitem__, keys), values))
    except KeyError:
        return False


class _Mark:
    """Holds the grader's nonce between `_Guard.plant` and the sweep that must report it."""

    nonce: str | None = None


def _function_parts(fn: Any) -> list[tuple[Any, Any, list[tuple[Any, Any]]]]:
    """(function, its code, [(closure cell, its value)]) for fn and every function in its closure, recursively."""
    parts, todo, seen = [], [fn], set()
    while todo:
        f = todo.pop()
        if id(f) in seen:
            continue
        seen.add(id(f))
        cells = [(c, c.cell_contents) for c in f.__closure__ or ()]
        parts.append((f, f.__code__, cells))
        todo += [v for _, v in cells if type(v) is type(_function_parts)]
    return parts


class _ModeStacks:
    """torch's function and dispatch mode stacks and its torch-function switch, as they were in the zygote: a mode
    left active after a cell (or a torch._C.DisableTorchFunction left entered) changes what every later probe
    sees, so the sweep reports it and puts the stacks back."""

    def __init__(self) -> None:
        torch = sys.modules.get("torch")
        self.c = getattr(torch, "_C", None)
        names = ("_len_torch_function_stack", "_pop_torch_function_stack", "_len_torch_dispatch_stack",
                 "_pop_torch_dispatch_stack", "_get_torch_function_state", "_set_torch_function_state")
        self.fns = tuple(getattr(self.c, n, None) for n in names)
        if not all(self.fns):
            self.fns = ()
            return
        self.state = self.fns[4]()
        self.depths = (self.fns[0](), self.fns[2]())

    def sweep(self) -> list[str]:
        if not self.fns:
            return []
        fn_len, fn_pop, disp_len, disp_pop, get_state, set_state = self.fns
        facts = []
        if fn_len() > self.depths[0]:
            facts.append("a torch function mode (TorchFunctionMode) was left active")
            while fn_len() > self.depths[0]:
                fn_pop()
        if disp_len() > self.depths[1]:
            facts.append("a torch dispatch mode (TorchDispatchMode) was left active")
            while disp_len() > self.depths[1]:
                disp_pop(None)  # the innermost mode (None: of any key)
        if get_state() != self.state:
            facts.append("torch functions were left disabled (DisableTorchFunction)")
            set_state(self.state)
        return facts


def _count_tasks(uid: int) -> int:
    n = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{name}").st_uid == uid:
                    n += len(os.listdir(f"/proc/{name}/task"))
    return n


def _vm_size(pid: int | str = "self") -> int:
    """The address space a process uses (VmSize, bytes); 0 when it cannot be read."""
    with contextlib.suppress(OSError, StopIteration, ValueError, IndexError), open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    return 0


def _rlimits(limits: Limits, *, vm: int, base: int) -> list[tuple[int, int, int]]:
    """A child's per-process limits as (rlim, soft, hard): vm is its size, base the tasks its uid runs already."""
    return [(resource.RLIMIT_AS, vm + limits.memory_mb * MIB, vm + limits.memory_mb * MIB),
            (resource.RLIMIT_NPROC, base + limits.processes, base + limits.processes),
            (resource.RLIMIT_FSIZE, limits.file_mb * MIB, limits.file_mb * MIB), (resource.RLIMIT_CORE, 0, 0),
            (resource.RLIMIT_NOFILE, 1024, 1024), (resource.RLIMIT_CPU, limits.cpu_s, limits.cpu_s + 1)]


def _apply_limits(limits: Limits, uid: int | None) -> None:
    base = 1 if uid is not None else _count_tasks(os.getuid())
    for rlim, soft, hard in _rlimits(limits, vm=_vm_size(), base=base):  # never above the grader's own hard limits
        resource.setrlimit(rlim, fit_hard(rlim, soft, hard))
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)


def _own_ipc_namespace() -> None:
    """Give this job's child an IPC namespace of its own (System V objects and POSIX message queues), so it finds
    nothing an earlier job made and leaves nothing for a later one. It needs CAP_SYS_ADMIN: as root without
    bubblewrap it works; inside bubblewrap the worker's namespace is emptied after each job instead (the zygote
    removes every System V object and everything in the sandbox's own /dev/mqueue)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.unshare(_CLONE_NEWIPC)  # EPERM without the capability: then the zygote's clean-up alone holds


def _describe(exc: BaseException) -> tuple[str, str]:
    try:
        name = type(exc).__name__
        text = str(exc)[:300]
    except BaseException:  # noqa: BLE001 - a student exception may break its own __str__
        return "Exception", "<unprintable>"
    return name, text


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    name, text = _describe(exc)
    return name == "OutOfMemoryError" or "can't allocate memory" in text or "not enough memory" in text


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(BaseException):
            stream.flush()


def _child(fds: list[int], limits: Limits, shell: Any, guard: _Guard, run_probe: Any,
           suspicious: list[str] | None, scratch: str, uid: int | None, cgroups: dict[str, str]) -> NoReturn:
    """Runs in the forked child: confine, receive the cells from the grader, run them, then answer the
    grader's probe requests (a frame of public ones, then one of hidden ones) in order; exits without
    returning."""
    # Everything that encodes and writes a frame was taken before student code ran (the encoder by the zygote):
    # a patched json, base64, os or struct cannot strip or rewrite what the child reports.
    write, exit_, getpid, encode, decode, sanitize = os.write, os._exit, os.getpid, guard.encode, wire.decode, \
        wire.sanitize
    pack_len, check_encoder, wire_error, view_of = _LEN.pack, guard.check_encoder, wire.WireError, memoryview
    res_cap = limits.result_mb * MIB
    me, parent = getpid(), os.getppid()
    # the child's CPU per step, reported in its frames for the benchmark's split: this thread's clock, exact; the
    # process clock advances in scheduler ticks while RLIMIT_CPU is set, and credits a step's time to whichever
    # later step blocks first (a frame's write), so it showed the probes' time as frame traffic
    clock = time.thread_time

    def send(msg: dict[str, Any]) -> None:
        if getpid() != me:
            exit_(0)
        changed = check_encoder()
        if changed and type(msg.get("tamper")) is list:
            msg["tamper"] += changed
        try:
            data = encode(msg, res_cap)
        except wire_error as exc:
            data = encode({**msg, "value": {"error": {"type": "WireError", "message": str(exc)[:300]}}}, res_cap)
        view = view_of(pack_len(len(data)) + data)
        while view:
            view = view[write(_JOB_FD, view):]

    def recv() -> dict[str, Any] | None:
        head = _recv_exact(_JOB_FD, _LEN.size)
        data = None if head is None else _recv_exact(_JOB_FD, _LEN.unpack(head)[0])
        msg = None if data is None else decode(data, max_bytes=len(data))
        return msg if type(msg) is dict else None

    try:
        job_fd, out_fd = fds
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        os.dup2(job_fd, _JOB_FD)  # the zygote's fds 0-2 are taken, so neither channel is 0, 1 or 2
        os.closerange(_JOB_FD + 1, 1 << 20)  # the control socket, the zygote's other fds
        sys.stdout, sys.stderr = (io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding="utf-8",
                                                   errors="backslashreplace") for fd in (1, 2))
        for folder in cgroups.values():  # join the worker's cgroups while still allowed to
            _write(os.path.join(folder, "cgroup.procs"), str(me))
        os.chdir(scratch)
        os.environ.update(HOME=scratch, TMPDIR=scratch, PWD=scratch)
        tempfile.tempdir = scratch
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        _own_ipc_namespace()
        _apply_limits(limits, uid)
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:
            exit_(_SETUP_FAILED)  # the zygote died before the line above
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(limits.threads)
        setup_cpu = clock()  # fork (page faults of the copy), cgroups, limits, until the cells can be received
        job = recv()
        if job is None or job.get("t") != "cells":
            exit_(_SETUP_FAILED)
    except BaseException:  # noqa: BLE001
        with contextlib.suppress(BaseException):
            send({"t": "fail", "text": "sandbox setup failed: " + traceback.format_exc()[-400:]})
        exit_(_SETUP_FAILED)

    try:
        for i, src in job["cells"]:
            began = clock()
            try:
                result = shell.run_cell(src, store_history=True)
                err = result.error_before_exec or result.error_in_exec
            except BaseException as exc:  # noqa: BLE001 - a cell that broke IPython itself
                err = exc
            facts = guard.sweep()
            _flush()
            if getpid() != me:
                exit_(0)
            how = None
            if isinstance(err, SystemExit) or shell.exit_now:
                how = f"cell {i} called " + (f"sys.exit({_describe(err)[1]})" if isinstance(err, SystemExit)
                                             else "exit()")
            note = None
            if err is not None and how is None:
                name, text = _describe(err)
                note = f"cell {i}: {name}: {text}"
            send({"t": "cell", "i": i, "note": note, "oom": err is not None and _is_oom(err), "tamper": facts,
                  "exit": how, "cpu": clock() - began})
            if how:
                exit_(0)
        send({"t": "cells_done", "cpu": setup_cpu})
        while (req := recv()) is not None and req.get("t") == "probes":
            nonce = str(req.get("nonce"))
            for key, name, args in req["probes"]:  # answered one by one, in the order asked
                began = clock()
                try:
                    value = run_probe(shell.user_ns, name, args)
                except BaseException as exc:  # noqa: BLE001 - SystemExit and friends from student code
                    ename, text = _describe(exc)
                    value = {"error": {"type": ename, "message": text, "where": "probe harness"}}
                guard.plant(nonce)
                facts = guard.sweep()
                if getpid() != me:
                    exit_(0)
                if suspicious:
                    facts += [f"suspicious probe output in {key!r}: {s}"[:200] for s in suspicious[:5]]
                    del suspicious[:]
                value = sanitize(value)
                err = value.get("error") if type(value) is dict else None
                oom = type(err) is dict and (err.get("type") in _OOM_TYPES
                                             or "can't allocate memory" in str(err.get("message", "")))
                send({"t": "out", "key": key, "value": value, "oom": oom, "tamper": facts, "cpu": clock() - began})
        _flush()
        exit_(0)
    except BaseException:  # noqa: BLE001 - anything escaping the harness is a crash, reported as such
        with contextlib.suppress(BaseException):
            send({"t": "fail", "text": "the grading harness failed: " + traceback.format_exc()[-400:]})
        exit_(_HARNESS_FAILED)


def _install_otter_stub() -> None:
    """Notebooks start with `grader = otter.Notebook(...)`; in the sandbox its checks and export do nothing."""
    import types

    class Notebook:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def __getattr__(self, name: str) -> Any:
            return lambda *args, **kwargs: None

    stub = types.ModuleType("otter", "stand-in: grading never runs Otter inside the student's process")
    stub.Notebook = Notebook  # type: ignore[attr-defined]
    sys.modules["otter"] = stub


def _make_shell() -> Any:
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    config = Config()
    config.HistoryManager.enabled = False
    config.InteractiveShell.colors = "nocolor"
    config.InteractiveShell.xmode = "Plain"
    shell = InteractiveShell.instance(config=config)
    shell.ask_exit = lambda: setattr(shell, "exit_now", True)  # exit() and quit() as in a kernel
    return shell
