"""The zygote backs its memory with 2 MB pages where the kernel can (zygote.collapse_memory, once a worker has run
COLLAPSE_AFTER jobs: one upload does not wait for it), so that forking a child
and its exit copy and free a hundred page-table entries instead of tens of thousands; where the kernel cannot,
nothing changes and grading goes on."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autograder.sandbox import COLLAPSE_AFTER, Limits, WorkerPool
from helpers.probes import importable

PROBE = "def run_probe(env, name, args):\n    return {'value': env[name]()}\n"


def _huge_pages_possible() -> bool:
    """MADV_COLLAPSE exists from Linux 6.1 and needs transparent huge pages not switched off."""
    try:
        mode = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return False
    major, minor = (int(x) for x in os.uname().release.split(".")[:2])
    return (major, minor) >= (6, 1) and "[never]" not in mode


def _anon_huge_kb(pid: int | str) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return 0


def test_collapse_backs_a_process_heap_with_huge_pages() -> None:
    if not _huge_pages_possible():
        pytest.skip("this kernel has no MADV_COLLAPSE or transparent huge pages are off")
    code = ("from autograder.sandbox.zygote import collapse_memory\n"
            "keep = [list(range(50)) for _ in range(200_000)]  # about 100 MB of Python objects\n"
            "from pathlib import Path\n"
            "before = [l for l in Path('/proc/self/smaps_rollup').read_text().splitlines() if 'AnonHuge' in l]\n"
            "n = collapse_memory()\n"
            "after = [l for l in Path('/proc/self/smaps_rollup').read_text().splitlines() if 'AnonHuge' in l]\n"
            "print(n, before[0].split()[1], after[0].split()[1])\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    regions, before, after = map(int, done.stdout.split())
    assert regions >= 1 and int(after) >= int(before) + 50 * 1024, done.stdout


@pytest.mark.sandbox
def test_the_workers_zygote_is_collapsed_and_grades(tmp_path_factory: pytest.TempPathFactory) -> None:
    if not _huge_pages_possible():
        pytest.skip("this kernel has no MADV_COLLAPSE or transparent huge pages are off")
    notebook = ('{"cells": [{"cell_type": "code", "metadata": {}, "source": "def one():\\n    return 1", '
                '"outputs": [], "execution_count": null}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}')
    with importable(tmp_path_factory, "probe_one", PROBE) as module, \
            WorkerPool(1, limits=Limits(wall_timeout_s=30, cpu_timeout_s=20), probe_module=module) as pool:
        results = [pool.run(notebook.encode(), probes=[("one", "one", {})]) for _ in range(COLLAPSE_AFTER)]
        deadline = time.monotonic() + 60  # collapsed once its jobs show it grades a class, after the last answer
        while not all(huge := [_anon_huge_kb(pid) for pid in pool.worker_pids()]) and time.monotonic() < deadline:
            time.sleep(0.1)
        results.append(pool.run(notebook.encode(), probes=[("one", "one", {})]))
    assert huge and all(kb >= 2048 for kb in huge), huge  # torch's imports, in 2 MB pages
    assert all(r.outputs == {"one": {"value": 1}} for r in results), results
