"""The results object and its views: the stored record, the grades.csv row, the Gradescope view; status words."""

from __future__ import annotations

import json

import pytest

from autograder.model import STATUS_WORDS, STUDENT_HELP, CaseResult, RecordError, Status, SubmissionResult
from autograder.sandbox.protocol import STATUSES


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
    assert _result(Status.GRADED).csv_row(["q1"])["message"] == ""
    assert [c.id for c in result.failed("q1")] == ["q1/b"] and result.diagnoses() == ["sign_flipped"]
    assert result.score("q1") == 2.0 and not result.ran and _result(Status.GRADED).ran


def test_the_gradescope_view_hides_hidden_cases_and_the_ta_notes() -> None:
    view = _result().gradescope(revisit={"q1/b": "the sign of the angle"})
    hidden = next(t for t in view["tests"] if t["name"] == "q1/b")
    assert hidden["output"] == "a hidden case of q1 failed; revisit: the sign of the angle"
    assert "called sys.exit" not in json.dumps(view) and "wrong" not in json.dumps(view)
    assert view["output"].startswith(f"Status: crashed\n{STUDENT_HELP[Status.CRASHED]}\na note for ann")


def test_every_executor_status_has_one_word() -> None:
    assert set(STATUS_WORDS) == set(STATUSES)
    assert set(STUDENT_HELP) <= set(STATUS_WORDS.values())
