"""File jobs: a long-lived reader process, confined as the notebook workers are, reads each upload in a child."""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autograder.sandbox.cputime import BACKSTOP
from autograder.sandbox.fallback import choose_isolation, fallback_plan, refuse_unsandboxed
from autograder.sandbox.frames import WorkerError
from autograder.sandbox.isolation import (
    CGROUP_PREFIX,
    ENGINE_HOME,
    SANDBOX_SCRATCH,
    SANDBOX_STAGE,
    UID_BASE,
    UIDS_PER_WORKER,
    bwrap_argv,
    make_cgroups,
    remove_cgroup,
    reserve_uid_block,
    shared_writable,
)
from autograder.sandbox.limits import CHECKPOINT_MEMORY_MB, MIB, Limits
from autograder.sandbox.zygote import read_line

log = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 120  # for a reader process to start its module (torch and models: about 3 CPU-s, once)
_LOWERED: dict[str, None] = {}  # the reader's limits that an operator's lower hard limits lowered
_ISOLATIONS: dict[str, None] = {}  # the isolation each reader started in this process had
_WARNED: set[str] = set()
_SLOTS = itertools.count()  # readers started by this process: their cgroups' names and uid blocks
_STAGED_COURSE = "course"  # the stage's copy of the lesson's folders, below the engine's


def _threads() -> int:
    """How many files are read side by side: the CPUs this process may run on (taskset, cgroups), at most 4."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(4, cpus or 1))


def _child_env() -> dict[str, str]:
    """The environment of a reader without bubblewrap: the grader's, the engine first on the path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONSTARTUP", "PYTHONINSPECT")}
    env.update(PYTHONPATH=os.pathsep.join(filter(None, (str(ENGINE_HOME), os.environ.get("PYTHONPATH")))),
               PYTHONDONTWRITEBYTECODE="1", MALLOC_ARENA_MAX="2", OMP_NUM_THREADS="1")
    return env


class VerifierError(RuntimeError):
    """The reader process itself failed (not the file): it is restarted and the request retried once."""


def _warn(msg: str) -> None:
    if msg and msg not in _WARNED:
        _WARNED.add(msg)
        log.warning("%s", msg)


@dataclass(frozen=True)
class ReaderFiles:
    """What a checkpoint reader may read while it starts, given by its caller (the sandbox reads no course):
    `folders`, copied into the stage's course folder (their path there -> the folder: the lesson's assignment folder
    and reference/, or nothing beside the plug-in); `plugin`, the plug-in's path there; `shipped`, the paths there
    that students have anyway (they stay once the reader has started; the rest is removed); `hide`, the folders the
    uid fallback shows its children empty (the course)."""

    folders: Mapping[str, Path]
    plugin: str
    shipped: frozenset[str] = frozenset()
    hide: tuple[Path, ...] = ()


def _stage(stage: Path, plugin: Path, files: ReaderFiles) -> tuple[str, list[Path]]:
    """Copy the engine's modules, and the caller's folders (or the plug-in alone) into `stage`, which bubblewrap
    shows read-only: the plug-in's path inside the sandbox, and the staged files to remove once the reader has
    started (all but those shipped to students)."""
    engine = ENGINE_HOME / "autograder"
    for path in engine.rglob("*.py"):
        if "__pycache__" not in path.parts:
            (stage / "autograder" / path.relative_to(engine)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, stage / "autograder" / path.relative_to(engine))
    course = stage / _STAGED_COURSE
    course.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", ".*")
    for inside, folder in files.folders.items():
        shutil.copytree(folder, course / inside, ignore=ignore)
    if not (course / files.plugin).is_file():
        shutil.copyfile(plugin, course / files.plugin)
    for path in [stage, *stage.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    startup_only = [p for p in course.rglob("*") if p.is_file() and p.relative_to(course).as_posix() not in
                    files.shipped]
    for path in startup_only:  # the reader's user alone, while they exist (a killed grader leaves them behind)
        path.chmod(0o600)
    return f"{SANDBOX_STAGE}/{_STAGED_COURSE}/{files.plugin}", startup_only


class Verifier:
    """A pre-started reader: a process that loads the plug-in and runs its reader_start once (imports, models),
    then forks a child per file (cheap: the child shares the started interpreter) that runs reader_evaluate on the
    file's bytes and exits, so a hostile file can only ever cost that child. One request at a time; a pool of them
    serves threads. plugin: the lesson's plug-in file; threads: threads of each child (one: files are read side by
    side); sandbox: "auto", "bwrap" or "none" as WorkerPool's (default: env_name("SANDBOX")); memory_guard: "auto",
    "cgroup" or "watchdog" (here: no cgroup, the rlimits alone).

    A reader module (a lesson's checkpoint plug-in, autograder/checkpoint.py) defines reader_start() -> state, run
    once when its process starts (imports, models, the grader's data), and reader_evaluate(request, data, state) ->
    plain JSON data, run in a fresh child per file on the file's bytes. The process is started once per Verifier and
    confined as the notebook workers are (sandbox/isolation.py), chosen the same way:

    - bubblewrap where it works (env_name("SANDBOX") none forces the fallback): the process runs inside the notebook
      workers' sandbox (the same bwrap_argv: no network, the system read-only, the repository, /tmp, /root, /home
      and every other top-level folder empty). It sees a staged copy of the engine, of the lesson's assignment folder
      and of its reference/ folder while reader_start runs; then every staged file of the lesson that is not shipped
      to students (the plug-in, reference/, the question files) is removed before the first file is read, so a child
      finds on disk only what a student has anyway;
    - otherwise, as root, the process runs unconfined and each child drops to an unprivileged uid of a block of its
      own (it reads only what any user may: `chmod o=` the course, as for notebooks; what it leaves in the folders
      anyone may write to is removed after it);
    - otherwise only the limits ("none": said once in the log, as for notebooks).

    Each child joins a memory and a pids cgroup of its reader where cgroups are writable (its memory: the request's
    memory_mb plus the reader's resident size, which its copy-on-write pages may duplicate), gets an IPC namespace of
    its own (as root without bubblewrap), a fresh scratch folder as cwd, HOME and TMPDIR, the rlimits of a notebook
    child (address space: the reader's size plus memory_mb; CPU: the timeout; files, processes, cores) and a wall
    clock; after it, its process tree, its scratch folder and its IPC objects are removed. Verifier.isolation says
    which isolation held: "bubblewrap", "unprivileged uid" or "none".
    """

    def __init__(self, *, plugin: Path, files: ReaderFiles, threads: int = 1, startup_s: float = STARTUP_TIMEOUT_S,
                 sandbox: str = "auto", memory_guard: str = "auto") -> None:
        self.plugin, self.threads, self.startup_s = Path(plugin).resolve(), threads, startup_s
        self.files = files
        self.wanted, self.memory_guard = sandbox, memory_guard
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup: dict[str, float] = {}  # seconds (wall) and cpu_s of the last start
        self.exit_cpu_s: float | None = None  # CPU seconds of the last process and its children, said as it exited
        self.sandbox = self.isolation = ""  # chosen at each start
        self._tmp: Path | None = None
        self._cgroups: list[str] = []
        self._uid_lock: int | None = None

    def start(self) -> Verifier:
        """Start the process (about 3 CPU-s) unless it runs; VerifierError when it cannot."""
        if self.alive():
            return self
        self.close()
        started = time.perf_counter()
        try:
            argv, env, cwd, startup_only = self._prepare()
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=cwd, env=env,
                                         start_new_session=True)  # its own group: close() stops its child too
        except (OSError, WorkerError) as err:
            self.close()
            raise VerifierError(f"the grader could not start its checkpoint reader ({err})") from err
        ready = read_line(self.proc.stdout.fileno(), time.monotonic() + self.startup_s)  # type: ignore[union-attr]
        if ready is None:
            self.close(wait_s=0)
            raise VerifierError(f"the grader's checkpoint reader did not start within {self.startup_s:g} s")
        for path in startup_only:  # what only reader_start needed: gone before any file is read
            path.unlink()
        self.startup = {"seconds": time.perf_counter() - started, **json.loads(ready)}
        unconfined = self.startup.pop("unconfined", "")
        _warn(unconfined and f"without bubblewrap, the checkpoint reader has {unconfined}: its children may reach "
              "the network and read what any user may")
        _ISOLATIONS[self.isolation] = None
        return self

    def _prepare(self) -> tuple[list[str], dict[str, str], str, list[Path]]:
        """Choose the isolation (as WorkerPool does), make the cgroups, reserve a uid block and stage the files:
        the reader's command line, environment, working folder and the staged files only its start may read."""
        self._tmp = Path(tempfile.mkdtemp(prefix="grader-files-"))
        self._tmp.chmod(0o755)
        iso = choose_isolation(self.wanted, scratch=self._tmp)
        refuse_unsandboxed(iso)  # unless this process was allowed to (permit_unsandboxed)
        self.sandbox, why = iso.sandbox, iso.why
        slot = next(_SLOTS)
        groups, self._cgroups, guard_why = make_cgroups([f"{CGROUP_PREFIX}{os.getpid()}-f{slot}"],
                                                        memory_bytes=CHECKPOINT_MEMORY_MB * MIB,
                                                        pids=Limits().max_processes + 1, wanted=self.memory_guard)
        drop = os.geteuid() == 0 if iso.sandbox == "bwrap" else iso.kind == "unprivileged uid"
        scratch = self._tmp / "scratch"
        if self.sandbox == "none":
            why += ("; the checkpoint reader's children run as an unprivileged uid in namespaces of its own" if drop
                    else f"; UNSANDBOXED: the checkpoint reader runs as this process's user: {iso.problem}")
        self.isolation = iso.kind
        _warn(why)
        _warn(guard_why and guard_why + "; the checkpoint reader's rlimits alone limit its memory")
        uid = None
        if drop:
            block, self._uid_lock = reserve_uid_block((os.getpid() % 2000) * 64 + 32 + slot % 32)
            uid = UID_BASE + block * UIDS_PER_WORKER
        cfg: dict[str, Any] = {"uid": uid, "uids": UIDS_PER_WORKER, "cgroups": groups[0] if groups else {}}
        code = ("import sys, json; sys.path[:] = json.loads(sys.argv[1])['path']; "
                "from autograder.sandbox.zygote import serve_files; serve_files(sys.argv[1])")
        if self.sandbox == "bwrap":
            stage = self._tmp / "stage"
            plugin, startup_only = _stage(stage, self.plugin, self.files)
            prefix, path, exe = bwrap_argv(stage, (), Limits(), cfg["cgroups"])
            cfg.update(path=[SANDBOX_STAGE, *path], plugin=plugin, scratch=SANDBOX_SCRATCH, own_ipc=True,
                       wipe=[SANDBOX_SCRATCH, "/dev/shm", "/dev/mqueue"], sweep=[])
            env = {"PATH": f"{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
                   "PYTHONDONTWRITEBYTECODE": "1", "MALLOC_ARENA_MAX": "2", "OMP_NUM_THREADS": "1",
                   "HOME": SANDBOX_SCRATCH, "TMPDIR": SANDBOX_SCRATCH}
            return [*prefix, exe, "-I", "-c", code, json.dumps(cfg)], env, "/", startup_only
        os.makedirs(scratch, mode=0o711)
        path, plugin, startup_only, confine = [str(ENGINE_HOME), *(p for p in sys.path if p and os.path.isdir(p))], \
            str(self.plugin), [], None
        if uid is not None:  # as under bubblewrap: the staged files, then namespaces that hide the rest
            plugin, startup_only = _stage(self._tmp / "stage", self.plugin, self.files)
            plugin = str(self._tmp / "stage") + plugin.removeprefix(SANDBOX_STAGE)
            confine = fallback_plan(path, stage=str(self._tmp / "stage"), rw=[str(scratch)],
                                    hide=self.files.hide)
            path = confine["path"]
        cfg.update(path=path, plugin=plugin, scratch=str(scratch), own_ipc=False, wipe=[str(scratch)],
                   sweep=shared_writable() if uid is not None else [], confine=confine)
        return [sys.executable, "-c", code, json.dumps(cfg)], _child_env(), "/" if confine else str(ENGINE_HOME), \
            startup_only

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def request(self, data: bytes, request: dict[str, Any], *, timeout_s: float) -> dict[str, Any]:
        """Evaluate one file in a fresh limited child; its answer, or {"error": ...} about the file."""
        proc = self.start().proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        header = json.dumps({**request, "timeout_s": timeout_s, "threads": self.threads,
                             "size": len(data)}).encode() + b"\n"
        try:
            proc.stdin.write(header + data)
            proc.stdin.flush()
        except OSError as err:
            self.close(wait_s=0)
            raise VerifierError(f"the checkpoint reader stopped ({err})") from err
        # the reader stops its child at timeout_s of CPU or at its wall-clock backstop (cputime); this is the grader's
        # last resort, should the reader itself hang
        line = read_line(proc.stdout.fileno(), time.monotonic() + 4 * BACKSTOP * timeout_s + 60)
        if line is None:
            self.close(wait_s=0)
            raise VerifierError("the checkpoint reader stopped answering")
        return json.loads(line)

    def close(self, *, wait_s: float = 5.0) -> None:
        """Stop the process (a later request starts it again): its stdin closes and it exits, within wait_s or
        killed (its child by its parent-death signal; inside bubblewrap, with the sandbox's pid namespace). As it
        exits it says its CPU seconds and its children's (exit_cpu_s: bubblewrap does not wait for it, so they do
        not count as this process's children's)."""
        proc, self.proc = self.proc, None
        if proc is not None:
            if proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
            last = read_line(proc.stdout.fileno(), time.monotonic() + wait_s) if proc.stdout and wait_s > 0 else None
            self.exit_cpu_s = json.loads(last).get("exit_cpu_s") if last else None
            if proc.stdout is not None:
                proc.stdout.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                if wait_s > 0:
                    proc.wait(timeout=wait_s)
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for path in reversed(self._cgroups):
            remove_cgroup(path)
        self._cgroups = []
        if self._uid_lock is not None:
            os.close(self._uid_lock)
            self._uid_lock = None
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def __enter__(self) -> Verifier:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class _Pool:
    """Up to `slots` verifiers, started when first needed and kept for the process (grade_batch, the tests)."""

    def __init__(self, slots: int, *, make: Callable[[], Verifier]) -> None:
        self.make = make
        self.slots = threading.BoundedSemaphore(slots)
        self.idle: list[Verifier] = []
        self.warming: Future[Verifier] | None = None  # a verifier starting ahead of the first request (warm)
        self.guard = threading.Lock()
        self.owner = os.getpid()  # a forked copy of this process must not stop the owner's verifiers

    def warm(self) -> None:
        """Start one verifier now, in a thread of its own, unless one is idle or starting: a grader that knows a
        file will come starts its reader beside its other work (seconds), and the first request takes it, started
        or still starting. A failed start is met again, and reported, by that request."""
        with self.guard:
            if self.idle or self.warming is not None:
                return
            self.warming = warming = Future()

        def start() -> None:
            verifier = self.make()
            with contextlib.suppress(VerifierError):
                verifier.start()
            warming.set_result(verifier)

        threading.Thread(target=start, name="reader-warm", daemon=True).start()

    def request(self, data: bytes, request: dict[str, Any], *, timeout_s: float) -> dict[str, Any]:
        with self.slots:
            with self.guard:
                warming = self.warming if not self.idle else None
                if warming is not None:
                    self.warming = None
                verifier = self.idle.pop() if self.idle else None if warming is not None else self.make()
            if verifier is None:
                assert warming is not None
                verifier = warming.result()
            try:
                for attempt in (1, 2):  # a reader that dies for reasons of its own is started again, once
                    try:
                        return verifier.request(data, request, timeout_s=timeout_s)
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
            warming, self.warming = self.warming, None
        if warming is not None:  # closed once started: a start is never left running
            warming.add_done_callback(lambda started: started.result().close())
        for verifier in idle:
            verifier.close()


VERIFY_SLOTS = _threads()  # files read side by side (grade_batch verifies checkpoints ahead in as many threads)
_POOLS: dict[Path, _Pool] = {}
_POOLS_GUARD = threading.Lock()


def reader_pool(plugin: Path, *, make: Callable[..., Verifier]) -> _Pool:
    """The process's pool of verifiers of one plug-in file (started when first needed, stopped at exit); make:
    a Verifier of the plug-in (make(plugin=...): the caller's, which gives it the files it stages)."""
    plugin = Path(plugin).resolve()
    with _POOLS_GUARD:
        if plugin not in _POOLS:
            _POOLS[plugin] = _Pool(VERIFY_SLOTS, make=lambda: make(plugin=plugin))
            atexit.register(_POOLS[plugin].close)
        return _POOLS[plugin]


def run_child(data: bytes, request: dict[str, Any], *, memory_mb: int, timeout_s: float,
              readers: _Pool | None = None, verifier: Verifier | None = None) -> dict[str, Any]:
    """Read and evaluate a file's bytes in a limited child of a verifier (`verifier`, else one of `readers`, a
    pool); any failure comes back as {"error": ...}. The limits the operator's hard limits lowered are noted for
    reader_limits_lowered."""
    request = {**request, "memory_mb": memory_mb}
    if verifier is None:
        assert readers is not None, "run_child needs a verifier or a pool of them"
        found = readers.request(data, request, timeout_s=timeout_s)
    else:
        try:
            found = verifier.request(data, request, timeout_s=timeout_s)
        except VerifierError as err:
            found = {"error": str(err), "infrastructure": True}
    _LOWERED.update(dict.fromkeys(str(n) for n in found.get("limits_lowered", [])))
    return found


def reader_limits_lowered() -> list[str]:
    """Which limits of the reader this process's hard limits lowered (an operator's ulimit), and to what, for
    every file read so far; [] when none."""
    return list(_LOWERED)


def reader_isolation() -> str:
    """The weakest isolation of the readers this process started: "bubblewrap", "unprivileged uid" or "none";
    "" when none started."""
    return next((i for i in ("none", "unprivileged uid", "bubblewrap") if i in _ISOLATIONS), "")
