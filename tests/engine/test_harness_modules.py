"""The tamper guard's list of the grader's own modules in the child is derived from the package, and holds every
autograder module a child has actually loaded (sys.modules in the sandbox), the checks runtime's modules too."""

from __future__ import annotations

import nbformat
import pytest

from autograder.lesson import RUNTIME_FILE, RUNTIME_NAME
from autograder.model import Status
from autograder.runtime import CODEC, runtime_for, runtime_modules
from autograder.sandbox import Limits, WorkerPool
from autograder.sandbox.guard import HARNESS_MODULES, harness_modules
from helpers.probes import importable

pytestmark = pytest.mark.sandbox

# A probe module that reports, from inside the child, what it has loaded and what the guard recorded.
SEEN = '''
import gc
import sys

def run_probe(env, name, args):
    guard = next(o for o in gc.get_objects() if type(o).__name__ == "TamperGuard")
    return {"value": {"loaded": sorted(m for m in sys.modules if m == "autograder" or m.startswith("autograder.")),
            "recorded": [m for _, m, _ in guard.globals],
            "harness": list(sys.modules["autograder.sandbox.guard"].HARNESS_MODULES),
            "runtime": [m for m in sys.modules if m in RUNTIME]}}

RUNTIME = %r
'''
# the modules the guard listed by hand before it was derived (protocol.py's frames are frames.py's now)
HAND_LIST = ("autograder.wire", *(f"autograder.sandbox.{m}" for m in (
    "limits", "frames", "isolation", "guard", "child", "zygote")))


def test_the_harness_list_is_the_fork_servers_imports() -> None:
    assert HARNESS_MODULES == harness_modules()
    assert set(HAND_LIST) <= set(HARNESS_MODULES)
    # what the grader alone runs is not the child's
    assert not {"autograder.sandbox.pool", "autograder.sandbox.worker", "autograder.sandbox.files",
                "autograder.lesson", "autograder.config"} & set(HARNESS_MODULES)


def test_the_guard_records_every_autograder_module_a_child_has_loaded(tmp_path_factory) -> None:
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell("x = 1")]
    with importable(tmp_path_factory, "seen_checks", SEEN % (runtime_modules(),)) as module, \
            WorkerPool(1, probe_module=module, modules=runtime_for(RUNTIME_FILE),
                       limits=Limits(wall_timeout_s=30, cpu_timeout_s=20)) as pool:
        res = pool.run(nbformat.writes(notebook).encode(), probes=[("seen", "seen", {})])
    assert res.status == Status.GRADED, (res.notes, res.outputs)
    seen = res.outputs["seen"]["value"]
    loaded, recorded = set(seen["loaded"]), set(seen["recorded"])
    assert seen["harness"] == list(HARNESS_MODULES)
    assert loaded and loaded <= recorded, f"loaded in the child but not guarded: {sorted(loaded - recorded)}"
    # the list holds nothing a child does not load (the uid fallback's namespaces are entered in the zygote alone)
    assert set(HARNESS_MODULES) - loaded <= {"autograder.sandbox.fallback"}
    assert {RUNTIME_NAME, CODEC} <= set(seen["runtime"]) and set(seen["runtime"]) <= recorded
