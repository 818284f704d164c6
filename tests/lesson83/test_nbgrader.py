"""nbgrader graded by the sandboxed engine, with real nbgrader: an attack earns nothing and is flagged, an honest
notebook earns full marks, nothing a student kernel can read holds a hidden value, files stay small."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import nbformat
import pytest

from autograder.authoring.hidden_seed import read_seed, seed_file
from autograder.authoring.suite import Suite
from autograder.config import ROOT
from autograder.course import course_of
from autograder.grading.gradebook import Gradebook
from autograder.grading.nbgrader import ALLOW_FLAG, NbgraderGradingError, cell_text, flag_note, nbgrader_autograde
from autograder.grading.tables import UNSANDBOXED, write_tables
from autograder.release.common import case_json, grader_limits, tool_env

pytestmark = [pytest.mark.sandbox, pytest.mark.build]  # the tiers are in pyproject.toml

LESSON = course_of().lesson
LIMITS = grader_limits(course_of().config)  # the grader's time limits each case carries
checks = LESSON.checks
CHECKPOINT = ROOT / "reference" / "lesson83_checkpoint"
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
    run = nbgrader_autograde(course, progress=False, course=course_of())
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
    messages in full, hidden cases by their verdicts only, in one row per question."""
    nb = nbformat.read(str(graded["course"] / "autograded" / "blank" / "lesson83" / "lesson83.ipynb"), as_version=4)
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "q2_sinusoidal_pe-tests")
    text = "".join(o.get("text", "") for o in cell.outputs)
    assert "q2_sinusoidal_pe: 0 of 12 points" in text and "NotImplementedError" in text
    assert "FAILED q2_sinusoidal_pe: hidden tests" in text and "hidden case 1: failed; revisit: " in text, text
    assert "q2_sinusoidal_pe/" not in text  # the cases by their names, never the grader's ids (#42.7)


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
    seen = set().union(*(_secret_forms(case_json(c, suite.expected, by_id, lesson=LESSON, limits=LIMITS))
                         for c in suite.cases if not c.hidden))
    secrets = {c.id: {f for f in _secret_forms(case_json(c, suite.expected, by_id, lesson=LESSON, limits=LIMITS))
                         if f not in public and f not in seen} for c in suite.cases if c.hidden}
    valued = [cid for cid in secrets if "value" in suite.expected[cid]]
    assert all(secrets[cid] for cid in valued), [cid for cid in valued if not secrets[cid]]
    secrets["the hidden seed"] = {str(read_seed(seed_file(course_of().path)))}  # the draws' seed (issue 41.5)
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
        nbgrader_autograde(course, progress=False, course=course_of())
    assert main(["nbgrader-autograde", str(course), "--quiet"]) == 2
    assert ALLOW_FLAG in capsys.readouterr().err
    assert not (tmp_path / "course-grades").exists()  # nothing ran
    with pytest.raises(NbgraderGradingError, match="outside the course"):
        nbgrader_autograde(course, out=course / "grades", progress=False, course=course_of())


def test_unsandboxed_grading_says_so_on_every_row_cell_and_flag(tmp_path: Path, suite: Suite) -> None:
    """A stored result graded with isolation "none": its grades.csv row, its grade cells and its gradebook flag
    say so (the --allow-unsandboxed path)."""
    from autograder.grading.submissions import Submission

    out = tmp_path / "grades"
    (out / "results").mkdir(parents=True)
    record = {"submission": "alice", "status": "graded", "cases": [], "isolation": "none",
              "questions": {"q2_sinusoidal_pe": 12.0}, "gradescope": {"tests": []}}
    (out / "results" / "alice.json").write_text(json.dumps(record))
    rows = write_tables(suite, [Submission("alice", Path(), None, result_name="alice.json")], Gradebook(out)).rows
    assert rows[0]["message"].startswith(UNSANDBOXED)
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


# --- issue 33: a rebuild, `make clean` and a plain `nbgrader autograde` leave the instructor's work in place ---

def _graded_dist(graded: dict[str, Any], root: Path) -> Path:
    """dist/ as `make demo` and a term of grading leave it: the graded course (three graded students, a manual Q9
    grade and comment for honest, everyone's feedback), its grades folder, the outputs of the last release."""
    dist = root / "dist"
    shutil.copytree(graded["course"], dist / "nbgrader")
    shutil.copytree(graded["out"], dist / "nbgrader-grades")
    with _gradebook(dist / "nbgrader") as gb:
        gb.find_grade("q9_buffer", "lesson83", "lesson83", "honest").manual_score = 1.5
        gb.find_comment("q9_buffer", "lesson83", "lesson83", "honest").manual_comment = "say why it is a buffer"
        gb.db.commit()
    _nbgrader(dist / "nbgrader", "generate_feedback", "lesson83", "--force")
    for stale in ("otter", "samples", "report", "nbgrader/source/lesson83", "nbgrader/release/lesson83"):
        (dist / stale).mkdir(parents=True, exist_ok=True)
        (dist / stale / "STALE").write_text("from an older release")
    (dist / "manifest.json").write_text("{}")
    return dist


def _work(dist: Path) -> dict[str, Any]:
    """Everything of the instructor's in dist/: each file of submitted/, autograded/, feedback/ and of the grades
    folder (its bytes), and the gradebook's students, grades, comments and flags."""
    course = dist / "nbgrader"
    files = {str(p.relative_to(dist)): p.read_bytes() for top in (course / "submitted", course / "autograded",
             course / "feedback", dist / "nbgrader-grades") for p in sorted(top.rglob("*")) if p.is_file()}
    with _gradebook(course) as gb:
        book = {"students": sorted(s.id for s in gb.students), "max": gb.find_assignment("lesson83").max_score}
        for sub in gb.find_assignment("lesson83").submissions:
            nb = gb.find_submission_notebook("lesson83", "lesson83", sub.student_id)
            book[sub.student_id] = (nb.flagged, sorted((g.name, g.auto_score, g.manual_score) for g in nb.grades),
                                    sorted((c.name, c.auto_comment, c.manual_comment) for c in nb.comments))
    return {"files": files, "gradebook": book}


def _prebuilt(fresh_build: dict[str, Path], edit: Any = None) -> Any:
    """A stand-in for release's build step that copies the session's fresh build (optionally edited) into place, so
    the rebuild's install runs for real without building everything again."""
    top = fresh_build["manifest"].parent

    def build(*, work: Path, **_: Any) -> dict[str, Path]:
        shutil.copytree(top, work)
        parts = {k: work / v.relative_to(top) for k, v in fresh_build.items()}
        if edit is not None:
            edit(parts)
        return parts
    return build


def test_a_rebuild_and_make_clean_keep_the_course_and_its_grades(graded: dict[str, Any], fresh_build: dict[str, Path],
                                                                  tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """`lesson83 release` over a course in use replaces only source/lesson83, release/lesson83 and
    nbgrader_config.py of it (generate_assignment in the course) and its own outputs; it says so first. Every
    submitted, autograded and feedback file, the grades folder and the gradebook's rows stay as they were; so do
    they through `make clean`, which deletes the rest of dist/."""
    import autograder.release as rel

    dist = _graded_dist(graded, tmp_path)
    course, before = dist / "nbgrader", _work(dist)
    monkeypatch.setattr(rel, "build", _prebuilt(fresh_build))
    said: list[str] = []
    rel.release(dist=dist, templates=tmp_path / "templates", say=said.append, course=course_of())
    assert _work(dist) == before
    plan = "\n".join(said)
    assert "only source/lesson83, release/lesson83 and nbgrader_config.py" in plan, plan
    assert "submitted/ (3 students)" in plan and "report" in plan and "nbgrader-grades" in plan, plan
    for replaced in ("otter", "samples", "nbgrader/source/lesson83", "nbgrader/release/lesson83"):
        assert not (dist / replaced / "STALE").exists(), replaced
    assert (dist / "report" / "STALE").exists() and json.loads((dist / "manifest.json").read_text())["questions"]
    assert [c.source for c in _read(course, "release").cells] == \
        [c.source for c in _read(fresh_build["nbgrader"], "release").cells]  # the answer stubs too
    _nbgrader(course, "generate_feedback", "lesson83", "--force")  # the new config works in the old course
    assert _work(dist) == before

    repo = tmp_path / "repo"  # `make clean` as written in the Makefile, in a copy of the repository's layout
    (repo / "autograder" / "release").mkdir(parents=True)
    shutil.copy(ROOT / "Makefile", repo / "Makefile")
    shutil.copy(ROOT / "autograder" / "release" / "keep.py", repo / "autograder" / "release" / "keep.py")
    os.replace(dist, repo / "dist")
    proc = subprocess.run(["make", "clean"], cwd=repo, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "kept" in proc.stdout and "submitted/ (3 students)" in proc.stdout, proc.stdout
    assert sorted(p.name for p in (repo / "dist").iterdir()) == ["nbgrader", "nbgrader-grades"]
    assert _work(repo / "dist") == before
    shutil.rmtree(repo / "dist")  # a course without work (as built) goes with the rest
    shutil.copytree(fresh_build["nbgrader"], repo / "dist" / "nbgrader")
    subprocess.run(["make", "clean"], cwd=repo, capture_output=True, text=True, check=True)
    assert not (repo / "dist").exists()


def test_a_rebuild_that_changes_grade_cells_under_submissions_refuses(graded: dict[str, Any],
                                                                      fresh_build: dict[str, Path], tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A question's points changed while the course holds submissions: release refuses, naming the cell and the
    change, and replaces nothing (not the course, not its other outputs, not student_templates)."""
    import autograder.release as rel

    def new_points(parts: dict[str, Path]) -> None:
        path = parts["nbgrader"] / "source" / "lesson83" / "lesson83.ipynb"
        nb = nbformat.read(str(path), as_version=4)
        cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "q2_sinusoidal_pe-tests")
        cell.metadata["nbgrader"]["points"] = 10
        nbformat.write(nb, str(path))

    dist = _graded_dist(graded, tmp_path)
    tree = {str(p.relative_to(dist)): p.read_bytes() for p in sorted(dist.rglob("*")) if p.is_file()}
    monkeypatch.setattr(rel, "build", _prebuilt(fresh_build, new_points))
    with pytest.raises(rel.BuildError, match=r"q2_sinusoidal_pe-tests from 12 to 10 points.*Nothing was replaced"):
        rel.release(dist=dist, templates=tmp_path / "templates", say=lambda _: None, course=course_of())
    assert {str(p.relative_to(dist)): p.read_bytes() for p in sorted(dist.rglob("*")) if p.is_file()} == tree
    assert not (tmp_path / "templates").exists()


def test_plain_nbgrader_autograde_on_a_graded_course_changes_nothing(graded: dict[str, Any], tmp_path: Path) -> None:
    """`nbgrader autograde` (with or without --force) stops as it loads nbgrader_config.py, and formgrader's
    autograde button (nbgrader's API, in a process with no such command line) as its converter starts: every
    autograded/ folder and the gradebook stay byte for byte (nbgrader's own clean-up used to delete them)."""
    dist = tmp_path / "dist"
    shutil.copytree(graded["course"], dist / "nbgrader")
    shutil.copytree(graded["out"], dist / "nbgrader-grades")
    course = dist / "nbgrader"

    def state() -> dict[str, bytes]:
        return {str(p.relative_to(course)): p.read_bytes() for p in sorted(course.rglob("*"))
                if p.is_file() and "__pycache__" not in p.parts}

    before = state()
    assert any(k.startswith("autograded/honest/") for k in before)
    nbgrader = str(Path(sys.executable).with_name("nbgrader"))
    for args in (["autograde", "lesson83"], ["autograde", "lesson83", "--force"],
                 ["autograde", "lesson83", "--student", "honest", "--force"]):
        proc = subprocess.run([nbgrader, *args], cwd=course, capture_output=True, text=True, env=tool_env())
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0 and "lesson83 nbgrader-autograde ." in out and "Nothing was changed" in out, out
        assert "Removing" not in out and state() == before, args
    button = ("import json\nfrom nbgrader.apps.api import NbGraderAPI\nfrom nbgrader.apps.baseapp import NbGrader\n"
              "from nbgrader.auth import Authenticator\nfrom nbgrader.coursedir import CourseDirectory\n"
              "app = NbGrader()\napp.load_config_file()\ncoursedir = CourseDirectory(parent=app)\n"
              "api = NbGraderAPI(coursedir, Authenticator(parent=app), parent=app)\n"
              "print(json.dumps(api.autograde('lesson83', 'honest')))\n")
    proc = subprocess.run([sys.executable, "-c", button], cwd=course, capture_output=True, text=True, env=tool_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    answer = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not answer["success"] and "lesson83 nbgrader-autograde ." in answer.get("error", ""), answer
    assert state() == before


def test_feedback_shows_its_maths_without_a_network(graded: dict[str, Any]) -> None:
    """The feedback page loads nothing from elsewhere (no MathJax from a CDN): each maths span of the notebook's
    markdown is MathML, which browsers show without a script, and no LaTeX is left to typeset."""
    from nbconvert.filters.markdown_mistune import IPythonRenderer, MarkdownWithMath

    spans: list[str] = []

    class Counting(IPythonRenderer):
        def inline_math(self, body: str) -> str:
            spans.append(body)
            return ""

        def block_math(self, body: str) -> str:
            spans.append(body)
            return ""

    for cell in _read(graded["course"], "release").cells:
        if cell.cell_type == "markdown":
            MarkdownWithMath(renderer=Counting(escape=False)).render(cell.source)
    page = (graded["course"] / "feedback" / "blank" / "lesson83" / "lesson83.html").read_text()
    assert len(spans) > 20
    assert "mathjax" not in page.lower() and not re.search(r"""(src|href)=["']?(https?:)?//""", page)
    assert page.count("<math ") == len(spans)
    assert '<code class="tex">' not in page  # every span converted
    assert not re.search(r"\\(frac|sqrt|mathbb|mathrm|left|top)\b", re.sub(r"<pre.*?</pre>|<code.*?</code>", "",
                                                                           page, flags=re.S))


def test_the_gradebook_export_and_feedback_show_the_engines_total_whatever_the_notebooks_form(
        fresh_build: dict[str, Path], tmp_path: Path) -> None:
    """A notebook with no nbgrader metadata (Otter's format, or stripped by an editor) still gets the engine's total
    in nbgrader's gradebook, `nbgrader export` and its feedback page (they said 0 of 100 before); a renamed notebook
    gets its total in the gradebook, and the command names it as one whose feedback nbgrader cannot make."""
    from autograder.authoring.questions import mc_answers
    from autograder.grading.nbgrader import record_scores  # noqa: F401 - the step under test, run by the verb
    from autograder.release.sample import filled_notebook

    course = tmp_path / "course"
    shutil.copytree(fresh_build["nbgrader"], course)
    stripped = _read(course, "source")
    for cell in stripped.cells:
        cell.metadata.pop("nbgrader", None)
    otter = filled_notebook(ROOT / "student_templates" / "lesson83" / "lesson83.ipynb",
                            answers=mc_answers(list(course_of().suite.questions)), lesson=course_of().lesson)
    _submit(course, "stripped", stripped, checkpoint=False)
    _submit(course, "otter", otter, checkpoint=False)
    _submit(course, "renamed", stripped, checkpoint=False)
    folder = course / "submitted" / "renamed" / "lesson83"
    (folder / "lesson83.ipynb").rename(folder / "my work.ipynb")
    run = nbgrader_autograde(course, progress=False, course=course_of())
    totals = {r["id"]: float(r["total"]) for r in run.summary.rows}
    assert totals["stripped"] == totals["otter"] == totals["renamed"] == course_of().suite.notebook_points
    with _gradebook(course) as gb:
        shown = {s: gb.find_submission("lesson83", s).score for s in totals}
    assert shown == totals
    assert list(run.unrecorded) == ["renamed"] and "rename the notebook to lesson83.ipynb" in run.unrecorded["renamed"]
    _nbgrader(course, "export")
    with open(course / "grades.csv") as f:
        assert {r["student_id"]: float(r["score"]) for r in csv.DictReader(f)} == totals
    (course / "autograded" / "renamed").rename(tmp_path / "aside")  # nbgrader makes no page without the notebook
    _nbgrader(course, "generate_feedback", "lesson83", "--force")
    for student in ("stripped", "otter"):
        page = (course / "feedback" / student / "lesson83" / "lesson83.html").read_text()
        assert f"Score: {totals[student]:.1f} / 100.0" in page, student
