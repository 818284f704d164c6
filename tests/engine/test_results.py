"""The results object and its views: the stored record, the grades.csv row, the Gradescope view; status words."""

from __future__ import annotations

import ast
import dataclasses
import json
import sys
from pathlib import Path

import pytest

from autograder.config import ROOT
from autograder.model import RUN_STATUSES, STUDENT_HELP, Case, CaseResult, RecordError, Status, SubmissionResult


def _result(status: str = Status.CRASHED) -> SubmissionResult:
    cases = [CaseResult("q1/a", "q1", 2.0, 2.0, True, False),
             CaseResult("q1/b", "q1", 0.0, 1.5, False, True, "q1/b: wrong", "sign_flipped", {"value": 1}, {"value": 2}),
             CaseResult("q2/a", "q2", 0.0, 3.0, False, False, "q2/a: no result")]
    return SubmissionResult("ann", status, cases, ["cell 3: ValueError", "the notebook called sys.exit"],
                            ["a note for ann"], "0123456789abcdef")


def test_the_stored_record_reads_back_as_the_same_result() -> None:
    result = _result()
    record = json.loads(json.dumps({"key": "k", "path": "/x/ann.ipynb", **result.to_dict(), "stdout": ""}))
    assert record["total"] == 2.0 and record["questions"] == {"q1": 2.0, "q2": 0.0}
    assert SubmissionResult.from_dict(record) == result


@pytest.mark.parametrize(("change", "words"), [
    (lambda r: r.update(status=3), "status is not text"),
    (lambda r: r.update(cases={"q1/a": 2}), "cases are not a list"),
    (lambda r: r["cases"][1].update(points="2"), "case 1 has no proper points"),
    (lambda r: r["cases"][0].update(passed="yes"), "case 0 has no proper passed"),
    (lambda r: r["cases"][2].update(max_points=float("nan")), "case 2 has no proper points"),
    (lambda r: r.update(notes="cell 3"), "notes are not a list of text"),
    (lambda r: r.update(fingerprint=7), "fingerprint is not text"),
])
def test_a_stored_record_of_the_wrong_types_is_refused_naming_the_field(change, words: str) -> None:
    """One check of a stored result, shared with the TA report: a damaged or forged record is refused with the field
    named, never read into a result whose scores are text or NaN."""
    from autograder.report import record_problem

    record = json.loads(json.dumps(_result().to_dict()))
    assert SubmissionResult.from_dict(record) == _result() and record_problem(record) == ""
    change(record)
    with pytest.raises(RecordError, match=words):
        SubmissionResult.from_dict(record)
    assert words in record_problem(record)


def test_the_csv_row_puts_the_reason_first_and_the_report_view_finds_failures() -> None:
    result = _result()
    assert result.csv_row(["q1", "q2", "q3"]) == {
        "total": 2.0, "q1": 2.0, "q2": 0.0, "q3": 0.0, "status": Status.CRASHED,
        "message": "the notebook called sys.exit"}  # the reason, not the cell's own note
    # a graded submission that lost points says why: what its student was told first, else its first failed case
    assert _result(Status.GRADED).csv_row(["q1"])["message"] == "a note for ann"
    quiet = _result(Status.GRADED)
    quiet.student_notes = []
    assert quiet.csv_row(["q1"])["message"].startswith("2 of 3 cases lost points: q1/b")
    quiet.cases = [c for c in quiet.cases if c.passed]
    assert quiet.csv_row(["q1"])["message"] == ""  # full marks: nothing to say
    assert [c.id for c in result.failed("q1")] == ["q1/b"] and result.diagnoses() == ["sign_flipped"]
    assert result.score("q1") == 2.0 and not result.ran and _result(Status.GRADED).ran


def test_the_gradescope_view_hides_hidden_cases_and_the_ta_notes() -> None:
    view = _result().gradescope(revisit={"q1/b": "the sign of the angle"})
    hidden = next(t for t in view["tests"] if t["name"] == "q1: hidden tests")
    assert hidden["output"] == "hidden case 1: failed; revisit: the sign of the angle"
    assert "called sys.exit" not in json.dumps(view) and "wrong" not in json.dumps(view)
    assert view["output"].startswith(f"Status: crashed\n{STUDENT_HELP[Status.CRASHED]}\na note for ann")


def test_every_status_a_student_is_helped_with_is_one_a_run_ends_with() -> None:
    assert set(STUDENT_HELP) <= set(RUN_STATUSES) and len(set(RUN_STATUSES)) == len(RUN_STATUSES)
    assert set(RUN_STATUSES) <= {v for k, v in vars(Status).items() if k.isupper()}


def _is_status(node: ast.expr) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "status" or isinstance(node, ast.Name) and \
        node.id == "status"


def _is_text(node: ast.expr) -> bool:
    """A string constant, or a tuple, list or set holding one."""
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_is_text(e) for e in node.elts)
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


# The callables that take a status, and the position of that argument.
STATUS_ARGUMENT = {"ExecResult": 0, "SubmissionResult": 1, "judge_submission": 2}


def bare_statuses(source: str, name: str) -> list[str]:
    """`name:line` of every status spelled as a bare string instead of a Status word: compared with a `.status`,
    assigned to one, or given to a callable of STATUS_ARGUMENT (or as any `status=`)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        texts: list[ast.expr] = []
        called = getattr(node.func, "id", getattr(node.func, "attr", "")) if isinstance(node, ast.Call) else ""
        if isinstance(node, ast.Compare) and any(_is_status(x) for x in [node.left, *node.comparators]):
            texts = [node.left, *node.comparators]
        elif isinstance(node, ast.Assign) and any(_is_status(t) for t in node.targets):
            texts = [node.value]
        elif isinstance(node, ast.Call):
            at = STATUS_ARGUMENT.get(called)
            texts = [*(node.args[at:at + 1] if at is not None else []),
                     *(k.value for k in node.keywords if k.arg == "status")]
        if any(_is_text(t) for t in texts):
            found.append(f"{name}:{node.lineno}")
    return found


def test_no_status_is_spelled_as_a_bare_string() -> None:
    """One status vocabulary: the sandbox, the judge and the tests use the Status words, never "ok" or "crashed"
    (a second vocabulary mapped onto the first, as the executor once had)."""
    found = [hit for folder in ("autograder", "tests", "benchmarks") for path in sorted((ROOT / folder).rglob("*.py"))
             for hit in bare_statuses(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))]
    assert found == [], "statuses spelled as bare strings (use autograder.model.Status):\n" + "\n".join(found)
    words = {v for k, v in vars(Status).items() if k.isupper()}
    spelled = [f"{path.relative_to(ROOT)}:{node.lineno}" for path in sorted((ROOT / "autograder").rglob("*.py"))
               if path != ROOT / "autograder" / "model.py" for node in ast.walk(ast.parse(path.read_text("utf-8")))
               if isinstance(node, ast.Constant) and node.value in words]
    assert spelled == [], "status words spelled outside autograder/model.py:\n" + "\n".join(spelled)


def test_a_bare_status_is_found(tmp_path: Path) -> None:
    planted = ('res = ExecResult("ok", notes=[])\nif res.status == "timeout":\n    res.status = "crashed"\n'
               'r = SubmissionResult("ann", "graded")\nok = res.status in ("oom", Status.CRASHED)\n'
               'judge_submission(suite, sub, "unreadable", {}, [])\nf(status="timeout")\n'
               'fine = ExecResult(Status.GRADED) and res.status == Status.TAMPERING and msg["oom"]\n')
    assert bare_statuses(planted, "x.py") == [f"x.py:{n}" for n in range(1, 8)]


def test_a_case_is_typed_once_and_its_plain_view_is_what_the_checks_read() -> None:
    """Cases are model.Case, built by the question reader; the lesson's shipped checks and the generated test files
    get `plain()`: the question file's fields in their order, then id, question and points (the bytes of every
    generated test file depend on that order), lists for the tuples, no known_cause when there is none."""
    from autograder.authoring.questions import CaseSpec
    from autograder.course import course_of

    suite = course_of(ROOT / "tests" / "fixtures" / "lesson_demo" / "grading_config.yaml").suite
    assert suite.cases and all(isinstance(c, Case) for c in suite.cases)
    case = suite.cases[0]
    plain = case.plain()
    read = [f for f in CaseSpec.model_fields if f != "drawn"]  # drawn: the reader consumes it (hidden_seed.py)
    assert list(plain) == [*read,
                           *(["known_cause"] if case.known_cause else []), "id", "question", "points"]
    assert isinstance(plain["requires"], list) and plain is not case.plain()
    with pytest.raises(dataclasses.FrozenInstanceError):
        case.points = 99.0  # type: ignore[misc]
    diagnosed = Case(name="n", probe="p", check="c", atol=1e-6, rtol=0, revisit="r", id="q/n", question="q",
                     points=1, requires=("a", "b"), known_cause={"id": "m", "description": "d"})
    assert list(diagnosed.plain())[-4:] == ["known_cause", "id", "question", "points"]
    assert diagnosed.required == ["q/a", "q/b"]


def test_the_model_needs_no_pydantic() -> None:
    """model.py runs where pydantic is not installed (the sandbox, the GPU machine): it imports the standard
    library alone."""
    tree = ast.parse((ROOT / "autograder" / "model.py").read_text(encoding="utf-8"))
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported


def test_students_see_at_most_two_decimals_and_the_stored_record_keeps_all() -> None:
    """Issue 42, item 7: "35.9971 of 100" and "0.4706 / 0.4706" become "36" and "0.47" wherever a student reads
    a score (Gradescope's results.json, nbgrader's grade cell); the stored record and grades.csv keep every digit."""
    from autograder.grading.nbgrader import cell_text
    from autograder.model import shown

    assert [shown(x) for x in (35.9971, 0.4706, 2.5, 100.0, 0.0, -0.001, 1 / 3)] == \
        ["36", "0.47", "2.5", "100", "0", "0", "0.33"]
    cases = [CaseResult(f"q1/c{n}", "q1", 0.4706, 0.4706, True, n % 2 == 1) for n in range(3)]
    cases.append(CaseResult("q1/d", "q1", 0.0, 1 / 3, False, False, "q1/d: wrong"))
    result = SubmissionResult("ann", Status.GRADED, cases)
    view = result.gradescope(revisit={})
    assert view["score"] == 1.41 and result.total == 1.4118 and result.csv_row(["q1"])["q1"] == 1.4118
    assert all(round(t[k], 2) == t[k] for t in view["tests"] for k in ("score", "max_score"))
    record = json.loads(json.dumps(result.to_dict() | {"gradescope": view}))
    text, score = cell_text(record, "q1", 1.7451)
    assert "q1: 1.41 of 1.75 points" in text and "0.4706" not in text and "1.4118" not in text, text
    assert score == 1.4118  # the gradebook's number keeps full precision


def test_a_question_has_at_most_two_gradescope_rows_with_its_cases_inside() -> None:
    """Issue 42, item 7: one row of a question's visible cases and one of its hidden cases (not one per case), each
    listing its cases' verdicts, scored the sum of its cases' points."""
    result = _result(Status.GRADED)
    result.cases += [CaseResult("q1/c", "q1", 1.0, 1.0, True, True), CaseResult("q1/d", "q1", 0.5, 0.5, True, False),
                     CaseResult("q1/note", "q1", 0.0, 0.0, True, False, "not graded here")]
    view = result.gradescope(revisit={"q1/b": "the sign of the angle"})
    rows = {t["name"]: t for t in view["tests"]}
    assert list(rows) == ["q1: visible tests", "q1: hidden tests", "q2: visible tests"]
    assert (rows["q1: visible tests"]["score"], rows["q1: visible tests"]["max_score"]) == (2.5, 2.5)
    assert (rows["q1: hidden tests"]["score"], rows["q1: hidden tests"]["max_score"]) == (1.0, 2.5)
    assert rows["q1: hidden tests"]["status"] == "failed" and rows["q1: visible tests"]["status"] == "passed"
    assert rows["q1: hidden tests"]["output"].splitlines() == [
        "hidden case 1: failed; revisit: the sign of the angle", "hidden case 2: passed"]
    assert rows["q1: visible tests"]["output"].splitlines() == ["a: passed", "d: passed"]
    assert rows["q2: visible tests"]["output"] == "a: no result" and rows["q2: visible tests"]["status"] == "failed"
    assert "q1/" not in json.dumps(view["tests"])
