"""The grader's side: a pool of warm workers (one zygote each) that runs submissions and retries."""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import logging
import os
import queue
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict
from pathlib import Path
from typing import Any

from autograder import wire
from autograder.model import Status
from autograder.sandbox.fallback import choose_isolation, fallback_plan, refuse_unsandboxed
from autograder.sandbox.isolation import (
    _SANDBOX_SCRATCH,
    _SANDBOX_STAGE,
    _UID_BASE,
    _UIDS_PER_WORKER,
    CGROUP_PREFIX,
    SANDBOX_ENV,
    _bwrap_argv,
    _count_tasks,
    _remove_cgroup,
    _reserve_uid_block,
    _rlimits,
    _shared_writable,
    _stage_modules,
    _vm_size,
    _zygote_host_pid,
    make_cgroups,
    oom_kills,
    place_in_cgroups,
)
from autograder.sandbox.limits import (
    MIB,
    Limits,
    lowered_limits,
)
from autograder.sandbox.notebook import SKIP_TAGS, NotebookError, read_notebook
from autograder.sandbox.protocol import (
    _CTL_BYTES,
    _MAX_TIME_STOPS,
    MAX_PROBE_RUNS,
    MEMORY_GUARDS,
    ExecResult,
    Probe,
    ProbeStops,
    WorkerError,
    _cell_name,
    _cells_job,
    _classify,
    _Conversation,
    _order_probes,
    _time_note,
    _Transcript,
    group_of,
)
from autograder.sandbox.zygote import PRELOAD

log = logging.getLogger(__name__)

_WARNED: set[str] = set()


class WorkerPool:
    """Warm sandboxed zygotes that run submissions in parallel, one at a time per worker."""

    def __init__(self, size: int = 1, *, limits: Limits = Limits(), probe_module: str,
                 modules: Mapping[str, Path] | None = None, skip_tags: Iterable[str] = SKIP_TAGS,
                 hide: Iterable[str | Path] = (),
                 sandbox: str = "auto", preload: Iterable[str] = PRELOAD, start_timeout_s: float = 180.0,
                 memory_guard: str = "auto", allow_unsandboxed: bool | None = None):
        if sandbox == "auto" and os.environ.get(SANDBOX_ENV):
            sandbox = os.environ[SANDBOX_ENV]
        if sandbox not in ("auto", "bwrap", "none"):
            raise ValueError(f"sandbox ({SANDBOX_ENV}) must be 'auto', 'bwrap' or 'none', got {sandbox!r}")
        # allow_unsandboxed: run even where nothing confines student code (default: permit_unsandboxed's answer)
        if memory_guard not in ("auto", *MEMORY_GUARDS):
            raise ValueError(f"memory_guard must be 'auto', 'cgroup' or 'watchdog', got {memory_guard!r}")
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
            iso = choose_isolation(sandbox, scratch=self._tmp)
            refuse_unsandboxed(iso, allowed=allow_unsandboxed)
            self.sandbox, why = iso.sandbox, iso.why
            groups, guard_why = self._make_cgroups(size, memory_guard)
        except BaseException:
            self.close()
            raise
        self.memory_guard = "cgroup" if groups else "watchdog"
        drop = os.geteuid() == 0 if iso.sandbox == "bwrap" else iso.kind == "unprivileged uid"
        if self.sandbox == "none":
            why += ("; student code runs as an unprivileged uid in namespaces of its worker's own" if drop
                    else f"; UNSANDBOXED: student code runs as this process's user, with its privileges: {iso.problem}")
        self.isolation = iso.kind
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
        names = [f"{CGROUP_PREFIX}{os.getpid()}-{self._slots[i]}" for i in range(size)]
        groups, self._cgroups, msg = make_cgroups(names, memory_bytes=self.limits.memory_mb * MIB,
                                                  pids=self.limits.processes + 1, wanted=wanted)
        return groups, msg + "; a watchdog in each worker limits the memory of each submission instead" if msg else ""

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
            return ExecResult(Status.UNREADABLE, notes=[str(exc)], wall_s=time.monotonic() - start,
                              sandbox=self.sandbox, memory_guard=self.memory_guard, isolation=self.isolation)
        try:  # the cells travel as one frame straight to the child; JSON escapes may make it larger
            _cells_job(cells)
        except wire.WireError as exc:
            return ExecResult(Status.UNREADABLE, notes=[f"the notebook's code cells cannot be sent: {exc}"],
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
        """Run the notebook; when a time limit stops it in a cell, run it again in a fresh child without that cell;
        when one stops it among its probes, run the probes not yet answered in a fresh child.

        A cell over the per-cell limit is left out and everything else runs (at most _MAX_TIME_STOPS such
        cells). When a whole-notebook limit stops a cell, or one more cell is too slow, only the cells before
        it run again, then the probes. Each probe has its own limit (probe_s) and each question a share of the
        probes' time (question_s, counted over every run): a probe past either is stopped, earns nothing and does
        not run again, nor do the probes of a question whose share is spent; one stopped by a whole-notebook
        limit runs once more. The answers given so far are kept and the rest go to a fresh child (the same cells
        first, public probes before hidden ones), at most MAX_PROBE_RUNS times.
        """
        limits, source = self.limits, dict(cells)
        stopped: list[int] = []
        cut: tuple[int, str] | None = None  # (cell, limit): only the cells before it run
        facts: list[str] = []
        cpu = 0.0
        hidden = {k for k, _, _ in probes[public:]}
        share = {group_of(k): limits.question_s for k, _, _ in probes}
        stops, left = ProbeStops(limits, probes), probes
        cell_runs = probe_runs = 0
        while True:
            todo = [(i, s) for i, s in cells if i not in stopped and (cut is None or i < cut[0])]
            raw = self._attempt(worker, _cells_job(todo), todo, left, sum(k not in hidden for k, _, _ in left), share)
            if isinstance(raw, ExecResult):
                return raw
            header, _, _, t = raw
            cpu += float(header.get("cpu_s", 0.0))
            facts += [f for f in t.tampering if f not in facts]
            whole = "wall" if header.get("timed_out") else "cpu" if header.get("cpu_exceeded") else ""
            over, limit = t.cell_over, "cell"
            if over is None and t.running is not None and whole:
                over, limit = t.running, whole
            if over is not None and cell_runs <= _MAX_TIME_STOPS:
                cell_runs += 1
                if limit == "cell" and len(stopped) < _MAX_TIME_STOPS:
                    stopped.append(over)
                else:
                    cut = (over, limit)
                continue
            if over is None and (t.probe_over or (t.probe_running and whole)):
                left = stops.after(t, left, share)
                if left and probe_runs < MAX_PROBE_RUNS:
                    probe_runs += 1
                    continue
                stops.give_up(left, cell_runs + probe_runs + 1)
            break
        t.outputs = {**stops.answered, **t.outputs}
        for k, v in t.wall.items():
            stops.wall[k] = stops.wall.get(k, 0.0) + v
        res = _classify(*raw, [p for p in probes if p[0] not in stops.not_run], limits, self.memory_guard)
        said = [_time_note(i, "cell", source[i], limits) for i in stopped]
        if cut is not None:
            said.append(_time_note(cut[0], cut[1], source[cut[0]], limits, cut=True, stops=len(stopped)))
            if res.status == Status.GRADED:
                res.status = Status.TIMED_OUT
        res.tampering = facts + [f for f in res.tampering if f not in facts]
        if res.status == Status.GRADED and res.tampering:
            res.status = Status.TAMPERING
        if over is not None:  # the last run was stopped too: the grader gives up there
            said.append(f"{_cell_name(over, source[over], word='Cell')} was stopped by a time limit in the "
                        f"grader's last run of the notebook ({cell_runs + probe_runs + 1} runs in all): no check "
                        "could run")
        said += stops.said
        res.stopped_cells = stopped + ([cut[0]] if cut else [])
        res.not_run, res.probe_wall = stops.not_run, stops.wall
        res.notes[:0] = said
        res.student_notes = said
        res.cpu_s = cpu
        steps = raw[3].cpu
        own = steps["setup"] + steps["cells"] + sum(steps["probes"].values())
        res.timing = {**steps, "rest": max(0.0, cpu - own)}  # earlier runs of a stopped notebook count as rest
        return res

    def _attempt(self, worker: _Worker, job: bytes, cells: list[tuple[int, str]],
                 probes: list[tuple[str, str, dict[str, Any]]], public: int,
                 share: dict[str, float]) -> tuple[Any, ...] | ExecResult:
        """One run of the cells in a fresh child: what the worker returned, or a crashed result when it failed twice.

        A worker that fails (not the student's doing) is restarted and the run retried once.
        """
        failures: list[str] = []
        kept = dict(share)  # a failed worker's run spends nothing of the questions' shares
        while True:
            share.update(kept)
            if not worker.alive():
                err = worker.restart()
                if err:
                    raise WorkerError(err)
            try:
                return worker.run(job, cells, probes, public, share)
            except (WorkerError, OSError) as exc:
                failures.append(str(exc)[:300])
                log.warning("worker %d failed (%s); restarting it", worker.index, exc)
                worker.kill()
                if len(failures) == 2:
                    return ExecResult(Status.CRASHED, notes=[
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
                       skip_tags: Iterable[str] = SKIP_TAGS, probe_module: str,
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
                  skip_tags: Iterable[str] = SKIP_TAGS, probe_module: str,
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
               # tensor (a long attention bias, a model's tables) is first-touched page by page otherwise
               "THP_MEM_ALLOC_ENABLE": "1",
               # glibc keeps freed blocks under 32 MB for reuse instead of unmapping them (and trimming the heap):
               # a child allocates the same tensors probe after probe, and each fresh mapping is faulted in page by
               # page again (about 17,000 minor faults a notebook, 10,000 with these)
               "MALLOC_MMAP_THRESHOLD_": str(32 * MIB), "MALLOC_TRIM_THRESHOLD_": str(128 * MIB)}
        confine = None
        if self.pool.sandbox == "bwrap":
            prefix, path, exe = _bwrap_argv(self.stage, self.hide, limits, self.cgroups)
            stage, scratch, wipe = _SANDBOX_STAGE, _SANDBOX_SCRATCH, [_SANDBOX_SCRATCH, "/dev/shm", "/dev/mqueue"]
            own_ipc = True
        else:
            prefix, path, exe = [], [p for p in sys.path if p and os.path.isdir(p)], sys.executable
            stage, scratch = str(self.stage), str(self.pool._tmp / f"scratch{self.index}")
            wipe, own_ipc = [scratch], False
            os.makedirs(scratch, mode=0o711, exist_ok=True)
            if self.uid is not None:  # the uid fallback: namespaces of the worker's own (fallback.enter_namespaces)
                confine = fallback_plan(path, stage=stage, rw=[scratch], hide=self.hide)
                stage, path = confine["path"][0], confine["path"][1:]
        env.update(HOME=scratch, TMPDIR=scratch)
        cfg = {"path": [stage, *path], "probe_module": self.pool.probe_module, "preload": list(self.preload),
               "lesson_modules": list(self.pool.lesson_modules),
               "scratch": scratch, "wipe": wipe, "uid": self.uid, "uids": _UIDS_PER_WORKER,
               "limits": asdict(limits), "cgroups": self.cgroups, "own_ipc": own_ipc,
               "sweep": [] if own_ipc or self.uid is None else _shared_writable(),
               "confine": confine}
        code = "import sys; sys.path[:] = __import__('json').loads(sys.argv[1])['path']; " \
               "import autograder.sandbox.zygote as e; e._zygote_main(sys.argv[1])"
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
        if ready.get("unconfined") and ready["unconfined"] not in _WARNED:  # said once: the jobs are not separated
            _WARNED.add(ready["unconfined"])
            log.warning("worker %d: %s", self.index, ready["unconfined"])
        self.zygote_pid = (self.proc.pid if self.pool.sandbox == "none"
                           else _zygote_host_pid(self.proc.pid, ready["pid"]))
        if self.cgroups:
            try:
                place_in_cgroups(self.zygote_pid, self.cgroups, processes=limits.processes)
            except OSError as exc:
                self.kill()
                return f"worker {self.index} did not start: it cannot be placed in its cgroups ({exc})"
        return ""

    def oom_kills(self) -> int:
        """Processes the kernel has killed for memory in this worker's memory cgroup so far (0 without one)."""
        return oom_kills(self.cgroups["memory"]) if self.cgroups.get("memory") else 0

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and self.ctl is not None

    def run(self, job: bytes, cells: list[tuple[int, str]], probes: list[tuple[str, str, dict[str, Any]]],
            public: int, share: dict[str, float]) -> tuple[dict[str, Any], bytes, int, _Transcript]:
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
            talk = _Conversation(self, job_g, out_r, job, cells, probes, public, share)
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
