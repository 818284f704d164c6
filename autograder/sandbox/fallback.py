"""Without bubblewrap: the one choice of isolation every entry point shares, its refusal, and the uid fallback's
namespaces (no network, the grader's folders hidden, a /dev/shm of a worker's own)."""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autograder.sandbox.frames import WorkerError
from autograder.sandbox.isolation import (
    ENGINE_HOME,
    SANDBOX_ENV,
    SHM_MB,
    choose_sandbox,
    hidden_tops,
    is_under,
    uid_drop_problem,
)
from autograder.sandbox.limits import MIB

_CLONE_NEWNS, _CLONE_NEWNET = 0x00020000, 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18


class UnsandboxedError(WorkerError):
    """Neither bubblewrap nor the uid drop can confine student code here, and running it unconfined was not
    allowed (ALLOW_UNSANDBOXED): nothing was run; the message says what to install or change."""


ALLOW_UNSANDBOXED = "--allow-unsandboxed"
UNSANDBOXED_HELP = ("grade even where neither bubblewrap nor the uid drop (root, with a Python every user may read) "
                    "confines student code: it then runs as your user, with your privileges and the network; every "
                    "row and the summary say so")
_PERMITTED = {"unsandboxed": False}  # set by permit_unsandboxed (grade_batch, from the command's flag)


@dataclass(frozen=True)
class Isolation:
    """What would confine student code here: sandbox "bwrap" or "none" (no bubblewrap), kind "bubblewrap",
    "unprivileged uid" (the fallback as root) or "none" (limits only: the grader's own user and privileges); why
    bubblewrap is not used and why the uid drop does not work ('' when it does)."""

    sandbox: str
    kind: str
    why: str = ""
    problem: str = ""

    def refusal(self) -> str:
        """What to install or change before student code may run here ('' unless kind is "none")."""
        if self.kind != "none":
            return ""
        user = "root" if os.geteuid() == 0 else f"uid {os.geteuid()}"
        return (f"refusing to run student code: neither bubblewrap nor an unprivileged uid can confine it here "
                f"({self.why.removeprefix('sandbox: ')}; no uid drop: {self.problem}), so it would run as {user}, "
                "with your files, your privileges and the network. Install bubblewrap (apt-get install bubblewrap) "
                f"where user namespaces are allowed and leave {SANDBOX_ENV} unset, or run the grader as root with "
                f"a Python every user may read (not one under /root); or pass {ALLOW_UNSANDBOXED} to grade anyway "
                "(every row and the summary then say so)")


def choose_isolation(wanted: str = "auto", *, scratch: str | Path | None = None) -> Isolation:
    """The isolation student code gets on this machine, chosen once for every entry point (the workers, the
    checkpoint reader, grade, nbgrader-autograde, Gradescope, cluster workers): bubblewrap where it works (wanted
    "auto"; SANDBOX_ENV may force "none"), else the uid drop where the grader is root and every folder the child
    reads is open to others (`scratch` too), else "none". WorkerError when "bwrap" is wanted and does not work."""
    if wanted == "auto" and os.environ.get(SANDBOX_ENV):
        wanted = os.environ[SANDBOX_ENV]
    if wanted not in ("auto", "bwrap", "none"):
        raise WorkerError(f"sandbox ({SANDBOX_ENV}) must be 'auto', 'bwrap' or 'none', got {wanted!r}")
    sandbox, why = choose_sandbox(wanted)
    if sandbox == "bwrap":
        return Isolation("bwrap", "bubblewrap")
    problem = uid_drop_problem(scratch=scratch) or namespace_problem()
    return Isolation("none", "none" if problem else "unprivileged uid", why, problem)


@functools.cache
def namespace_problem() -> str:
    """Why the uid fallback cannot give its workers namespaces of their own here ('' when it can): asked once per
    process of a forked child that tries the unshare enter_namespaces does and exits (a few ms). Where the kernel
    refuses it (root without CAP_SYS_ADMIN, as in some containers), jobs would reach the network and share /tmp:
    that confines nothing, so the isolation is "none" (refused unless allowed)."""
    if os.geteuid() != 0:
        return ""  # no uid drop either: uid_drop_problem says why
    unshare = ctypes.CDLL(None, use_errno=True).unshare  # looked up before the fork: the child only calls it
    pid = os.fork()
    if pid == 0:  # the child only: the grader's own namespaces stay as they are
        code = 1
        try:
            code = 0 if unshare(_CLONE_NEWNET | _CLONE_NEWNS) == 0 else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        return ""
    return ("the kernel refuses the uid fallback a network and mount namespace of its own (unshare needs "
            "CAP_SYS_ADMIN: run the grader with it, e.g. a container started with --cap-add SYS_ADMIN, or where "
            "bubblewrap works), so jobs would reach the network and share /tmp")


def permit_unsandboxed(allowed: bool) -> None:
    """Whether this process may run student code unconfined where choose_isolation finds kind "none" (the
    command's ALLOW_UNSANDBOXED flag); WorkerPool and the checkpoint reader refuse otherwise."""
    _PERMITTED["unsandboxed"] = bool(allowed)


def refuse_unsandboxed(iso: Isolation, *, allowed: bool | None = None) -> None:
    """UnsandboxedError when `iso` confines nothing and running unconfined is not allowed (`allowed`, or this
    process's permit_unsandboxed)."""
    if iso.kind == "none" and not (_PERMITTED["unsandboxed"] if allowed is None else allowed):
        raise UnsandboxedError(iso.refusal())


def fallback_plan(path: Iterable[str], *, stage: str, rw: Iterable[str],
                  hide: Iterable[str | Path] = ()) -> dict[str, Any]:
    """What a worker of the uid fallback shows its jobs (enter_namespaces), as bwrap_argv does: every folder
    bubblewrap shows empty (hidden_tops: /tmp, /root, /home, /var, /run, this checkout, `hide` ...) is an empty
    read-only tmpfs, with back in it, read-only, only the staged modules (`stage`), the interpreter (its
    prefixes) and the entries of `path` inside them, outside every hidden folder or named site-packages (not a
    checkout or the current folder on sys.path, which may hold reference/), and `rw` (the scratch folder)
    writable. Also the worker's sys.path: the stage, then the entries kept."""
    tops = hidden_tops(tuple(hide))
    secret = [*tops, str(ENGINE_HOME), *(os.path.realpath(h) for h in hide)]
    prefixes = sorted({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.base_exec_prefix)})
    real = [os.path.realpath(p) for p in path if p and os.path.isdir(p)]
    kept = [p for p in dict.fromkeys(real) if not any(is_under(s, p) for s in secret)
            and (any(is_under(p, x) for x in prefixes) or not any(is_under(p, h) for h in tops)
                 or os.path.basename(p) in ("site-packages", "dist-packages"))]  # packages a .pth line adds
    stage = os.path.realpath(stage)
    keep = [p for p in dict.fromkeys([stage, *prefixes, *kept]) if not any(is_under(s, p) for s in secret)]
    return {"tops": tops, "keep": keep, "rw": [os.path.realpath(p) for p in rw], "path": [stage, *kept]}


def _mount(libc: Any, src: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    args = [None if v is None else v.encode() for v in (src, target, fstype)]
    if libc.mount(args[0], args[1], args[2], ctypes.c_ulong(flags), None if data is None else data.encode()) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount on {target}: {os.strerror(err)}")


def enter_namespaces(plan: dict[str, Any]) -> str:
    """Put this process (a worker of the uid fallback, as root, before any job) and every process it will start in
    a network namespace of its own (only a loopback interface, left down: no network, no abstract socket of the
    host) and a mount namespace of its own laid out by `plan` (fallback_plan), with a /dev/shm of its own: what a
    job leaves there or in the scratch folder is seen by no other worker and is wiped after the job, and nothing
    outlives the worker. Done once per worker: a job costs nothing more. '' when done; else why not (the kernel
    refuses without CAP_SYS_ADMIN, as in a container; then a job's uid still reads only what others may)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWNET | _CLONE_NEWNS) != 0:
        return f"no network or mount namespace of its own ({os.strerror(ctypes.get_errno())})"
    fds: dict[str, int] = {}
    try:
        _mount(libc, None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing done here reaches the host
        rw = set(plan["rw"])
        binds = sorted(set(plan["keep"]) | rw, key=len)
        fds = {p: os.open(p, os.O_PATH | os.O_CLOEXEC) for p in binds}  # taken before the tmpfs covers them
        for top in plan["tops"]:
            _mount(libc, "tmpfs", top, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755,size=1m")
            done: list[str] = []
            for p in (p for p in binds if is_under(p, top) and p != top):
                inside = any(is_under(p, d) for d in done)  # already shown (read-only) by a folder above it
                if inside and p not in rw:
                    continue
                if not inside:
                    os.makedirs(p, mode=0o755, exist_ok=True)
                _mount(libc, f"/proc/self/fd/{fds[p]}", p, None, _MS_BIND | _MS_REC)
                if p not in rw:
                    _mount(libc, None, p, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
                done.append(p)
            _mount(libc, None, top, None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
        if os.path.isdir("/dev/shm"):
            _mount(libc, "tmpfs", "/dev/shm", "tmpfs", _MS_NOSUID | _MS_NODEV, f"mode=1777,size={SHM_MB * MIB}")
    except OSError as exc:
        raise WorkerError(f"the worker's namespaces could not be laid out: {exc}") from exc
    finally:
        for fd in fds.values():
            os.close(fd)
    return ""


def require_isolation(*, allow_unsandboxed: bool) -> Isolation:
    """The isolation student code gets here (choose_isolation), checked before the first submission of a class:
    UnsandboxedError when it confines nothing, unless `allow_unsandboxed` (the command's ALLOW_UNSANDBOXED),
    which this process's pools and checkpoint readers then honour too (permit_unsandboxed)."""
    iso = choose_isolation()
    permit_unsandboxed(allow_unsandboxed)
    refuse_unsandboxed(iso)
    return iso

