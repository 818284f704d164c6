"""The grader's side: a pool of warm workers (one zygote each) that runs submissions and retries."""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import queue
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from autograder import wire
from autograder.model import Status
from autograder.sandbox.cputime import BACKSTOP, make_cpu_group
from autograder.sandbox.fallback import choose_isolation, refuse_unsandboxed
from autograder.sandbox.frames import MEMORY_GUARDS, WorkerError
from autograder.sandbox.isolation import (
    CGROUP_PREFIX,
    SANDBOX_ENV,
    UID_BASE,
    UIDS_PER_WORKER,
    count_tasks,
    make_cgroups,
    remove_cgroup,
    reserve_uid_block,
    rlimits,
    stage_modules,
    vm_size,
)
from autograder.sandbox.limits import MIB, Limits, lowered_limits
from autograder.sandbox.notebook import SKIP_TAGS, NotebookError, read_notebook
from autograder.sandbox.results import (
    MAX_PROBE_RUNS,
    MAX_TIME_STOPS,
    ExecResult,
    Probe,
    ProbeStops,
    add_trips,
    cell_name,
    cells_job,
    classify,
    group_of,
    order_probes,
    time_note,
)
from autograder.sandbox.worker import Worker, warn_once
from autograder.sandbox.zygote import PRELOAD

log = logging.getLogger(__name__)


class WorkerPool:
    """Warm sandboxed zygotes that run submissions in parallel, one at a time per worker."""

    def __init__(self, size: int = 1, *, probe_module: str, limits: Limits = Limits(),
                 modules: Mapping[str, Path] | None = None, skip_tags: Iterable[str] = SKIP_TAGS,
                 hide: Iterable[str | Path] = (),
                 sandbox: str = "auto", preload: Iterable[str] = PRELOAD, start_timeout_s: float = 180.0,
                 memory_guard: str = "auto", allow_unsandboxed: bool | None = None, tripwire: bool = True):
        """probe_module: the lesson's checks module (its name) that answers the probes; modules: the modules shipped
        with it (top-level name -> file: the lesson's sandbox_modules, the checks runtime among them), staged for the
        sandbox (the probe module too unless it is found on sys.path); hide: folders the sandbox shows empty (the
        course); the sandbox reads no configuration: the caller gives what it runs. tripwire: the child's audit hook
        (tripwire.py), on unless a test of the layers beneath it (isolation, the guard) turns it off."""
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
            stage_modules(stage, probe_module, modules or {})
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
            warn_once(msg)
        workers = []
        self._uid_locks: list[int] = []
        cpu_groups = [make_cpu_group(f"{CGROUP_PREFIX}{os.getpid()}-{slot}") for slot in self._slots]
        self._cgroups += [g for g in cpu_groups if g]  # removed at close with the others
        for i in range(size):
            uid = None
            if drop:
                try:
                    block, fd = reserve_uid_block((os.getpid() % 2000) * 64 + self._slots[i])
                except BaseException:
                    self.close()
                    raise
                self._uid_locks.append(fd)
                uid = UID_BASE + block * UIDS_PER_WORKER
            workers.append(Worker(i, limits=limits, sandbox=self.sandbox, probe_module=probe_module,
                                  lesson_modules=self.lesson_modules, tmp=self._tmp, stage=stage, uid=uid,
                                  hide=tuple(hide), preload=tuple(preload), start_timeout_s=start_timeout_s,
                                  cgroups=groups[i] if groups else {}, cpu_group=cpu_groups[i],
                                  tripwire=tripwire))
        self._workers = workers
        self.drops_privileges = workers[0].uid is not None
        self._idle: queue.Queue[Worker] = queue.Queue()
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
        self.cpu_clock = "cgroup" if all(w.clock_group for w in workers) else "proc"  # where jobs' CPU time is read
        # An operator's lower hard limits (ulimit) hold for every child instead of the configured ones: said here,
        # in the log, and in each result's notes.
        base = 1 if self.drops_privileges else count_tasks(os.getuid())
        vm = vm_size(workers[0].zygote_pid or "self")
        self.limits_lowered = lowered_limits([(rlim, hard) for rlim, _, hard in rlimits(limits, vm=vm, base=base)],
                                             who="the sandbox", size=vm)
        for msg in self.limits_lowered:
            warn_once(msg)

    def _make_cgroups(self, size: int, wanted: str) -> tuple[list[dict[str, str]], str]:
        """One memory and one pids cgroup (v1) per worker, or none and why (then the watchdog holds)."""
        names = [f"{CGROUP_PREFIX}{os.getpid()}-{self._slots[i]}" for i in range(size)]
        groups, self._cgroups, msg = make_cgroups(names, memory_bytes=self.limits.memory_mb * MIB,
                                                  pids=self.limits.max_processes + 1, wanted=wanted)
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
        ordered, public = order_probes(probes)
        try:
            cells, skipped = read_notebook(source, skip_tags=self.skip_tags)
        except NotebookError as exc:
            return ExecResult(Status.UNREADABLE, notes=[str(exc)], wall_s=time.monotonic() - start,
                              sandbox=self.sandbox, memory_guard=self.memory_guard, isolation=self.isolation)
        try:  # the cells travel as one frame straight to the child; JSON escapes may make it larger
            cells_job(cells)
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

    def _run_timed(self, worker: Worker, cells: list[tuple[int, str]],
                   probes: list[tuple[str, str, dict[str, Any]]], public: int) -> ExecResult:
        """Run the notebook; when a time limit stops it in a cell, run it again in a fresh child without that cell;
        when one stops it among its probes, run the probes not yet answered in a fresh child.

        A cell over the per-cell limit is left out and everything else runs (at most MAX_TIME_STOPS such
        cells). When a whole-notebook limit stops a cell, or one more cell is too slow, only the cells before
        it run again, then the probes. Each probe has its own limit (probe_timeout_s) and each question a share of
        the probes' time (question_timeout_s, counted over every run): a probe past either is stopped, earns nothing
        and does not run again, nor do the probes of a question whose share is spent; one stopped by a whole-notebook
        limit runs once more. The answers given so far are kept and the rest go to a fresh child (the same cells
        first, public probes before hidden ones), at most MAX_PROBE_RUNS times.
        """
        limits, source = self.limits, dict(cells)
        stopped: list[int] = []
        cut: tuple[int, str] | None = None  # (cell, limit): only the cells before it run
        facts: list[str] = []
        trips: list[dict[str, Any]] = []  # the tripwire's records of every run
        cpu = 0.0
        hidden = {k for k, _, _ in probes[public:]}
        # each question's share of the probes' time in CPU seconds, and its wall-clock backstop (wall less waits for
        # a CPU), both spent over every run (cputime: the grader reads the CPU time itself)
        share = {group_of(k): limits.question_timeout_s for k, _, _ in probes}
        backstop = {group_of(k): BACKSTOP * limits.question_timeout_s for k, _, _ in probes}
        stops, left = ProbeStops(limits, probes), probes
        cell_runs = probe_runs = 0
        by: dict[int, str] = {}  # a stopped cell -> what stopped it ("cpu", "wall")
        stalls: list[str] = []
        while True:
            todo = [(i, s) for i, s in cells if i not in stopped and (cut is None or i < cut[0])]
            raw = self._attempt(worker, cells_job(todo), todo, left, sum(k not in hidden for k, _, _ in left), share,
                                backstop)
            if isinstance(raw, ExecResult):
                return raw
            header, _, _, t = raw
            cpu += float(header.get("cpu_s", 0.0))
            facts += [f for f in t.tampering if f not in facts]
            add_trips(trips, t.tripwire)
            stalls += [s for s in t.stalls if s not in stalls]
            whole = t.whole or ("wall" if header.get("timed_out") else "cpu" if header.get("cpu_exceeded") else "")
            if t.whole:  # the grader's own reading stopped the notebook: said as the zygote's would be
                header["timed_out" if whole == "wall" else "cpu_exceeded"] = True
            over, limit = t.cell_over, "cell"
            if over is not None:
                by[over] = t.stopped_by.get(f"cell {over}", "cpu")
            if over is None and t.running is not None and whole:
                over, limit = t.running, whole
            if over is not None and cell_runs <= MAX_TIME_STOPS:
                cell_runs += 1
                if limit == "cell" and len(stopped) < MAX_TIME_STOPS:
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
        stops.take_times(t)
        res = classify(*raw, [p for p in probes if p[0] not in stops.not_run], limits, self.memory_guard)
        said = [time_note(i, "cell", source[i], limits, by=by.get(i, "cpu")) for i in stopped]
        if cut is not None:
            said.append(time_note(cut[0], cut[1], source[cut[0]], limits, cut=True, stops=len(stopped),
                                  by=by.get(cut[0], "cpu")))
            if res.status == Status.GRADED:
                res.status = Status.TIMED_OUT
        res.tampering = facts + [f for f in res.tampering if f not in facts]
        res.tripwire = trips
        if res.status == Status.GRADED and res.tampering:
            res.status = Status.TAMPERING
        if over is not None:  # the last run was stopped too: the grader gives up there
            said.append(f"{cell_name(over, source[over], word='Cell')} was stopped by a time limit in the "
                        f"grader's last run of the notebook ({cell_runs + probe_runs + 1} runs in all): no check "
                        "could run")
        said += stops.said
        res.stopped_cells = stopped + ([cut[0]] if cut else [])
        res.not_run, res.probe_wall, res.probe_cpu = stops.not_run, stops.wall, stops.cpu
        res.notes[:0] = said
        res.notes += stalls  # the machine slowed a step, whose CPU time was under its limit: nothing charged
        res.student_notes = said
        res.cpu_s = cpu
        steps = raw[3].cpu
        own = steps["setup"] + steps["cells"] + sum(steps["probes"].values())
        res.timing = {**steps, "rest": max(0.0, cpu - own)}  # earlier runs of a stopped notebook count as rest
        return res

    def _attempt(self, worker: Worker, job: bytes, cells: list[tuple[int, str]],
                 probes: list[tuple[str, str, dict[str, Any]]], public: int,
                 share: dict[str, float], backstop: dict[str, float]) -> tuple[Any, ...] | ExecResult:
        """One run of the cells in a fresh child: what the worker returned, or a crashed result when it failed twice.

        A worker that fails (not the student's doing) is restarted and the run retried once.
        """
        failures: list[str] = []
        kept = dict(share), dict(backstop)  # a failed worker's run spends nothing of the questions' shares
        while True:
            share.update(kept[0])
            backstop.update(kept[1])
            if not worker.alive():
                err = worker.restart()
                if err:
                    raise WorkerError(err)
            try:
                return worker.run(job, cells, probes, public, share, backstop)
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
            remove_cgroup(path)
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


def execute_submission(source: bytes, *, probes: list[Probe], probe_module: str, limits: Limits = Limits(),
                       skip_tags: Iterable[str] = SKIP_TAGS,
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


def execute_batch(items: Iterable[tuple[str, bytes]], *, probes: list[Probe], probe_module: str,
                  limits: Limits = Limits(), skip_tags: Iterable[str] = SKIP_TAGS,
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
