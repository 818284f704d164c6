"""A worker and the conversation it holds: one zygote process, its control socket, and the grader's side of one job
(send the cells and the probe requests, read the child's frames strictly in order, stop it at a limit)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import select
import selectors
import socket
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from autograder import wire
from autograder.model import UNCHARGED
from autograder.sandbox.cputime import BACKSTOP, Budget, JobClock, job_cpus, join_group
from autograder.sandbox.fallback import fallback_plan
from autograder.sandbox.frames import CANARY, CTL_BYTES, LEN, WorkerError
from autograder.sandbox.isolation import (
    SANDBOX_SCRATCH,
    SANDBOX_STAGE,
    UIDS_PER_WORKER,
    bwrap_argv,
    oom_kills,
    place_in_cgroups,
    shared_writable,
    zygote_host_pid,
)
from autograder.sandbox.limits import MIB, Limits
from autograder.sandbox.notebook import MAX_NOTEBOOK_BYTES
from autograder.sandbox.results import Transcript, add_trips, cell_name, frame_cpu, group_of

log = logging.getLogger(__name__)

_WARNED: set[str] = set()


def warn_once(msg: str, *, prefix: str = "") -> None:
    """Log a warning once per process (the same isolation or limit is said once, not per worker or pool)."""
    if msg and msg not in _WARNED:
        _WARNED.add(msg)
        log.warning("%s%s", prefix, msg)


class Worker:
    """One zygote process and the control socket to it."""

    def __init__(self, index: int, *, limits: Limits, sandbox: str, probe_module: str, lesson_modules: tuple[str, ...],
                 tmp: Path, stage: Path, uid: int | None, hide: tuple[str | Path, ...], preload: tuple[str, ...],
                 start_timeout_s: float, cgroups: dict[str, str], cpu_group: str = "", tripwire: bool = True):
        """limits: every job's; sandbox: "bwrap" or "none" (the pool's choice); probe_module and lesson_modules:
        imported once by the zygote; tmp: the pool's folder (this worker's log and scratch); stage: the staged
        modules; uid: the first of this worker's block of job uids (None: no uid drop); cgroups: controller ->
        folder of this worker's groups ({} for none); cpu_group: a CPU-accounting cgroup of this worker's own ("":
        the grader reads /proc), from which the grader reads its jobs' CPU time (cputime.JobClock)."""
        self.index, self.limits, self.sandbox, self.stage, self.uid = index, limits, sandbox, stage, uid
        self.probe_module, self.lesson_modules, self.tmp = probe_module, lesson_modules, tmp
        self.hide, self.preload, self.start_timeout_s, self.cgroups = hide, preload, start_timeout_s, cgroups
        self.cpu_group, self.clock_group, self.tripwire = cpu_group, "", tripwire
        self.proc: subprocess.Popen[bytes] | None = None
        self.ctl: socket.socket | None = None
        self.zygote_pid = 0
        self.log_path = tmp / f"worker{index}.log"

    def start(self) -> str:
        """Start the zygote and wait until it is warm; returns an error message, or '' when ready."""
        limits = self.limits
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
        if self.sandbox == "bwrap":
            prefix, path, exe = bwrap_argv(self.stage, self.hide, limits, self.cgroups)
            stage, scratch, wipe = SANDBOX_STAGE, SANDBOX_SCRATCH, [SANDBOX_SCRATCH, "/dev/shm", "/dev/mqueue"]
            own_ipc = True
        else:
            prefix, path, exe = [], [p for p in sys.path if p and os.path.isdir(p)], sys.executable
            stage, scratch = str(self.stage), str(self.tmp / f"scratch{self.index}")
            wipe, own_ipc = [scratch], False
            os.makedirs(scratch, mode=0o711, exist_ok=True)
            if self.uid is not None:  # the uid fallback: namespaces of the worker's own (fallback.enter_namespaces)
                confine = fallback_plan(path, stage=stage, rw=[scratch], hide=self.hide)
                stage, path = confine["path"][0], confine["path"][1:]
        env.update(HOME=scratch, TMPDIR=scratch)
        cfg = {"path": [stage, *path], "probe_module": self.probe_module, "preload": list(self.preload),
               "lesson_modules": list(self.lesson_modules),
               "scratch": scratch, "wipe": wipe, "uid": self.uid, "uids": UIDS_PER_WORKER,
               "limits": asdict(limits), "cgroups": self.cgroups, "own_ipc": own_ipc,
               "sweep": [] if own_ipc or self.uid is None else shared_writable(),
               "confine": confine, "tripwire": self.tripwire}
        code = "import sys; sys.path[:] = __import__('json').loads(sys.argv[1])['path']; " \
               "import autograder.sandbox.zygote as e; e.serve_notebooks(sys.argv[1])"
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
        if ready.get("unconfined"):  # said once: the jobs are not separated
            warn_once(str(ready["unconfined"]), prefix=f"worker {self.index}: ")
        self.zygote_pid = (self.proc.pid if self.sandbox == "none"
                           else zygote_host_pid(self.proc.pid, ready["pid"]))
        if self.cgroups:
            try:
                place_in_cgroups(self.zygote_pid, self.cgroups, processes=limits.max_processes)
            except OSError as exc:
                self.kill()
                return f"worker {self.index} did not start: it cannot be placed in its cgroups ({exc})"
        # the jobs' CPU time: read from the worker's cpuacct group where the zygote could join it, else from /proc
        self.clock_group = self.cpu_group if self.cpu_group and join_group(self.cpu_group, self.zygote_pid) else ""
        return ""

    def oom_kills(self) -> int:
        """Processes the kernel has killed for memory in this worker's memory cgroup so far (0 without one)."""
        return oom_kills(self.cgroups["memory"]) if self.cgroups.get("memory") else 0

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and self.ctl is not None

    def run(self, job: bytes, cells: list[tuple[int, str]], probes: list[tuple[str, str, dict[str, Any]]],
            public: int, share: dict[str, float],
            backstop: dict[str, float] | None = None) -> tuple[dict[str, Any], bytes, int, Transcript]:
        """One job: make the child's channels, hand them over, talk to the child, collect the facts. share: question
        -> CPU seconds of checking it has left; backstop: question -> seconds of wall clock (less waits for a CPU)
        it has left (both spent here, kept across runs)."""
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
            # this process forks nothing while the job runs (the zygote forks it): the clock keeps its files open
            clock = JobClock(self.zygote_pid, self.clock_group, held=True)
            try:
                clock.begin()  # before the fork: the job's CPU time is all its processes', measured here
                try:
                    socket.send_fds(self.ctl, [wire.encode({"t": "job"})], [job_c.fileno(), out_w])
                except OSError as exc:
                    os.close(out_r)
                    raise WorkerError(f"cannot send the job: {exc}") from exc
                finally:
                    job_c.close()
                    os.close(out_w)
                talk = Conversation(self, job_g, out_r, job, cells, probes, public, share, clock,
                                    backstop if backstop is not None else {})
                try:
                    return talk.run()
                finally:
                    os.close(out_r)
            finally:
                clock.close()
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
        return self.read_ctl()

    def read_ctl(self) -> dict[str, Any]:
        assert self.ctl is not None
        try:
            data = self.ctl.recv(CTL_BYTES)
        except OSError as exc:
            raise WorkerError(f"the worker's control socket failed: {exc}") from exc
        if not data:
            raise WorkerError("the worker exited")
        try:
            msg = wire.decode(data, max_bytes=CTL_BYTES)
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


# While the child still owes many answers to requests already sent, the grader reads its frames every few ms, not
# at each one: about half the wake-ups of a notebook and a third less of the conversation's CPU. Nothing is lost or
# late: the child writes on into the socket, and the last answers of a batch (which the child's next request or
# its exit waits for) are read as they come.
_COALESCE_S, _COALESCE_OWED = 0.005, 8
_CELL_FRAME = {"t": (str,), "i": (int,), "note": (str, type(None)), "oom": (bool,), "tamper": (list,),
               "exit": (str, type(None))}
_OUT_FRAME = {"t": (str,), "key": (str,), "value": None, "oom": (bool,), "tamper": (list,)}
_TRIP_FRAME = {"t": (str,), "event": (str,), "cell": (int,), "line": (int,), "detail": (str,)}


def _fits(msg: dict[str, Any], shape: dict[str, Any]) -> bool:
    """Whether msg has exactly shape's keys (and optionally "cpu", a number the child reports about itself)."""
    keys = msg.keys() - {"cpu"} if type(msg.get("cpu")) in (float, int) else msg.keys()
    return keys == shape.keys() and all(kinds is None or type(msg[k]) in kinds for k, kinds in shape.items())


class Conversation:
    """The grader's side of one job: send the cells, then the public probe requests in one frame and, once
    every public answer is in, the hidden ones in another; one answer per request, strictly in order."""

    def __init__(self, worker: Worker, sock: socket.socket, out_r: int, job: bytes, cells: list[tuple[int, str]],
                 probes: list[tuple[str, str, dict[str, Any]]], public: int, share: dict[str, float],
                 clock: JobClock, backstop: dict[str, float]):
        limits = worker.limits
        self.worker, self.sock, self.out_r, self.job, self.cells, self.probes = worker, sock, out_r, job, cells, probes
        self.out_cap, self.res_cap = limits.max_output_kb * 1024, limits.result_mb * MIB
        self.output, self.total = bytearray(), 0
        self.buf, self.received = bytearray(), 0
        self.t = Transcript()
        self.phase, self.cell, self.probe = "cells", 0, 0
        self.public, self.asked = public, 0  # probes[:asked] have been sent to the child
        self.wanted = {k for k, _, _ in probes}
        self.void = self.t.void
        self.share = share  # question -> CPU seconds of probe time it has left (spent here, kept across runs)
        self.backstop = backstop  # question -> its wall-clock backstop left (wall less waits for a CPU)
        self.probe_began = 0.0
        self.nonce = ""  # sent with the latest probe requests; the guard's report of each answer must carry it
        self.started = time.monotonic()
        # the grader's own safety: the zygote stops the job long before (its backstop), the checks below before it
        self.deadline = self.started + 10 * BACKSTOP * limits.wall_timeout_s + 60
        self.cell_timeout_s, self.probe_timeout_s = limits.cell_timeout_s, limits.probe_timeout_s
        self.clock, self.cpus = clock, job_cpus()  # the job's CPU time, read here (cputime.JobClock)
        self.last = (0.0, 0.0, 0.0)  # the latest reading: when, CPU seconds, seconds waited for a CPU
        self.whole = Budget(float(limits.cpu_timeout_s), limits.wall_timeout_s, began=self.started)
        self.step: Budget | None = None  # the running cell's or probe's limit
        self.cell_deadline = float("inf")  # when to look at the clock next
        self.sel = selectors.DefaultSelector()

    def run(self) -> tuple[dict[str, Any], bytes, int, Transcript]:
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
                if now >= self.cell_deadline:
                    self._look(now)
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
            return self.worker.read_ctl()
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
        while len(self.buf) >= LEN.size:
            (n,) = LEN.unpack_from(self.buf)
            if n > self.res_cap:
                return self._break(f"a frame of {n} bytes")
            if len(self.buf) < LEN.size + n:
                return
            data = bytes(self.buf[LEN.size:LEN.size + n])
            del self.buf[:LEN.size + n]
            try:
                msg = wire.decode(data, max_bytes=self.res_cap)
            except wire.WireError as exc:
                return self._break(f"a malformed frame ({str(exc)[:120]})")
            if type(msg) is not dict:
                return self._break("a frame that is not an object")
            self._handle(msg)

    def _handle(self, msg: dict[str, Any]) -> None:
        kind, t = msg.get("t"), self.t
        if kind == "trip" and _fits(msg, _TRIP_FRAME):  # the tripwire, at any step: it changes no step's answer
            add_trips(t.tripwire, [msg])
        elif kind == "cell" and self.phase == "cells" and self.cell < len(self.cells) and _fits(msg, _CELL_FRAME) \
                and msg["i"] == self.cells[self.cell][0]:
            self.cell += 1
            t.cpu["cells"] += frame_cpu(msg)
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
            t.cpu["setup"] = frame_cpu(msg)
            self.phase = "probes"
            self._next_probe()
        elif kind == "out" and self.phase == "probes" and _fits(msg, _OUT_FRAME) \
                and msg["key"] == self.probes[self.probe][0]:
            key = msg["key"]
            mark = f"{CANARY} {self.nonce}"
            facts = [f for f in msg["tamper"] if not (type(f) is str and f.startswith(CANARY))]
            if mark not in msg["tamper"] or len(facts) != len(msg["tamper"]) - 1:
                facts.append(f"the guard's report for {key!r} came back without the grader's check mark (the guard "
                             "was switched off or its report rewritten): the case earns nothing")
                self.void.add(key)
            self._facts(facts)
            t.cpu["probes"][key] = frame_cpu(msg)
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

    def _reading(self, now: float, *, fresh: bool = False) -> tuple[float, float]:
        """The job's CPU seconds so far and its wall-clock seconds less its waits for a CPU (the backstop's clock).
        Between looks (fresh) a reading of the last 2 ms stands, and the waits are read at most twice a second (an
        older reading only makes a step's backstop later): a step of a few ms costs no more than it did."""
        last = self.last
        if not fresh and now - last[0] < 0.002:
            return last[1], now - self.started - last[2]
        waited = self.clock.waited_s() if fresh or now - last[0] >= 0.5 or last[0] == 0.0 else last[2]
        self.last = (now, self.clock.cpu_s(), waited)
        return self.last[1], now - self.started - waited

    def _look(self, now: float) -> None:
        """The clock at a step's next look: stop the step when it used its CPU share or passed its backstop
        (only a killed process reliably stops a long C call), the job when the notebook's did; else look again
        when it could next be over."""
        cpu, busy = self._reading(now, fresh=True)
        step = self.step.over(cpu, busy) if self.step is not None else ""
        whole = self.whole.over(cpu, busy)
        if step:
            if self.phase == "probes":
                key = self.t.probe_running
                self._charge(now)
                self.t.probe_over, self.t.stopped_by[key] = key, step
                group = group_of(key)
                if step == "wall" and self.backstop.get(group, 1.0) <= 0:  # the question's backstop: its share
                    self.share[group] = min(self.share.get(group, 0.0), 0.0)
                    self.t.stopped_by[group] = "wall"
            else:
                self.t.cell_over = self.t.running
                self.t.stopped_by[f"cell {self.t.running}"] = step
        elif whole:
            self.t.whole = whole
        if step or whole:
            self.cell_deadline = float("inf")
            self.deadline = min(self.deadline, now + 30)  # the zygote's report on the killed job is due
            self._hang_up()
            return
        looks = [b.next_look(cpu, busy, cpus=self.cpus) for b in (self.step, self.whole) if b is not None]
        self.cell_deadline = now + min(looks)

    def _begin_step(self, now: float, cpu_s: float, wall_s: float) -> None:
        """A cell or a probe starts now with these limits (CPU seconds; the backstop's base)."""
        cpu, busy = self._reading(now)
        self.step = Budget(cpu_s, wall_s, cpu0=cpu, busy0=busy, began=now)
        self.cell_deadline = now + min(self.step.next_look(cpu, busy, cpus=self.cpus),
                                       self.whole.next_look(cpu, busy, cpus=self.cpus))

    def _end_step(self, now: float, what: str) -> tuple[float, float]:
        """The running step ended now: the CPU seconds it used; a step that ran past its limit on the wall clock with
        its CPU under it was slowed by the machine, which is said and never charged."""
        step, self.step = self.step, None
        if step is None:
            return 0.0, 0.0
        cpu, busy = self._reading(now)
        if step.stalled(now, cpu) and len(self.t.stalls) < 20:
            self.t.stalls.append(f"{what} ran {now - step.began:.1f} s on the wall clock, past its limit of "
                                 f"{step.cpu_s:g} s, with {cpu - step.cpu0:.1f} s of CPU time: {UNCHARGED}")
        return max(0.0, cpu - step.cpu0), max(0.0, busy - step.busy0)

    def _charge(self, now: float) -> None:
        """The probe being answered ran until now: its CPU time counts against its question's share, its wall time
        (less its waits for a CPU) against the question's backstop."""
        key = self.t.probe_running
        if key:
            cpu, busy = self._end_step(now, f"The check {key}")
            group = group_of(key)
            self.t.wall[key] = self.t.wall.get(key, 0.0) + max(0.0, now - self.probe_began)
            self.t.probe_cpu[key] = self.t.probe_cpu.get(key, 0.0) + cpu
            self.share[group] = self.share.get(group, 0.0) - cpu
            self.backstop[group] = self.backstop.get(group, 0.0) - busy
            self.probe_began = now

    def _where(self) -> None:
        """Say where the child is; a cell that starts now (the previous one reported) starts its clock, and so does
        a probe (its limits: its own or what is left of its question's share, whichever comes first; in CPU time,
        with the wall-clock backstop of each)."""
        now = time.monotonic()
        if self.step is not None and self.t.running is not None:
            self._end_step(now, cell_name(self.t.running, dict(self.cells).get(self.t.running, ""), word="Cell"))
        self.t.running, self.cell_deadline, self.t.probe_running, self.step = None, float("inf"), "", None
        if self.phase == "cells":
            self.t.where = f"in cell {self.cells[self.cell][0]}" if self.cell < len(self.cells) else "after the cells"
            if self.cell < len(self.cells):
                self.t.running = self.cells[self.cell][0]
                self._begin_step(now, self.cell_timeout_s, self.cell_timeout_s)
        elif self.phase == "probes":
            key = self.probes[self.probe][0]
            self.t.where, self.t.probe_running = f"in probe {key!r}", key
            self.probe_began = now
            group = group_of(key)
            cpu_left = max(0.0, min(self.probe_timeout_s, self.share.get(group, float("inf"))))
            wall_left = max(0.0, min(self.probe_timeout_s, self.backstop.get(group, float("inf")) / BACKSTOP))
            self._begin_step(now, cpu_left, wall_left)
        elif self.phase == "ended":
            self.t.where = "after the probes"
        if self.step is None and self.phase != "over":  # between steps the notebook's own limits still hold
            cpu, busy = self._reading(now)
            self.cell_deadline = now + self.whole.next_look(cpu, busy, cpus=self.cpus)

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
            self.sock.sendall(LEN.pack(len(data)) + data)
        except OSError:  # the child is gone, or does not read: what the zygote reports tells why
            self._hang_up()
