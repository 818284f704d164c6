"""Execution stage: run student notebooks in a sandbox, call probes inside them and return plain data.

Layout. A WorkerPool starts one warm *zygote* per worker, inside bubblewrap when it works: a Python process
with numpy, torch, IPython and the probe module imported. It forks one child per submission; the child
drops to an unprivileged uid (when the grader runs as root), applies rlimits, runs the notebook's code
cells in-process with IPython's InteractiveShell, calls the probes and streams framed wire messages
(never pickles) back. The zygote watches the child (wall clock, CPU, exit status, output caps), kills
the child's whole process tree afterwards and replies to the grader. Judging happens in the grader.

Threat model, briefly. Student code is hostile and runs with the child's privileges.
- Sandbox: no network (own net namespace); the system is read-only; /tmp, /root, /home, the repository
  (so reference/ and hidden tests) and any `hide` path are empty tmpfs, except the Python installation;
  cwd and $HOME are a fresh scratch dir on a size-capped tmpfs; /proc shows only the sandbox. Without
  bubblewrap only the rlimits, the scratch dir and (as root) the uid drop remain: said once in the log.
- Limits: RLIMIT_AS (memory), RLIMIT_CPU, RLIMIT_NPROC (fork bombs; the child gets its own uid as
  root, since root ignores RLIMIT_NPROC), RLIMIT_FSIZE, RLIMIT_CORE; wall clock and captured output
  (the rest is read and discarded) are enforced by the zygote.
- Forgery: stdout/stderr go to a separate pipe, so nothing printed can become a result. The result
  pipe (fd 3 in the child) is reachable by code in the child, so a determined student could write
  probe outputs there; that is no stronger than hard-coding return values, because the grader computes
  the expected values itself. What the zygote reports (exit status, signal, timeout, CPU time) comes
  from outside the child and cannot be forged. The zygote is not dumpable, so the child cannot open
  its fds through /proc; the wire format is strict JSON, and any malformed stream makes the run crash.
- Tampering: identities of numpy/torch comparison functions, builtins, sys.modules entries and the
  globals (and function code) of the probe, wire and execute modules are recorded before student code
  runs; changes are reported as facts and undone after every cell and probe, so the harness keeps
  working. The facts come from the child: best-effort evidence for the report; scores never use them.
- Between submissions: the child's process tree is killed, the scratch tmpfs and /dev/shm are wiped;
  each child is a fresh fork of the untouched zygote. The zygote exits when its stdin closes.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import importlib
import importlib.util
import io
import json
import logging
import os
import queue
import resource
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from autograder import wire

log = logging.getLogger(__name__)

STATUSES = ("ok", "timeout", "oom", "unreadable", "crashed", "tampering")
SKIP_TAGS = ("long-running", "milestone-train")
PROBE_MODULE = "autograder.lesson83_checks"
PRELOAD = ("numpy", "torch", "IPython.core.interactiveshell")
MAX_NOTEBOOK_BYTES = 64 * 2**20
Probe = tuple[str, str, dict[str, Any]]

_WARNED: set[str] = set()
_VISIBLE_ROOTS = {"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/dev", "/proc", "/sys"}
_SANDBOX_STAGE = "/tmp/grader"
_SANDBOX_SCRATCH = "/tmp/scratch"
_UID_BASE = 1_500_000_000
_RESULT_FD = 3
_SETUP_FAILED, _HARNESS_FAILED = 70, 71
_LEN = struct.Struct(">Q")
_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE, _PR_SET_CHILD_SUBREAPER, _PR_SET_NO_NEW_PRIVS = 1, 4, 36, 38
_OOM_TYPES = ("MemoryError", "_ArrayMemoryError", "OutOfMemoryError")
_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER")
_GUARDED = (
    ("numpy", "allclose"), ("numpy", "isclose"), ("numpy", "array_equal"), ("numpy", "ndarray"),
    ("numpy.testing", "assert_allclose"), ("numpy.testing", "assert_array_equal"),
    ("numpy.testing", "assert_array_almost_equal"), ("numpy.testing", "assert_equal"),
    ("torch", "allclose"), ("torch", "isclose"), ("torch", "equal"), ("torch", "Tensor"),
    ("torch.testing", "assert_close"), ("torch", "Tensor.__eq__"), ("torch", "Tensor.allclose"),
    ("json", "dumps"), ("json", "loads"), ("base64", "b64encode"), ("os", "write"), ("os", "_exit"),
)
_GUARDED_MODULES = ("builtins", "sys", "os", "json", "base64", "numpy", "numpy.testing", "torch",
                    "torch.testing", "autograder.wire", "autograder.execute")


@dataclass(frozen=True)
class Limits:
    """Per-submission limits, as in grading_config.yaml's `execution` section (wall_timeout_s: wall_s...).

    scratch_mb (the scratch tmpfs) and threads (torch/BLAS threads) are fixed when a pool starts.
    """

    wall_s: float = 60.0
    cpu_s: int = 60
    memory_mb: int = 4096
    processes: int = 64
    file_mb: int = 64
    output_kb: int = 256
    result_mb: int = 64
    scratch_mb: int = 512
    threads: int = 1


@dataclass
class ExecResult:
    """What happened to one submission: a status, the probe outputs (plain data) and short notes."""

    status: str
    outputs: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    skipped_cells: list[int] = field(default_factory=list)
    tampering: list[str] = field(default_factory=list)
    stdout: str = ""
    wall_s: float = 0.0
    cpu_s: float = 0.0
    sandbox: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class NotebookError(ValueError):
    """A submission that cannot be read as a Jupyter notebook."""


class WorkerError(RuntimeError):
    """A zygote that failed to start or stopped answering."""


# --------------------------------------------------------------------------- grader side


def read_notebook(source: bytes, *,
                  skip_tags: Iterable[str] = SKIP_TAGS) -> tuple[list[tuple[int, str]], list[int]]:
    """Code cells to run as (cell index, source), and the indices of cells skipped for their tags."""
    if type(source) is not bytes:
        raise NotebookError(f"expected the notebook's bytes, got {type(source).__name__}")
    if not source.strip():
        raise NotebookError("the file is empty")
    if len(source) > MAX_NOTEBOOK_BYTES:
        raise NotebookError(f"the file is {len(source)} bytes, over the {MAX_NOTEBOOK_BYTES} byte cap")
    try:
        nb = json.loads(source.decode("utf-8-sig"))
    except UnicodeDecodeError:
        raise NotebookError("not a notebook: the file is not UTF-8 text (a zip, pickle or binary?)") from None
    except (ValueError, RecursionError) as exc:
        raise NotebookError(f"not a notebook: the file is not valid JSON ({str(exc)[:120]})") from None
    if type(nb) is not dict or type(nb.get("cells")) is not list:
        if type(nb) is dict and "worksheets" in nb:
            raise NotebookError("notebook format 3 is not supported: open and save it in Jupyter first")
        raise NotebookError("not a notebook: valid JSON, but without a list of cells")
    skip = set(skip_tags)
    cells: list[tuple[int, str]] = []
    skipped: list[int] = []
    for i, cell in enumerate(nb["cells"]):
        if type(cell) is not dict:
            raise NotebookError(f"not a notebook: cell {i} is not an object")
        if cell.get("cell_type") != "code":
            continue
        src = cell.get("source", "")
        if type(src) is list and all(type(s) is str for s in src):
            src = "".join(src)
        meta = cell.get("metadata", {})
        tags = meta.get("tags", []) if type(meta) is dict else []
        if type(src) is not str or type(tags) is not list:
            raise NotebookError(f"not a notebook: cell {i} has a malformed source or tags")
        if skip.intersection(t for t in tags if type(t) is str):
            skipped.append(i)
        else:
            cells.append((i, src))
    return cells, skipped


class WorkerPool:
    """Warm sandboxed zygotes that run submissions in parallel, one at a time per worker."""

    def __init__(self, size: int = 1, *, limits: Limits = Limits(), probe_module: str = PROBE_MODULE,
                 skip_tags: Iterable[str] = SKIP_TAGS, hide: Iterable[str | Path] = (),
                 sandbox: str = "auto", preload: Iterable[str] = PRELOAD, start_timeout_s: float = 180.0):
        if sandbox not in ("auto", "bwrap", "none"):
            raise ValueError(f"sandbox must be 'auto', 'bwrap' or 'none', got {sandbox!r}")
        self.limits, self.probe_module, self.skip_tags = limits, probe_module, tuple(skip_tags)
        self._closed = False
        self._tmp = Path(tempfile.mkdtemp(prefix="grader-"))
        self._tmp.chmod(0o755)
        stage = self._tmp / "stage"
        try:
            _stage_modules(stage, probe_module)
            self.sandbox, why = _choose_sandbox(sandbox)
        except BaseException:
            shutil.rmtree(self._tmp, ignore_errors=True)
            raise
        if why and why not in _WARNED:
            _WARNED.add(why)
            log.warning("%s", why)
        root = os.geteuid() == 0
        workers = []
        for i in range(max(1, size)):
            uid = _UID_BASE + (os.getpid() % 100_000) * 64 + i if root else None
            if self.sandbox == "none" and not all(map(_world_readable, (sys.prefix, sys.base_prefix))):
                uid = None  # the child could not import from a Python it cannot read
            workers.append(_Worker(i, self, stage, uid, tuple(hide), tuple(preload), start_timeout_s))
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

    def run(self, source: bytes, *, probes: list[Probe]) -> ExecResult:
        """Run one notebook and its probes; never raises for anything the submission does."""
        if self._closed:
            raise RuntimeError("the worker pool is closed")
        start = time.monotonic()
        _check_probes(probes)
        try:
            cells, skipped = read_notebook(source, skip_tags=self.skip_tags)
        except NotebookError as exc:
            return ExecResult("unreadable", notes=[str(exc)], wall_s=time.monotonic() - start,
                              sandbox=self.sandbox)
        job = {"cells": [[i, s] for i, s in cells], "probes": [[k, n, a] for k, n, a in probes],
               "limits": asdict(self.limits)}
        worker = self._idle.get()
        try:
            try:
                header, output, stream = worker.run(wire.encode(job, max_bytes=4 * MAX_NOTEBOOK_BYTES))
            except (WorkerError, OSError) as exc:
                worker.restart()
                result = ExecResult("crashed", notes=[f"the sandbox worker failed: {exc}"])
            else:
                result = _classify(header, output, stream, probes, self.limits)
        finally:
            self._idle.put(worker)
        result.skipped_cells = skipped
        if skipped:
            result.notes.insert(0, f"skipped cells {skipped} (tagged {' or '.join(self.skip_tags)})")
        result.wall_s = time.monotonic() - start
        result.sandbox = self.sandbox
        return result

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
        shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_POOLS: dict[tuple[Any, ...], WorkerPool] = {}
_POOLS_LOCK = threading.Lock()


def execute_submission(source: bytes, *, probes: list[Probe], limits: Limits = Limits(),
                       skip_tags: Iterable[str] = SKIP_TAGS, probe_module: str = PROBE_MODULE,
                       hide: Iterable[str | Path] = ()) -> ExecResult:
    """Run one notebook on a warm one-worker pool kept for these options until the process exits."""
    key = (limits, tuple(skip_tags), probe_module, tuple(map(str, hide)))
    with _POOLS_LOCK:
        if key not in _POOLS:
            _POOLS[key] = WorkerPool(1, limits=limits, probe_module=probe_module, skip_tags=skip_tags,
                                     hide=hide)
        pool = _POOLS[key]
    return pool.run(source, probes=probes)


def execute_batch(items: Iterable[tuple[str, bytes]], *, probes: list[Probe], limits: Limits = Limits(),
                  skip_tags: Iterable[str] = SKIP_TAGS, probe_module: str = PROBE_MODULE,
                  workers: int | None = None,
                  hide: Iterable[str | Path] = ()) -> Iterator[tuple[str, ExecResult]]:
    """Run many (id, notebook bytes) pairs on a fresh pool (one worker per core by default)."""
    with WorkerPool(workers or os.cpu_count() or 1, limits=limits, probe_module=probe_module,
                    skip_tags=skip_tags, hide=hide) as pool:
        yield from pool.run_many(items, probes=probes)


@atexit.register
def _close_pools() -> None:
    for pool in _POOLS.values():
        pool.close()


def _check_probes(probes: list[Probe]) -> None:
    keys = [p[0] for p in probes]
    if len(set(keys)) != len(keys) or not all(type(k) is str and type(n) is str for k, n, _ in probes):
        raise ValueError("probes must be (case_key, probe_name, args) with unique str keys")


def _choose_sandbox(wanted: str) -> tuple[str, str]:
    if wanted == "none":
        return "none", "sandbox: none requested; running with resource limits only"
    exe = shutil.which("bwrap")
    if exe is None:
        msg = "bubblewrap (bwrap) is not installed"
    else:
        argv = [exe, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-net",
                "--unshare-pid", "true"]
        probe = subprocess.run(argv, capture_output=True, text=True)
        if probe.returncode == 0:
            return "bwrap", ""
        msg = f"bubblewrap does not work here: {probe.stderr.strip()[:200]}"
    if wanted == "bwrap":
        raise WorkerError(msg)
    return "none", f"sandbox: {msg}; falling back to resource limits only (no network or file isolation)"


def _stage_modules(stage: Path, probe_module: str) -> None:
    """Copy only this module, wire.py, the probe module and the shipped milestone trainer into a folder the
    sandbox sees read-only."""
    spec = importlib.util.find_spec(probe_module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise WorkerError(f"cannot find the source of probe module {probe_module!r}")
    here = Path(__file__).resolve().parent
    files = {"autograder/__init__.py": "", "autograder/wire.py": (here / "wire.py").read_text(),
             "autograder/execute.py": Path(__file__).read_text()}
    parts = probe_module.split(".")
    for n in range(1, len(parts)):
        files.setdefault("/".join(parts[:n]) + "/__init__.py", "")
    files["/".join(parts) + ".py"] = Path(spec.origin).read_text()
    # Student notebooks import the shipped milestone trainer at top level (its training cells never run here).
    files["lesson83_milestone.py"] = (here / "lesson83_milestone.py").read_text()
    for rel, text in files.items():
        path = stage / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for path in [stage, *stage.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)


def _world_readable(path: str) -> bool:
    p = Path(path).resolve()
    return all(os.stat(d).st_mode & 0o005 == 0o005 for d in [p, *p.parents])


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _bwrap_argv(stage: Path, hide: tuple[str | Path, ...], limits: Limits) -> tuple[list[str], list[str]]:
    """bubblewrap arguments, and the sys.path the zygote should use inside."""
    repo = str(Path(__file__).resolve().parent.parent)
    prefixes = sorted({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)})
    # Allow-list: only the system folders stay visible; every other top-level folder (/work, /srv, /opt,
    # other checkouts of this repository ...) is an empty tmpfs, with the Python installation bound back in.
    others = [os.path.join("/", d) for d in os.listdir("/") if os.path.join("/", d) not in _VISIBLE_ROOTS]
    hidden = sorted({os.path.realpath(p) for p in ("/tmp", "/root", "/home", repo, *others, *hide)
                     if os.path.isdir(p) and not os.path.islink(p)}, key=len)
    top = [h for h in hidden if not any(h != o and _under(h, o) for o in hidden)]
    path = [p for p in map(os.path.realpath, sys.path) if p and os.path.isdir(p)
            and (any(_under(p, x) for x in prefixes) or not any(_under(p, h) for h in top))]
    argv = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
            "--perms", "1777", "--size", str(64 * 2**20), "--tmpfs", "/dev/shm",
            "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--new-session"]
    for h in top:
        argv += ["--tmpfs", h]
        for p in prefixes:
            if _under(p, h) and p != h:
                parents = [str(d) for d in reversed(Path(p).parents) if _under(str(d), h) and str(d) != h]
                argv += [a for d in parents for a in ("--perms", "0755", "--dir", d)] + ["--ro-bind", p, p]
        if h == "/tmp":
            argv += ["--ro-bind", str(stage), _SANDBOX_STAGE,
                     "--perms", "0755", "--size", str(limits.scratch_mb * 2**20), "--tmpfs", _SANDBOX_SCRATCH]
        argv += ["--remount-ro", h]
    if os.geteuid() == 0:
        argv += ["--cap-drop", "ALL"] + [a for c in _CAPS for a in ("--cap-add", c)]
    return argv, path


class _Worker:
    """One zygote process and the pipes to it."""

    def __init__(self, index: int, pool: WorkerPool, stage: Path, uid: int | None,
                 hide: tuple[str | Path, ...], preload: tuple[str, ...], start_timeout_s: float):
        self.index, self.pool, self.stage, self.uid = index, pool, stage, uid
        self.hide, self.preload, self.start_timeout_s = hide, preload, start_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = pool._tmp / f"worker{index}.log"

    def start(self) -> str:
        """Start the zygote and wait until it is warm; returns an error message, or '' when ready."""
        limits = self.pool.limits
        threads = str(limits.threads)
        env = {"PATH": f"{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
               "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "OPENBLAS_NUM_THREADS": threads,
               "MPLBACKEND": "Agg", "PYTHONDONTWRITEBYTECODE": "1"}
        if self.pool.sandbox == "bwrap":
            prefix, path = _bwrap_argv(self.stage, self.hide, limits)
            stage, scratch, wipe = _SANDBOX_STAGE, _SANDBOX_SCRATCH, [_SANDBOX_SCRATCH, "/dev/shm"]
        else:
            prefix, path = [], [p for p in sys.path if p and os.path.isdir(p)]
            stage, scratch = str(self.stage), str(self.pool._tmp / f"scratch{self.index}")
            wipe = [scratch]
            os.makedirs(scratch, mode=0o711, exist_ok=True)
        env.update(HOME=scratch, TMPDIR=scratch)
        cfg = {"path": [stage, *path], "probe_module": self.pool.probe_module, "preload": list(self.preload),
               "scratch": scratch, "wipe": wipe, "uid": self.uid}
        code = "import sys; sys.path[:] = __import__('json').loads(sys.argv[1])['path']; " \
               "import autograder.execute as e; e._zygote_main(sys.argv[1])"
        argv = [*prefix, sys.executable, "-I", "-c", code, json.dumps(cfg)]
        with open(self.log_path, "ab") as err:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                         env=env, cwd="/", start_new_session=True)
        try:
            ready = wire.decode(self._read(time.monotonic() + self.start_timeout_s, 1 << 20))
        except (WorkerError, wire.WireError) as exc:
            self.kill()
            return f"worker {self.index} did not start: {exc}; log: {self._log_tail()}"
        if type(ready) is not dict or ready.get("ready") is not True:
            self.kill()
            return f"worker {self.index} did not start: {ready}"
        return ""

    def run(self, job: bytes) -> tuple[dict[str, Any], bytes, bytes]:
        limits = self.pool.limits
        if self.proc is None or self.proc.poll() is not None:
            raise WorkerError("the worker is not running")
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(_LEN.pack(len(job)) + job)
            self.proc.stdin.flush()
        except OSError as exc:
            raise WorkerError(f"cannot send the job: {exc}") from exc
        deadline = time.monotonic() + limits.wall_s + 60
        try:
            header = wire.decode(self._read(deadline, 1 << 20))
        except wire.WireError as exc:
            raise WorkerError(f"malformed reply header: {exc}") from exc
        output = self._read(deadline, limits.output_kb * 1024 + 1)
        stream = self._read(deadline, limits.result_mb * 2**20 + 1)
        if type(header) is not dict:
            raise WorkerError("malformed reply header")
        return header, output, stream

    def _read(self, deadline: float, cap: int) -> bytes:
        assert self.proc is not None and self.proc.stdout is not None
        head = _read_exact(self.proc.stdout.fileno(), _LEN.size, deadline)
        (n,) = _LEN.unpack(head)
        if n > cap:
            raise WorkerError(f"reply of {n} bytes is over the cap of {cap}")
        return _read_exact(self.proc.stdout.fileno(), n, deadline)

    def restart(self) -> None:
        self.kill()
        err = self.start()
        if err:
            log.error("%s", err)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-1500:].strip() or "(empty)"
        except OSError:
            return "(no log)"


def _read_exact(fd: int, n: int, deadline: float) -> bytes:
    buf = bytearray()
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while len(buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WorkerError("the worker did not answer in time")
            if not sel.select(left):
                continue
            chunk = os.read(fd, min(n - len(buf), 1 << 20))
            if not chunk:
                raise WorkerError("the worker exited")
            buf += chunk
    return bytes(buf)


def _classify(header: dict[str, Any], output: bytes, stream: bytes, probes: list[Probe],
              limits: Limits) -> ExecResult:
    """Turn the zygote's facts and the child's message stream into an ExecResult."""
    res = ExecResult("ok", cpu_s=float(header.get("cpu_s", 0.0)))
    res.stdout = output[: limits.output_kb * 1024].decode("utf-8", errors="replace")
    total = int(header.get("output_total", 0))
    if total > len(output):
        res.notes.append(f"output truncated: kept {len(output)} of {total} bytes")
    wanted = {p[0] for p in probes}
    where, done, exited, oom, malformed = "while starting", False, "", "", ""
    for msg in _frames(stream):
        if msg is None:
            malformed = "the result stream from the sandbox was malformed; the rest was ignored"
            break
        t, key = msg.get("t"), msg.get("key")
        if t == "cell" and type(msg.get("i")) is int:
            where = f"in cell {msg['i']}"
        elif t == "probe" and type(key) is str and key in wanted:
            where = f"in probe {key!r}"
        elif t == "note" and type(msg.get("text")) is str:
            if len(res.notes) < 50:
                res.notes.append(msg["text"][:500])
        elif t == "oom":
            oom = oom or where
        elif t == "exit" and type(msg.get("text")) is str:
            exited = msg["text"][:300]
        elif t == "tamper" and type(msg.get("facts")) is list:
            new = [f[:200] for f in msg["facts"] if type(f) is str and f[:200] not in res.tampering]
            res.tampering += new[: max(0, 50 - len(res.tampering))]
        elif t == "out" and type(key) is str and key in wanted and "value" in msg:
            res.outputs.setdefault(key, msg["value"])
        elif t == "done":
            done = True
            where = "after the probes"
        else:
            malformed = "the result stream from the sandbox held an unexpected message; the rest was ignored"
            break
    sig, code = header.get("signal"), header.get("exit_code")
    if header.get("timed_out"):
        res.status = "timeout"
        res.notes.append(f"wall-clock limit of {limits.wall_s:g} s reached {where}")
    elif header.get("cpu_exceeded"):
        res.status = "timeout"
        res.notes.append(f"CPU-time limit of {limits.cpu_s} s reached {where}")
    elif oom:
        res.status = "oom"
        res.notes.append(f"out of memory (limit {limits.memory_mb} MB) {oom}")
    elif sig == signal.SIGKILL and not header.get("killed"):
        res.status = "oom"
        res.notes.append(f"killed by SIGKILL {where}: most likely out of memory ({limits.memory_mb} MB)")
    elif exited:
        res.status = "crashed"
        res.notes.append(f"{exited}; the notebook stopped there and no probe ran")
    elif header.get("result_overflow"):
        res.status = "crashed"
        res.notes.append(f"the results were over the {limits.result_mb} MB cap")
    elif sig is not None:
        res.status = "crashed"
        res.notes.append(f"the process was killed by signal {_signame(sig)} {where}")
    elif malformed:
        res.status = "crashed"
        res.notes.append(malformed)
    elif code in (_SETUP_FAILED, _HARNESS_FAILED):
        res.status = "crashed"
        res.notes.append(f"the harness inside the sandbox failed {where} (were its pipes broken?)")
    elif not done or code != 0:
        res.status = "crashed"
        res.notes.append(f"the process exited with code {code} {where} (sys.exit or os._exit?)")
    elif res.tampering:
        res.status = "tampering"
    missing = [k for k, _, _ in probes if k not in res.outputs]
    if missing and not exited:
        res.notes.append(f"{len(missing)} of {len(probes)} probes returned nothing")
    return res


def _frames(stream: bytes) -> Iterator[dict[str, Any] | None]:
    pos = 0
    while pos < len(stream):
        if pos + _LEN.size > len(stream):
            yield None
            return
        (n,) = _LEN.unpack_from(stream, pos)
        pos += _LEN.size
        if pos + n > len(stream):
            yield None
            return
        try:
            msg = wire.decode(stream[pos:pos + n])
        except wire.WireError:
            yield None
            return
        pos += n
        if type(msg) is not dict:
            yield None
            return
        yield msg


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return str(sig)


# --------------------------------------------------------------------------- sandbox side: zygote


def _prctl(option: int, arg: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")


def _send(fd: int, data: bytes) -> None:
    view = memoryview(_LEN.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _recv(fd: int) -> bytes | None:
    head = _recv_exact(fd, _LEN.size)
    return None if head is None else _recv_exact(fd, _LEN.unpack(head)[0])


def _recv_exact(fd: int, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _zygote_main(config_text: str) -> None:
    """Entry point inside the sandbox: import everything once, then fork one child per job."""
    cfg = json.loads(config_text)
    ctl_in, ctl_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    _prctl(_PR_SET_DUMPABLE, 0)
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    try:
        for name in cfg["preload"]:
            importlib.import_module(name)
        probes = importlib.import_module(cfg["probe_module"])
        _install_otter_stub()
        shell = _make_shell()
        guard = _Guard([*_GUARDED_MODULES, cfg["probe_module"]])
    except BaseException:  # noqa: BLE001 - report any start-up failure to the grader
        _send(ctl_out, wire.encode({"ready": False, "error": traceback.format_exc()[-3000:]}))
        return
    _send(ctl_out, wire.encode({"ready": True}))
    jobs = 0
    while (data := _recv(ctl_in)) is not None:
        jobs += 1
        job = wire.decode(data, max_bytes=len(data))
        header, output, stream = _run_job(job, shell, guard, probes.run_probe, cfg, jobs, ctl_in)
        _send(ctl_out, wire.encode(header))
        _send(ctl_out, output)
        _send(ctl_out, stream)
    os._exit(0)  # skip interpreter teardown (seconds with torch loaded)


def _install_otter_stub() -> None:
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


def _make_shell() -> Any:
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    config = Config()
    config.HistoryManager.enabled = False
    config.InteractiveShell.colors = "nocolor"
    config.InteractiveShell.xmode = "Plain"
    shell = InteractiveShell.instance(config=config)
    shell.ask_exit = lambda: setattr(shell, "exit_now", True)  # exit() and quit() as in a kernel
    return shell


def _run_job(job: dict[str, Any], shell: Any, guard: _Guard, run_probe: Any, cfg: dict[str, Any], n: int,
             ctl_in: int) -> tuple[dict[str, Any], bytes, bytes]:
    limits = Limits(**job["limits"])
    uid = cfg["uid"]
    scratch = tempfile.mkdtemp(prefix=f"job{n}-", dir=cfg["scratch"])
    if uid is not None:
        os.chown(scratch, uid, uid)
    out_r, out_w = os.pipe()
    res_r, res_w = os.pipe()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.close(out_r)
        os.close(res_r)
        _child(job, limits, shell, guard, run_probe, scratch, uid, out_w, res_w)
    os.close(out_w)
    os.close(res_w)
    header, output, stream = _watch(pid, out_r, res_r, ctl_in, limits, start)
    for folder in cfg["wipe"]:  # nothing a submission leaves behind may reach the next one
        for name in os.listdir(folder):
            path = os.path.join(folder, name)
            if os.path.isdir(path) and not os.path.islink(path):
                _rmtree(path)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(path)
    return header, output, stream


def _watch(pid: int, out_r: int, res_r: int, ctl_in: int, limits: Limits,
           start: float) -> tuple[dict[str, Any], bytes, bytes]:
    """Collect the child's output (capped) and messages until it exits or a limit is hit.

    The grader never writes during a job, so ctl_in turning readable means it went away: then the
    child's tree is killed and the zygote exits (which ends the sandbox).
    """
    out_cap, res_cap = limits.output_kb * 1024, limits.result_mb * 2**20
    output, stream = bytearray(), bytearray()
    total, status, rusage = 0, None, None
    timed_out = overflow = killed = False
    sel = selectors.DefaultSelector()
    pidfd = os.pidfd_open(pid)
    for fd in (out_r, res_r, pidfd, ctl_in):
        sel.register(fd, selectors.EVENT_READ)
    deadline = start + limits.wall_s

    def pump(fd: int) -> bool:
        nonlocal total, overflow
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            sel.unregister(fd)
            return False
        if fd == out_r:
            total += len(chunk)
            output.extend(chunk[: max(0, out_cap - len(output))])
        else:
            stream.extend(chunk)
            overflow = overflow or len(stream) > res_cap
        return True

    while status is None and not overflow:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        for key, _ in sel.select(left):
            if key.fd == pidfd:
                _, status, rusage = os.wait4(pid, 0)
            elif key.fd == ctl_in:
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)
                    os.kill(pid, signal.SIGKILL)
                _kill_descendants()
                os._exit(0)
            elif not overflow:
                pump(key.fd)
    if status is None:
        killed = True
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        _, status, rusage = os.wait4(pid, 0)
    _kill_descendants()
    sel.unregister(pidfd)
    sel.unregister(ctl_in)
    os.close(pidfd)
    drain_until = time.monotonic() + 2
    while sel.get_map() and time.monotonic() < drain_until and not overflow:
        for key, _ in sel.select(0.1):
            pump(key.fd)
    sel.close()
    os.close(out_r)
    os.close(res_r)
    cpu = rusage.ru_utime + rusage.ru_stime if rusage else 0.0
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    header = {"exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None, "signal": sig,
              "timed_out": timed_out, "killed": killed, "result_overflow": overflow, "cpu_s": cpu,
              "cpu_exceeded": sig == signal.SIGXCPU or (sig == signal.SIGKILL and not killed
                                                         and cpu >= limits.cpu_s - 0.5),
              "output_total": total, "wall_s": time.monotonic() - start}
    return header, bytes(output), bytes(stream[: res_cap + 1])


def _kill_descendants() -> None:
    """SIGKILL every process left below the zygote (it is a subreaper, so orphans come back to it)."""
    me = os.getpid()
    for _ in range(500):
        kids = []
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    with open(f"/proc/{name}/stat", "rb") as f:
                        stat = f.read()
                except OSError:
                    continue
                if int(stat[stat.rindex(b")") + 2:].split()[1]) == me:
                    kids.append(int(name))
        if not kids:
            return
        for kid in kids:
            with contextlib.suppress(OSError):
                os.kill(kid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        time.sleep(0.005)


def _rmtree(path: str) -> None:
    def fix(func: Any, p: str, _exc: Any) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
            func(p)

    shutil.rmtree(path, onerror=fix)


# --------------------------------------------------------------------------- sandbox side: child


class _Guard:
    """Identities of what a cheat would patch, recorded in the zygote before any student code runs."""

    _MISSING = object()

    def __init__(self, modules: list[str]):
        self.attrs: list[tuple[Any, str, str, Any]] = []
        for mod, dotted in _GUARDED:
            try:
                owner: Any = importlib.import_module(mod)
            except ImportError:
                continue
            *path, attr = dotted.split(".")
            for part in path:
                owner = getattr(owner, part, None)
            if owner is not None:
                self.attrs.append((owner, attr, f"{mod}.{dotted}", owner.__dict__.get(attr, self._MISSING)))
        self.modules = {m: sys.modules[m] for m in modules if m in sys.modules}
        self.builtins = vars(self.modules["builtins"])
        self.builtins_snap = dict(self.builtins)
        self.globals = [(vars(self.modules[m]), m, dict(vars(self.modules[m])))
                        for m in ("autograder.wire", "autograder.execute", modules[-1]) if m in self.modules]
        self.code = {id(f): (f, f.__code__, f.__defaults__, f.__kwdefaults__)
                     for _, _, snap in self.globals for f in snap.values() if type(f) is type(_make_shell)}
        self.tables = {id(d): (d, dict(d)) for _, _, snap in self.globals
                       for d in snap.values() if type(d) is dict}

    def sweep(self) -> list[str]:
        """Say what changed since the snapshot and undo it all, builtins first so the rest can run."""
        ns, snap, missing = self.builtins, self.builtins_snap, self._MISSING
        facts = [f"builtins.{k} was replaced" for k, v in snap.items() if ns.get(k, missing) is not v]
        ns.update(snap)
        for owner, attr, name, value in self.attrs:
            if owner.__dict__.get(attr, missing) is not value:
                facts.append(f"{name} was replaced")
                with contextlib.suppress(AttributeError, TypeError):
                    if value is missing:
                        delattr(owner, attr)
                    else:
                        setattr(owner, attr, value)
        for name, mod in self.modules.items():
            if sys.modules.get(name) is not mod:
                facts.append(f"sys.modules[{name!r}] was replaced")
                sys.modules[name] = mod
        for ns, name, snap in self.globals:
            facts += [f"{name}.{k} was replaced" for k, v in snap.items() if ns.get(k, missing) is not v]
            ns.update(snap)
        for f, code, defaults, kwdefaults in self.code.values():
            if f.__code__ is not code or f.__defaults__ is not defaults or f.__kwdefaults__ is not kwdefaults:
                facts.append(f"{f.__module__}.{f.__qualname__} was replaced (its code or defaults)")
                f.__code__, f.__defaults__, f.__kwdefaults__ = code, defaults, kwdefaults
        for d, snap in self.tables.values():
            if d.keys() != snap.keys() or any(d[k] is not v for k, v in snap.items()):
                facts.append(f"a table of the grader's modules was changed (keys {sorted(snap)[:3]})")
                d.clear()
                d.update(snap)
        return facts


def _count_tasks(uid: int) -> int:
    n = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{name}").st_uid == uid:
                    n += len(os.listdir(f"/proc/{name}/task"))
    return n


def _apply_limits(limits: Limits, uid: int | None) -> None:
    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    base = 1 if uid is not None else _count_tasks(os.getuid())
    for rlim, value in ((resource.RLIMIT_AS, vm + limits.memory_mb * 2**20),
                        (resource.RLIMIT_NPROC, base + limits.processes),
                        (resource.RLIMIT_FSIZE, limits.file_mb * 2**20), (resource.RLIMIT_CORE, 0),
                        (resource.RLIMIT_NOFILE, 1024)):
        resource.setrlimit(rlim, (value, value))
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)


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


def _child(job: dict[str, Any], limits: Limits, shell: Any, guard: _Guard, run_probe: Any, scratch: str,
           uid: int | None, out_w: int, res_w: int) -> NoReturn:
    """Runs in the forked child: confine, run the cells, run the probes, and exit without returning."""
    write, exit_, getpid, encode, to_plain = os.write, os._exit, os.getpid, wire.encode, wire.to_plain
    res_cap = limits.result_mb * 2**20
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_w, 1)
        os.dup2(out_w, 2)
        os.dup2(res_w, _RESULT_FD)  # the zygote's fds 0-3 are taken, so neither pipe end is 1, 2 or 3
        os.closerange(_RESULT_FD + 1, 1 << 20)
        sys.stdout, sys.stderr = (io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding="utf-8",
                                                   errors="backslashreplace") for fd in (1, 2))
        os.chdir(scratch)
        os.environ.update(HOME=scratch, TMPDIR=scratch, PWD=scratch)
        tempfile.tempdir = scratch
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        _apply_limits(limits, uid)
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(limits.threads)
    except BaseException:  # noqa: BLE001
        with contextlib.suppress(BaseException):
            msg = encode({"t": "note", "text": "sandbox setup failed: " + traceback.format_exc()[-400:]})
            write(_RESULT_FD, _LEN.pack(len(msg)) + msg)
        exit_(_SETUP_FAILED)
    me = getpid()

    def send(msg: dict[str, Any]) -> None:
        if getpid() != me:
            exit_(0)
        try:
            data = encode(msg, max_bytes=res_cap)
        except wire.WireError as exc:
            data = encode({**msg, "value": {"error": {"type": "WireError", "message": str(exc)[:300]}}})
        view = memoryview(_LEN.pack(len(data)) + data)
        while view:
            view = view[write(_RESULT_FD, view):]

    try:
        for i, src in job["cells"]:
            send({"t": "cell", "i": i})
            try:
                result = shell.run_cell(src, store_history=True)
                err = result.error_before_exec or result.error_in_exec
            except BaseException as exc:  # noqa: BLE001 - a cell that broke IPython itself
                err = exc
            facts = guard.sweep()
            _flush()
            if getpid() != me:
                exit_(0)
            if facts:
                send({"t": "tamper", "facts": facts})
            if isinstance(err, SystemExit) or shell.exit_now:
                how = f"sys.exit({_describe(err)[1]})" if isinstance(err, SystemExit) else "exit()"
                send({"t": "exit", "text": f"cell {i} called {how}"})
                exit_(0)
            if err is not None:
                if _is_oom(err):
                    send({"t": "oom"})
                name, text = _describe(err)
                send({"t": "note", "text": f"cell {i}: {name}: {text}"})
        for key, name, args in job["probes"]:
            send({"t": "probe", "key": key})
            try:
                value = run_probe(shell.user_ns, name, args)
            except BaseException as exc:  # noqa: BLE001 - SystemExit and friends from student code
                ename, text = _describe(exc)
                value = {"error": {"type": ename, "message": text, "where": "probe harness"}}
            facts = guard.sweep()
            if getpid() != me:
                exit_(0)
            if facts:
                send({"t": "tamper", "facts": facts})
            value = to_plain(value)
            err = value.get("error") if type(value) is dict else None
            if type(err) is dict and (err.get("type") in _OOM_TYPES
                                      or "can't allocate memory" in str(err.get("message", ""))):
                send({"t": "oom"})
            send({"t": "out", "key": key, "value": value})
        send({"t": "done"})
        _flush()
        exit_(0)
    except BaseException:  # noqa: BLE001 - anything escaping the harness is a crash, reported as such
        with contextlib.suppress(BaseException):
            send({"t": "note", "text": "the grading harness failed: " + traceback.format_exc()[-400:]})
        exit_(_HARNESS_FAILED)
