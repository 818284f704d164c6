"""The shipped checks runtime (autograder/runtime/checks_runtime.py): every lesson's checks module reuses it and
defines none of it; each lesson gets its own copy in the grader; a checks_runtime.py of a student's folder is never
imported by the grader or the sandbox."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import numpy as np
import pytest

from autograder.config import ROOT
from autograder.course import course_of
from autograder.lesson import RUNTIME_FILE, RUNTIME_NAME, Lesson, LessonError
from autograder.model import Status
from autograder.runtime import runtime_files

FIXTURE = ROOT / "tests" / "fixtures" / "lesson_demo"
LESSONS = [course_of().lesson, Lesson.load("lesson_demo", near=FIXTURE)]
# A checks_runtime.py as a student's folder could hold one: importing it leaves a mark and breaks every verdict.
FAKE = ("import pathlib\npathlib.Path(__file__).with_name('FAKE_IMPORTED').write_text('yes')\n"
        "raise ImportError('the fake checks_runtime was imported')\n")


def runtime_names() -> set[str]:
    """Every public name the runtime file binds at its top level."""
    tree = ast.parse(RUNTIME_FILE.read_text())
    return {n for n in _bound(tree) if not n.startswith("_")}


def _bound(tree: ast.Module) -> set[str]:
    """The names a module's top-level statements define (def, class, assignments)."""
    out: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return out


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda lesson: lesson.name)
def test_a_lesson_checks_module_defines_no_runtime_name(lesson: Lesson) -> None:
    own = _bound(ast.parse(lesson.checks_file.read_text())) - {"__all__"}
    assert own & runtime_names() == set(), f"{lesson.checks_file} defines runtime names again"
    module = lesson.checks
    for name in lesson.runtime.__all__:  # the engine's API comes from this lesson's copy of the runtime
        assert getattr(module, name) is getattr(lesson.runtime, name), name
    assert Path(lesson.runtime.__file__).resolve() == RUNTIME_FILE.resolve()


def test_a_checks_module_that_defines_a_runtime_name_is_refused(tmp_path: Path) -> None:
    course = tmp_path / "course"
    shutil.copytree(FIXTURE, course, ignore=shutil.ignore_patterns("__pycache__"))
    checks = course / "assignments" / "lesson_demo" / "lesson_demo_checks.py"
    checks.write_text(checks.read_text() + "\n\ndef judge(case, got, expected):\n    return Verdict(True)\n")
    assert "judge" in _bound(ast.parse(checks.read_text())) & runtime_names()  # what the test above finds
    with pytest.raises(LessonError, match="judge must come from the runtime"):
        _ = Lesson("lesson_demo", course).checks


def test_each_lesson_has_its_own_registries() -> None:
    big, demo = (lesson.checks for lesson in LESSONS)
    assert big.PROBES is not demo.PROBES and big.CHECKS is not demo.CHECKS
    assert set(demo.PROBES) == {"call", "answers"} and demo.CHECKS["close"] is not big.CHECKS["close"]
    assert demo.HOOKS["before_probe"] is not big.HOOKS["before_probe"]  # lesson83 seeds torch; the demo has no hook


def test_the_demo_lesson_works_with_the_runtime() -> None:
    """The demo's probes and checks, with everything else from the runtime: the reference passes, the catalogued
    mistake fails with its diagnosis, a stub gets the stub's line, and a local check raises CheckFailed."""
    lesson = LESSONS[1]
    checks = lesson.checks
    case = {"id": "q1_center/demo", "probe": "call", "args": {"fn": "center", "args": [[[1.0, 2.0], [3.0, 6.0]]]},
            "check": "close", "atol": 1e-6, "rtol": 1e-6, "what": "center(x)", "revisit": "column means"}
    expected = {"value": checks.run_probe(lesson.namespace(), "call", case["args"]),
                "variants": [{"id": m.id, "description": m.description,
                              "output": checks.run_probe(lesson.namespace(m), "call", case["args"])}
                             for m in lesson.mistakes]}
    assert checks.judge(case, checks.run_probe(lesson.namespace(), "call", case["args"]), expected).passed
    wrong = checks.judge(case, expected["variants"][0]["output"], expected)
    assert not wrong.passed and wrong.diagnosis == "center_rows" and "Revisit: column means" in wrong.message
    stub = checks.run_probe({"center": lambda x: None}, "call", case["args"])
    assert checks.STUB in checks.judge(case, stub, expected).message
    env = lesson.namespace(lesson.mistakes[0])
    with pytest.raises(checks.CheckFailed, match="Likely cause") as failed:  # it decodes the mistakes' outputs
        checks.check_case(env, checks.dumps(case | {"expected": expected}))
    said = str(failed.value)  # what Otter shows the student: the case by its name, not the grader's id
    assert said.startswith("demo: ") and "q1_center/" not in said, said
    assert checks.LOCAL_RESULTS["q1_center/demo"] is False
    checks.check_case(lesson.namespace(), checks.dumps(case | {"expected": expected}))
    assert checks.LOCAL_RESULTS["q1_center/demo"] is True
    assert "1 public test checked here" in checks.public_summary(["q1_center/demo"], hidden=0)


def test_the_runtime_needs_no_torch_and_no_autograder(tmp_path: Path) -> None:
    """Next to a student's notebook: the runtime and the demo's checks import with numpy alone."""
    for path in LESSONS[1].shipped_files:  # the runtime, the codec it imports, the checks
        shutil.copy(path, tmp_path / path.name)
    code = ("import sys; sys.path.insert(0, '.'); sys.modules['torch'] = None; sys.modules['autograder'] = None\n"
            "import lesson_demo_checks as c\n"
            "got = c.run_probe({'center': lambda x: [[0.0, 1.0]]}, 'call', {'fn': 'center', 'args': [1]})\n"
            "print(sorted(c.PROBES), got['value'].tolist())")
    done = subprocess.run([sys.executable, "-I", "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["['answers',", "'call']", "[[0.0,", "1.0]]"]


def test_a_fake_runtime_in_the_working_folder_is_never_imported_by_the_grader(tmp_path: Path) -> None:
    """The grader binds a lesson's checks to the engine's runtime file, whatever the working folder and sys.path
    hold (a student's folder with a checks_runtime.py, or a plain_codec.py, of its own)."""
    for name in runtime_files():
        (tmp_path / f"{name}.py").write_text(FAKE)
    code = (f"import sys; sys.path.insert(0, {str(tmp_path)!r}); sys.path.insert(0, {str(ROOT)!r})\n"
            "from autograder.lesson import Lesson\n"
            f"lesson = Lesson.load('lesson_demo', near=__import__('pathlib').Path({str(FIXTURE)!r}))\n"
            "c = lesson.checks\n"
            "got = c.run_probe(lesson.namespace(), 'call', {'fn': 'center', 'args': [[[1.0], [3.0]]]})\n"
            "print(c.judge({'id': 'x', 'check': 'close', 'atol': 1e-9, 'rtol': 0, 'args': {}}, got, "
            "{'value': got}).passed, c.run_probe.__module__)")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0] == "True" and not (tmp_path / "FAKE_IMPORTED").exists()
    # the attack is real: a plain import from that folder takes the fake
    tried = subprocess.run([sys.executable, "-c", f"import {RUNTIME_NAME}"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=60)
    assert tried.returncode != 0 and (tmp_path / "FAKE_IMPORTED").exists()


def _notebook(*cells: str) -> bytes:
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(src) for src in cells]
    return nbformat.writes(notebook).encode()


CENTER = "import numpy as np\ndef center(x):\n    x = np.asarray(x, dtype=float)\n    return x - x.mean(axis=0)"
PROBE = [("center", "call", {"fn": "center", "args": [[[1.0, 2.0], [3.0, 6.0]]]})]


@pytest.mark.sandbox
def test_the_sandbox_runs_the_engine_runtime_and_guards_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sandbox stages the engine's runtime next to the lesson's checks: a checks_runtime.py in the grader's
    working folder or on its sys.path changes nothing, and a notebook that patches the runtime is caught."""
    from autograder.sandbox import Limits, WorkerPool

    lesson = LESSONS[1]
    for name in runtime_files():
        (tmp_path / f"{name}.py").write_text(FAKE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    patch = ("import checks_runtime\n"
             "checks_runtime._run_one.__code__ = (lambda env, name, args: {'value': 0.0}).__code__")
    codec = ("import plain_codec\n"  # the codec the runtime imports is staged and guarded as the runtime is
             "plain_codec.to_plain.__code__ = (lambda value, *, array=None: {'value': 0.0}).__code__")
    limits = Limits(wall_timeout_s=30, cpu_timeout_s=20, memory_mb=2048, max_processes=32, max_file_mb=8,
                    max_output_kb=64, scratch_mb=64)
    with WorkerPool(1, limits=limits, probe_module=lesson.checks_name, modules=lesson.sandbox_modules,
                    tripwire=False) as pool:  # the guard on its own: the tripwire refuses the __code__ writes first
        honest = pool.run(_notebook(CENTER), probes=PROBE)
        patched = pool.run(_notebook(CENTER, patch), probes=PROBE)
        recoded = pool.run(_notebook(CENTER, codec), probes=PROBE)
    assert honest.status == Status.GRADED, honest
    assert np.allclose(honest.outputs["center"]["value"], [[-1.0, -2.0], [1.0, 2.0]])
    assert not (tmp_path / "FAKE_IMPORTED").exists()
    assert patched.status == Status.TAMPERING, patched.notes
    assert any("checks_runtime" in f for f in patched.tampering), patched.tampering
    assert json.dumps(patched.outputs.get("center", {}), default=str) != json.dumps({"value": 0.0})
    assert recoded.status == Status.TAMPERING, recoded.notes
    assert any("plain_codec" in f for f in recoded.tampering), recoded.tampering


def _spin(seconds: float) -> None:
    """Spend `seconds` of this process's CPU time (the grader's limits are CPU time)."""
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


BUSY_CELL = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end:\n    pass"


def test_the_local_check_warns_when_a_call_or_a_cell_takes_half_the_graders_limit(
        capfd: pytest.CaptureFixture[str]) -> None:
    """The limits travel with each case of a release (`limits`); a check whose call takes more than half the grader's
    limit of one check says so, and so does, from then on, a cell that takes more than half the limit of one cell;
    a quick call and a quick cell say nothing."""
    from IPython.core.interactiveshell import InteractiveShell

    lesson = LESSONS[1]
    checks = lesson.checks
    case = {"id": "q1_center/demo", "probe": "call", "args": {"fn": "center", "args": [[[1.0, 2.0], [3.0, 6.0]]]},
            "check": "close", "atol": 1e-6, "rtol": 1e-6, "what": "center(x)", "revisit": "column means"}
    expected = {"value": checks.run_probe(lesson.namespace(), "call", case["args"]), "variants": []}
    center = lesson.namespace()["center"]

    def slow_center(x: object) -> object:
        _spin(0.3)
        return center(x)

    shell = InteractiveShell.instance()
    try:
        data = checks.dumps(case | {"expected": expected, "limits": {"cell_s": 0.5, "probe_s": 0.4}})
        checks.check_case(lesson.namespace(), data)
        assert "Warning" not in capfd.readouterr().err  # a quick call
        checks.check_case({**lesson.namespace(), "center": slow_center}, data)
        err = capfd.readouterr().err
        assert "the check q1_center/demo took 0.3 s of CPU" in err and "allows 0.4 s of CPU for one" in err, err
        shell.run_cell("x = 1")
        assert "Warning" not in capfd.readouterr().err
        shell.run_cell(BUSY_CELL)
        err = capfd.readouterr().err
        assert "this cell took 0.3 s of CPU" in err and "allows 0.5 s of CPU for a cell" in err, err
    finally:
        lesson.runtime.LIMITS.clear()
        InteractiveShell.clear_instance()


def test_the_first_check_in_a_fresh_kernel_warns_of_no_slow_cell(capfd: pytest.CaptureFixture[str]) -> None:
    """The cell timer is registered inside the running check cell: that cell's end is not timed from zero (it read
    as the machine's uptime: "this cell took 3678.9 s"); the cells after it are timed (issue 40, item 7)."""
    from IPython.core.interactiveshell import InteractiveShell

    lesson = LESSONS[1]
    checks = lesson.checks
    case = {"id": "q1_center/demo", "probe": "call", "args": {"fn": "center", "args": [[[1.0, 2.0], [3.0, 6.0]]]},
            "check": "close", "atol": 1e-6, "rtol": 1e-6, "what": "center(x)", "revisit": "column means"}
    expected = {"value": checks.run_probe(lesson.namespace(), "call", case["args"]), "variants": []}
    InteractiveShell.clear_instance()
    shell = InteractiveShell.instance()
    try:
        shell.user_ns.update(lesson.namespace(), _checks=checks,
                             _data=checks.dumps(case | {"expected": expected, "limits": {"cell_s": 0.5}}))
        shell.run_cell("_checks.check_case(dict(globals()), _data)")  # the first check: it registers the timer
        assert "this cell took" not in capfd.readouterr().err
        shell.run_cell(BUSY_CELL)
        assert "this cell took 0.3 s of CPU" in capfd.readouterr().err
    finally:
        lesson.runtime.LIMITS.clear()
        InteractiveShell.clear_instance()


def test_a_questions_checks_warn_when_they_would_use_half_its_share(capfd: pytest.CaptureFixture[str]) -> None:
    """grader.check warns when a question's checks, public and hidden together at the pace the public ones took
    here, would pass half of the question's CPU share or half of its wall-clock backstop (the release ships both
    as `question_s` and `backstop`); quick checks say nothing (issue 40, items 4 and 7)."""
    lesson = LESSONS[1]
    checks = lesson.checks
    case = {"id": "q1_center/demo", "probe": "call", "args": {"fn": "center", "args": [[[1.0, 2.0], [3.0, 6.0]]]},
            "check": "close", "atol": 1e-6, "rtol": 1e-6, "what": "center(x)", "revisit": "column means"}
    expected = {"value": checks.run_probe(lesson.namespace(), "call", case["args"]), "variants": []}
    center = lesson.namespace()["center"]

    def busy_center(x: object) -> object:
        _spin(0.12)
        return center(x)

    def sleepy_center(x: object) -> object:
        import time

        time.sleep(0.1)
        return center(x)

    def data(question_s: float) -> str:
        return checks.dumps(case | {"expected": expected, "limits": {"question_s": question_s, "backstop": 3.0}})

    try:
        checks.check_case(lesson.namespace(), data(1.0))
        checks.check_summary(["q1_center/demo"], hidden=4)
        assert "Warning" not in capfd.readouterr().err  # five quick checks
        checks.check_case({**lesson.namespace(), "center": sleepy_center}, data(1.0))
        checks.check_summary(["q1_center/demo"], hidden=4)  # 0.5 s of waiting: under half of the 3 s backstop
        assert "Warning" not in capfd.readouterr().err
        checks.check_case({**lesson.namespace(), "center": busy_center}, data(1.0))
        checks.check_summary(["q1_center/demo"], hidden=4)  # five of 0.12 s of CPU: past half of 1 s
        err = capfd.readouterr().err
        assert "5 graded checks of q1_center" in err and "of CPU" in err and "allows 1 s of CPU" in err, err
        checks.check_case({**lesson.namespace(), "center": sleepy_center}, data(0.2))
        checks.check_summary(["q1_center/demo"], hidden=4)  # 0.5 s of waiting: past half of the 0.6 s backstop
        err = capfd.readouterr().err
        assert "5 graded checks of q1_center" in err and "after 0.6 s on the clock" in err, err
    finally:
        lesson.runtime.LIMITS.clear()


def test_otters_summary_case_fails_when_a_public_case_failed() -> None:
    """Otter's summary row agrees with its tests (issue 42, item 7): it passes only when every public case of the
    question passed, and otherwise says how many did not ("passed" under seven failures, before)."""
    checks = LESSONS[1].checks
    public = ["q1_center/demo", "q1_center/other"]
    try:
        checks.LOCAL_RESULTS.update({"q1_center/demo": True, "q1_center/other": True})
        checks.check_summary(public, hidden=3)
        checks.LOCAL_RESULTS["q1_center/other"] = False
        with pytest.raises(AssertionError, match=r"1 of 2 public tests did not pass \(see above\)"):
            checks.check_summary(public, hidden=3)
        del checks.LOCAL_RESULTS["q1_center/demo"]  # not run: not passed
        with pytest.raises(AssertionError, match="2 of 2 public tests did not pass"):
            checks.check_summary(public, hidden=3)
    finally:
        for cid in public:
            checks.LOCAL_RESULTS.pop(cid, None)
