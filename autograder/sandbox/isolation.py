"""Isolation of a worker: bubblewrap argv, the uid fallback, cgroups, IPC and file sweeps, rlimits."""

from __future__ import annotations

import collections
import contextlib
import ctypes
import fcntl
import functools
import importlib
import importlib.util
import logging
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autograder import env_name
from autograder.runtime import runtime_files
from autograder.sandbox.frames import MEMORY_GUARDS, WorkerError
from autograder.sandbox.limits import (
    MIB,
    Limits,
    fit_hard,
)

log = logging.getLogger(__name__)

MEMORY_GUARD_ENV = env_name("MEMORY_GUARD")  # "watchdog" forces the watchdog where "auto" would pick a cgroup
SANDBOX_ENV = env_name("SANDBOX")  # "none" forces the fallback (no bubblewrap) where "auto" would pick bwrap
CGROUP_PREFIX = "grader-cgroup-"  # one memory and one pids group per worker: PREFIX<pid>-<slot>
# The folder the engine package is imported from (a checkout holds reference/ beside it): the engine's own files are
# staged from it and the sandbox shows it empty. Nothing of a course is found from here: callers give it.
ENGINE_HOME = Path(__file__).resolve().parents[2]
_VISIBLE_ROOTS = {"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/dev", "/proc", "/sys"}
SANDBOX_STAGE = "/tmp/grader"
SANDBOX_SCRATCH = "/tmp/scratch"
_SANDBOX_SITE = "/tmp/site"
UID_BASE = 1_500_000_000
UIDS_PER_WORKER = 1024  # each job of a worker runs under the next uid of its block
_UID_BLOCKS = 2000 * 64  # blocks above UID_BASE; a worker holds one, reserved by a lock no other grader can take
UID_LOCKS_ENV = env_name("UID_LOCKS")  # folder of the uid-block locks (default /run/lock/autograder-uid-blocks)
# Without bubblewrap, the folders where a job's uid may leave files (anyone may write there); swept after each job.
_SHARED_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm", "/dev/mqueue", "/run/lock", "/var/lock")
SHM_MB = 64  # the sandbox's own /dev/shm
_IPC_RMID = 0
_CLONE_NEWIPC = 0x08000000
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 4, 36, 38
_SETRESUID = {"x86_64": 117, "aarch64": 147}  # the raw syscall, which changes one thread
_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER")


def write_file(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _own_cgroup(controller: str) -> str:
    """This process's cgroup folder for a v1 controller, if it is mounted and writable by us."""
    mount = f"/sys/fs/cgroup/{controller}"
    if not os.path.isfile(os.path.join(mount, "cgroup.procs")):
        raise OSError(f"no cgroup v1 {controller} controller at {mount}")
    with open("/proc/self/cgroup") as f:
        rel = next((line.rstrip("\n").split(":", 2)[2] for line in f
                    if controller in line.split(":", 2)[1].split(",")), None)
    path = os.path.join(mount, (rel or "/").lstrip("/"))
    if not os.path.isdir(path):
        path = mount  # inside a cgroup namespace the path may not resolve; the root is still ours to use
    if not os.access(path, os.W_OK):
        raise OSError(f"{path} is not writable")
    return path


def _remove_stale_cgroups(root: str) -> None:
    """Empty groups left by a grader that was killed (SIGKILL skips close())."""
    for name in os.listdir(root):
        parts = name.split("-")
        if name.startswith(CGROUP_PREFIX) and len(parts) == 4 and parts[2].isdigit():
            try:
                os.kill(int(parts[2]), 0)
            except ProcessLookupError:
                with contextlib.suppress(OSError):
                    os.rmdir(os.path.join(root, name))  # fails while a process is still in it
            except OSError:
                pass


def _kill_members(path: str) -> bool:
    """SIGKILL every process in a cgroup; whether its list of processes could be read."""
    try:
        with open(os.path.join(path, "cgroup.procs")) as f:
            pids = [int(p) for p in f.read().split()]
    except OSError:
        return False
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return True


def remove_cgroup(path: str) -> None:
    for _ in range(50):
        if not _kill_members(path):
            return
        try:
            os.rmdir(path)
            return
        except OSError:
            time.sleep(0.02)
    log.warning("could not remove cgroup %s", path)


def make_cgroups(names: list[str], *, memory_bytes: int, pids: int,
                 wanted: str) -> tuple[list[dict[str, str]], list[str], str]:
    """One memory and one pids cgroup (v1) per name, limited to memory_bytes and pids tasks: the groups
    (controller -> folder), the folders made (to remove at close), and '' ; or none and why (wanted: "auto",
    "cgroup", which raises WorkerError instead, or "watchdog", which makes none; MEMORY_GUARD_ENV may choose)."""
    if wanted == "auto" and os.environ.get(MEMORY_GUARD_ENV, "") in MEMORY_GUARDS:
        wanted = os.environ[MEMORY_GUARD_ENV]
    if wanted == "watchdog":
        return [], [], ""
    groups: list[dict[str, str]] = []
    made_all: list[str] = []
    try:
        roots = {c: _own_cgroup(c) for c in ("memory", "pids")}
        for root in roots.values():
            _remove_stale_cgroups(root)
        for name in names:
            made = {}
            for ctrl, root in roots.items():
                path = os.path.join(root, name)
                os.mkdir(path, 0o755)
                made_all.append(path)
                made[ctrl] = path
            set_memory_limit(made["memory"], memory_bytes)
            write_file(os.path.join(made["pids"], "pids.max"), str(pids))
            groups.append(made)
    except OSError as exc:
        for path in reversed(made_all):
            with contextlib.suppress(OSError):
                os.rmdir(path)
        msg = f"memory: cgroup v1 memory/pids controllers are not usable ({exc})"
        if wanted == "cgroup":
            raise WorkerError(msg) from exc
        return [], [], msg
    return groups, made_all, ""


def place_in_cgroups(pid: int, groups: dict[str, str], *, processes: int) -> None:
    """Move a worker's zygote (all its threads) into the worker's cgroups for good, leaving its pids group room for
    `processes` tasks more than the zygote and a job's first process: every child it forks is born there. Cgroup
    v1 moves a task only after an RCU grace period (about 10 ms of waiting), which a move per job, by the child,
    used to add to every submission. OSError when a group cannot take it."""
    for folder in groups.values():  # only a job's processes are there before: left by a zygote that died
        _kill_members(folder)
    tasks = len(os.listdir(f"/proc/{pid}/task"))
    if "pids" in groups:
        write_file(os.path.join(groups["pids"], "pids.max"), str(processes + 1 + tasks))
    for folder in groups.values():
        write_file(os.path.join(folder, "cgroup.procs"), str(pid))


def oom_kills(memory_group: str) -> int:
    """How many processes the kernel has killed for memory in this memory cgroup (0 when it cannot be read)."""
    try:
        with open(os.path.join(memory_group, "memory.oom_control")) as f:
            return next((int(line.split()[1]) for line in f if line.startswith("oom_kill ")), 0)
    except (OSError, ValueError, IndexError):
        return 0


def set_memory_limit(folder: str, limit: int) -> None:
    """A memory cgroup's limit (and its memory+swap limit where swap is accounted: no memsw file otherwise);
    OSError when the memory limit cannot be set."""
    memsw = os.path.join(folder, "memory.memsw.limit_in_bytes")
    with contextlib.suppress(OSError):  # raised first where memsw is below the new limit, lowered after otherwise
        write_file(memsw, str(limit))
    write_file(os.path.join(folder, "memory.limit_in_bytes"), str(limit))
    with contextlib.suppress(OSError):
        write_file(memsw, str(limit))


def choose_sandbox(wanted: str) -> tuple[str, str]:
    if wanted == "none":
        return "none", f"sandbox: none requested (sandbox='none' or {SANDBOX_ENV}=none)"
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
    return "none", f"sandbox: {msg}; falling back to the uid drop"


def stage_modules(stage: Path, probe_module: str, modules: Mapping[str, Path]) -> None:
    """Copy only the package's __init__.py, wire.py, model.py (the status words), the runtime modules (wire's array
    layout; the guard's list of them), the sandbox package and the
    lesson's shipped modules (`modules`: top-level name -> file; the probe module is one of them, or found on
    sys.path) into a folder the sandbox sees read-only: the child imports the same files under the same names as
    the student's notebook does."""
    here = Path(__file__).resolve().parent
    package = here.parent
    files = {"autograder/__init__.py": (package / "__init__.py").read_text(),
             "autograder/wire.py": (package / "wire.py").read_text(),
             "autograder/model.py": (package / "model.py").read_text(),
             "autograder/runtime/__init__.py": (package / "runtime" / "__init__.py").read_text(),
             **{f"autograder/runtime/{p.name}": p.read_text() for p in runtime_files().values()},
             **{f"autograder/sandbox/{p.name}": p.read_text() for p in sorted(here.glob("*.py"))}}
    for name, path in modules.items():
        if not name.isidentifier():
            raise WorkerError(f"cannot ship {path} as module {name!r}: not a top-level module name")
        files[f"{name}.py"] = Path(path).read_text()
    if probe_module not in modules:
        spec = importlib.util.find_spec(probe_module)
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            raise WorkerError(f"cannot find the source of probe module {probe_module!r}")
        parts = probe_module.split(".")
        for n in range(1, len(parts)):
            files.setdefault("/".join(parts[:n]) + "/__init__.py", "")
        files["/".join(parts) + ".py"] = Path(spec.origin).read_text()
    for rel, text in files.items():
        path = stage / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for path in [stage, *stage.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)


def _world_readable(path: str) -> bool:
    p = Path(path).resolve()
    return all(os.stat(d).st_mode & 0o005 == 0o005 for d in [p, *p.parents])


def _others_can_enter(path: str) -> bool:
    p = Path(path).resolve()
    with contextlib.suppress(OSError):
        return all(os.stat(d).st_mode & 0o001 for d in [p, *p.parents])
    return False


def uid_drop_problem(*, scratch: str | Path | None = None) -> str:
    """Why student code cannot run as an unprivileged uid without bubblewrap here, or '' when it can: the
    grader is not root, or a folder the child reads (the interpreter, the venv, `scratch`) is closed to others."""
    if os.geteuid() != 0:
        return "the grader is not root, so it cannot switch student code to another uid"
    needed = [sys.prefix, sys.base_prefix, *(p for p in sys.path if p and is_under(p, sys.prefix) and os.path.isdir(p))]
    for path in dict.fromkeys([*needed, *([str(scratch)] if scratch else [])]):
        if not _world_readable(path):
            return f"{path} is not readable by other users (chmod -R o+rX it, and o+rx on its parents)"
    return ""


def reserve_uid_block(start: int) -> tuple[int, int]:
    """A block of uids that no other worker on this host holds, and the descriptor that holds it: the first block
    from `start` on whose lock file (one per block, in a folder only this user may write to) an exclusive flock
    can take. The kernel releases the lock when the descriptor closes or the process dies, even by SIGKILL, so
    several grading processes on one host (Dask workers, two classes at once) never share a uid."""
    chosen = os.environ.get(UID_LOCKS_ENV)
    for folder in [chosen] if chosen else [os.path.join(d, "autograder-uid-blocks")
                                           for d in ("/run/lock", tempfile.gettempdir())]:
        try:  # /run/lock may be missing or read-only (a container image): then the temporary folder
            os.makedirs(folder, mode=0o700, exist_ok=True)
        except OSError:
            if chosen:
                raise
            continue
        if chosen or os.access(folder, os.W_OK):
            break
    st = os.lstat(folder)
    if not os.path.isdir(folder) or os.path.islink(folder) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise WorkerError(f"{folder}: the uid-block locks need a folder of this user that nobody else may write "
                          f"to; remove it, or set {UID_LOCKS_ENV} to another folder")
    for i in range(_UID_BLOCKS):
        block = (start + i) % _UID_BLOCKS
        fd = os.open(os.path.join(folder, str(block)), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return block, fd
    raise WorkerError(f"all {_UID_BLOCKS} uid blocks are held by other graders on this host (locks in {folder})")


def is_under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def hidden_tops(hide: tuple[str | Path, ...] = ()) -> list[str]:
    """The folders a sandbox shows empty: /tmp, /root, /home, this checkout, every top-level folder but the system's
    (_VISIBLE_ROOTS) and `hide`, without those inside another."""
    repo = str(ENGINE_HOME)
    others = [os.path.join("/", d) for d in os.listdir("/") if os.path.join("/", d) not in _VISIBLE_ROOTS]
    hidden = sorted({os.path.realpath(p) for p in ("/tmp", "/root", "/home", repo, *others, *hide)
                     if os.path.isdir(p) and not os.path.islink(p)}, key=len)
    return [h for h in hidden if not any(h != o and is_under(h, o) for o in hidden)]


def bwrap_argv(stage: Path, hide: tuple[str | Path, ...], limits: Limits,
                cgroups: dict[str, str]) -> tuple[list[str], list[str], str]:
    """bubblewrap arguments, the sys.path the zygote should use inside, and the interpreter to run.

    Allow-list: only the system folders stay visible; every other top-level folder (/work, /srv, /opt,
    other checkouts ...) is an empty tmpfs. The base Python installation is bound back in at its own
    path; a virtual environment's site-packages folders at /tmp/site/N, so nothing of the checkout
    around a venv (its name, its neighbours) is ever visible.
    """
    exe = os.path.realpath(getattr(sys, "_base_executable", "") or sys.executable)
    base = sorted({os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix)})
    venv = os.path.realpath(sys.prefix)
    top = hidden_tops(hide)
    path: list[str] = []
    site: list[tuple[str, str]] = []
    for p in dict.fromkeys(os.path.realpath(p) for p in sys.path if p and os.path.isdir(p)):
        if any(is_under(p, b) for b in base) and not (venv not in base and is_under(p, venv)):
            path.append(p)
        elif is_under(p, venv) and venv not in base:
            inside = f"{_SANDBOX_SITE}/{len(site)}"
            site.append((p, inside))
            path.append(inside)
        elif not any(is_under(p, h) for h in top):
            path.append(p)
    argv = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
            "--perms", "1777", "--size", str(SHM_MB * MIB), "--tmpfs", "/dev/shm", "--mqueue", "/dev/mqueue",
            "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--new-session"]
    for h in top:
        argv += ["--tmpfs", h]
        for p in base:
            if is_under(p, h) and p != h:
                parents = [str(d) for d in reversed(Path(p).parents) if is_under(str(d), h) and str(d) != h]
                argv += [a for d in parents for a in ("--perms", "0755", "--dir", d)] + ["--ro-bind", p, p]
        if h == "/tmp":
            argv += ["--ro-bind", str(stage), SANDBOX_STAGE,
                     "--perms", "0755", "--size", str(limits.scratch_mb * MIB), "--tmpfs", SANDBOX_SCRATCH]
            if site:
                argv += ["--perms", "0755", "--dir", _SANDBOX_SITE]
            argv += [a for src, dst in site for a in ("--ro-bind", src, dst)]
        argv += ["--remount-ro", h]
    for folder in cgroups.values():
        argv += ["--bind", folder, folder]
    if os.geteuid() == 0:
        argv += ["--cap-drop", "ALL"] + [a for c in _CAPS for a in ("--cap-add", c)]
    return argv, path, exe


def zygote_host_pid(root: int, nspid: int) -> int:
    """The pid, in our namespace, of the process below `root` whose innermost pid is `nspid`."""
    kids: dict[int, list[int]] = collections.defaultdict(list)
    inner: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        pid = int(name)
        kids[int(fields.get("PPid", "0").strip() or 0)].append(pid)
        ns = fields.get("NSpid", name).split()
        inner[pid] = int(ns[-1]) if ns else pid
    todo = [root]
    while todo:
        pid = todo.pop()
        if inner.get(pid) == nspid and (pid != root or pid == nspid):
            return pid
        todo += kids.get(pid, [])
    return 0


def _remove_ipc(uid: int | None, since: float, *, everything: bool) -> None:
    """Remove System V shared memory, semaphores and message queues a submission left behind.

    everything: the sandbox's own IPC namespace, where all that is visible is the student's; otherwise
    those owned by the job's uid, or (without a uid of its own) by ours and created during the job.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    removers = (("shm", "shmid", lambda i: libc.shmctl(i, _IPC_RMID, None)),
                ("sem", "semid", lambda i: libc.semctl(i, 0, _IPC_RMID)),
                ("msg", "msqid", lambda i: libc.msgctl(i, _IPC_RMID, None)))
    me = os.geteuid()
    for table, id_col, remove in removers:
        try:
            with open(f"/proc/sysvipc/{table}") as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        cols = lines[0].split() if lines else []
        for line in lines[1:]:
            row = dict(zip(cols, line.split()))
            try:
                ident, owner, creator, ctime = (int(row[k]) for k in (id_col, "uid", "cuid", "ctime"))
            except (KeyError, ValueError):
                continue
            if not (everything or (uid is not None and uid in (owner, creator))
                    or (uid is None and me in (owner, creator) and ctime >= int(since) - 1)):
                continue
            if remove(ident) != 0 and me == 0 and owner != 0:  # IPC_RMID needs the owner (or CAP_SYS_ADMIN)
                try:
                    os.seteuid(owner)
                    remove(ident)
                finally:
                    os.seteuid(0)


def shared_writable() -> list[str]:
    """The folders (of _SHARED_WRITABLE and TMPDIR) that exist here and that others may write to."""
    found = [os.path.realpath(p) for p in (*_SHARED_WRITABLE, tempfile.gettempdir())]
    return [p for p in dict.fromkeys(found) if os.path.isdir(p) and os.stat(p).st_mode & 0o003 == 0o003]


def _remove_owned(uid: int, roots: list[str]) -> None:
    """Remove every entry owned by `uid` in these folders and in the folders below them that others may write
    to (outside its scratch folder a job's uid can create files nowhere else)."""
    todo = list(roots)
    while todo:
        folder = todo.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            is_dir = entry.is_dir(follow_symlinks=False)
            if st.st_uid == uid and is_dir:
                _rmtree(entry.path)
            elif st.st_uid == uid:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
            elif is_dir and st.st_mode & 0o003 == 0o003:
                todo.append(entry.path)


def clean_after_job(wipe: list[str], uid: int | None, since: float, *, own_ipc: bool, sweep: list[str]) -> None:
    """After a job's child (notebook or file) is gone: empty its writable folders, remove the IPC objects it made
    and, under a uid of its own, what that uid left in shared writable folders; nothing reaches the next job."""
    for folder in wipe:
        for name in os.listdir(folder):
            path = os.path.join(folder, name)
            if os.path.isdir(path) and not os.path.islink(path):
                _rmtree(path)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(path)
    if uid is not None:
        kill_uid(uid)
    _remove_ipc(uid, since, everything=own_ipc)
    if uid is not None and sweep:
        _remove_owned(uid, sweep)


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def kill_uid(uid: int) -> None:
    """SIGKILL every process of a job's uid, wherever it went (a daemon that left the session and the worker's
    tree, one in a namespace of its own): kill(-1) from this thread alone acting as that uid (a raw setresuid
    changes one thread; the saved uid 0 takes it back) reaches exactly the processes whose real or saved uid is the
    job's, all in one pass (a fork under way is cancelled); then the zombies left to this process are reaped.
    Without root, or on another architecture, nothing (the worker's tree is killed anyway)."""
    nr = _SETRESUID.get(platform.machine())
    if nr is None or os.geteuid() != 0:
        return
    libc = _libc()
    if libc.syscall(nr, uid, uid, 0) != 0:
        raise OSError(ctypes.get_errno(), "setresuid to the job's uid failed")
    try:
        libc.kill(-1, signal.SIGKILL)
    finally:
        if libc.syscall(nr, 0, 0, 0) != 0:
            os._exit(70)  # this thread could not be root again: never go on as the job's uid
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def _rmtree(path: str) -> None:
    def fix(func: Any, p: str, _exc: Any) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
            func(p)

    shutil.rmtree(path, onerror=fix)


def count_tasks(uid: int) -> int:
    n = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{name}").st_uid == uid:
                    n += len(os.listdir(f"/proc/{name}/task"))
    return n


def vm_size(pid: int | str = "self") -> int:
    """The address space a process uses (VmSize, bytes); 0 when it cannot be read."""
    with contextlib.suppress(OSError, StopIteration, ValueError, IndexError), open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    return 0


def rlimits(limits: Limits, *, vm: int, base: int) -> list[tuple[int, int, int]]:
    """A child's per-process limits as (rlim, soft, hard): vm is its size, base the tasks its uid runs already."""
    return [(resource.RLIMIT_AS, vm + limits.memory_mb * MIB, vm + limits.memory_mb * MIB),
            (resource.RLIMIT_NPROC, base + limits.max_processes, base + limits.max_processes),
            (resource.RLIMIT_FSIZE, limits.max_file_mb * MIB, limits.max_file_mb * MIB), (resource.RLIMIT_CORE, 0, 0),
            (resource.RLIMIT_NOFILE, 1024, 1024), (resource.RLIMIT_CPU, limits.cpu_timeout_s, limits.cpu_timeout_s + 1)]


def apply_limits(limits: Limits, uid: int | None) -> None:
    base = 1 if uid is not None else count_tasks(os.getuid())
    for rlim, soft, hard in rlimits(limits, vm=vm_size(), base=base):  # never above the grader's own hard limits
        resource.setrlimit(rlim, fit_hard(rlim, soft, hard))
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    prctl(PR_SET_NO_NEW_PRIVS, 1)


def confine_job(scratch: str, limits: Limits, uid: int | None) -> None:
    """In a job's forked child (notebook or file), before anything of the job runs: its scratch folder as cwd, HOME
    and TMPDIR, SIGXFSZ ignored (a write past RLIMIT_FSIZE fails instead of killing), an IPC namespace of its own
    (as root), the rlimits and the uid (apply_limits), and death with its parent (the caller then checks that the
    parent is still the server that forked it)."""
    os.chdir(scratch)
    os.environ.update(HOME=scratch, TMPDIR=scratch, PWD=scratch)
    tempfile.tempdir = scratch
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    own_ipc_namespace()
    apply_limits(limits, uid)
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def own_ipc_namespace() -> None:
    """Give this job's child an IPC namespace of its own (System V objects and POSIX message queues), so it finds
    nothing an earlier job made and leaves nothing for a later one. It needs CAP_SYS_ADMIN: as root without
    bubblewrap it works; inside bubblewrap the worker's namespace is emptied after each job instead (the zygote
    removes every System V object and everything in the sandbox's own /dev/mqueue)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.unshare(_CLONE_NEWIPC)  # EPERM without the capability: then the zygote's clean-up alone holds


def prctl(option: int, arg: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")
