"""A slow cell costs only itself: it is stopped at the per-cell limit, the rest of the notebook is graded (a probe
module of the tests' own, then the grade command on the demo lesson's student notebook)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
import yaml

from autograder.authoring.questions import mc_answers
from autograder.config import ROOT, ConfigError, load_config
from autograder.course import Course
from autograder.grading.batch import grade_batch
from autograder.model import Status
from autograder.release.sample import filled_notebook
from autograder.sandbox import ExecResult, Limits, WorkerPool
from helpers.celltime import FAKE_CHECKS, demo_copy, nb

FIXTURE = ROOT / "tests" / "fixtures" / "lesson_demo"
CELL_S = 2  # short, so that the tests stay quick; real limits are in a course's grading_config.yaml
LIMITS = Limits(wall_timeout_s=8, cell_timeout_s=CELL_S, cpu_timeout_s=6, memory_mb=2048, max_processes=32,
                max_file_mb=8, max_output_kb=64, scratch_mb=64)
PROBES = [("add", "add", {"args": [2, 3]}), ("value", "value", {})]
ADD = "def add(a, b):\n    return a + b"
VALUE = "def value():\n    return 1"
PY_SLEEP = "import time\ntime.sleep(600)"
C_SLEEP = "import ctypes\nctypes.CDLL(None).sleep(600)  # one C call: no Python-level alarm stops it"
# the same without ctypes, which the tripwire refuses where it is on (the grade command): a read that never returns
C_READ = "import os\nos.read(os.pipe()[0], 1)  # one C call that never returns: only a kill stops it"
TORCH_LOOP = "import torch\nbig = torch.linalg.matrix_power(torch.rand(3000, 3000), 10**6)  # one long C call"



@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ExecResult]]:
    folder = tmp_path_factory.mktemp("probes")
    (folder / "fake_checks_celltime.py").write_text(FAKE_CHECKS)
    sys.path.insert(0, str(folder))
    cases = {
        # cells 1..: a slow cell in Python, in a torch C call and in a libc C call, each between honest cells
        "three_slow": nb(ADD, PY_SLEEP, "x = 1", TORCH_LOOP, C_SLEEP, VALUE),
        # one slow cell more than the grader leaves out: it stops there, what came before is graded
        "four_slow": nb(ADD, PY_SLEEP, PY_SLEEP, PY_SLEEP, C_SLEEP, VALUE),
        # a cell that announces itself done (a forged frame) and then sleeps: the next cell is blamed
        "forged_start": nb("import os, struct\nfrom autograder import wire\n"
                           "data = wire.encode({'t': 'cell', 'i': 1, 'note': None, 'oom': False, 'tamper': [],"
                           " 'exit': None})\nos.write(3, struct.pack('>Q', len(data)) + data)\n"
                           "import time\ntime.sleep(600)", ADD, VALUE),
    }
    try:
        with WorkerPool(2, limits=LIMITS, probe_module="fake_checks_celltime", tripwire=False) as pool:
            yield dict(pool.run_many(cases.items(), probes=PROBES))
    finally:
        sys.path.remove(str(folder))


def value(res: ExecResult, key: str) -> object:
    out = res.outputs.get(key, {})
    assert "value" in out, (key, res.outputs, res.notes)
    return out["value"]


@pytest.mark.sandbox
def test_slow_cells_are_stopped_and_the_rest_is_graded(runs: dict[str, ExecResult]) -> None:
    res = runs["three_slow"]
    assert res.status == Status.GRADED, res.notes
    assert value(res, "add") == 5 and value(res, "value") == 1  # defined before and after the slow cells
    assert res.stopped_cells == [2, 4, 5]
    for cell, first in ((2, "import time"), (4, "import torch"), (5, "import ctypes")):
        note = next(n for n in res.student_notes if f"Cell {cell} " in n)
        assert f"`{first}`" in note and f"{CELL_S} s, the time limit for one cell" in note, note
    assert res.student_notes == res.notes[:3]


@pytest.mark.sandbox
def test_too_many_slow_cells_end_the_notebook_there(runs: dict[str, ExecResult]) -> None:
    res = runs["four_slow"]
    assert res.status == Status.TIMED_OUT, res.notes
    assert value(res, "add") == 5 and "error" in res.outputs["value"]  # value() is defined after the cut
    assert res.stopped_cells == [2, 3, 4, 5]
    assert "Cell 5 (the one that starts `import ctypes`)" in res.student_notes[-1]
    assert "cell 5 and the cells after it did not run" in res.student_notes[-1]


@pytest.mark.sandbox
def test_a_forged_cell_frame_only_changes_which_cell_is_left_out(runs: dict[str, ExecResult]) -> None:
    res = runs["forged_start"]
    assert res.status == Status.TIMED_OUT and res.outputs == {}, res.notes  # nothing after the sleeping cell runs
    assert 1 not in res.stopped_cells


# --------------------------------------------------------------------------- the grade command, real notebooks



def test_config_keeps_the_cell_limit_below_the_notebook_limits(tmp_path: Path) -> None:
    wall = yaml.safe_load((FIXTURE / "grading_config.yaml").read_text())["execution"]["wall_timeout_s"]
    with pytest.raises(ConfigError, match="cell_timeout_s"):
        load_config(demo_copy(tmp_path, cell_timeout_s=wall))


@pytest.mark.build
@pytest.mark.sandbox
def test_a_correct_notebook_with_a_slow_cell_keeps_every_point(tmp_path: Path, demo_course: Course) -> None:
    course = Course.load(demo_copy(tmp_path, cell_timeout_s=CELL_S, wall_timeout_s=30, cpu_timeout_s=30,
                                 memory_mb=3072))
    suite = course.suite
    answers = mc_answers(list(suite.questions))
    subs = tmp_path / "subs"
    subs.mkdir()
    placed = {}
    for name, code, where in (("near_the_end", "import time; time.sleep(35)", -1),  # above the notebook's limits
                              ("c_call_early", C_READ, 3)):
        notebook = filled_notebook(demo_course.lesson.notebook, answers=answers, lesson=course.lesson)
        at = where % len(notebook.cells)
        notebook.cells.insert(at, nbformat.v4.new_code_cell(code))
        nbformat.write(notebook, str(subs / f"{name}.ipynb"))
        placed[name] = (at, code.splitlines()[0])
    summary = grade_batch(subs, out=tmp_path / "out", course=course, progress=False, workers=2)
    rows = {r["id"]: r for r in summary.rows}
    for name, (at, first) in placed.items():
        assert rows[name]["status"] == "graded" and rows[name]["total"] == suite.notebook_points, rows[name]
        record = json.loads((tmp_path / "out" / "results" / f"{name}.json").read_text())
        said = record["gradescope"]["output"]
        assert f"Cell {at} (the one that starts `{first[:57]}" in said, said
        assert f"after {CELL_S} s, the time limit for one cell" in said, said
