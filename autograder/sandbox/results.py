"""What a run of a notebook makes: the result, the grader's transcript of the child's frames, the probes' order and
the notes on time limits, in the grader's words."""

from __future__ import annotations

import signal
from dataclasses import asdict, dataclass, field
from typing import Any

from autograder import wire
from autograder.model import NOT_RUN, Status
from autograder.sandbox.cputime import BACKSTOP
from autograder.sandbox.frames import HARNESS_FAILED, MEMORY_GUARDS, SETUP_FAILED
from autograder.sandbox.limits import Limits
from autograder.sandbox.notebook import MAX_NOTEBOOK_BYTES
from autograder.sandbox.tripwire import MAX_TRIPS

Probe = tuple[Any, ...]  # (case key, probe name, args) or (case key, probe name, args, hidden)
MAX_TIME_STOPS = 3  # cells left out for the per-cell limit; one more too slow cell ends the notebook there
# fresh runs of the notebook for the probes not yet answered, after a run was stopped among its probes (a probe over
# its own limit or its question's share, or a whole-notebook limit); the probes still left after that do not run
MAX_PROBE_RUNS = 6


@dataclass
class ExecResult:
    """What happened to one submission: a status (a `Status` word), the probe outputs (plain data) and short notes."""

    status: str  # a Status word: GRADED when the notebook and its probes ran to their end
    outputs: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    skipped_cells: list[int] = field(default_factory=list)
    stopped_cells: list[int] = field(default_factory=list)  # stopped by a time limit, then left out
    not_run: dict[str, str] = field(default_factory=dict)  # probe key -> why it never ran (a time limit, in words)
    probe_wall: dict[str, float] = field(default_factory=dict)  # probe key -> wall seconds it ran (all runs)
    probe_cpu: dict[str, float] = field(default_factory=dict)  # probe key -> CPU seconds, read by the grader (all runs)
    student_notes: list[str] = field(default_factory=list)  # the grader's own words (no sandbox text)
    tampering: list[str] = field(default_factory=list)
    # what the child's tripwire refused (tripwire.py): {"event", "cell", "line", "detail"} each, at most MAX_TRIPS
    tripwire: list[dict[str, Any]] = field(default_factory=list)
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




def add_trips(kept: list[dict[str, Any]], new: list[dict[str, Any]]) -> None:
    """The tripwire's records of another run (or frame) added to those kept: each once, at most MAX_TRIPS, its
    words clipped (a frame's record holds the frame's `t` too: left out)."""
    for got in new:
        record = {"event": got["event"][:80], "cell": got["cell"], "line": got["line"], "detail": got["detail"][:200]}
        if record not in kept and len(kept) < MAX_TRIPS:
            kept.append(record)


def frame_cpu(msg: dict[str, Any]) -> float:
    """The CPU seconds a child's frame says its step took (0 when absent): for the benchmark's split, never judged."""
    value = msg.get("cpu")
    return float(value) if type(value) in (float, int) and 0 <= value < 1e6 else 0.0


def cells_job(cells: list[tuple[int, str]]) -> bytes:
    """The frame that carries the cells to run to the child (WireError when it is over the cap)."""
    return wire.encode({"t": "cells", "cells": [[i, s] for i, s in cells]}, max_bytes=4 * MAX_NOTEBOOK_BYTES)


def first_line(src: str) -> str:
    line = next((ln.strip() for ln in src.splitlines() if ln.strip()), "")
    return line if len(line) <= 60 else line[:57] + "..."


def cell_name(i: int, src: str, *, word: str = "cell") -> str:
    return f"{word} {i} (the one that starts `{first_line(src)}`)" if first_line(src) else f"{word} {i}"


def _backstop(limit: float) -> str:
    """How a wall-clock stop is said: the backstop for code that sleeps or waits, three times the CPU limit."""
    return (f"it waited {BACKSTOP * limit:g} s on the wall clock (three times the limit, the grader's backstop for "
            "code that sleeps or waits; limits are counted in CPU time)")


def time_note(i: int, limit: str, src: str, limits: Limits, *, cut: bool = False, stops: int = 0,
              by: str = "cpu") -> str:
    """In plain words: which cell a time limit stopped, its first line, the limit and what the grader did. by: what
    stopped a cell, its CPU time ("cpu") or its wall-clock backstop ("wall")."""
    cell = cell_name(i, src)
    how = f": {_backstop(limits.cell_timeout_s)}" if by == "wall" else " in CPU time"
    if limit == "cell" and not cut:
        return (f"{cell_name(i, src, word='Cell')} was still running after {limits.cell_timeout_s:g} s, the time limit "
                f"for one cell{how}; the grader stopped it and graded the rest of the notebook without it")
    if limit == "cell":
        what = (f"{cell} was still running after {limits.cell_timeout_s:g} s, the time limit for one cell{how}; and "
                f"{stops} cells had been stopped already")
    elif limit == "wall":
        what = (f"the whole notebook reached its wall-clock backstop of {BACKSTOP * limits.wall_timeout_s:g} s (three "
                f"times its limit of {limits.wall_timeout_s:g} s, for code that sleeps or waits) in {cell}")
    else:
        what = f"the whole notebook reached its CPU-time limit of {limits.cpu_timeout_s:g} s in {cell}"
    return (f"{what[0].upper()}{what[1:]}: the grader graded what the cells before it define; cell {i} and "
            "the cells after it did not run")


def group_of(key: str) -> str:
    """The question a probe's key belongs to (the key up to its first "/"): its share of the probes' time."""
    return key.split("/", 1)[0]


def order_probes(probes: list[Probe]) -> tuple[list[tuple[str, str, dict[str, Any]]], int]:
    """(key, name, args) with public probes first and hidden ones last, each group in list order; and how
    many are public."""
    keys = [p[0] for p in probes]
    if len(set(keys)) != len(keys) or not all(len(p) in (3, 4) and type(p[0]) is str and type(p[1]) is str
                                              for p in probes):
        raise ValueError("probes must be (case_key, probe_name, args[, hidden]) with unique str keys")
    public = [tuple(p[:3]) for p in probes if not (len(p) == 4 and p[3])]
    hidden = [tuple(p[:3]) for p in probes if len(p) == 4 and p[3]]
    return public + hidden, len(public)  # type: ignore[return-value]



@dataclass
class Transcript:
    """What the grader learned from the child's frames."""

    outputs: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    tampering: list[str] = field(default_factory=list)
    tripwire: list[dict[str, Any]] = field(default_factory=list)  # the child's trip frames, as they came
    where: str = "while starting"
    running: int | None = None  # the cell the child was running (None once the cells are done)
    cell_over: int | None = None  # the cell the grader stopped for running past the per-cell limit
    probe_over: str = ""  # the probe the grader stopped for running past its own limit or its question's share
    probe_running: str = ""  # the probe being answered when the run ended ("" when none was)
    void: set[str] = field(default_factory=set)  # probes whose answers earn nothing (forged, out of order)
    wall: dict[str, float] = field(default_factory=dict)  # probe key -> wall seconds, as the grader timed it
    oom: str = ""  # where the child reported running out of memory (a MemoryError it caught)
    exited: str = ""  # a cell called sys.exit() or exit()
    finished: bool = False  # every probe was answered
    overflow: bool = False  # more result bytes than the cap
    violated: bool = False  # a frame out of protocol
    cpu: dict[str, Any] = field(default_factory=lambda: {"setup": 0.0, "cells": 0.0, "probes": {}})
    # the grader's own readings of the job's CPU time (cputime.JobClock): probe key -> CPU seconds; what stopped a
    # step ("cell N", a probe key or a question -> "cpu": its CPU share, "wall": its wall-clock backstop); "cpu" or
    # "wall" when the notebook's own limit stopped the run; steps the machine slowed, uncharged (in words)
    probe_cpu: dict[str, float] = field(default_factory=dict)
    stopped_by: dict[str, str] = field(default_factory=dict)
    whole: str = ""
    stalls: list[str] = field(default_factory=list)



def classify(header: dict[str, Any], output: bytes, total: int, t: Transcript,
              probes: list[tuple[str, str, dict[str, Any]]], limits: Limits, guard: str) -> ExecResult:
    """Turn the zygote's facts and the grader's transcript of the conversation into an ExecResult."""
    res = ExecResult(Status.GRADED, outputs=t.outputs, notes=list(t.notes), tampering=list(t.tampering),
                     tripwire=list(t.tripwire), cpu_s=float(header.get("cpu_s", 0.0)))
    res.stdout = output[: limits.max_output_kb * 1024].decode("utf-8", errors="replace")
    if total > len(output):
        res.notes.append(f"output truncated: kept {len(output)} of {total} bytes")
    sig, code, where = header.get("signal"), header.get("exit_code"), t.where
    if t.cell_over is not None:
        res.status = Status.TIMED_OUT
        res.notes.append(f"per-cell time limit of {limits.cell_timeout_s:g} s reached in cell {t.cell_over}")
    elif t.probe_over:
        res.status = Status.TIMED_OUT
        res.notes.append(f"a probe's time limit ({limits.probe_timeout_s:g} s, or its question's share of "
                         f"{limits.question_timeout_s:g} s) reached in probe {t.probe_over!r}")
    elif header.get("timed_out"):
        res.status = Status.TIMED_OUT
        res.notes.append(f"wall-clock backstop of {BACKSTOP * limits.wall_timeout_s:g} s (three times the limit of "
                         f"{limits.wall_timeout_s:g} s) reached {where}")
    elif header.get("cpu_exceeded"):
        res.status = Status.TIMED_OUT
        res.notes.append(f"CPU-time limit of {limits.cpu_timeout_s} s reached {where}")
    elif header.get("memory") in MEMORY_GUARDS:
        res.status = Status.OUT_OF_MEMORY
        how = ("the cgroup memory limit" if header["memory"] == "cgroup"
               else "the watchdog that sums the memory of its processes")
        res.notes.append(f"out of memory: the submission as a whole (all its processes) went over "
                         f"{limits.memory_mb} MB {where}; stopped by {how}")
    elif t.oom:
        res.status = Status.OUT_OF_MEMORY
        res.notes.append(f"out of memory (limit {limits.memory_mb} MB) {t.oom}")
    elif sig == signal.SIGKILL and not header.get("killed"):
        res.status = Status.OUT_OF_MEMORY
        res.notes.append(f"killed by SIGKILL {where}: most likely out of memory ({limits.memory_mb} MB, "
                         f"{guard})")
    elif t.violated:
        res.status = Status.TAMPERING
        res.notes.append("the result channel held forged or out-of-order frames; the cases they name "
                         "earn nothing")
    elif t.exited:
        res.status = Status.CRASHED
        res.notes.append(f"{t.exited}; the notebook stopped there and no probe ran")
    elif t.overflow:
        res.status = Status.CRASHED
        res.notes.append(f"the results were over the {limits.result_mb} MB cap")
    elif sig is not None:
        res.status = Status.CRASHED
        res.notes.append(f"the process was killed by signal {_signame(sig)} {where}")
    elif code in (SETUP_FAILED, HARNESS_FAILED):
        res.status = Status.CRASHED
        res.notes.append(f"the harness inside the sandbox failed {where} (were its channels broken?)")
    elif not t.finished or code != 0:
        res.status = Status.CRASHED
        res.notes.append(f"the process exited with code {code} {where} (sys.exit or os._exit?)")
    elif res.tampering:
        res.status = Status.TAMPERING
    missing = [k for k, _, _ in probes if k not in res.outputs]
    if missing and not t.exited:
        res.notes.append(f"{len(missing)} of {len(probes)} probes returned nothing")
    return res


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return str(sig)


def _calls(args: dict[str, Any]) -> str:
    """What a check calls, in the student's words: " (it calls `rope_cache`)" when its arguments name the function
    or class, else "" (the probe's own name is the grader's, never said to the student)."""
    named = next((args[k] for k in ("fn", "cls") if isinstance(args.get(k), str)), None)
    return f" (it calls `{str(named)[:60]}`)" if named else ""


class ProbeStops:
    """The probes of a notebook run after run: which were answered, which never ran for time and why (in the
    grader's words), and what the student is told."""

    def __init__(self, limits: Limits, probes: list[tuple[str, str, dict[str, Any]]]):
        self.limits, self.probes = limits, {k: (n, a) for k, n, a in probes}
        self.not_run: dict[str, str] = {}
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}  # probe key -> CPU seconds (the grader's reading), all runs
        self.stopped_by: dict[str, str] = {}  # probe key or question -> "cpu" or "wall" (Transcript.stopped_by)
        self.answered: dict[str, Any] = {}
        self.void: set[str] = set()
        self.retried: set[str] = set()  # stopped once by a whole-notebook limit: it runs once more, never twice
        self.said: list[str] = []
        self.spent: set[str] = set()  # questions whose share ran out

    def after(self, t: Transcript, left: list[tuple[str, str, dict[str, Any]]],
              share: dict[str, float]) -> list[tuple[str, str, dict[str, Any]]]:
        """Take in a run that ended among its probes; the probes still to run, in order."""
        self.take_times(t)
        self.answered.update(t.outputs)
        self.void |= t.void
        key = t.probe_over or t.probe_running
        if key and key not in self.answered:
            args = self.probes[key][1]
            if t.probe_over and share.get(group_of(key), 1.0) > 0:
                probe_s = self.limits.probe_timeout_s
                how = f" ({_backstop(probe_s)})" if t.stopped_by.get(key) == "wall" else " in CPU time"
                self.not_run[key] = (f"the check{_calls(args)}: still running after {probe_s:g} s, the "
                                     f"time limit of one check{how}")
                self.said.append(f"The check {key}{_calls(args)} was still running after "
                                 f"{probe_s:g} s, the time limit of one check{how}: it earns nothing, and the "
                                 "checks after it ran in a fresh run of the notebook")
            elif not t.probe_over and key in self.retried:
                self.not_run[key] = f"the check{_calls(args)}: stopped twice by the notebook's whole time limit"
            elif not t.probe_over:
                self.retried.add(key)
        for k, _, _ in left:
            group = group_of(k)
            if k not in self.answered and k not in self.void and k not in self.not_run and share.get(group, 1) <= 0:
                self.not_run[k] = self._spent(group, share)
        return [p for p in left if p[0] not in self.answered and p[0] not in self.void and p[0] not in self.not_run]

    def take_times(self, t: Transcript) -> None:
        """Add a run's times (wall, CPU) and what stopped its steps."""
        for mine, theirs in ((self.wall, t.wall), (self.cpu, t.probe_cpu)):
            for k, v in theirs.items():
                mine[k] = mine.get(k, 0.0) + v
        self.stopped_by.update(t.stopped_by)

    def _spent(self, group: str, share: dict[str, float]) -> str:
        """Why the probes of a question whose share ran out do not run; said to the student once."""
        share_s = self.limits.question_timeout_s
        times = self.wall if self.stopped_by.get(group) == "wall" else self.cpu
        slow = max((k for k in times if group_of(k) == group), key=lambda k: times[k], default="")
        what = f" (the slowest: {slow}{_calls(self.probes[slow][1])}, {times[slow]:.1f} s)" if slow else ""
        how = f" ({_backstop(share_s)})" if self.stopped_by.get(group) == "wall" else " in CPU time"
        why = f"the checks of {group} used up the question's share of {share_s:g} s of checking time{how}{what}"
        if group not in self.spent:
            self.spent.add(group)
            self.said.append(f"{why[0].upper()}{why[1:]}: its checks that had not run by then earn nothing "
                             f"({NOT_RUN}); the other questions have shares of their own")
        return why

    def give_up(self, left: list[tuple[str, str, dict[str, Any]]], runs: int) -> None:
        """The probes left when the grader stops running the notebook again."""
        for k, _, a in left:
            self.not_run.setdefault(k, f"the check{_calls(a)}: had not run after {runs} runs of the notebook")
        if left:
            self.said.append(f"The grader ran the notebook {runs} times for its checks and then stopped: "
                             f"{len(left)} checks did not run ({NOT_RUN}), the first {left[0][0]}")
