"""Time is charged in the student's CPU time, read by the grader itself (issue 40, item 4): a job the machine stalls
(SIGSTOP, then SIGCONT, from the test) past its limit on the wall clock but under the backstop keeps every answer and
is said to be uncharged; a busy loop past its CPU share is stopped and charged; on the cgroup's clock and on /proc's
(the clock is the grader's, the same whatever isolates the job)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from autograder.model import Status
from autograder.sandbox import (
    BACKSTOP,
    CPU_CLOCK_ENV,
    UID_BASE,
    Budget,
    ExecResult,
    JobClock,
    Limits,
    WorkerPool,
    group_cpu_s,
    make_cpu_group,
    remove_cgroup,
)
from helpers.celltime import FAKE_CHECKS, nb

CELL_S, PROBE_S, SHARE_S = 2, 1, 2
LIMITS = Limits(wall_timeout_s=8, cell_timeout_s=CELL_S, cpu_timeout_s=8, memory_mb=2048, max_processes=32,
                max_file_mb=8, max_output_kb=64, scratch_mb=64, probe_timeout_s=PROBE_S, question_timeout_s=SHARE_S)
BUSY = ("import time\ndef busy(s):\n    end = time.thread_time() + s\n    while time.thread_time() < end:\n"
        "        pass\n")
DEFS = BUSY + "def fast():\n    return 1\ndef spin():\n    while True:\n        pass\ndef half():\n    busy(0.6)\n" \
    "    return 2\n"
PROBES = [("qa/fast", "fast", {}), ("qb/spin", "spin", {}), ("qb/after", "fast", {}),
          ("qc/h1", "half", {}), ("qc/h2", "half", {}), ("qc/h3", "half", {}), ("qc/h4", "half", {}),
          ("qd/fast", "fast", {}, True)]
STALL_S = 3.5  # past the cell's limit (2 s) on the wall clock, under its backstop (6 s)


def _cpu_of(pid: int) -> float:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _stall(pool: WorkerPool, done: threading.Event) -> list[str]:
    """Find the job's child below the zygote; once it is inside its busy cell (0.3 s of CPU), stop it for STALL_S."""
    said: list[str] = []
    zygote = pool.worker_pids()[0]
    while not done.is_set():
        kids = [int(k) for t in os.listdir(f"/proc/{zygote}/task")
                for k in Path(f"/proc/{zygote}/task/{t}/children").read_text().split()]
        if kids and _cpu_of(kids[0]) >= 0.3:
            os.kill(kids[0], signal.SIGSTOP)
            time.sleep(STALL_S)
            os.kill(kids[0], signal.SIGCONT)
            said.append(f"stopped {kids[0]}")
            return said
        time.sleep(0.01)
    return said


@pytest.fixture(scope="module", params=["cgroup clock", "proc clock"])
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    folder = tmp_path_factory.mktemp("cputime")
    (folder / "fake_checks_cputime.py").write_text(FAKE_CHECKS)
    sys.path.insert(0, str(folder))
    proc_clock = request.param.startswith("proc")
    before = os.environ.get(CPU_CLOCK_ENV)
    if proc_clock:
        os.environ[CPU_CLOCK_ENV] = "proc"
    try:
        with WorkerPool(1, limits=LIMITS, probe_module="fake_checks_cputime") as pool:
            done = threading.Event()
            said: list[str] = []
            stall = threading.Thread(target=lambda: said.extend(_stall(pool, done)))
            stall.start()
            try:
                stalled = pool.run(nb(BUSY, "busy(1.2)\nx = 1", "def fast():\n    return x"),
                                   probes=[("qa/fast", "fast", {})])
            finally:
                done.set()
                stall.join()
            yield {"stalled": stalled, "said": said, "busy": pool.run(nb(DEFS, "busy(30)", "y = 2"), probes=PROBES),
                   "clock": pool.cpu_clock}
    finally:
        sys.path.remove(str(folder))
        if before is None:
            os.environ.pop(CPU_CLOCK_ENV, None)
        else:
            os.environ[CPU_CLOCK_ENV] = before


@pytest.mark.sandbox
def test_the_clock_is_the_one_asked_for(runs: dict[str, object], request: pytest.FixtureRequest) -> None:
    param = request.node.callspec.params["runs"]
    if param.startswith("proc"):
        assert runs["clock"] == "proc", runs["clock"]
    elif runs["clock"] != "cgroup":
        pytest.skip("no cpuacct cgroup can be made here: the grader reads /proc")


@pytest.mark.sandbox
def test_a_stalled_job_keeps_every_answer_and_is_not_charged(runs: dict[str, object]) -> None:
    res = runs["stalled"]
    assert isinstance(res, ExecResult) and runs["said"], runs["said"]  # the stall happened, inside the busy cell
    assert res.status == Status.GRADED and res.stopped_cells == [] and not res.not_run, res.notes
    assert res.outputs["qa/fast"] == {"value": 1}, (res.outputs, res.notes)
    assert any("nothing was charged" in n and "Cell 2" in n for n in res.notes), res.notes
    assert not res.student_notes, res.student_notes


@pytest.mark.sandbox
def test_a_busy_loop_past_its_cpu_share_is_charged(runs: dict[str, object]) -> None:
    res = runs["busy"]
    assert isinstance(res, ExecResult)
    assert res.stopped_cells == [2] and any("Cell 2" in n and "in CPU time" in n for n in res.student_notes), res.notes
    assert res.outputs["qa/fast"] == {"value": 1} and res.outputs["qb/after"] == {"value": 1}, res.notes
    assert "in CPU time" in res.not_run["qb/spin"], res.not_run
    # the question whose checks spend its CPU share loses what had not run by then, and only that
    assert {k for k in res.not_run if k.startswith("qc/")} == {"qc/h4"}, res.not_run
    assert res.outputs["qd/fast"] == {"value": 1}
    assert sum(v for k, v in res.probe_cpu.items() if k.startswith("qc/")) < SHARE_S + 0.3, res.probe_cpu
    assert res.probe_cpu["qb/spin"] >= PROBE_S - 0.05, res.probe_cpu


# --------------------------------------------------------------------------- the clock and the rule, no sandbox


def test_the_clock_reads_a_jobs_cpu_from_the_cgroup_and_from_proc() -> None:
    group = make_cpu_group(f"grader-cgroup-test-{os.getpid()}")
    # the server forks its busy child only once told (a line on stdin): by then it is in the group, as a worker's
    # fork server is before its first job (a child forked before the move would stay outside the group)
    server = subprocess.Popen([sys.executable, "-c", "import os, sys, time\n"
                               "sys.stdin.readline()\npid = os.fork()\n"
                               "if pid == 0:\n    end = time.process_time() + 0.6\n"
                               "    while time.process_time() < end: pass\n    os._exit(0)\n"
                               "os.waitpid(pid, 0)\nsys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        clocks = [JobClock(server.pid)]
        if group:
            Path(group, "cgroup.procs").write_text(str(server.pid))
            clocks.append(JobClock(server.pid, group))
        for c in clocks:
            c.begin()
        server.stdin.write(b"go\n")
        server.stdin.flush()
        time.sleep(0.1)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and min(c.cpu_s() for c in clocks) < 0.55:  # /proc counts in ticks
            time.sleep(0.05)
        readings = [c.cpu_s() for c in clocks]
        assert all(0.55 <= r < 1.0 for r in readings), readings  # the child's 0.6 s, after it was reaped too
        assert all(c.waited_s() >= 0 for c in clocks)
        if group:
            assert group_cpu_s(group) is not None
    finally:
        server.kill()
        server.wait()
        if group:
            remove_cgroup(group)


def test_a_held_clock_reads_its_open_files_afresh_and_closes_them() -> None:
    """The grader's conversation keeps the server's stat file (and the group's usage file) open between readings:
    each reading is the figure of now, the same as a clock that opens the files; close() lets them go."""
    fds = lambda: len(os.listdir("/proc/self/fd"))  # noqa: E731
    before = fds()
    held, fresh = JobClock(os.getpid(), held=True), JobClock(os.getpid())
    for c in (held, fresh):
        c.begin()
    assert fds() == before + 1  # this process's stat file, open in the held clock
    subprocess.run([sys.executable, "-c", "import time\nend = time.process_time() + 0.4\n"
                    "while time.process_time() < end: pass\n"], check=True)  # a reaped child's 0.4 s
    readings = held.cpu_s(), fresh.cpu_s()
    assert all(0.35 <= r < 1.5 for r in readings), readings  # both see the reaped child's CPU time (in ticks)
    assert abs(readings[0] - readings[1]) <= 0.05
    held.close()
    assert fds() == before


def test_a_budget_charges_cpu_and_the_backstop_only() -> None:
    b = Budget(2.0, 2.0, cpu0=1.0, busy0=10.0, began=100.0)
    assert b.over(2.9, 15.9) == "" and b.over(3.0, 11.0) == "cpu" and b.over(1.5, 10 + BACKSTOP * 2) == "wall"
    assert b.stalled(103.0, 1.5) and not b.stalled(101.0, 1.5) and not b.stalled(103.0, 3.0)
    assert 0.02 <= b.next_look(1.0, 10.0, cpus=2) <= 1.0


# --------------------------------------------------------------------------- the checkpoint reader's own limit

TIMED = '''
import os, signal, time


def reader_start():
    return None


def reader_evaluate(request, data, state):
    if request["how"] == "spin":
        while True:
            pass
    if request["how"] == "stall":  # the machine stops it for a while, past the limit on the wall clock
        os.kill(os.getpid(), signal.SIGSTOP)  # the test's SIGCONT, below, wakes it
    if request["how"] == "sleep":
        time.sleep(600)
    return {"how": request["how"]}
'''


@pytest.mark.sandbox
def test_the_checkpoint_reader_charges_cpu_time(tmp_path: Path) -> None:
    from autograder.checkpoint import Verifier

    plugin = tmp_path / "timed_checkpoint.py"
    plugin.write_text(TIMED)
    limit = 1.0
    with Verifier(plugin=plugin) as verifier:
        spun = verifier.request(b"x", {"how": "spin", "memory_mb": 256}, timeout_s=limit)
        slept = verifier.request(b"x", {"how": "sleep", "memory_mb": 256}, timeout_s=limit)
        done = threading.Event()

        def wake() -> None:  # SIGCONT to the stopped file child, 2 s (past the limit, under the backstop) later
            assert verifier.proc is not None
            while not done.is_set():
                stopped = [p for p in _below(verifier.proc.pid) if _state(p) == "T"]
                if stopped:
                    time.sleep(2 * limit)
                    for p in stopped:
                        os.kill(int(p), signal.SIGCONT)
                    return
                time.sleep(0.02)

        waker = threading.Thread(target=wake)
        waker.start()
        try:
            stalled = verifier.request(b"x", {"how": "stall", "memory_mb": 256}, timeout_s=limit)
        finally:
            done.set()
            waker.join()
    assert "of CPU time" in spun.get("error", ""), spun
    assert "waited 3 s on the wall clock" in slept.get("error", ""), slept
    assert stalled.get("how") == "stall", stalled  # stopped by the machine, under its CPU limit: not charged


def _state(pid: str) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat[stat.rindex(")") + 2:].split()[0]


def _below(pid: int) -> list[str]:
    """The processes below `pid` (this test's own reader's), from /proc's children lists."""
    out, todo = [], [str(pid)]
    while todo:
        top = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{top}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                kids = Path(f"/proc/{top}/task/{tid}/children").read_text().split()
            except OSError:
                continue
            out += kids
            todo += kids
    return out


# --------------------------------------------------------------------------- the uid fallback, without bubblewrap

RUN_FALLBACK = '''
import json, sys
checkout, folder, limits, stalled, busy, probes = sys.argv[1:]
sys.path[:0] = [checkout, folder]
from autograder.sandbox import Limits, WorkerPool
with WorkerPool(1, limits=Limits(**json.loads(limits)), probe_module="fake_checks_cputime", sandbox="none") as pool:
    out = {"isolation": pool.isolation, "clock": pool.cpu_clock}
    for name, source, asked in (("stalled", stalled, [["qa/fast", "fast", {}]]), ("busy", busy, json.loads(probes))):
        out[name] = pool.run(open(source, "rb").read(), probes=[tuple(p) for p in asked]).as_dict()
print(json.dumps(out, default=str))
'''


@pytest.mark.sandbox
def test_the_uid_fallback_charges_cpu_time_too(readable_python: Path, tmp_path: Path) -> None:
    """Without bubblewrap, as root, each job runs as an unprivileged uid: the grader reads its CPU time the same way
    (the stall: the test stops the job's process, found by its uid, inside its busy cell)."""
    import json
    from dataclasses import asdict

    from autograder.config import ROOT

    (tmp_path / "fake_checks_cputime.py").write_text(FAKE_CHECKS)
    (tmp_path / "stalled.ipynb").write_bytes(nb(BUSY, "busy(1.2)\nx = 1", "def fast():\n    return x"))
    (tmp_path / "busy.ipynb").write_bytes(nb(DEFS, "busy(30)", "y = 2"))
    proc = subprocess.Popen([str(readable_python), "-c", RUN_FALLBACK, str(ROOT), str(tmp_path),
                             json.dumps(asdict(LIMITS)), str(tmp_path / "stalled.ipynb"), str(tmp_path / "busy.ipynb"),
                             json.dumps(PROBES)], stdout=subprocess.PIPE, text=True, env={"PATH": "/usr/bin:/bin"})
    said: list[str] = []
    deadline = time.monotonic() + 300
    while not said and proc.poll() is None and time.monotonic() < deadline:
        for pid in _below(proc.pid):
            try:
                uid = Path(f"/proc/{pid}").stat().st_uid
            except OSError:
                continue
            if uid >= UID_BASE and _cpu_of(int(pid)) >= 0.3:
                os.kill(int(pid), signal.SIGSTOP)
                time.sleep(STALL_S)
                os.kill(int(pid), signal.SIGCONT)
                said.append(pid)
                break
        time.sleep(0.01)
    out, _ = proc.communicate(timeout=600)
    found = json.loads(out.strip().splitlines()[-1])
    assert found["isolation"] == "unprivileged uid" and said, (found["isolation"], said)
    stalled, busy = found["stalled"], found["busy"]
    assert stalled["status"] == Status.GRADED and stalled["outputs"]["qa/fast"] == {"value": 1}, stalled["notes"]
    assert any("nothing was charged" in n for n in stalled["notes"]), stalled["notes"]
    assert busy["stopped_cells"] == [2] and "in CPU time" in busy["not_run"]["qb/spin"], busy["notes"]
    assert {k for k in busy["not_run"] if k.startswith("qc/")} == {"qc/h4"}, busy["not_run"]


def test_the_grades_row_says_when_the_machine_slowed_a_step_and_nothing_was_charged() -> None:
    """A step the machine slowed past its limit on the clock, its CPU time under the limit, costs nothing, and the
    row in grades.csv says so (not only the results JSON's notes)."""
    from autograder.model import UNCHARGED, CaseResult, SubmissionResult

    case = CaseResult("qa/fast", "qa", 1.0, 1.0, True, False)
    quiet = SubmissionResult("s", Status.GRADED, [case])
    slowed = SubmissionResult("s", Status.GRADED, [case],
                              notes=[f"cell 2 ran 7.0 s on the wall clock, past its limit of 2 s, with 0.1 s of CPU "
                                     f"time: {UNCHARGED}"])
    assert quiet.csv_row(["qa"])["message"] == ""
    row = slowed.csv_row(["qa"])
    assert row["total"] == 1.0 and "slowed 1 step(s)" in row["message"] and "nothing was charged" in row["message"]
