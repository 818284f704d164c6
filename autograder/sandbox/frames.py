"""What grader, zygote and child share on the wire: frame lengths, fds, exit words, the guard's check mark."""

from __future__ import annotations

import os
import struct

JOB_FD = 3  # the child's end of the job channel (its fds 0-2 are taken)
SETUP_FAILED, HARNESS_FAILED = 70, 71  # the child's exit status when its set-up or the harness failed
LEN = struct.Struct(">Q")  # every frame on the job channel: its length, then a wire message
CTL_BYTES = 1 << 16  # the largest message on a worker's control socket
CANARY = "guard check mark"  # the fact the guard reports for the grader's nonce after every probe (guard.TamperGuard)
MEMORY_GUARDS = ("cgroup", "watchdog")  # what limits a submission's memory as a whole (the zygote's report)


class WorkerError(RuntimeError):
    """A zygote that failed to start or stopped answering (infrastructure, not the student)."""


def recv_exact(fd: int, n: int) -> bytes | None:
    """Exactly n bytes from fd, or None when it closes first."""
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, min(n - len(buf), 1 << 20))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)
