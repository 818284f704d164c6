"""The student's time, read by the grader itself: the CPU seconds a job's processes used (a cpuacct cgroup of the
job's worker where one can be made, else /proc of every process below the job's fork server) and how long they
waited for a CPU (schedstat), never what the child reports; and the rule that charges it (Budget).

A limit of L seconds is a share of CPU time: a step (a cell, a check, a question's checks, a whole notebook, a file
read) is stopped and charged when its processes used L seconds of CPU, or when it passed the wall-clock backstop,
BACKSTOP times L, counted on the wall clock less the time its processes were kept waiting for a CPU (a machine
busy with other work never charges the student; code that sleeps or waits does). A step that runs past L on the
wall clock with its CPU under L goes on, uncharged, and the grader says so (Budget.stalled).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from autograder import env_name

BACKSTOP = 3.0  # the wall-clock backstop, in multiples of a limit
_NS = 1e-9
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
CPU_CLOCK_ENV = env_name("CPU_CLOCK")  # "proc": read /proc even where a cpuacct cgroup could be made
_V1_MOUNTS = ("/sys/fs/cgroup/cpuacct", "/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/cpuacct,cpu")


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def group_cpu_s(folder: str, *, read: Callable[[str], str] = _read) -> float | None:
    """CPU seconds every process of a cgroup used so far: v1 cpuacct.usage (ns), v2 cpu.stat's usage_usec; None
    when neither can be read (`read`: how a file's text is read)."""
    with contextlib.suppress(OSError, ValueError):
        return int(read(os.path.join(folder, "cpuacct.usage"))) * _NS
    with contextlib.suppress(OSError, ValueError, StopIteration):
        stat = read(os.path.join(folder, "cpu.stat"))
        return next(int(line.split()[1]) for line in stat.splitlines() if line.startswith("usage_usec ")) * 1e-6
    return None


def _own_group() -> str:
    """This process's cpuacct cgroup folder (v1), or its v2 folder where no v1 cpuacct is mounted; OSError when
    none is writable."""
    with open("/proc/self/cgroup") as f:
        lines = [line.rstrip("\n").split(":", 2) for line in f if line.count(":") >= 2]
    for mount in _V1_MOUNTS:
        if os.path.isfile(os.path.join(mount, "cpuacct.usage")):
            rel = next((p for _, ctrls, p in lines if "cpuacct" in ctrls.split(",")), "/")
            path = os.path.join(mount, rel.lstrip("/"))
            path = path if os.path.isdir(path) else mount  # inside a cgroup namespace the path may not resolve
            if os.access(path, os.W_OK):
                return path
            raise OSError(f"{path} is not writable")
    rel = next((p for h, ctrls, p in lines if h == "0" and ctrls == ""), None)
    for mount in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
        if rel is not None and os.path.isfile(os.path.join(mount, "cgroup.controllers")):
            path = os.path.join(mount, rel.lstrip("/"))
            if os.path.isdir(path) and os.access(path, os.W_OK):
                return path
    raise OSError("no writable cpuacct (v1) or cgroup v2 folder")


def make_cpu_group(name: str) -> str:
    """A fresh CPU-accounting cgroup named `name` beside this process's, or '' where none can be made (then the
    grader reads /proc)."""
    if os.environ.get(CPU_CLOCK_ENV) == "proc":
        return ""
    try:
        root = _own_group()
        _remove_stale(root, name)
        path = os.path.join(root, name)
        os.mkdir(path, 0o755)
    except OSError:
        return ""
    if group_cpu_s(path) is None:
        with contextlib.suppress(OSError):
            os.rmdir(path)
        return ""
    return path


def _remove_stale(root: str, name: str) -> None:
    """Empty groups of this kind (`name` is PREFIX<pid>-<slot>) left by a grader that was killed: its pid is gone."""
    prefix = name.rsplit("-", 2)[0] + "-"
    for entry in os.listdir(root):
        pid = entry[len(prefix):].split("-")[0]
        if entry.startswith(prefix) and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(root, entry))  # fails while a process is still in it


def join_group(folder: str, pid: int) -> bool:
    """Move a process (a fork server, before any job) into a CPU-accounting group: every child it forks is born
    there. Whether it went."""
    try:
        with open(os.path.join(folder, "cgroup.procs"), "w") as f:
            f.write(str(pid))
    except OSError:
        return False
    return True


def _stat(pid: int | str, *, read: Callable[[str], str] = _read) -> list[str]:
    """The fields of /proc/PID/stat after the command name ([] when it is gone): [0] the state, [11:15] utime,
    stime, cutime, cstime in clock ticks."""
    try:
        raw = read(f"/proc/{pid}/stat")
    except OSError:
        return []
    return raw[raw.rindex(")") + 2:].split()


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (every thread of it: an orphan may be given to any)."""
    kids: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return kids
    for tid in tasks:
        with contextlib.suppress(OSError, ValueError):
            kids += [int(k) for k in _read(f"/proc/{pid}/task/{tid}/children").split()]
    return kids


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo and len(out) < 10_000:
        for kid in _children(todo.pop()):
            out.append(kid)
            todo.append(kid)
    return out


def _waited_s(pid: int) -> float:
    """Seconds the main thread of `pid` waited on a run queue for a CPU (schedstat's run_delay; 0 unknown)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int(_read(f"/proc/{pid}/schedstat").split()[1]) * _NS
    return 0.0


class JobClock:
    """The CPU seconds a job's processes used since `begin`, and the seconds its processes waited for a CPU, read
    by the grader: the fork server's cpuacct group less the server's own CPU, else every process below the server
    (their own and their reaped children's times) plus the children the server reaped."""

    def __init__(self, server: int, group: str = "", *, held: bool = False) -> None:
        """held: keep the server's stat file and the group's usage file open between readings (read again from
        their start: the same figures at a fifth of the cost); only in a process that forks no child while the
        clock runs (the grader's conversation, not a fork server), and closed by close()."""
        self.server, self.group, self.held = server, group, held
        self.cpu0 = self.wait0 = self.last = 0.0
        self.waits: dict[int, float] = {}
        self._fds: dict[str, int] = {}

    def _text(self, path: str) -> str:
        """The file's text now: opened and read (_read), or, held, read again from its start."""
        if not self.held:
            return _read(path)
        fd = self._fds.get(path)
        if fd is None:
            fd = self._fds[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        data = os.pread(fd, 4096, 0)
        while len(data) % 4096 == 0 and data:  # a longer file than one read takes (not these): read it on
            more = os.pread(fd, 4096, len(data))
            if not more:
                break
            data += more
        return data.decode()

    def close(self) -> None:
        """Close the files a held clock kept open."""
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)

    def _server_times(self) -> tuple[float, float]:
        s = _stat(self.server, read=self._text)
        if len(s) < 15:
            return 0.0, 0.0
        return (int(s[11]) + int(s[12])) / _TICK, (int(s[13]) + int(s[14])) / _TICK

    def _raw(self) -> float:
        own, reaped = self._server_times()
        if self.group:
            used = group_cpu_s(self.group, read=self._text)
            if used is not None:
                return used - own
        total = reaped
        for pid in _descendants(self.server):
            s = _stat(pid)
            if len(s) >= 15:
                total += sum(int(x) for x in s[11:15]) / _TICK
        return total

    def begin(self) -> None:
        """A job starts now (its processes are not forked yet)."""
        self.cpu0, self.last, self.waits = self._raw(), 0.0, {}

    def cpu_s(self) -> float:
        """CPU seconds of the job's processes since begin (never less than an earlier answer)."""
        self.last = max(self.last, self._raw() - self.cpu0)
        return self.last

    def waited_s(self) -> float:
        """Seconds the job's processes (each one's main thread, the longest) were kept waiting for a CPU since
        begin: what the machine's other work cost it, which the wall-clock backstop does not count."""
        for pid in _descendants(self.server):
            self.waits[pid] = max(self.waits.get(pid, 0.0), _waited_s(pid))
        return max(self.waits.values(), default=0.0)


@dataclass
class Budget:
    """One step's limit: `cpu_s` of CPU and BACKSTOP times `wall_s` of wall clock less waits, from the clock's
    readings when it began (cpu0; busy0: wall less waits)."""

    cpu_s: float
    wall_s: float
    cpu0: float = 0.0
    busy0: float = 0.0
    began: float = 0.0

    def over(self, cpu: float, busy: float) -> str:
        """'cpu' when its CPU share is used, 'wall' when it passed the backstop, else ''."""
        if cpu - self.cpu0 >= self.cpu_s:
            return "cpu"
        return "wall" if busy - self.busy0 >= BACKSTOP * self.wall_s else ""

    def next_look(self, cpu: float, busy: float, *, cpus: int) -> float:
        """Seconds until the step could next be over (its processes run on at most `cpus` CPUs at once)."""
        cpu_left = (self.cpu_s - (cpu - self.cpu0)) / max(1, cpus)
        wall_left = BACKSTOP * self.wall_s - (busy - self.busy0)
        return max(0.02, min(cpu_left, wall_left))

    def stalled(self, now: float, cpu: float) -> bool:
        """Whether the step ran past its limit on the wall clock with its CPU under it (the machine was slow)."""
        return now - self.began > self.wall_s and cpu - self.cpu0 < self.cpu_s


def job_cpus() -> int:
    """How many CPUs a job's processes may use at once (this process's affinity)."""
    with contextlib.suppress(AttributeError, OSError):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def now() -> float:
    return time.monotonic()
