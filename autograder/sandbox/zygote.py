"""The fork server: a confined process that imports once (the lesson for notebook jobs, a plug-in for file jobs),
then forks, watches and reaps one confined child per job (serve_notebooks, serve_files)."""

from __future__ import annotations

import collections
import contextlib
import importlib
import importlib.util
import itertools
import json
import logging
import os
import select
import selectors
import signal
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

from autograder import wire
from autograder.sandbox.child import child_main, install_otter_stub, make_shell
from autograder.sandbox.cputime import BACKSTOP, Budget, JobClock, job_cpus
from autograder.sandbox.frames import CTL_BYTES
from autograder.sandbox.guard import GUARDED_MODULES, TamperGuard, guarded_runtime
from autograder.sandbox.isolation import (
    PR_SET_CHILD_SUBREAPER,
    PR_SET_DUMPABLE,
    clean_after_job,
    confine_job,
    count_tasks,
    oom_kills,
    prctl,
    rlimits,
    set_memory_limit,
    vm_size,
    write_file,
)
from autograder.sandbox.limits import MIB, Limits, lowered_limits

log = logging.getLogger(__name__)

PRELOAD = ("numpy", "torch", "IPython.core.interactiveshell", "IPython.core.logger", "bdb")
# IPython imports its logger and bdb at the first cell it runs: every child would import them again. torch._dynamo
# is not loaded (0.8 s of every worker's start): what its import changes in what the guard records is done ahead,
# by settle_torch.
# How often the zygote looks at a running job's memory: the watchdog sums its processes' memory itself; under a
# memory cgroup the kernel enforces the limit and the zygote only looks for an OOM kill below the child (the
# child's own ends the job at once), so it looks less often.
_WATCH_S = {"watchdog": 0.05, "cgroup": 0.25}




# A worker's memory is collapsed once it has run this many jobs (a class, not one upload): the collapse takes about
# 0.6 s and saves 10-20 ms a job, so one upload would wait for it and gain nothing.
COLLAPSE_AFTER = 2
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


def settle_torch() -> None:
    """Wrap torch.manual_seed as importing torch._dynamo does when it is first imported (and only when it is not
    wrapped yet, as there): the guard then records the wrapped function, so honest code that imports torch._dynamo
    in a child (torch.compile) is not reported as replacing it; the import itself is left to the child that needs
    it."""
    torch = sys.modules.get("torch")
    disable = getattr(torch, "_disable_dynamo", None)
    if torch is None or disable is None or torch.manual_seed is not torch.random.manual_seed:
        return
    import torch.jit._builtins  # as torch._dynamo does, with torch loaded

    torch.manual_seed = disable(torch.manual_seed)
    torch.jit._builtins._register_builtin(torch.manual_seed, "aten::manual_seed")


def become_server() -> None:
    """A fork server's first step: not dumpable (a child of the same uid cannot open its memory or fds through
    /proc) and the subreaper of everything its children start (orphans come back to it, to be killed)."""
    prctl(PR_SET_DUMPABLE, 0)
    prctl(PR_SET_CHILD_SUBREAPER, 1)


def confine_server(cfg: dict[str, Any]) -> str:
    """In the uid fallback (cfg["confine"], fallback.fallback_plan): enter the worker's namespaces (no network, the
    grader's folders hidden, a /dev/shm of its own, then emptied after each job as bubblewrap's); '' when done or
    not asked, else why not."""
    if not cfg.get("confine"):
        return ""
    from autograder.sandbox.fallback import enter_namespaces

    unconfined = enter_namespaces(cfg["confine"])
    if not unconfined:
        cfg["wipe"].append("/dev/shm")
    return unconfined


def open_job(cfg: dict[str, Any], n: int) -> tuple[int | None, float, str]:
    """Before job n's fork: its uid (the next of the server's block; None without a uid drop), when it began (for
    the IPC objects it makes) and a fresh scratch folder it owns, whose name does not count the jobs."""
    uid = None if cfg["uid"] is None else cfg["uid"] + n % cfg["uids"]
    since = time.time()
    scratch = tempfile.mkdtemp(prefix="job-", dir=cfg["scratch"])
    if uid is not None:
        os.chown(scratch, uid, uid)
    return uid, since, scratch


def serve_notebooks(config_text: str) -> None:
    """The notebook workers' fork server (the zygote), inside the sandbox: import everything once, then fork and
    watch one child per job (its configuration: JSON from worker.Worker.start).

    The zygote only ever sees the child's fds and small control messages, never a job's cells or
    results, so nothing of one submission is in the memory the next child is forked from.
    """
    cfg = json.loads(config_text)
    ctl = socket.socket(fileno=os.dup(0))
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    become_server()
    unconfined = ""
    try:
        unconfined = confine_server(cfg)  # the uid fallback (root, no bubblewrap): no network, folders hidden
        for name in cfg["preload"]:
            importlib.import_module(name)
        settle_torch()
        probes = importlib.import_module(cfg["probe_module"])
        for name in cfg["lesson_modules"]:  # the notebook imports them (the trainer): once here, not in every child
            with contextlib.suppress(Exception):  # one that fails to import fails in the child, as before
                importlib.import_module(name)
        install_otter_stub()
        shell = make_shell()
        unguarded = getattr(probes, "UNGUARDED", ())
        guard = TamperGuard([*GUARDED_MODULES, *guarded_runtime(), cfg["probe_module"]],
                       unguarded=[n for n in unguarded if type(n) is str] if type(unguarded) is tuple else [])
        suspicious = getattr(probes, "SUSPICIOUS", None)
        limits = Limits(**cfg["limits"])
        memory = MemoryWatch(cfg, limits)
    except BaseException:  # noqa: BLE001 - report any start-up failure to the grader
        ctl.send(wire.encode({"ready": False, "error": traceback.format_exc()[-3000:]}))
        return
    ctl.send(wire.encode({"ready": True, "pid": os.getpid(), "unconfined": unconfined and (
        f"without bubblewrap, the worker has {unconfined}: its jobs may reach the network and read what any user "
        "may (chmod o= the course, the submissions and the grades)")}))
    jobs = 0
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(ctl, CTL_BYTES, 4)
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
        if jobs == COLLAPSE_AFTER:
            collapse_memory()
    os._exit(0)  # skip interpreter teardown (seconds with torch loaded)


def _run_job(fds: list[int], shell: Any, guard: TamperGuard, run_probe: Any, suspicious: list[str] | None,
             cfg: dict[str, Any], limits: Limits, n: int, ctl: socket.socket,
             memory: MemoryWatch) -> dict[str, Any]:
    try:
        uid, since, scratch = open_job(cfg, n)
        memory.begin()
        start = time.monotonic()
        pid = os.fork()
    except OSError as exc:
        for fd in fds:
            os.close(fd)
        return {"error": f"cannot start the job: {exc}"}
    if pid == 0:
        child_main(fds, limits, shell, guard, run_probe, suspicious, scratch, uid, tripwire=cfg.get("tripwire", True))
    for fd in fds:  # the child's ends are not ours to keep
        os.close(fd)
    header = _watch(pid, ctl, limits, start, memory)
    clean_after_job(cfg["wipe"], uid, since, own_ipc=cfg["own_ipc"], sweep=cfg.get("sweep") or [])
    return header


def _watch(pid: int, ctl: socket.socket, limits: Limits, start: float, memory: MemoryWatch) -> dict[str, Any]:
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
    # the grader stops a job at its CPU limit or its wall-clock backstop (cputime), reading its CPU time itself; this
    # is the zygote's own last resort, should the grader not act
    deadline = start + 4 * BACKSTOP * limits.wall_timeout_s
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
                    msg = ctl.recv(CTL_BYTES)
                except OSError:
                    msg = b""
                if not msg:
                    kill_tree(pid)
                    kill_descendants()
                    os._exit(0)
                killed = True
        if status is None and not killed and memory.over():
            over = memory.kind
            break
    if status is None:
        kill_tree(pid)
        _, status, rusage = os.wait4(pid, 0)
    kill_descendants()
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
                                                       and cpu >= limits.cpu_timeout_s - 0.5),
            "wall_s": time.monotonic() - start}


def kill_tree(pid: int) -> None:
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


def kill_descendants() -> None:
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


class MemoryWatch:
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


# ------------------------------------------------------------------------------------------------ file jobs


def _file_job(request: dict[str, Any], data: bytes, plugin: ModuleType, state: Any, cfg: dict[str, Any],
                n: int) -> dict[str, Any]:
    """In the reader: evaluate one file in a forked child confined as a notebook child (cgroups, own IPC, uid,
    rlimits: memory_mb beyond the reader's size, timeout_s of CPU; a scratch folder), timeout_s of wall-clock
    time; the child's answer with its CPU seconds, or an error. Its tree, scratch and IPC objects go after it."""
    uid, since, scratch = open_job(cfg, n)  # a fresh uid per file
    limits = Limits(memory_mb=int(request["memory_mb"]), cpu_timeout_s=int(request["timeout_s"]) + 1,
                    threads=int(request.get("threads", 1)))
    size = vm_size()  # the child's size as it starts: a fork of this process
    base = 1 if uid is not None else count_tasks(os.getuid())
    # what an operator's lower hard limits (ulimit) lower, said with the answer
    lowered = {"limits_lowered": lowered_limits([(rlim, hard) for rlim, _, hard in rlimits(limits, vm=size,
                                                                                              base=base)],
                                                who="the checkpoint reader", size=size)}
    if cfg["cgroups"]:  # the child's tree: its own allocations and the pages of this process it copies on write
        with contextlib.suppress(OSError), open("/proc/self/statm") as f:
            limit = limits.memory_mb * MIB + int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            if abs(limit - cfg.get("memory_limit", 0)) > 16 * MIB:  # set again when it moves
                set_memory_limit(cfg["cgroups"]["memory"], limit)
                cfg["memory_limit"] = limit
    read_end, write_end = os.pipe()
    parent = os.getpid()
    clock = JobClock(parent)  # the child's CPU time, read here from /proc (never what the child says)
    clock.begin()
    pid = os.fork()
    if pid == 0:  # the child: nothing of the reader's protocol, confined, one answer, then exit
        code = 0
        try:
            os.close(read_end)
            os.setsid()
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            for folder in cfg["cgroups"].values():  # join the reader's cgroups while still allowed to
                write_file(os.path.join(folder, "cgroup.procs"), str(os.getpid()))
            confine_job(scratch, limits, uid)  # never above the reader's own hard limits; the uid last
            if os.getppid() != parent:
                os._exit(1)
            answer = json.dumps(plugin.reader_evaluate(request, data, state)).encode() + b"\n"
            view = memoryview(answer)
            while view:
                view = view[os.write(write_end, view):]
        except BaseException:  # noqa: BLE001 - the reader reports how the child ended
            code = 1
        finally:
            os._exit(code)
    os.close(write_end)
    timeout_s = float(request["timeout_s"])
    try:
        line, over = _read_answer(read_end, clock, Budget(timeout_s, timeout_s, began=time.monotonic()))
    finally:
        os.close(read_end)
    timed_out = bool(over)
    if line is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    _, status, usage = os.wait4(pid, 0)
    kill_tree(pid)  # what the child started: its session, then orphans (this process is their subreaper)
    kill_descendants()
    clean_after_job(cfg["wipe"], uid, since, own_ipc=cfg["own_ipc"], sweep=cfg["sweep"])
    cpu_s = usage.ru_utime + usage.ru_stime
    if line is not None and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        return {**json.loads(line), "cpu_s": cpu_s, **lowered}
    if timed_out:
        how = (" of CPU time" if over == "cpu" else f": it waited {BACKSTOP * timeout_s:g} s on the wall clock, three "
               "times the limit (limits are counted in CPU time)")
        return {"error": f"reading and evaluating it took longer than the grader's limit of {timeout_s:g} s{how}",
                "cpu_s": cpu_s, **lowered}
    why = (f"the reader stopped with signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else
           f"the reader failed (exit status {os.WEXITSTATUS(status)})")
    return {"error": f"{why}; loading it needs more than the grader's {request['memory_mb']} MB or crashes the "
                     "reader", "cpu_s": cpu_s, **lowered}


def _read_answer(fd: int, clock: JobClock, budget: Budget) -> tuple[bytes | None, str]:
    """The file child's one line of answer, or None; and what stopped it: "cpu" (its CPU time reached the limit),
    "wall" (the wall-clock backstop, less its waits for a CPU) or "" (it answered, or exited without a line)."""
    buf, cpus = b"", job_cpus()
    while True:
        now = time.monotonic()
        cpu, busy = clock.cpu_s(), now - budget.began - clock.waited_s()
        over = budget.over(cpu, busy)
        if over:
            return None, over
        if not select.select([fd], [], [], budget.next_look(cpu, busy, cpus=cpus))[0]:
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return None, ""
        buf += chunk
        if buf.endswith(b"\n"):
            return buf, ""


def serve_files(config_text: str) -> None:
    """The reader's loop (its configuration: JSON from Verifier._prepare): load the plug-in and start once (its
    reader_start), say ready, then per request (a JSON line and the file's bytes on stdin) fork a confined child
    and answer one line; exits when stdin closes."""
    cfg = json.loads(config_text)
    become_server()
    plugin = _load_file(Path(cfg["plugin"]))
    state = plugin.reader_start()
    unconfined = confine_server(cfg)  # the uid fallback: no network, the grader's folders hidden, once started
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    times = os.times()
    stdout.write(json.dumps({"cpu_s": times.user + times.system, "unconfined": unconfined}).encode() + b"\n")
    stdout.flush()
    for n in itertools.count(1):
        header = stdin.readline()
        if not header:
            break
        request = json.loads(header)
        data = stdin.read(request["size"])
        stdout.write(json.dumps(_file_job(request, data, plugin, state, cfg, n)).encode() + b"\n")
        stdout.flush()
    times = os.times()
    with contextlib.suppress(OSError):
        stdout.write(json.dumps({"exit_cpu_s": times.user + times.system + times.children_user
                                 + times.children_system}).encode() + b"\n")
        stdout.flush()
    os._exit(0)  # skip interpreter teardown (seconds with torch loaded)


def _load_file(path: Path) -> ModuleType:
    """Import a reader's plug-in file under its own name (the reader process imports nothing else of the lesson)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


def read_line(fd: int, deadline: float) -> bytes | None:
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
