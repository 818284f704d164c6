"""The child: runs the student's cells in IPython and answers the grader's probe requests."""

from __future__ import annotations

import ast
import contextlib
import io
import logging
import os
import sys
import time
import traceback
from _thread import allocate_lock
from functools import partial
from typing import Any, NoReturn

from autograder import wire
from autograder.sandbox.frames import HARNESS_FAILED, JOB_FD, LEN, SETUP_FAILED, recv_exact
from autograder.sandbox.guard import TamperGuard
from autograder.sandbox.isolation import confine_job, write_file
from autograder.sandbox.limits import MIB, Limits
from autograder.sandbox.tripwire import install, trusted_roots

log = logging.getLogger(__name__)

_OOM_TYPES = ("MemoryError", "_ArrayMemoryError", "OutOfMemoryError")


def _describe(exc: BaseException) -> tuple[str, str]:
    try:
        name = type(exc).__name__
        text = str(exc)[:300]
    except BaseException:  # noqa: BLE001 - a student exception may break its own __str__
        return "Exception", "<unprintable>"
    return name, text


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    name, text = _describe(exc)
    return name == "OutOfMemoryError" or "can't allocate memory" in text or "not enough memory" in text


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(BaseException):
            stream.flush()


def child_main(fds: list[int], limits: Limits, shell: Any, guard: TamperGuard, run_probe: Any,
           suspicious: list[str] | None, scratch: str, uid: int | None, *, tripwire: bool = True) -> NoReturn:
    """Runs in the forked child: confine, install the tripwire (unless a test of the layers beneath turns it off),
    receive the cells from the grader, run them, then answer the grader's probe requests (a frame of public ones,
    then one of hidden ones) in order; exits without returning."""
    # Everything that encodes and writes a frame was taken before student code ran (the encoder by the zygote):
    # a patched json, base64, os or struct cannot strip or rewrite what the child reports.
    write, exit_, getpid, encode, decode, sanitize = os.write, os._exit, os.getpid, guard.encode, wire.decode, \
        wire.sanitize
    pack_len, check_encoder, wire_error, view_of = LEN.pack, guard.check_encoder, wire.WireError, memoryview
    res_cap = limits.result_mb * MIB
    me, parent = getpid(), os.getppid()
    # the child's CPU per step, reported in its frames for the benchmark's split: this thread's clock, exact; the
    # process clock advances in scheduler ticks while RLIMIT_CPU is set, and credits a step's time to whichever
    # later step blocks first (a frame's write), so it showed the probes' time as frame traffic
    clock = time.thread_time

    # One frame at a time on the channel: the tripwire reports from whichever thread tripped it, at once when the
    # channel is free, else right after the frame being written (`trips` waits there, in this closure).
    lock, trips = allocate_lock(), []

    def put(data: bytes) -> None:
        view = view_of(pack_len(len(data)) + data)
        while view:
            view = view[write(JOB_FD, view):]

    def flush() -> None:
        while trips:
            put(encode({"t": "trip", **trips.pop(0)}, res_cap))

    def send(msg: dict[str, Any]) -> None:
        if getpid() != me:
            exit_(0)
        changed = check_encoder()
        if changed and type(msg.get("tamper")) is list:
            msg["tamper"] += changed
        try:
            data = encode(msg, res_cap)
        except wire_error as exc:
            data = encode({**msg, "value": {"error": {"type": "WireError", "message": str(exc)[:300]}}}, res_cap)
        with lock:
            put(data)
            flush()

    def report(record: dict[str, Any]) -> None:
        """A tripped event, to the grader before the student's code goes on (a forked process of the student's
        reports nothing: its frames would cross the child's)."""
        if getpid() != me:
            return
        trips.append(record)
        if lock.acquire(False):
            try:
                flush()
            finally:
                lock.release()

    def recv() -> dict[str, Any] | None:
        head = recv_exact(JOB_FD, LEN.size)
        data = None if head is None else recv_exact(JOB_FD, LEN.unpack(head)[0])
        msg = None if data is None else decode(data, max_bytes=len(data))
        return msg if type(msg) is dict else None

    try:
        job_fd, out_fd = fds
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        os.dup2(job_fd, JOB_FD)  # the zygote's fds 0-2 are taken, so neither channel is 0, 1 or 2
        os.closerange(JOB_FD + 1, 1 << 20)  # the control socket, the zygote's other fds
        sys.stdout, sys.stderr = (io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding="utf-8",
                                                   errors="backslashreplace") for fd in (1, 2))
        # born in the worker's cgroups (the zygote lives there); first in line when memory runs out, before the zygote
        with contextlib.suppress(OSError):
            write_file("/proc/self/oom_score_adj", "1000")
        confine_job(scratch, limits, uid)
        if os.getppid() != parent:
            exit_(SETUP_FAILED)  # the zygote died before the line above
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(limits.threads)
        # the tripwire, last: the job is confined, and no code of the student's has run (docs/guarantees.md)
        enter = install(report=report, roots=trusted_roots(exclude=(scratch, os.getcwd()))) if tripwire \
            else _untripped
        setup_cpu = clock()  # fork (page faults of the copy), limits, until the cells can be received
        job = recv()
        if job is None or job.get("t") != "cells":
            exit_(SETUP_FAILED)
    except BaseException:  # noqa: BLE001
        with contextlib.suppress(BaseException):
            send({"t": "fail", "text": "sandbox setup failed: " + traceback.format_exc()[-400:]})
        exit_(SETUP_FAILED)

    try:
        for i, src in job["cells"]:
            began = clock()
            enter(i)
            try:
                result = shell.run_cell(src, store_history=True)
                err = result.error_before_exec or result.error_in_exec
            except BaseException as exc:  # noqa: BLE001 - a cell that broke IPython itself
                err = exc
            facts = guard.sweep()
            _flush()
            if getpid() != me:
                exit_(0)
            how = None
            if isinstance(err, SystemExit) or shell.exit_now:
                how = f"cell {i} called " + (f"sys.exit({_describe(err)[1]})" if isinstance(err, SystemExit)
                                             else "exit()")
            note = None
            if err is not None and how is None:
                name, text = _describe(err)
                note = f"cell {i}: {name}: {text}"
            send({"t": "cell", "i": i, "note": note, "oom": err is not None and _is_oom(err), "tamper": facts,
                  "exit": how, "cpu": clock() - began})
            if how:
                exit_(0)
        enter(-1)
        send({"t": "cells_done", "cpu": setup_cpu})
        while (req := recv()) is not None and req.get("t") == "probes":
            nonce = str(req.get("nonce"))
            for key, name, args in req["probes"]:  # answered one by one, in the order asked
                began = clock()
                try:
                    value = run_probe(shell.user_ns, name, args)
                except BaseException as exc:  # noqa: BLE001 - SystemExit and friends from student code
                    ename, text = _describe(exc)
                    value = {"error": {"type": ename, "message": text, "where": "probe harness"}}
                guard.plant(nonce)
                facts = guard.sweep()
                if getpid() != me:
                    exit_(0)
                if suspicious:
                    facts += [f"suspicious probe output in {key!r}: {s}"[:200] for s in suspicious[:5]]
                    del suspicious[:]
                value = sanitize(value)
                err = value.get("error") if type(value) is dict else None
                oom = type(err) is dict and (err.get("type") in _OOM_TYPES
                                             or "can't allocate memory" in str(err.get("message", "")))
                send({"t": "out", "key": key, "value": value, "oom": oom, "tamper": facts, "cpu": clock() - began})
        _flush()
        exit_(0)
    except BaseException:  # noqa: BLE001 - anything escaping the harness is a crash, reported as such
        with contextlib.suppress(BaseException):
            send({"t": "fail", "text": "the grading harness failed: " + traceback.format_exc()[-400:]})
        exit_(HARNESS_FAILED)


def _untripped(cell: int) -> None:
    """No tripwire: a test of the layers beneath it (WorkerPool(tripwire=False))."""


def install_otter_stub() -> None:
    """Notebooks start with `grader = otter.Notebook(...)`; in the sandbox its checks and export do nothing."""
    import types

    class Notebook:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def __getattr__(self, name: str) -> Any:
            return lambda *args, **kwargs: None

    stub = types.ModuleType("otter", "stand-in: grading never runs Otter inside the student's process")
    stub.Notebook = Notebook  # type: ignore[attr-defined]
    sys.modules["otter"] = stub


def make_shell() -> Any:
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    config = Config()
    config.HistoryManager.enabled = False
    config.InteractiveShell.colors = "nocolor"
    config.InteractiveShell.xmode = "Plain"
    shell = InteractiveShell.instance(config=config)
    shell.ask_exit = lambda: setattr(shell, "exit_now", True)  # exit() and quit() as in a kernel
    parsed: dict[str, Any] = {}  # the fast path's parse of the cell being run, for IPython's own parse of it
    shell.transform_cell = partial(transform_cell, shell.transform_cell, parsed=parsed, compiler=shell.compile)
    shell.compile.ast_parse = partial(_ast_parse, shell.compile.ast_parse, parsed=parsed, compiler=shell.compile)
    shell.should_run_async = partial(_should_run_async, shell.should_run_async)
    return shell


def transform_cell(ipython_transform: Any, raw_cell: str, *, parsed: dict[str, Any] | None = None,
                    compiler: Any = None) -> str:
    """IPython's input transformation, skipped where it returns the cell unchanged: a cell of several lines that
    starts with neither a blank line nor indentation and parses as Python holds no magic, shell escape, help
    request or prompt (each is a syntax error in Python), and single-line cells, where IPython may turn a bare
    name into a magic, always take IPython's path. Tokenizing every cell was about a third of a notebook's
    cell time. The parse (with the shell's compiler flags, as IPython parses) is kept in `parsed` for
    `_ast_parse`, which IPython calls next on the same text."""
    cell = raw_cell if raw_cell.endswith("\n") else raw_cell + "\n"
    if parsed is not None:
        parsed.clear()
    if cell.count("\n") > 1 and not cell[:1].isspace():
        flags = getattr(compiler, "flags", 0)
        try:
            tree = compile(cell, "<cell>", "exec", flags | ast.PyCF_ONLY_AST, True)
        except (SyntaxError, ValueError):
            pass
        else:
            if parsed is not None:
                parsed.update(cell=cell, flags=flags, tree=tree)
            return cell
    return ipython_transform(raw_cell)


def _ast_parse(ipython_parse: Any, source: str, filename: str = "<unknown>", symbol: str = "exec", *,
               parsed: dict[str, Any], compiler: Any) -> Any:
    """IPython's CachingCompiler.ast_parse, answered once from the fast path's parse of the very same text under
    the same flags (a syntax tree does not hold a file name): each cell is parsed once, not twice."""
    if (symbol == "exec" and parsed.get("cell") is source and parsed.get("flags") == getattr(compiler, "flags", 0)):
        tree = parsed["tree"]
        parsed.clear()
        return tree
    return ipython_parse(source, filename, symbol)


def _should_run_async(ipython_check: Any, raw_cell: str, *, transformed_cell: str | None = None,
                      preprocessing_exc_tuple: Any = None) -> bool:
    """IPython's check for top-level await, which compiles the whole cell to find out: a cell without the words
    `await` and `async` cannot hold a top-level await, async for or async with, so the answer is False without it."""
    if type(transformed_cell) is str and "await" not in transformed_cell and "async" not in transformed_cell:
        return False
    return ipython_check(raw_cell, transformed_cell=transformed_cell, preprocessing_exc_tuple=preprocessing_exc_tuple)
