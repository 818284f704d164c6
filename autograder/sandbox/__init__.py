"""The sandbox: run student notebooks in a sandbox, call probes inside them and return plain data.

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

File jobs (files.py). An uploaded file (a milestone checkpoint) is read by a long-lived reader process (the same
fork server, zygote.serve_files) started in
the same isolation (the same bubblewrap argv, or the uid fallback as root, or limits only; cgroups where writable),
which forks a confined child per file; docs/checkpoint.md.

Time. Every limit is charged in the student's CPU time, which the grader reads itself (cputime.py: the worker's
cpuacct cgroup, else /proc of the processes below the zygote; never what the child reports): a step (a cell, a
check, a question's checks, a whole run of the notebook, a file read) is stopped and charged when its processes used
its limit in CPU seconds, or passed its wall-clock backstop, three times the limit, counted on the wall clock less
the time they waited for a CPU. A step the machine slowed past its limit on the wall clock, its CPU under it, goes
on, uncharged, and the result's notes say so. RLIMIT_CPU still stops any one process at the notebook's CPU limit,
and the zygote keeps a last-resort wall clock of its own. The grader times each cell from the frames (a cell starts
when the previous one reports) and, when one is over its limit, has the zygote kill the child: only a killed process
reliably stops a long C call inside torch. It then runs the notebook again in a fresh child (fresh channels) without
that cell. When a whole-notebook limit stops a cell, the cells before it run again and the probes still run. Each
probe has its own limit and each question (a case id's prefix) a share of the probes' time: a probe past either is
stopped the same way, and the probes not yet answered go to a fresh child (the same cells first, public before
hidden), at most MAX_PROBE_RUNS times (results.py). A forged cell frame can change which cell is left out, never
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
  or env_name("SANDBOX") is none), as root, each job runs as a fresh uid (fallback.py): its worker entered a
  network namespace of its own and a mount namespace laid out as bubblewrap's (the same folders empty, its own
  /dev/shm) as it started, every process of the job's uid is killed after the job, and what that uid left in
  the folders anyone may write to is removed; the job's uid reads what any user may (close the grader's files to
  others: the Gradescope bundle's run_autograder runs `chmod o=` on the source and results folders). Where the
  uid cannot be dropped (not root, or the interpreter is not readable by others), or the kernel refuses the
  namespaces (no CAP_SYS_ADMIN: fallback.namespace_problem asks once) nothing starts (fallback.UnsandboxedError, with
  what to install or change) unless allowed (--allow-unsandboxed): then student code runs as the grader's
  user. ExecResult.isolation says which held: "bubblewrap", "unprivileged uid" or "none".
- Limits: the submission as a whole is limited in memory and processes by a cgroup (v1 memory and pids
  controllers, one group per worker, created outside the sandbox and bound writable into it; the grader
  places the zygote there once, so every child is born in it, its oom_score_adj raised to 1000 so that the
  kernel frees memory from the submission first, and a zygote killed for memory all the same is the
  submission's memory limit, not a crash) or, where cgroups are not writable, by a watchdog in the zygote
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
  array shapes) voids the case it names and flags the submission (Status.TAMPERING) without ever raising;
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
- Reach at run time: the child installs an audit hook (tripwire.py) before any cell runs; frames, gc, ctypes,
  code objects and a second hook asked for from student code are refused and reported to the grader at once
  (ExecResult.tripwire; docs/guarantees.md says what no audit event covers).
- Infrastructure: a worker that fails for reasons that are not the student's (zygote killed, out of
  fds, job not sent) is restarted and the submission retried once; a second failure is the student's
  (Status.CRASHED). When no worker can be started at all, run() raises WorkerError.

The front door. The rest of the engine (and the tests, the lessons, the benchmarks) imports the sandbox from here
only: `from autograder.sandbox import WorkerPool, ExecResult, Limits, ...`; __all__ names what it may use. Each
name is imported from its module when first asked for (the zygote and the child import only the modules they run).
The public names are written once, as the imports under TYPE_CHECKING at the end of this file (what a type checker
and an editor read); __all__ and the lazy map are read from those imports.

Files, one job each: frames.py (what grader and child share on the wire), limits.py (the limits), notebook.py (a
submission's cells), isolation.py (the confinement primitives), fallback.py (the choice of isolation, the refusal,
the uid fallback's namespaces), guard.py (the tamper guard), tripwire.py (the child's audit hook), child.py (the
child), zygote.py (the fork server of notebook and file jobs), results.py (what a run makes), worker.py (a worker and
its conversation with a child), pool.py (the pool of workers), files.py (the checkpoint readers).
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any


def _exports() -> dict[str, tuple[str, str]]:
    """Public name -> (module of this package, its name there), read from the imports under TYPE_CHECKING below: the
    one place the front door's names are written."""
    tree = ast.parse(Path(__file__).read_text(encoding="utf-8"))
    block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    return {a.asname or a.name: (node.module.rsplit(".", 1)[1], a.name) for node in block.body
            if isinstance(node, ast.ImportFrom) and node.module for a in node.names}


_EXPORTS = _exports()
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """A public name, imported from its module when first asked for."""
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = _EXPORTS[name]
    return getattr(importlib.import_module(f"{__name__}.{module}"), attr)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:  # the public names, written once: what a type checker and an editor see; _exports reads them
    from autograder.sandbox.cputime import BACKSTOP, CPU_CLOCK_ENV, Budget, JobClock, group_cpu_s, make_cpu_group
    from autograder.sandbox.fallback import (
        ALLOW_UNSANDBOXED,
        UNSANDBOXED_HELP,
        Isolation,
        UnsandboxedError,
        choose_isolation,
        namespace_problem,
        permit_unsandboxed,
        refuse_unsandboxed,
        require_isolation,
    )
    from autograder.sandbox.files import (
        STARTUP_TIMEOUT_S,
        VERIFY_SLOTS,
        ReaderFiles,
        Verifier,
        VerifierError,
        reader_isolation,
        reader_limits_lowered,
        reader_pool,
        run_child,
    )
    from autograder.sandbox.frames import MEMORY_GUARDS, WorkerError
    from autograder.sandbox.isolation import (
        MEMORY_GUARD_ENV,
        SANDBOX_ENV,
        UID_BASE,
        UID_LOCKS_ENV,
        choose_sandbox,
        remove_cgroup,
        uid_drop_problem,
    )
    from autograder.sandbox.limits import (
        CELL_TIMEOUT_S,
        CHECKPOINT_MEMORY_MB,
        CPU_TIMEOUT_S,
        MAX_OUTPUT_KB,
        MAX_PROCESSES,
        MEMORY_MB,
        MIB,
        PROBE_TIMEOUT_S,
        QUESTION_TIMEOUT_S,
        UPLOAD_CAP_MB,
        WALL_TIMEOUT_S,
        Limits,
        fit_hard,
        lowered_limits,
    )
    from autograder.sandbox.notebook import (
        MAX_NOTEBOOK_BYTES,
        SKIP_TAGS,
        NotebookError,
        notebook_cells,
        read_notebook,
    )
    from autograder.sandbox.pool import WorkerPool, execute_batch, execute_submission
    from autograder.sandbox.results import MAX_PROBE_RUNS, ExecResult, Probe, group_of
    from autograder.sandbox.zygote import COLLAPSE_AFTER, PRELOAD
