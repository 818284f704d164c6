"""The release: up to date, free of solutions and hidden tests, runnable, and graded right by nbgrader."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import nbformat

from autograder.build import TRAIN_TAG, diff_trees, tool_env
from autograder.config import ROOT
from autograder.judge import Suite

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
    hidden = [c for c in suite.cases if c["hidden"]]
    model_answers = [p.answer[:60] for q in suite.questions for p in q.written]
    banned = re.compile(r"BEGIN SOLUTION|END SOLUTION|BEGIN HIDDEN|from reference|import reference")
    files = _student_files(fresh_build)
    assert any(f.name == "lesson83.ipynb" for f in files)
    for f in files:
        text = f.read_text(errors="replace")
        assert not banned.search(text), f"{f}: solution marker or reference import"
        for line in solution:
            assert line not in text, f"{f}: contains solution line {line!r}"
        for case in hidden:
            assert case["id"] not in text and f"test_{case['name']}" not in text, f"{f}: hidden {case['id']}"
        for answer in model_answers:
            assert answer not in text, f"{f}: contains a model answer"
    # The public multiple-choice check carries no answers.
    q8 = (TEMPLATES / "tests" / "q8_checks.py").read_text()
    assert '"expected":{"variants":[]}' in q8


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


def test_nbgrader_autograde_gives_reference_full_marks(fresh_build: dict[str, Path], suite: Suite,
                                                       tmp_path: Path) -> None:
    course = tmp_path / "course"
    shutil.copytree(fresh_build["nbgrader"], course)
    src = course / "source" / "lesson83"
    release = course / "release" / "lesson83"
    for student, folder in (("reference", src), ("blank", release)):
        dest = course / "submitted" / student / "lesson83"
        dest.mkdir(parents=True)
        shutil.copy(folder / "lesson83.ipynb", dest / "lesson83.ipynb")
        for shipped in ("lesson83_checks.py", "lesson83_milestone.py", "timemachine.txt"):
            shutil.copy(folder / shipped, dest / shipped)
    for f in ("milestone.pt", "milestone.json"):  # the reference uploads its checkpoint (m1_checkpoint's cells)
        shutil.copy(ROOT / "reference" / "milestone" / f, course / "submitted" / "reference" / "lesson83" / f)
    nbgrader = str(Path(sys.executable).with_name("nbgrader"))
    for student in ("reference", "blank"):
        subprocess.run([nbgrader, "db", "student", "add", student], cwd=course, check=True,
                       capture_output=True, env=tool_env())
    proc = subprocess.run([nbgrader, "autograde", "lesson83", "--force"], cwd=course, capture_output=True,
                          text=True, env=tool_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    db = sqlite3.connect(course / "gradebook.db")
    rows = db.execute(
        "select s.student_id, sum(g.auto_score), sum(gc.max_score) from grade g "
        "join grade_cells gc on g.cell_id = gc.id join submitted_notebook n on g.notebook_id = n.id "
        "join submitted_assignment s on n.assignment_id = s.id where gc.cell_type = 'code' "
        "group by s.student_id").fetchall()
    scores = {r[0]: (round(r[1] or 0, 3), round(r[2], 3)) for r in rows}
    assert scores["reference"] == (suite.auto_points, suite.auto_points)
    assert scores["blank"][0] == 0
    manual = db.execute("select count(*) from grade_cells where cell_type = 'markdown'").fetchone()[0]
    assert manual == 3  # the three written answers are manually graded cells


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
from autograder import build, lesson83_checks as checks
from autograder.config import load_config
from autograder.content import expected_values, load_questions
questions = load_questions(load_config())
expected = expected_values(questions)
parts = {"expected values": checks.dumps(expected)}
for name, nb in (("otter master", build.otter_master(questions, expected, name="lesson83")),
                 ("nbgrader source", build.nbgrader_source(questions, expected))):
    parts[name] = json.dumps([[c.cell_type, c.source, c.metadata] for c in nb.cells], sort_keys=True)
cases = {c["id"]: c for q in questions for c in q.cases}
parts |= {f"test file of {cid}": build._otter_test(c, expected, cases) for cid, c in cases.items()}
print(json.dumps({k: hashlib.sha256(v.encode()).hexdigest() for k, v in parts.items()}))
"""


def _numbered_parts(threads: int) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
               OPENBLAS_NUM_THREADS=str(threads))
    proc = subprocess.run([sys.executable, "-c", NUMBERED_PARTS, str(threads)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_numbers_in_the_release_are_identical_with_one_and_two_threads() -> None:
    one, two = _numbered_parts(1), _numbered_parts(2)
    assert len(one) > 60 and one.keys() == two.keys()
    assert [k for k in one if one[k] != two[k]] == []


def test_stored_floats_are_rounded_within_the_tolerances() -> None:
    import numpy as np

    from autograder.content import canonical

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


def test_no_template_or_source_leftovers_reach_students() -> None:
    """Every student-facing file of the committed release is rendered: no Jinja code and no `ref.` calls."""
    for path in sorted((ROOT / "student_templates").rglob("*")):
        if path.is_file() and path.suffix in (".ipynb", ".py", ".md"):
            text = path.read_text()
            for leftover in ("{{", "{%", "ref."):
                assert leftover not in text, f"{path}: {leftover!r}"
