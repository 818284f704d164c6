"""nbgrader graded by the sandboxed engine, with real nbgrader: an attack earns nothing and is flagged, an honest
notebook earns full marks, nothing a student kernel can read holds a hidden value, files stay small."""

from __future__ import annotations

import csv
import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import nbformat
import pytest

from autograder.authoring.suite import Suite
from autograder.config import ROOT
from autograder.grading import store
from autograder.grading.nbgrader import ALLOW_FLAG, NbgraderGradingError, cell_text, flag_note, nbgrader_autograde
from autograder.lesson import default_lesson
from autograder.release.common import case_json, tool_env

pytestmark = [pytest.mark.sandbox, pytest.mark.build]  # the tiers are in pyproject.toml

LESSON = default_lesson()
checks = LESSON.checks
CHECKPOINT = ROOT / "reference" / "lesson83_checkpoint"
# The README's nbgrader commands (test_deploy.py checks the README shows exactly these), from dist/nbgrader.
NBGRADER_STEPS = """\
nbgrader db student add alice
../../.venv/bin/lesson83 nbgrader-autograde .
nbgrader generate_feedback lesson83 --force
"""
# The attack of issue 20: walk up to any file of expected values, take the Q8 key from it, and switch the
# notebook's own checks off; every stub is left empty.
ATTACK = """\
import json, pathlib
import lesson83_checks

lesson83_checks.run_case = lambda *a, **k: None
lesson83_checks.check_case = lambda *a, **k: None
for folder in [pathlib.Path.cwd(), *pathlib.Path.cwd().parents]:
    for found in folder.glob("*.json"):
        try:
            cases = json.loads(found.read_text())
        except Exception:
            continue
        for cid, case in (cases.items() if isinstance(cases, dict) else ()):
            if str(cid).startswith("q8_checks/correct_"):
                case = json.loads(case) if isinstance(case, str) else case
                globals().update(case["expected"]["value"])
"""


def _nbgrader(course: Path, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(Path(sys.executable).with_name("nbgrader")), *args], cwd=course,
                          capture_output=True, text=True, env=tool_env())
    assert proc.returncode == 0, f"nbgrader {' '.join(args)}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc


def _submit(course: Path, student: str, nb: nbformat.NotebookNode, *, checkpoint: bool) -> None:
    dest = course / "submitted" / student / "lesson83"
    dest.mkdir(parents=True)
    nbformat.write(nb, str(dest / "lesson83.ipynb"))
    for f in (course / "release" / "lesson83").iterdir():
        if f.suffix != ".ipynb":
            shutil.copy(f, dest / f.name)
    for f in ("milestone.pt", "milestone.json") if checkpoint else ():
        shutil.copy(CHECKPOINT / f, dest / f)


def _read(course: Path, kind: str) -> nbformat.NotebookNode:
    return nbformat.read(str(course / kind / "lesson83" / "lesson83.ipynb"), as_version=4)


@pytest.fixture(scope="module")
def graded(fresh_build: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A copy of the built course with three submissions (the source notebook with the reference's checkpoint, the
    blank release, the release with the attack), graded by `nbgrader_autograde`, then nbgrader's feedback."""
    course = tmp_path_factory.mktemp("nbgrader") / "course"
    shutil.copytree(fresh_build["nbgrader"], course)
    _submit(course, "honest", _read(course, "source"), checkpoint=True)
    _submit(course, "blank", _read(course, "release"), checkpoint=False)
    attack = _read(course, "release")
    attack.cells.insert(3, nbformat.v4.new_code_cell(ATTACK))
    _submit(course, "attack", attack, checkpoint=False)
    run = nbgrader_autograde(course, progress=False)
    _nbgrader(course, "generate_feedback", "lesson83", "--force")
    out = course.with_name("course-grades")
    with open(out / "grades.csv") as f:
        rows = {r["id"]: r for r in csv.DictReader(f)}
    results = {s: json.loads((out / "results" / f"{s}.json").read_text()) for s in rows}
    return {"course": course, "run": run, "rows": rows, "results": results, "out": out}


def _gradebook(course: Path) -> Any:
    from nbgrader.api import Gradebook

    return Gradebook(f"sqlite:///{course / 'gradebook.db'}")


def test_attack_earns_nothing_on_hidden_cases_and_is_flagged(graded: dict[str, Any], suite: Suite) -> None:
    record = graded["results"]["attack"]
    hidden = [c for c in record["cases"] if c["hidden"]]
    assert hidden and all(c["points"] == 0 for c in hidden)
    assert record["total"] == 0 and graded["rows"]["attack"]["status"] == "tampering detected"
    assert "run_case" in graded["rows"]["attack"]["message"]  # the TA's grades.csv says what was replaced
    with _gradebook(graded["course"]) as gb:
        assert gb.find_submission("lesson83", "attack").score == 0
        notebook = gb.find_submission_notebook("lesson83", "lesson83", "attack")
        assert notebook.flagged
        assert any("tampering detected" in (c.comment or "") for c in notebook.comments)
        assert not gb.find_submission_notebook("lesson83", "lesson83", "honest").flagged
    assert graded["run"].flagged.keys() == {"attack"}


def test_honest_notebook_gets_full_marks_and_the_gradebook_totals_exactly_100(graded: dict[str, Any],
                                                                               suite: Suite) -> None:
    assert graded["rows"]["honest"]["status"] == "graded"
    assert float(graded["rows"]["honest"]["total"]) == suite.auto_points
    with _gradebook(graded["course"]) as gb:
        assert gb.find_assignment("lesson83").max_score == 100.0  # exactly, not 99.99999999999989
        sub = gb.find_submission("lesson83", "honest")
        assert sub.code_score == suite.auto_points == 94
        for part in ("q9_buffer", "q9_rope_v", "q9_alibi"):  # the TA grades Q9 in formgrader
            grade = gb.find_grade(part, "lesson83", "lesson83", "honest")
            grade.manual_score = grade.max_score
        gb.db.commit()
        assert gb.find_submission("lesson83", "honest").score == 100.0
        assert gb.find_submission("lesson83", "blank").score == 0
    for student in ("honest", "blank", "attack"):
        assert (graded["course"] / "feedback" / student / "lesson83" / "lesson83.html").is_file()
    assert graded["run"].problem == ""


def test_the_grade_cells_show_the_graders_verdicts(graded: dict[str, Any]) -> None:
    """The autograded notebook (what formgrader and the feedback show) carries the engine's verdicts: public
    messages in full, hidden cases by name only."""
    nb = nbformat.read(str(graded["course"] / "autograded" / "blank" / "lesson83" / "lesson83.ipynb"), as_version=4)
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "q2_sinusoidal_pe-tests")
    text = "".join(o.get("text", "") for o in cell.outputs)
    assert "q2_sinusoidal_pe: 0 of 12 points" in text and "NotImplementedError" in text
    assert "a hidden case of q2_sinusoidal_pe failed" in text


def _secret_forms(case_json: str) -> set[str]:
    """How a hidden case's arguments and expected values could show: its JSON, its encoded arrays, its numbers
    printed with 4 or 8 decimals or in full, and for a multiple-choice case the answer written as Python or JSON."""
    import numpy as np

    forms = {case_json[case_json.index('"expected"'):][:60], '"args":' + checks.dumps(checks.loads(case_json)["args"])}
    forms |= {m[:40] for m in re.findall(r'"__ndarray__":"([^"]+)"', case_json) if len(m) >= 40}
    value = checks.loads(case_json)["expected"].get("value", {})
    for item in value.values() if isinstance(value, dict) else [value]:
        if isinstance(item, str) and len(item) == 1:  # a multiple-choice answer
            var = next(iter(value))
            forms |= {f'"{var}":"{item}"', f'"{var}": "{item}"', f"'{var}': '{item}'", f'{var} = "{item}"',
                      f"{var} = '{item}'", f'{var} == "{item}"'}
        elif isinstance(item, np.ndarray) and item.dtype.kind == "f":
            xs = [float(x) for x in item.ravel()[:200] if abs(x) > 1e-3 and abs(abs(x) - 1) > 1e-3
                  and abs(x - round(x)) > 1e-3][:6]
            forms |= {f for x in xs for f in (f"{x:.4f}", f"{x:.8f}", repr(x))}
    return forms


def test_nothing_a_student_kernel_can_read_holds_a_hidden_value(graded: dict[str, Any], suite: Suite) -> None:
    """Every file of the graded course (source, release, submitted, autograded, feedback, the gradebook, the
    config) is scanned for each hidden case's expected values and every Q8 answer: none is there."""
    course = graded["course"]
    # The students' own uploads (nbgrader copies them into autograded/ and feedback/) hold only what they wrote:
    # a milestone.json of thousands of numbers matches some hidden digits by chance, so copies of them are skipped.
    uploaded = {p.read_bytes() for p in (course / "submitted").rglob("*") if p.is_file()}
    files = [p for p in course.rglob("*") if p.is_file() and p.suffix != ".pt" and "submitted" not in p.parts
             and (p.suffix == ".ipynb" or p.read_bytes() not in uploaded)]
    assert not [p for p in files if "hidden" in p.name]
    by_id = {c.id: c for c in suite.cases}
    public = "\n".join(c.source for c in _read(course, "release").cells)
    seen = set().union(*(_secret_forms(case_json(c, suite.expected, by_id, lesson=LESSON)) for c in suite.cases
                         if not c.hidden))
    secrets = {c.id: {f for f in _secret_forms(case_json(c, suite.expected, by_id, lesson=LESSON))
                         if f not in public and f not in seen} for c in suite.cases if c.hidden}
    valued = [cid for cid in secrets if "value" in suite.expected[cid]]
    assert all(secrets[cid] for cid in valued), [cid for cid in valued if not secrets[cid]]
    for path in files:
        text = path.read_bytes().decode("utf-8", "replace")
        leaks = {cid: sorted(f for f in forms if f in text) for cid, forms in secrets.items()}
        assert not any(leaks.values()), (path, {cid: f for cid, f in leaks.items() if f})


def test_no_checksum_warnings_and_no_code_run_by_nbgrader(graded: dict[str, Any]) -> None:
    """The release's locked cells are the source's (no hidden tests to put back), so nbgrader autograde warns about
    no changed cell; and it runs no kernel (EngineVerdicts replaces Execute)."""
    log = graded["run"].log
    assert "Autograding" in log
    assert "has changed" not in log and "checksum" not in log.lower()
    assert "Executing notebook" not in log


def test_student_notebooks_and_feedback_stay_small(fresh_build: dict[str, Path], graded: dict[str, Any]) -> None:
    notebooks = [fresh_build["student"] / "lesson83.ipynb", fresh_build["otter"] / "student" / "lesson83.ipynb",
                 fresh_build["nbgrader"] / "release" / "lesson83" / "lesson83.ipynb"]
    for nb in notebooks:
        assert nb.stat().st_size < 150_000, (nb, nb.stat().st_size)
        assert max(len(line) for line in nb.read_text().splitlines()) < 20_000, nb  # no base64 blob of test data
    blank = graded["course"] / "feedback" / "blank" / "lesson83" / "lesson83.html"
    assert graded["rows"]["blank"]["total"] == "0.0"
    assert blank.stat().st_size < 200_000, blank.stat().st_size
    assert "Bootstrap v3" not in blank.read_text()


def test_plain_nbgrader_autograde_refuses_and_runs_nothing(fresh_build: dict[str, Path], tmp_path: Path) -> None:
    course, marker = tmp_path / "course", Path("/tmp/lesson83-ran-in-nbgrader")
    marker.unlink(missing_ok=True)
    shutil.copytree(fresh_build["nbgrader"], course)
    nb = _read(course, "release")
    nb.cells.insert(3, nbformat.v4.new_code_cell("open('/tmp/lesson83-ran-in-nbgrader', 'w').write('ran')"))
    _submit(course, "alice", nb, checkpoint=False)
    proc = subprocess.run([str(Path(sys.executable).with_name("nbgrader")), "autograde", "lesson83"], cwd=course,
                          capture_output=True, text=True, env=tool_env())
    assert proc.returncode != 0 and "lesson83 nbgrader-autograde ." in proc.stdout + proc.stderr
    assert not marker.exists()


def test_grading_refuses_without_a_sandbox_unless_allowed(fresh_build: dict[str, Path], tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from autograder.cli import main
    from autograder.grading import nbgrader as nbgrader_grade

    course = tmp_path / "course"
    shutil.copytree(fresh_build["nbgrader"], course)
    _submit(course, "alice", _read(course, "release"), checkpoint=False)
    monkeypatch.setattr(nbgrader_grade, "isolation_here", lambda: "none")
    with pytest.raises(NbgraderGradingError, match=ALLOW_FLAG):
        nbgrader_autograde(course, progress=False)
    assert main(["nbgrader-autograde", str(course), "--quiet"]) == 2
    assert ALLOW_FLAG in capsys.readouterr().err
    assert not (tmp_path / "course-grades").exists()  # nothing ran
    with pytest.raises(NbgraderGradingError, match="outside the course"):
        nbgrader_autograde(course, out=course / "grades", progress=False)


def test_unsandboxed_grading_says_so_on_every_row_cell_and_flag(tmp_path: Path, suite: Suite) -> None:
    """A stored result graded with isolation "none": its grades.csv row, its grade cells and its gradebook flag
    say so (the --allow-unsandboxed path)."""
    from autograder.grading.submissions import Submission

    out = tmp_path / "grades"
    (out / "results").mkdir(parents=True)
    record = {"submission": "alice", "status": "graded", "cases": [], "isolation": "none",
              "questions": {"q2_sinusoidal_pe": 12.0}, "gradescope": {"tests": []}}
    (out / "results" / "alice.json").write_text(json.dumps(record))
    rows = store.write_tables(suite, [Submission("alice", Path(), None, result_name="alice.json")], out)
    assert rows[0]["message"].startswith(store.UNSANDBOXED)
    assert "without a sandbox" in cell_text(record, "q2_sinusoidal_pe", 12.0)[0]
    assert "without a sandbox" in flag_note(record)
    assert flag_note(record | {"isolation": "bubblewrap"}) == ""


def test_otter_zip_says_it_grades_the_notebook_only(fresh_build: dict[str, Path], suite: Suite) -> None:
    with zipfile.ZipFile(fresh_build["otter_zip"]) as zf:
        note = zf.read("tests/m1_checkpoint.py").decode()
    assert "points = 0" in note
    assert f"grades the notebook's {suite.notebook_points:g} points" in note
    assert f"the milestone checkpoint's {suite.config.milestone.points:g}" in note
    assert f"grades all {suite.auto_points:g}" in note
