"""The environment a Dask scheduler and its workers run with in the tests."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from autograder.config import ROOT
from autograder.release.common import tool_env

# On this shared 2-core machine a worker's event loop can stall for tens of seconds while it imports torch and
# computes the reference values; Dask's default 30 s would drop it from the scheduler.
DASK_ENV = {"DASK_DISTRIBUTED__COMM__TIMEOUTS__TCP": "600s", "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "120s",
            "DASK_DISTRIBUTED__SCHEDULER__WORKER_TTL": "600s"}


def dask_env() -> dict[str, str]:
    return tool_env() | DASK_ENV | {"PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT),
                                                                             os.environ.get("PYTHONPATH"))))}


class LocalCluster:
    """`dask scheduler` and `dask worker` processes on 127.0.0.1, as a real deployment starts them."""

    def __init__(self, tmp: Path) -> None:
        self.tmp, self.file = tmp, tmp / "scheduler.json"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.workers: list[subprocess.Popen[bytes]] = []

    def _start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115 - closed when the process is
        proc = subprocess.Popen([sys.executable, "-m", "dask", *args, "--scheduler-file", str(self.file)],
                                cwd=self.tmp, env=dask_env(), stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.procs.append(proc)
        return proc

    def start(self, workers: int) -> LocalCluster:
        self._start("scheduler", "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard")
        wait_for("the scheduler", self.file.exists)
        for i in range(workers):  # no nanny: a worker killed stays dead, as a lost machine does
            self.workers.append(self._start(f"worker{i}", "worker", "--nthreads", "1", "--no-nanny",
                                            "--memory-limit", "0", "--no-dashboard", "--name", f"w{i}",
                                            "--preload", "autograder.grading.cluster"))
        wait_for("both workers", lambda: (self.tmp / "scheduler.log").read_text().count("Register worker") >= workers)
        return self

    @property
    def address(self) -> str:
        import json

        return json.loads(self.file.read_text())["address"]

    def log(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.tmp.glob("*.log")))

    def stop(self) -> None:
        """The workers first, then the scheduler: a worker told to stop while its scheduler closes can hang in
        Dask's own close (seen once in CI: a minute until the kill)."""
        for group in (self.workers, [p for p in self.procs if p not in self.workers]):
            for proc in group:
                if proc.poll() is None:
                    proc.terminate()
            for proc in group:
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def wait_for(what: str, done: object, *, limit_s: float = 600) -> None:
    deadline = time.monotonic() + limit_s  # a guard, not a timing: start-up is slow on a loaded machine
    while not done():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"waited {limit_s:g} s for {what}"
        time.sleep(0.2)
