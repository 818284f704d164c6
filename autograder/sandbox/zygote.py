"""The zygote: imports the lesson once inside the sandbox, then forks and watches one child per job."""

from __future__ import annotations

import collections
import contextlib
import importlib
import importlib.util
import json
import logging
import os
import selectors
import signal
import socket
import tempfile
import time
import traceback
from typing import Any

from autograder import wire
from autograder.sandbox.child import _child, _install_otter_stub, _make_shell
from autograder.sandbox.guard import _GUARDED_MODULES, RUNTIME_MODULES, _Guard
from autograder.sandbox.isolation import (
    _PR_SET_CHILD_SUBREAPER,
    _PR_SET_DUMPABLE,
    _prctl,
    clean_after_job,
    oom_kills,
)
from autograder.sandbox.limits import (
    MIB,
    Limits,
)
from autograder.sandbox.protocol import _CTL_BYTES

log = logging.getLogger(__name__)

PRELOAD = ("numpy", "torch", "torch._dynamo", "IPython.core.interactiveshell", "IPython.core.logger", "bdb")
# torch._dynamo wraps torch.manual_seed when first imported: loaded before the guard records identities, so honest
# code that triggers it (fused attention, torch.compile) is not reported as tampering. IPython imports its logger
# and bdb at the first cell it runs: every child would import them again.
# How often the zygote looks at a running job's memory: the watchdog sums its processes' memory itself; under a
# memory cgroup the kernel enforces the limit and the zygote only looks for an OOM kill below the child (the
# child's own ends the job at once), so it looks less often.
_WATCH_S = {"watchdog": 0.05, "cgroup": 0.25}




_MADV_COLLAPSE = 25  # Linux 6.1+
_HUGE = 1 << 21


def collapse_memory() -> int:
    """Back the zygote's private memory with 2 MB pages where the kernel can (MADV_COLLAPSE); the number of
    regions collapsed. A fork copies, and an exit frees, one page-table entry per resident 4 KB page: with torch
    imported, about 57,000 of them, 10-20 ms per job on the grading machines, against about a hundred for 2 MB
    pages (a child's first write to one still copies 4 KB). A hint only: where the kernel is older or huge pages
    are off, nothing changes."""
    import ctypes

    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
        madvise.argtypes, madvise.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
        with open("/proc/self/maps") as maps:
            regions = [line.split() for line in maps]
    except (OSError, AttributeError):
        return 0
    done = 0
    for fields in regions:
        if len(fields) < 5 or not fields[1].startswith("rw") or fields[1][3] != "p" or fields[4] != "0" or (
                len(fields) > 5 and fields[5] != "[heap]"):
            continue  # private, writable and anonymous (or the heap) only
        start, end = (int(x, 16) for x in fields[0].split("-"))
        lo, hi = (start + _HUGE - 1) & ~(_HUGE - 1), end & ~(_HUGE - 1)
        if hi - lo >= _HUGE and madvise(lo, hi - lo, _MADV_COLLAPSE) == 0:
            done += 1
    return done


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
    unconfined = ""
    try:
        if cfg.get("confine"):  # the uid fallback (root, no bubblewrap): no network, the grader's folders hidden
            from autograder.sandbox.fallback import enter_namespaces

            unconfined = enter_namespaces(cfg["confine"])
            if not unconfined:
                cfg["wipe"].append("/dev/shm")  # its own: emptied after each job, as bubblewrap's
        for name in cfg["preload"]:
            importlib.import_module(name)
        probes = importlib.import_module(cfg["probe_module"])
        for name in cfg["lesson_modules"]:  # the notebook imports them (the trainer): once here, not in every child
            with contextlib.suppress(Exception):  # one that fails to import fails in the child, as before
                importlib.import_module(name)
        _install_otter_stub()
        shell = _make_shell()
        unguarded = getattr(probes, "UNGUARDED", ())
        guard = _Guard([*_GUARDED_MODULES, *RUNTIME_MODULES, cfg["probe_module"]],
                       unguarded=[n for n in unguarded if type(n) is str] if type(unguarded) is tuple else [])
        suspicious = getattr(probes, "SUSPICIOUS", None)
        limits = Limits(**cfg["limits"])
        memory = _MemoryWatch(cfg, limits)
        collapse_memory()
    except BaseException:  # noqa: BLE001 - report any start-up failure to the grader
        ctl.send(wire.encode({"ready": False, "error": traceback.format_exc()[-3000:]}))
        return
    ctl.send(wire.encode({"ready": True, "pid": os.getpid(), "unconfined": unconfined and (
        f"without bubblewrap, the worker has {unconfined}: its jobs may reach the network and read what any user "
        "may (chmod o= the course, the submissions and the grades)")}))
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
        _child(fds, limits, shell, guard, run_probe, suspicious, scratch, uid)
    for fd in fds:  # the child's ends are not ours to keep
        os.close(fd)
    header = _watch(pid, ctl, limits, start, memory)
    clean_after_job(cfg["wipe"], uid, since, own_ipc=cfg["own_ipc"], sweep=cfg.get("sweep") or [])
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
        for key, _ in sel.select(min(left, _WATCH_S[memory.kind])):
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
        self.memory_group = cfg["cgroups"]["memory"] if cfg["cgroups"] else ""
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
        return oom_kills(self.memory_group)

    def _private(self, pid: int) -> int:
        try:
            with open(f"/proc/{pid}/statm") as f:
                fields = f.read().split()
            return (int(fields[1]) - int(fields[2])) * self.page  # resident minus file-backed/shared
        except (OSError, ValueError, IndexError):
            return 0
