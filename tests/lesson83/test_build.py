"""The release: up to date, free of solutions and hidden tests, runnable, and graded right by nbgrader."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import nbformat
import pytest

from autograder.authoring.hidden_seed import read_seed, seed_file
from autograder.authoring.suite import Suite
from autograder.config import ROOT
from autograder.course import Course, course_of
from autograder.release.common import TRAIN_TAG, diff_trees, tool_env

TEMPLATES = ROOT / "student_templates" / "lesson83"
REFERENCE = ROOT / "reference" / "lesson83.py"


def _solution_lines() -> list[str]:
    """Every substantial line between solution markers of the reference."""
    lines, inside = [], False
    for line in REFERENCE.read_text().splitlines():
        s = line.strip()
        if s == "# BEGIN SOLUTION":
            inside = True
        elif s == "# END SOLUTION":
            inside = False
        elif inside and len(s) > 12 and not s.startswith(("return x", "T = x.shape[1]")):
            lines.append(s)
    return lines


def _student_files(fresh_build: dict[str, Path]) -> list[Path]:
    roots = [TEMPLATES, fresh_build["student"], fresh_build["otter"] / "student",
             fresh_build["nbgrader"] / "release"]
    return [p for r in roots for p in r.rglob("*") if p.is_file() and "__pycache__" not in p.parts]


def test_student_release_is_up_to_date(fresh_build: dict[str, Path]) -> None:
    assert diff_trees(fresh_build["student"], TEMPLATES) == [], "run `make release` and commit student_templates/"


def test_generated_files_carry_a_banner() -> None:
    nb = nbformat.read(str(TEMPLATES / "lesson83.ipynb"), as_version=4)
    assert "do not edit" in nb.metadata["lesson83_generated"]
    for py in TEMPLATES.rglob("*.py"):
        assert "do not edit" in py.read_text().splitlines()[0], py


def test_no_solution_hidden_test_or_reference_reaches_students(fresh_build: dict[str, Path],
                                                               suite: Suite) -> None:
    solution = _solution_lines()
    assert len(solution) > 30
    hidden = [c for c in suite.cases if c.hidden]
    model_answers = [p.answer[:60] for q in suite.questions for p in q.written]
    banned = re.compile(r"BEGIN SOLUTION|END SOLUTION|BEGIN HIDDEN|from reference|import reference")
    files = _student_files(fresh_build)
    assert any(f.name == "lesson83.ipynb" for f in files)
    seed = str(read_seed(seed_file(course_of().path)))  # the hidden seed the hidden cases draw from (issue 41.5)
    for f in files:
        text = f.read_text(errors="replace")
        assert not banned.search(text), f"{f}: solution marker or reference import"
        assert seed not in text, f"{f}: the course's hidden seed"
        for line in solution:
            assert line not in text, f"{f}: contains solution line {line!r}"
        for case in hidden:
            assert case.id not in text and f"test_{case.name}" not in text, f"{f}: hidden {case.id}"
        for answer in model_answers:
            assert answer not in text, f"{f}: contains a model answer"
    # The public multiple-choice check carries no answers.
    q8 = (TEMPLATES / "tests" / "q8_checks.py").read_text()
    assert '"expected":{"variants":[]}' in q8


@pytest.mark.build
def test_notebook_runs_top_to_bottom_with_stubs_unfilled(tmp_path: Path) -> None:
    from nbclient import NotebookClient

    work = tmp_path / "lesson83"
    shutil.copytree(TEMPLATES, work)
    nb = nbformat.read(str(work / "lesson83.ipynb"), as_version=4)
    train = [c for c in nb.cells if TRAIN_TAG in c.metadata.get("tags", [])]
    assert len(train) == 1 and "otter_ignore" in train[0].metadata["tags"]
    nb.cells = [c for c in nb.cells if c not in train]  # training is the student's long run, not a check
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(work)}}).execute()
    checks = [c for c in nb.cells if c.cell_type == "code" and "grader.check(" in c.source]
    assert len(checks) == 9
    for cell in checks:  # every check ran and reported failures, none crashed the notebook
        text = json.dumps(cell.outputs)
        assert "Test case failed" in text or "failed" in text, cell.source


def test_otter_export_marks_written_answers_as_manual(fresh_build: dict[str, Path]) -> None:
    nb = nbformat.read(str(fresh_build["student"] / "lesson83.ipynb"), as_version=4)
    answer_cells = [c for c in nb.cells if "otter_answer_cell" in c.metadata.get("tags", [])
                    and c.cell_type == "markdown"]
    assert len(answer_cells) == 3
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert text.count("<!-- BEGIN QUESTION -->") == 3 and text.count("<!-- END QUESTION -->") == 3


def test_public_checks_are_valid_otter_test_files() -> None:
    for test_file in (TEMPLATES / "tests").glob("*.py"):
        tree = ast.parse(test_file.read_text())
        names = {n.targets[0].id for n in tree.body if isinstance(n, ast.Assign)}
        assert {"OK_FORMAT", "name", "points"} <= names, test_file


# Builds every generated part that holds numbers (expected values, the Otter master notebook whose test cells
# become the student test files, the nbgrader source notebook) and prints one hash per part.
NUMBERED_PARTS = """
import hashlib, json, sys
import torch
torch.set_num_threads(int(sys.argv[1]))
from autograder.authoring.content import expected_values
from autograder.authoring.questions import load_questions
from autograder.course import course_of
from autograder.release.common import grader_limits
from autograder.release.nbgrader import nbgrader_public_cases, nbgrader_source
from autograder.release.otter import otter_master, otter_test
lesson = course_of().lesson
LIMITS = grader_limits(course_of().config)  # the grader's time limits each case carries
questions = load_questions(course_of().config, lesson)
expected = expected_values(questions, lesson=lesson)
checks = lesson.checks
parts = {"expected values": checks.dumps(expected)}
for name, nb in (("otter master", otter_master(questions, expected, name="lesson83", lesson=lesson, limits=LIMITS)),
                 ("nbgrader source", nbgrader_source(questions, expected, lesson=lesson))):
    parts[name] = json.dumps([[c.cell_type, c.source, c.metadata] for c in nb.cells], sort_keys=True)
parts["nbgrader public cases"] = json.dumps(nbgrader_public_cases(questions, expected, lesson=lesson, limits=LIMITS),
                                           sort_keys=True)
cases = {c.id: c for q in questions for c in q.cases}
parts |= {f"test file of {cid}": otter_test(c, expected, cases, lesson=lesson, limits=LIMITS)
          for cid, c in cases.items()}
print(json.dumps({k: hashlib.sha256(v.encode()).hexdigest() for k, v in parts.items()}))
"""


def _numbered_parts(threads: int, *, kernels: str | None = None) -> dict[str, str]:
    """The hashes of NUMBERED_PARTS, built on `threads` threads with torch's kernels for the instruction set
    `kernels` (ATEN_CPU_CAPABILITY: "default" has no AVX; None: the best this CPU has)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
               OPENBLAS_NUM_THREADS=str(threads))
    env.pop("ATEN_CPU_CAPABILITY", None)
    env |= {"ATEN_CPU_CAPABILITY": kernels} if kernels else {}
    proc = subprocess.run([sys.executable, "-c", NUMBERED_PARTS, str(threads)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.build
def test_numbers_in_the_release_are_identical_with_other_vector_units_and_thread_counts() -> None:
    """One build on one thread with torch's kernels for a CPU without AVX, one on two threads with this CPU's own
    (AVX2 or AVX-512 on most machines): their float32 results differ in the last bits, as another CPU's do (the
    model's logits, a float32 randn of 16 values or more), and the stored values may not (#19)."""
    one, two = _numbered_parts(1, kernels="default"), _numbered_parts(2)
    assert len(one) > 60 and one.keys() == two.keys()
    assert [k for k in one if one[k] != two[k]] == []


@pytest.mark.build
def test_expected_values_skip_only_mistake_runs_that_cannot_be_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A mistake runs on a case only where the reference's probe read a name it redefines, through the reference's
    own functions too (the model's logits call sinusoidal_pe and apply_rope), and one that does more than define
    names runs everywhere: the variants are exactly those of every mistake run on every case."""
    import dataclasses

    from autograder.authoring.content import expected_values
    from autograder.authoring.questions import load_questions, mc_answers
    from reference.lesson83_mistakes import MISTAKES, Mistake, reference_namespace

    lesson = course_of().lesson
    checks = lesson.checks
    planted = Mistake("patched_after_definition", "q3_sinusoidal_module", "defines nothing, patches the module",
                      "SinusoidalPE.forward = lambda self, x: x * 0\n")
    monkeypatch.setitem(lesson.__dict__, "mistakes", (*MISTAKES, planted))  # Lesson.mistakes is cached there
    model_cases = ("m1_tinycharlm/logits_sinusoidal", "m1_tinycharlm/logits_rope")
    questions = [dataclasses.replace(q, cases=[c for c in q.cases if q.id != "m1_tinycharlm" or c.id in model_cases])
                 for q in load_questions(course_of().config, lesson)
                 if q.id in ("q3_sinusoidal_module", "m1_tinycharlm")]
    expected = expected_values(questions, lesson=lesson)
    answers = mc_answers(questions)
    every = {}
    for case in (c for q in questions for c in q.cases):
        caught = []
        for m in (*MISTAKES, planted):
            got = checks.run_probe(reference_namespace(m) | answers, case.probe, case.args)
            if "error" not in got and not checks.judge(case.plain(), got, expected[case.id]).passed:
                caught.append(m.id)
        every[case.id] = caught
    assert {cid: [v["id"] for v in e["variants"]] for cid, e in expected.items()} == every
    assert "patched_after_definition" in every["q3_sinusoidal_module/forward_adds_table"]
    assert {"pe_sin_cos_swapped", "rope_interleaved"} <= {m for ids in every.values() for m in ids}  # read indirectly


def test_stored_floats_are_rounded_within_the_tolerances() -> None:
    import numpy as np

    from autograder.authoring.content import canonical

    rng = np.random.default_rng(0)
    for atol, rtol in ((1e-4, 1e-4), (1e-3, 1e-3), (1e-6, 0.0)):
        x = rng.standard_normal(2000) * 10.0 ** rng.integers(-8, 4, 2000)
        for dtype in (np.float64, np.float32):
            a = x.astype(dtype)
            stored = canonical(a, atol=atol, rtol=rtol)
            assert stored.dtype == dtype
            moved = np.abs(stored.astype(float) - a.astype(float))
            assert (moved <= 0.06 * (atol + rtol * np.abs(a)) + np.abs(np.spacing(a))).all()
        # One ulp of noise (another machine, another thread count) almost never changes what is stored.
        noisy = np.nextafter(x, np.inf)
        assert (canonical(x, atol=atol, rtol=rtol) == canonical(noisy, atol=atol, rtol=rtol)).mean() > 0.999
    plain = canonical({"v": [-0.0, 1 / 3, float("nan"), 7, True, "x"]}, atol=1e-4, rtol=1e-4)["v"]
    assert plain[:2] == [0.0, 0.333333] and plain[3:] == [7, True, "x"] and str(plain[0]) == "0.0"


def _moved_by_ulps(value: Any, rng: Any, *, scalars: Any, ulps: int = 4) -> Any:
    """Probe data with each float moved by a random number of steps, up to `ulps` either way, of its own dtype (of
    `scalars` for a Python float): the last bits of a result that another CPU's vector units compute. A short binary
    fraction (16 significant bits or fewer: 0, 0.0078125 = 2**-7 of an ALiBi slope, 3 * 2**-6) stays as it is:
    such a value comes from exact operations, which give it on every CPU (and it may sit exactly on a rounding tie,
    which no rounded result does)."""
    import numpy as np

    if isinstance(value, np.ndarray) and value.dtype.kind == "f":
        mantissa = np.frexp(value.astype(np.float64))[0] * 2.0**16
        steps = rng.integers(-ulps, ulps + 1, value.shape) * (mantissa != np.round(mantissa))
        return (value + steps * np.spacing(np.abs(value))).astype(value.dtype)
    if isinstance(value, dict):
        return {k: _moved_by_ulps(v, rng, scalars=scalars, ulps=ulps) for k, v in value.items()}
    if isinstance(value, list):
        return [_moved_by_ulps(v, rng, scalars=scalars, ulps=ulps) for v in value]
    if isinstance(value, float):
        return _moved_by_ulps(np.array([value], dtype=scalars), rng, scalars=scalars, ulps=ulps).item()
    return value


def _release_numbers(questions: list[Any]) -> dict[str, str]:
    """Every generated text that holds the questions' stored values: the grader's expected values, each case's
    Otter test file and nbgrader's hidden cases."""
    from autograder.authoring.content import expected_values
    from autograder.release.common import grader_limits
    from autograder.release.nbgrader import nbgrader_public_cases
    from autograder.release.otter import otter_test

    lesson, limits = course_of().lesson, grader_limits(course_of().config)
    expected = expected_values(questions, lesson=lesson)
    cases = {c.id: c for q in questions for c in q.cases}
    return {"expected values": lesson.checks.dumps(expected),
            "nbgrader public cases": json.dumps(nbgrader_public_cases(questions, expected, lesson=lesson,
                                                                      limits=limits), sort_keys=True),
            **{f"test file of {cid}": otter_test(c, expected, cases, lesson=lesson, limits=limits)
               for cid, c in cases.items()}}


@pytest.mark.build
def test_a_few_ulps_of_another_cpu_change_no_stored_value(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another CPU moves the last bits of a float32 result (so of the model's logits) by a few ulps, and those of a
    float64 one by a few float64 ulps: the stored values, rounded from the float64 results (run_probe_exact), stay
    byte for byte. The same noise on the float32 path alone (stored values rounded from run_probe, as before
    #19) moves stored digits, so the noise is big enough to show a build that depends on float32 bits."""
    import numpy as np

    from autograder.authoring.questions import load_questions

    course = course_of()
    checks = course.lesson.checks
    questions = [q for q in load_questions(course.config, course.lesson)  # those whose probes compute in float32
                 if q.id in ("q3_sinusoidal_module", "q4_learned_pe", "q5_rope", "q7_alibi", "m1_tinycharlm")]
    run, run_exact, rng = checks.run_probe, checks.run_probe_exact, np.random.default_rng(19)
    noisy = {"run_probe": lambda env, name, args: _moved_by_ulps(run(env, name, args), rng, scalars=np.float32),
             "run_probe_exact": lambda env, name, args: _moved_by_ulps(run_exact(env, name, args), rng,
                                                                       scalars=np.float64)}

    clean = _release_numbers(questions)
    for name, fn in noisy.items():
        monkeypatch.setattr(checks, name, fn)
    assert [k for k, text in _release_numbers(questions).items() if text != clean[k]] == []

    monkeypatch.delattr(checks, "run_probe_exact")  # the float32 path: noisy, then as it computes
    moved = _release_numbers(questions)
    monkeypatch.setattr(checks, "run_probe", run)
    before = _release_numbers(questions)
    assert any(k.startswith("test file of m1_tinycharlm/logits_") and moved[k] != text for k, text in before.items())


def test_staleness_test_fails_when_a_stored_value_moves_beyond_its_tolerance(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """test_student_release_is_up_to_date passes on a copy of the committed release, and fails on a copy in which
    one stored logit moved by twice its tolerance, a move that fails the reference on its own case."""
    import numpy as np


    lesson = course_of().lesson
    committed = tmp_path / "lesson83"
    shutil.copytree(TEMPLATES, committed, ignore=shutil.ignore_patterns("__pycache__"))
    fresh = {"student": TEMPLATES}  # what a fresh build gives: the committed release (its own test says so)
    monkeypatch.setattr(sys.modules[__name__], "TEMPLATES", committed)
    test_student_release_is_up_to_date(fresh)

    test_file = committed / "tests" / "m1_tinycharlm.py"
    text = test_file.read_text()
    literal, case = next((node.value.value, case) for node in ast.walk(ast.parse(text))
                         if isinstance(node, ast.Assign) and node.targets[0].id == "case"
                         and (case := lesson.checks.loads(node.value.value))["id"] == "m1_tinycharlm/logits_learned")
    value = case["expected"]["value"]["value"]
    got = lesson.checks.run_probe(lesson.namespace(), case["probe"], case["args"])
    assert lesson.checks.judge(case, got, case["expected"]).passed
    value.flat[0] += 2 * (case["atol"] + case["rtol"] * abs(float(value.flat[0])))
    assert np.isfinite(value).all() and not lesson.checks.judge(case, got, case["expected"]).passed
    test_file.write_text(text.replace(repr(literal), repr(lesson.checks.dumps(case))))
    assert test_file.read_text() != text
    with pytest.raises(AssertionError, match="run `make release`"):
        test_student_release_is_up_to_date(fresh)


# Template code (Jinja delimiters, the template's names) and directives of the question sources: none may reach
# a student.
LEFTOVERS = re.compile(r"\{\{|\{%|\{#|\bref\.|(?<![.\w])(fmt|table|milestone_bounds)\(|\blm_small\b"
                       r"|<!--\s*(solution|tests|choices|written|cell)\s*-->")


def _leftovers(files: list[Path]) -> list[str]:
    """'file: leftover in context' for every template or source leftover in the files."""
    found = []
    for f in files:
        text = f.read_text(errors="replace")
        found += [f"{f}: {m.group(0)!r} in {text[max(0, m.start() - 40):m.end() + 40]!r}"
                  for m in LEFTOVERS.finditer(text)]
    return found


def _all_student_facing(fresh_build: dict[str, Path]) -> list[Path]:
    """The three targets' student-facing files: the committed and fresh student folders, Otter's student release,
    nbgrader's release and the source notebook it is made from (and the shipped .py files beside them)."""
    source = fresh_build["nbgrader"] / "source"
    return _student_files(fresh_build) + [p for p in source.rglob("*") if p.is_file()
                                          and "__pycache__" not in p.parts]


def test_no_template_or_source_leftovers_reach_students(fresh_build: dict[str, Path]) -> None:
    """Every student-facing file of every target is rendered: no Jinja code, no `ref.` calls, no directives."""
    files = _all_student_facing(fresh_build)
    roots = (TEMPLATES, fresh_build["otter"] / "student", fresh_build["nbgrader"] / "release",
             fresh_build["nbgrader"] / "source")
    for root in roots:  # each target: its notebook, its test files (Otter) and the shipped modules
        names = {p.name for p in files if root in p.parents}
        assert {"lesson83.ipynb", "lesson83_checks.py", "checks_runtime.py", "lesson83_milestone.py"} <= names, root
    assert any(p.parent.name == "tests" for p in files)
    assert _leftovers(files) == []
    import zipfile

    otter_zip = set(zipfile.ZipFile(fresh_build["otter_zip"]).namelist())  # `otter run` imports the checks there
    assert {"lesson83_checks.py", "checks_runtime.py"} <= {n.rsplit("/", 1)[-1] for n in otter_zip}, otter_zip


def test_leftover_scan_finds_a_planted_leftover(fresh_build: dict[str, Path], tmp_path: Path) -> None:
    """The scan above can fail: a copy of each target's notebook with one leftover planted in a cell is caught."""
    plants = ("$\\sin(1/100) \\approx {{ fmt(ref.sinusoidal_pe(2, 4)[1, 2]) }}$", "{% if x %}A{% endif %}",
              "see ref.rope_cache", "<!-- tests -->")
    notebooks = [fresh_build["otter"] / "student" / "lesson83.ipynb",
                 fresh_build["nbgrader"] / "release" / "lesson83" / "lesson83.ipynb"]
    for n, (plant, notebook) in enumerate((p, nb) for p in plants for nb in notebooks):
        nb = nbformat.read(str(notebook), as_version=4)
        nb.cells[len(nb.cells) // 2].source += "\n" + plant
        planted = tmp_path / f"{n}.ipynb"
        nbformat.write(nb, str(planted))
        assert _leftovers([notebook]) == [] and len(_leftovers([planted])) >= 1, plant
    test_file = tmp_path / "q8_checks.py"
    test_file.write_text((fresh_build["otter"] / "student" / "tests" / "q8_checks.py").read_text() + "# {{ x }}\n")
    assert len(_leftovers([test_file])) == 1


def test_headings_show_each_questions_points(fresh_build: dict[str, Path], suite: Suite) -> None:
    notebooks = [fresh_build["student"] / "lesson83.ipynb", fresh_build["nbgrader"] / "release" / "lesson83" /
                 "lesson83.ipynb"]
    for notebook in notebooks:
        headings = [line for c in nbformat.read(str(notebook), as_version=4).cells if c.cell_type == "markdown"
                    for line in c.source.splitlines() if line.startswith("## ")]
        for q in suite.questions:
            if q.graded and q.cells:
                mine = [h for h in headings if f"`{q.id}`" in h]
                assert len(mine) == 1 and f"(`{q.id}`, {q.points:g} points" in mine[0], (notebook, q.id, mine)
                if q.manual:
                    assert "graded by hand" in mine[0]
                if q.id.startswith("m"):
                    assert f"{suite.config.milestone.points:g} more for the checkpoint" in mine[0]


# --------------------------------------------------------------------------- what a local check says

# Runs the real checks of a built target on the reference solution (optionally with one catalogued mistake) and
# the given multiple-choice answers, with the student's torch at 3 threads; prints what each check printed.
LOCAL_CHECKS = """
import contextlib, io, json, sys
import nbformat, torch
from reference.lesson83_mistakes import MISTAKES, reference_namespace
target, mistake, answers, questions = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4:]
env = reference_namespace(next((m for m in MISTAKES if m.id == mistake), None)) | answers
seen, pe = [], env["sinusoidal_pe"]
env["sinusoidal_pe"] = lambda *a: seen.append(torch.get_num_threads()) or pe(*a)
torch.set_num_threads(3)
out = {}
if target == "otter":
    import otter
    grader = otter.Notebook("lesson83.ipynb")
    out = {q: str(grader.check(q, env)) for q in questions}
else:  # nbgrader: the release's grade cell of the question (its public checks and its summary)
    cells = nbformat.read("lesson83.ipynb", as_version=4).cells
    for q in questions:
        printed = io.StringIO()
        for cell in cells:
            if cell.cell_type == "code" and cell.source.startswith(f"# {q} ("):  # the question's grade cell
                with contextlib.redirect_stdout(printed):
                    try:
                        exec(cell.source, env)
                    except AssertionError:
                        pass
        out[q] = printed.getvalue()
print(json.dumps({"checks": out, "threads_during": sorted(set(seen)), "threads_after": torch.get_num_threads()}))
"""


def _local_checks(folder: Path, target: str, mistake: str, answers: dict[str, str],
                  questions: tuple[str, ...], tmp_path: Path) -> dict:
    work = tmp_path / f"{target}-{mistake}"
    shutil.copytree(folder, work)
    proc = subprocess.run([sys.executable, "-c", LOCAL_CHECKS, target, mistake, json.dumps(answers), *questions],
                          cwd=work, capture_output=True, text=True, env=tool_env(), timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_local_checks_say_public_and_hidden_counts(fresh_build: dict[str, Path], suite: Suite,
                                                   tmp_path: Path) -> None:
    """A real grader.check (Otter) and the nbgrader release's check cells, on the built student files: they say how
    many public tests passed and how many more are graded after submission, and, for Q8, that the answers are
    only checked then (a wrong answer passes locally); they run on one torch thread and restore the student's 3."""
    from autograder.authoring.questions import mc_answers

    right = mc_answers(list(suite.questions))
    wrong = {var: next(x for x in "ABCD" if x != letter) for var, letter in right.items()}
    count = {q.id: (sum(not c.hidden for c in q.cases), sum(c.hidden for c in q.cases))
             for q in suite.questions}
    (n2, m2), (n8, m8) = count["q2_sinusoidal_pe"], count["q8_checks"]
    assert n2 > 1 and m2 > 1 and n8 == 1 and m8 == 5
    passed = f"{n2} public tests checked here; {m2} more tests are graded after you submit."
    answers = (f"1 public test checked here; {m8} more tests are graded after you submit. Only the format of your "
               "answers is checked here: whether they are right is checked after you submit.")
    failed = re.compile(rf"\d+ of {n2} public tests did not pass \(see above\); {m2} more tests are graded after "
                        "you submit.")
    folders = {"otter": fresh_build["otter"] / "student", "nbgrader": fresh_build["nbgrader"] / "release" / "lesson83"}
    for target, folder in folders.items():
        good = _local_checks(folder, target, "none", wrong, ("q2_sinusoidal_pe", "q8_checks"), tmp_path)
        assert passed in good["checks"]["q2_sinusoidal_pe"], (target, good)
        assert answers in good["checks"]["q8_checks"], (target, good)
        assert good["threads_during"] == [1] and good["threads_after"] == 3, (target, good)
        bad = _local_checks(folder, target, "pe_sin_cos_swapped", right, ("q2_sinusoidal_pe",), tmp_path)
        text = bad["checks"]["q2_sinusoidal_pe"]
        # the summary agrees with the tests (#42.7): under failed tests it says how many, never "passed"
        assert failed.search(text) and "checked here" not in text, (target, text)
        assert "All test cases passed" not in text and "test_summary result:\n    ✅" not in text, (target, text)


# --------------------------------------------------------------------------- command line


def test_cli_help_lists_every_verb_and_shows_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    """The top-level description names no subset of the verbs; every verb's help gives each option's default."""
    from autograder.cli import main

    with pytest.raises(SystemExit):
        main(["no-such-verb"])
    verbs = re.findall(r"'([a-z]+)'", capsys.readouterr().err.split("choose from", 1)[1])
    assert {"release", "selfcheck", "grade", "gradescope", "report"} <= set(verbs)
    with pytest.raises(SystemExit):
        main(["--help"])
    top = capsys.readouterr().out
    description = top.split("\n\n")[1]
    named = [v for v in verbs if re.search(rf"\b{v}\b", description)]
    assert named in ([], verbs), f"the description names only {named}"
    assert all(re.search(rf"^\s+{v}\s", top, re.M) for v in verbs)
    for verb in verbs:
        with pytest.raises(SystemExit):
            main([verb, "--help"])
        text = capsys.readouterr().out
        options = [o for o in re.split(r"\n(?=  -)", text.split("options:", 1)[1]) if o.strip()]
        assert len(options) >= 2, verb
        for option in options:
            flat = " ".join(option.split())
            if not flat.startswith("-h, --help"):
                assert "default:" in flat, f"{verb}: {flat}"
        assert "--config" in text, verb


def test_gradescope_bundle_carries_only_what_grading_needs(course: Course, tmp_path: Path) -> None:
    """The zip holds the engine, the lesson and the reference, never the README or the mutation suite's variants
    (#21): what Gradescope runs is all it gets."""
    import zipfile

    from autograder.release.gradescope import gradescope_bundle

    names = set(zipfile.ZipFile(gradescope_bundle(tmp_path / "autograder.zip", course=course)).namelist())
    assert {"run_autograder", "setup.sh", "lesson83/autograder/cli.py", "lesson83/reference/lesson83.py",
            "lesson83/assignments/lesson83/lesson83_checks.py", "lesson83/autograder/runtime/checks_runtime.py",
            "lesson83/grading_config.yaml"} <= names
    assert [n for n in names if n.endswith(("README.md", "variants.py"))] == []


def test_the_nbgrader_release_says_nothing_of_grader_check(fresh_build: dict[str, Path]) -> None:
    """nbgrader students have no `grader.check`: their notebook's text never names it (issue 40, item 7); the
    Otter notebook, whose check cells call it, does."""
    import nbformat

    def text(path: Path) -> str:
        nb = nbformat.read(str(path), as_version=4)
        return "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")

    assert "grader.check" not in text(fresh_build["nbgrader"] / "release" / "lesson83" / "lesson83.ipynb")
    assert "grader.check" in text(fresh_build["otter"] / "student" / "lesson83.ipynb")
