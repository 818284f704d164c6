"""The checkpoint engine: the contract of a lesson's milestone plug-in, typed verdicts, and the reader processes
that load and evaluate an uploaded checkpoint in a limited child.

A lesson with a milestone declares its checkpoint in the milestone question's front matter (`checkpoint: {id,
title, files}`, autograder/authoring/questions.py) and provides a plug-in, assignments/NAME/NAME_checkpoint.py
(Lesson.plugin_file; graders only: it is never shipped to students). The engine imports it only when the lesson
grades a checkpoint (load_plugin). A plug-in module defines:

    PARTS: Sequence[str]         the graded parts, each a case of the checkpoint's question (equal shares)
    PROBLEMS: dict[str, str]     problem id -> what it means and what to do: the report's checkpoint section.
                                 It has UNREADABLE ("checkpoint_unreadable"): uploads the grader could not read.
    UNVERIFIED: str              what to do when the checkpoint could not be verified at all (a judge's message)
    verify(files, *, rules, memory_mb) -> Verdict
                                 the uploaded files (name -> bytes, as the question declares them) against the
                                 config's milestone section (rules); never raises for what the files hold
    reader_start() -> state      in a verifier process, once: imports and models set up before any child forks
    reader_evaluate(request, data, state) -> dict
                                 in the limited child: read the checkpoint's bytes and answer plain JSON data

A plug-in runs its evaluation through run_child (or a Verifier of its own file), so the bytes of a hostile file
are only ever read in a child with a memory, CPU-time and wall-clock limit: it can only ever give a verdict.
This module imports the standard library and the engine's lesson and limits modules alone (no torch).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from autograder.lesson import ENGINE_ROOT, Lesson, LessonError, default_lesson, load_module
from autograder.model import PartVerdict, Verdict  # noqa: F401 - re-exported: the plug-ins build them from here
from autograder.sandbox.limits import fit_hard, lowered_limits

STARTUP_TIMEOUT_S = 120  # for a verifier process to start its plug-in (torch and models: about 3 CPU-s, once)
UNREADABLE = "checkpoint_unreadable"  # the problem of uploads that could not be read at all
_LOWERED: dict[str, None] = {}  # the reader's limits that an operator's lower hard limits lowered


def load_plugin(lesson: Lesson) -> ModuleType:
    """The lesson's milestone plug-in, imported once per process; LessonError when the lesson has none."""
    path = lesson.plugin_file
    if path is None:
        raise LessonError(f"{lesson.assignment_dir}: lesson {lesson.name} grades a checkpoint but has no plug-in "
                          f"{lesson.plugin_name}.py: add it (autograder/checkpoint.py says what it defines)")
    return load_module(lesson.plugin_name, path)


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


def _threads() -> int:
    """How many checkpoints are verified side by side: the CPUs this process may run on (taskset, cgroups),
    at most 4."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(4, cpus or 1))


def _child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONSTARTUP", "PYTHONINSPECT")}
    env.update(PYTHONPATH=os.pathsep.join(filter(None, (str(ENGINE_ROOT), os.environ.get("PYTHONPATH")))),
               PYTHONDONTWRITEBYTECODE="1", MALLOC_ARENA_MAX="2", OMP_NUM_THREADS="1")
    return env


class VerifierError(RuntimeError):
    """The verifier process itself failed (not the checkpoint): it is restarted and the request retried once."""


def _read_line(fd: int, deadline: float) -> bytes | None:
    """One line from a pipe, or None at end of file or when the deadline (time.monotonic) passes."""
    buf = b""
    while not buf.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return None
        buf += chunk
    return buf


class Verifier:
    """A pre-started reader: a process that loads the plug-in and runs its reader_start once (imports, models),
    then forks a child per checkpoint (cheap: the child shares the started interpreter). Each child reads the
    checkpoint under its own memory, CPU-time and wall-clock limits (the plug-in's reader_evaluate) and exits,
    so a hostile file can only ever cost that child. One request at a time; a pool of them serves threads.
    plugin: the lesson's plug-in file; threads: threads of each child (one: verifications run side by side)."""

    def __init__(self, *, plugin: Path, threads: int = 1, startup_s: float = STARTUP_TIMEOUT_S) -> None:
        self.plugin, self.threads, self.startup_s = Path(plugin).resolve(), threads, startup_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup: dict[str, float] = {}  # seconds (wall) and cpu_s of the last start

    def start(self) -> Verifier:
        """Start the process (about 3 CPU-s) unless it runs; VerifierError when it cannot."""
        if self.alive():
            return self
        self.close()
        started = time.perf_counter()
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "autograder.checkpoint", "--server",
                                          str(self.plugin)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         cwd=ENGINE_ROOT, env=_child_env(),
                                         start_new_session=True)  # its own group: close() stops its child too
        except OSError as err:
            raise VerifierError(f"the grader could not start its checkpoint reader ({err})") from err
        ready = _read_line(self.proc.stdout.fileno(), time.monotonic() + self.startup_s)  # type: ignore[union-attr]
        if ready is None:
            self.close()
            raise VerifierError(f"the grader's checkpoint reader did not start within {self.startup_s:g} s")
        self.startup = {"seconds": time.perf_counter() - started, **json.loads(ready)}
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def request(self, pt_bytes: bytes, request: dict[str, Any], *, timeout_s: float) -> dict[str, Any]:
        """Evaluate one checkpoint in a fresh limited child; its answer, or {"error": ...} about the file."""
        proc = self.start().proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        header = json.dumps({**request, "timeout_s": timeout_s, "threads": self.threads,
                             "size": len(pt_bytes)}).encode() + b"\n"
        try:
            proc.stdin.write(header + pt_bytes)
            proc.stdin.flush()
        except OSError as err:
            self.close()
            raise VerifierError(f"the checkpoint reader stopped ({err})") from err
        line = _read_line(proc.stdout.fileno(), time.monotonic() + timeout_s + 60)
        if line is None:
            self.close()
            raise VerifierError("the checkpoint reader stopped answering")
        return json.loads(line)

    def close(self) -> None:
        """Stop the process and a child it may be running (a later request starts it again)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()

    def __enter__(self) -> Verifier:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class _Pool:
    """Up to `slots` verifiers, started when first needed and kept for the process (grade_batch, the tests)."""

    def __init__(self, slots: int, *, plugin: Path) -> None:
        self.plugin = plugin
        self.slots = threading.BoundedSemaphore(slots)
        self.idle: list[Verifier] = []
        self.guard = threading.Lock()
        self.owner = os.getpid()  # a forked copy of this process must not stop the owner's verifiers

    def request(self, pt_bytes: bytes, request: dict[str, Any], *, timeout_s: float) -> dict[str, Any]:
        with self.slots:
            with self.guard:
                verifier = self.idle.pop() if self.idle else Verifier(plugin=self.plugin)
            try:
                for attempt in (1, 2):  # a reader that dies for reasons of its own is started again, once
                    try:
                        return verifier.request(pt_bytes, request, timeout_s=timeout_s)
                    except VerifierError as err:
                        if attempt == 2:
                            return {"error": str(err), "infrastructure": True}
                raise AssertionError("unreachable")
            finally:
                with self.guard:
                    self.idle.append(verifier)

    def close(self) -> None:
        if os.getpid() != self.owner:
            return
        with self.guard:
            idle, self.idle = self.idle, []
        for verifier in idle:
            verifier.close()


VERIFY_SLOTS = _threads()  # checkpoints verified side by side (grade_batch verifies ahead in as many threads)
_POOLS: dict[Path, _Pool] = {}
_POOLS_GUARD = threading.Lock()


def pool(plugin: Path) -> _Pool:
    """The process's pool of verifiers of one plug-in file (started when first needed, stopped at exit)."""
    plugin = Path(plugin).resolve()
    with _POOLS_GUARD:
        if plugin not in _POOLS:
            _POOLS[plugin] = _Pool(VERIFY_SLOTS, plugin=plugin)
            atexit.register(_POOLS[plugin].close)
        return _POOLS[plugin]


def run_child(data: bytes, request: dict[str, Any], *, plugin: Path, memory_mb: int, timeout_s: float,
              verifier: Verifier | None = None) -> dict[str, Any]:
    """Read and evaluate a checkpoint's bytes in a limited child of a verifier of `plugin` (the pool's unless
    one is given); any failure comes back as {"error": ...}. The limits the operator's hard limits lowered are
    noted for reader_limits_lowered."""
    request = {**request, "memory_mb": memory_mb}
    if verifier is None:
        found = pool(plugin).request(data, request, timeout_s=timeout_s)
    else:
        try:
            found = verifier.request(data, request, timeout_s=timeout_s)
        except VerifierError as err:
            found = {"error": str(err), "infrastructure": True}
    _LOWERED.update(dict.fromkeys(str(n) for n in found.get("limits_lowered", [])))
    return found


def reader_limits_lowered() -> list[str]:
    """Which limits of the checkpoint reader this process's hard limits lowered (an operator's ulimit), and to
    what, for every checkpoint read so far; [] when none."""
    return list(_LOWERED)


def _fork_child(request: dict[str, Any], pt_bytes: bytes, plugin: ModuleType, state: Any) -> dict[str, Any]:
    """In the verifier: evaluate one checkpoint in a forked child limited to memory_mb beyond the verifier's
    size, timeout_s of CPU and of wall-clock time; the child's answer with its CPU seconds, or an error."""
    import resource

    status = Path("/proc/self/status")  # the child's size as it starts: a fork of this process
    base = next((int(line.split()[1]) * 1024 for line in status.read_text().splitlines()
                 if line.startswith("VmSize:")), 0) if status.exists() else 0
    limit, cpu = base + int(request["memory_mb"]) * 2**20, int(request["timeout_s"]) + 1
    rlimits = ((resource.RLIMIT_AS, limit), (resource.RLIMIT_CPU, cpu), (resource.RLIMIT_CORE, 0))
    # what an operator's lower hard limits (ulimit) lower, said with the answer
    lowered = {"limits_lowered": lowered_limits(rlimits, who="the checkpoint reader", size=base)}
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: nothing of the verifier's protocol, its own limits, one answer, then exit
        code = 0
        try:
            os.close(read_end)
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            for rlim, value in rlimits:  # never above the verifier's own hard limits
                resource.setrlimit(rlim, fit_hard(rlim, value))
            answer = json.dumps(plugin.reader_evaluate(request, pt_bytes, state)).encode() + b"\n"
            view = memoryview(answer)
            while view:
                view = view[os.write(write_end, view):]
        except BaseException:  # noqa: BLE001 - the verifier reports how the child ended
            code = 1
        finally:
            os._exit(code)
    os.close(write_end)
    timeout_s = float(request["timeout_s"])
    deadline = time.monotonic() + timeout_s
    try:
        line = _read_line(read_end, deadline)
    finally:
        os.close(read_end)
    timed_out = line is None and time.monotonic() >= deadline
    if line is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    _, status, usage = os.wait4(pid, 0)
    cpu_s = usage.ru_utime + usage.ru_stime
    if line is not None and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        return {**json.loads(line), "cpu_s": cpu_s, **lowered}
    if timed_out:
        return {"error": f"reading and evaluating it took longer than the grader's limit of {timeout_s:g} s",
                "cpu_s": cpu_s, **lowered}
    why = (f"the reader stopped with signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else
           f"the reader failed (exit status {os.WEXITSTATUS(status)})")
    return {"error": f"{why}; loading it needs more than the grader's {request['memory_mb']} MB or crashes the "
                     "reader", "cpu_s": cpu_s, **lowered}


def _serve(path: Path) -> int:
    """The verifier's loop: load the plug-in and start once (its reader_start), say ready, then per request (a
    JSON line and the checkpoint's bytes on stdin) fork a limited child, answer one line."""
    plugin = load_module(path.stem, path)
    state = plugin.reader_start()
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    times = os.times()
    stdout.write(json.dumps({"cpu_s": times.user + times.system}).encode() + b"\n")
    stdout.flush()
    while header := stdin.readline():
        request = json.loads(header)
        data = stdin.read(request["size"])
        stdout.write(json.dumps(_fork_child(request, data, plugin, state)).encode() + b"\n")
        stdout.flush()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m autograder.checkpoint [--config PATH] ARGS...`: the command line of the lesson's plug-in (its
    main(ARGS): e.g. train or verify a checkpoint), the lesson of the grading config (default: the package's).
    `--server PLUGIN`: a verifier process (Verifier starts it)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--server"] and len(args) == 2:
        return _serve(Path(args[1]))
    config = None
    if args[:1] == ["--config"] and len(args) >= 2:
        config, args = Path(args[1]), args[2:]
    plugin = load_plugin(default_lesson(config))
    return int(plugin.main(args))


if __name__ == "__main__":
    sys.exit(main())
