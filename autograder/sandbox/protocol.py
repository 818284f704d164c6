"""Frames between grader and child, the conversation the grader holds with it, and the result it makes."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import select
import selectors
import signal
import socket
import struct
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from autograder import wire
from autograder.model import NOT_RUN, Status
from autograder.sandbox.limits import (
    MIB,
    Limits,
)
from autograder.sandbox.notebook import MAX_NOTEBOOK_BYTES

if TYPE_CHECKING:
    from autograder.sandbox.pool import _Worker


log = logging.getLogger(__name__)

MEMORY_GUARDS = ("cgroup", "watchdog")
Probe = tuple[Any, ...]  # (case key, probe name, args) or (case key, probe name, args, hidden)
_JOB_FD = 3
_SETUP_FAILED, _HARNESS_FAILED = 70, 71
_LEN = struct.Struct(">Q")
_CTL_BYTES = 1 << 16
_MAX_TIME_STOPS = 3  # cells left out for the per-cell limit; one more too slow cell ends the notebook there
# fresh runs of the notebook for the probes not yet answered, after a run was stopped among its probes (a probe over
# its own limit or its question's share, or a whole-notebook limit); the probes still left after that do not run
MAX_PROBE_RUNS = 6
# While the child still owes many answers to requests already sent, the grader reads its frames every few ms, not
# at each one: about half the wake-ups of a notebook and a third less of the conversation's CPU. Nothing is lost or
# late: the child writes on into the socket, and the last answers of a batch (which the child's next request or
# its exit waits for) are read as they come.
_COALESCE_S, _COALESCE_OWED = 0.005, 8
_CANARY = "guard check mark"  # the fact the guard reports for the grader's nonce after every probe (see _Guard)


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



class WorkerError(RuntimeError):
    """A zygote that failed to start or stopped answering (infrastructure, not the student)."""




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


def group_of(key: str) -> str:
    """The question a probe's key belongs to (the key up to its first "/"): its share of the probes' time."""
    return key.split("/", 1)[0]


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




def _recv_exact(fd: int, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, min(n - len(buf), 1 << 20))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)




@dataclass
class _Transcript:
    """What the grader learned from the child's frames."""

    outputs: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    tampering: list[str] = field(default_factory=list)
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
                 probes: list[tuple[str, str, dict[str, Any]]], public: int, share: dict[str, float]):
        limits = worker.pool.limits
        self.worker, self.sock, self.out_r, self.job, self.cells, self.probes = worker, sock, out_r, job, cells, probes
        self.out_cap, self.res_cap = limits.output_kb * 1024, limits.result_mb * MIB
        self.output, self.total = bytearray(), 0
        self.buf, self.received = bytearray(), 0
        self.t = _Transcript()
        self.phase, self.cell, self.probe = "cells", 0, 0
        self.public, self.asked = public, 0  # probes[:asked] have been sent to the child
        self.wanted = {k for k, _, _ in probes}
        self.void = self.t.void
        self.share = share  # question -> seconds of probe time it has left (spent here, kept across runs)
        self.probe_began = 0.0
        self.nonce = ""  # sent with the latest probe requests; the guard's report of each answer must carry it
        self.deadline = time.monotonic() + limits.wall_s + 30
        self.cell_s, self.cell_deadline, self.probe_s = limits.cell_s, float("inf"), limits.probe_s
        self.sel = selectors.DefaultSelector()

    def run(self) -> tuple[dict[str, Any], bytes, int, _Transcript]:
        assert self.worker.ctl is not None
        sel, header = self.sel, None
        try:
            sel.register(self.sock, selectors.EVENT_READ)
            sel.register(self.out_r, selectors.EVENT_READ)
            sel.register(self.worker.ctl, selectors.EVENT_READ)
            oom_base = self.worker.oom_kills()
            self._where()
            self._send_bytes(self.job)
            while header is None:
                now = time.monotonic()
                left = self.deadline - now
                if left <= 0:
                    raise WorkerError("the worker did not report on the job in time")
                if now >= self.cell_deadline and self._drained():  # its answer was waiting: not slow
                    continue
                if now >= self.cell_deadline:  # only a killed process reliably stops a long C call
                    if self.phase == "probes":
                        self._charge(now)
                        self.t.probe_over = self.t.probe_running
                    else:
                        self.t.cell_over = self.t.running
                    self.cell_deadline = float("inf")
                    self._hang_up()
                for key, _ in sel.select(min(left, max(0.0, self.cell_deadline - now))):
                    if key.fileobj is self.worker.ctl:
                        header = self._header(oom_base)
                    elif key.fileobj == self.out_r:
                        self._pump_output()
                    elif key.fileobj is self.sock:
                        self._pump_frames()
                        if self.phase == "probes" and self.asked - self.probe >= _COALESCE_OWED:
                            time.sleep(min(_COALESCE_S, max(0.0, self.deadline - time.monotonic())))
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

    def _header(self, oom_base: int) -> dict[str, Any]:
        """The zygote's facts about the job. The zygote lives in the worker's cgroups with the job: when it died
        while the memory cgroup counted a kill, the kernel chose it to free the submission's memory (whose
        processes can make themselves look smaller), so the job went over its memory limit."""
        try:
            return self.worker._read_ctl()
        except WorkerError:
            if self.worker.oom_kills() <= oom_base:
                raise
            return {"memory": "cgroup", "killed": True}

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
            self._charge(time.monotonic())
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

    def _drained(self) -> bool:
        """Read the frames already waiting (a busy grader may wake late): whether the child moved on meanwhile."""
        where = (self.cell, self.probe)
        while self.sock.fileno() >= 0 and self.sock in {k.fileobj for k in self.sel.get_map().values()}:
            if not select.select([self.sock], [], [], 0)[0]:
                break
            self._pump_frames()
        return (self.cell, self.probe) != where

    def _charge(self, now: float) -> None:
        """The probe being answered ran until now: its wall time counts against its question's share."""
        key = self.t.probe_running
        if key:
            spent = max(0.0, now - self.probe_began)
            self.t.wall[key] = self.t.wall.get(key, 0.0) + spent
            self.share[group_of(key)] = self.share.get(group_of(key), 0.0) - spent
            self.probe_began = now

    def _where(self) -> None:
        """Say where the child is; a cell that starts now (the previous one reported) starts its clock, and so does
        a probe (its deadline: its own limit or what is left of its question's share, whichever comes first)."""
        self.t.running, self.cell_deadline, self.t.probe_running = None, float("inf"), ""
        if self.phase == "cells":
            self.t.where = f"in cell {self.cells[self.cell][0]}" if self.cell < len(self.cells) else "after the cells"
            if self.cell < len(self.cells):
                self.t.running, self.cell_deadline = self.cells[self.cell][0], time.monotonic() + self.cell_s
        elif self.phase == "probes":
            key = self.probes[self.probe][0]
            self.t.where, self.t.probe_running = f"in probe {key!r}", key
            self.probe_began = time.monotonic()
            left = self.share.get(group_of(key), float("inf"))
            self.cell_deadline = self.probe_began + max(0.0, min(self.probe_s, left))
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
    res = ExecResult(Status.GRADED, outputs=t.outputs, notes=list(t.notes), tampering=list(t.tampering),
                     cpu_s=float(header.get("cpu_s", 0.0)))
    res.stdout = output[: limits.output_kb * 1024].decode("utf-8", errors="replace")
    if total > len(output):
        res.notes.append(f"output truncated: kept {len(output)} of {total} bytes")
    sig, code, where = header.get("signal"), header.get("exit_code"), t.where
    if t.cell_over is not None:
        res.status = Status.TIMED_OUT
        res.notes.append(f"per-cell time limit of {limits.cell_s:g} s reached in cell {t.cell_over}")
    elif t.probe_over:
        res.status = Status.TIMED_OUT
        res.notes.append(f"a probe's time limit ({limits.probe_s:g} s, or its question's share of "
                         f"{limits.question_s:g} s) reached in probe {t.probe_over!r}")
    elif header.get("timed_out"):
        res.status = Status.TIMED_OUT
        res.notes.append(f"wall-clock limit of {limits.wall_s:g} s reached {where}")
    elif header.get("cpu_exceeded"):
        res.status = Status.TIMED_OUT
        res.notes.append(f"CPU-time limit of {limits.cpu_s} s reached {where}")
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
    elif code in (_SETUP_FAILED, _HARNESS_FAILED):
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


def _calls(name: str, args: dict[str, Any]) -> str:
    """A probe in words: its name, and the function or class it calls when its arguments name one."""
    named = next((args[k] for k in ("fn", "cls") if isinstance(args.get(k), str)), None)
    return f"probe `{name}`" + (f", which calls `{str(named)[:60]}`" if named else "")


class ProbeStops:
    """The probes of a notebook run after run: which were answered, which never ran for time and why (in the
    grader's words), and what the student is told."""

    def __init__(self, limits: Limits, probes: list[tuple[str, str, dict[str, Any]]]):
        self.limits, self.probes = limits, {k: (n, a) for k, n, a in probes}
        self.not_run: dict[str, str] = {}
        self.wall: dict[str, float] = {}
        self.answered: dict[str, Any] = {}
        self.void: set[str] = set()
        self.retried: set[str] = set()  # stopped once by a whole-notebook limit: it runs once more, never twice
        self.said: list[str] = []
        self.spent: set[str] = set()  # questions whose share ran out

    def after(self, t: _Transcript, left: list[tuple[str, str, dict[str, Any]]],
              share: dict[str, float]) -> list[tuple[str, str, dict[str, Any]]]:
        """Take in a run that ended among its probes; the probes still to run, in order."""
        for k, v in t.wall.items():
            self.wall[k] = self.wall.get(k, 0.0) + v
        self.answered.update(t.outputs)
        self.void |= t.void
        key = t.probe_over or t.probe_running
        if key and key not in self.answered:
            name, args = self.probes[key]
            if t.probe_over and share.get(group_of(key), 1.0) > 0:
                self.not_run[key] = (f"{_calls(name, args)}: still running after {self.limits.probe_s:g} s, the "
                                     "time limit of one check")
                self.said.append(f"The check {key} ({_calls(name, args)}) was still running after "
                                 f"{self.limits.probe_s:g} s, the time limit of one check: it earns nothing, and the "
                                 "checks after it ran in a fresh run of the notebook")
            elif not t.probe_over and key in self.retried:
                self.not_run[key] = f"{_calls(name, args)}: stopped twice by the notebook's whole time limit"
            elif not t.probe_over:
                self.retried.add(key)
        for k, _, _ in left:
            group = group_of(k)
            if k not in self.answered and k not in self.void and k not in self.not_run and share.get(group, 1) <= 0:
                self.not_run[k] = self._spent(group, share)
        return [p for p in left if p[0] not in self.answered and p[0] not in self.void and p[0] not in self.not_run]

    def _spent(self, group: str, share: dict[str, float]) -> str:
        """Why the probes of a question whose share ran out do not run; said to the student once."""
        slow = max((k for k in self.wall if group_of(k) == group), key=lambda k: self.wall[k], default="")
        what = f" (the slowest: {slow}, {_calls(*self.probes[slow])}, {self.wall[slow]:.1f} s)" if slow else ""
        why = (f"the checks of {group} used up the question's share of {self.limits.question_s:g} s of checking "
               f"time{what}")
        if group not in self.spent:
            self.spent.add(group)
            self.said.append(f"{why[0].upper()}{why[1:]}: its checks that had not run by then earn nothing "
                             f"({NOT_RUN}); the other questions have shares of their own")
        return why

    def give_up(self, left: list[tuple[str, str, dict[str, Any]]], runs: int) -> None:
        """The probes left when the grader stops running the notebook again."""
        for k, n, a in left:
            self.not_run.setdefault(k, f"{_calls(n, a)}: had not run after {runs} runs of the notebook")
        if left:
            self.said.append(f"The grader ran the notebook {runs} times for its checks and then stopped: "
                             f"{len(left)} checks did not run ({NOT_RUN}), the first {left[0][0]}")
