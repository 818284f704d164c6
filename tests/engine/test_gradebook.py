"""The grades folder has one owner (autograder/grading/gradebook.py): no other module spells its file names, its
records round-trip in the stored layout, and one `grade` run reads back nothing it wrote. On the demo lesson."""

from __future__ import annotations

import ast
import json
from collections import Counter
from pathlib import Path

import pytest

from autograder.config import ROOT
from autograder.course import Course
from autograder.grading import gradebook
from autograder.grading.batch import grade_batch
from autograder.grading.gradebook import Gradebook, Record, RunFacts, Summary, SummaryRow
from autograder.model import CaseResult, Status, SubmissionResult

ENGINE = ROOT / "autograder"
NAMES = [gradebook.RESULTS_DIR, gradebook.SUMMARY_FILE, gradebook.GRADES_CSV, gradebook.MERGED_FILE,
         gradebook.REVIEW_DECISIONS_FILE, gradebook.SIMILARITY_DECISIONS_FILE, gradebook.OLD_SIMILARITY_DECISIONS_FILE,
         gradebook.FEEDBACK_DIR, gradebook.ROSTER_FILE]
# release/keep.py reads an nbgrader course's own folders (submitted/, autograded/, feedback/) with the standard
# library alone, by design (`make clean` runs it without the package's dependencies).
EXEMPT = {ENGINE / "grading" / "gradebook.py", ENGINE / "release" / "keep.py"}


def _spells(value: str, path: Path) -> bool:
    """Whether a string constant of `path` names a file of the grades folder: the name itself, or a path that
    starts or ends with it; a package's own module of that name (the sandbox's results.py) is not one."""
    if value.isidentifier() and (path.parent / f"{value}.py").is_file():
        return False
    return any(value == n or value.startswith(f"{n}/") or value.endswith(f"/{n}") for n in NAMES)


def test_only_the_gradebook_spells_the_grades_folders_names() -> None:
    spelled = [f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}"
               for path in sorted(ENGINE.rglob("*.py")) if path not in EXEMPT
               for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
               if isinstance(node, ast.Constant) and isinstance(node.value, str) and _spells(node.value, path)]
    assert spelled == [], "grades-folder names spelled outside grading/gradebook.py:\n" + "\n".join(spelled)


def test_the_name_test_can_fail(tmp_path: Path) -> None:
    """The check above sees a name spelled in a path, and leaves a module of that name alone."""
    module = tmp_path / "module.py"
    assert _spells("results", module) and _spells("out/summary.json", module) and not _spells("summary", module)
    (tmp_path / "results.py").write_text("")
    assert not _spells("results", module)


def _record(*, run: RunFacts | None) -> Record:
    cases = [CaseResult("q/a", "q", 1.0, 1.0, True, False), CaseResult("q/b", "q", 0.0, 2.0, False, True, "no")]
    result = SubmissionResult("ann", Status.GRADED, cases, ["a note"], ["told"], "fp")
    return Record("k" * 64, "/class/ann.ipynb", result, {"score": 1.0, "tests": []}, run,
                  {"flags": [], "digest": "0" * 16, "cleared": False, "decision": None}, "bubblewrap" if run else "")


@pytest.mark.parametrize("run", [RunFacts("out", 1.25, "bwrap", "cgroup", "bubblewrap"), None])
def test_a_record_round_trips_in_the_stored_layout(tmp_path: Path, run: RunFacts | None) -> None:
    """The stored layout is the one results/ always had: key, path, the result, the sandbox's facts (a run's only),
    review, checkpoint_isolation (when a reader ran), gradescope."""
    record = _record(run=run)
    book = Gradebook(tmp_path)
    book.write_record("ann.json", record)
    data = json.loads((tmp_path / "results" / "ann.json").read_text())
    facts = ["stdout", "wall_s", "sandbox", "memory_guard", "isolation"] if run else []
    assert list(data) == ["key", "path", "submission", "status", "cases", "notes", "student_notes", "fingerprint",
                          "total", "questions", *facts, "review", *(["checkpoint_isolation"] if run else []),
                          "gradescope"]
    again = book.read_record("ann.json")
    assert again.to_json() == data and again.isolation == (run.isolation if run else "")
    assert book.stored_record("ann.json", "k" * 64) is not None and book.stored_record("ann.json", "other") is None
    (tmp_path / "results" / "ann.json").write_text("{")
    assert book.stored_record("ann.json", "k" * 64) is None  # damaged: graded again


VARIED = [None, True, False, 0, -7, 10**30, 1.5, -0.0, 1e-300, float("nan"), float("inf"), -float("inf"), "",
          'q"\\\n\t\u2028\U0001F600\u00e9', Status.GRADED, (), [], {}, (1, [2.5, "x"], {"a": None}),
          {"k": [{"n": [1, 2.0, True]}, []], 1: "int key", 2.5: "float key", False: "f", None: "n", "\u00e9": {}}]


def test_a_record_is_stored_as_json_dumps_with_an_indent_writes_it(tmp_path: Path) -> None:
    """The record's text is exactly json.dumps(indent=1)'s (indented_json writes it faster): any value, any key."""
    record = _record(run=RunFacts("out", 1.25, "bwrap", "cgroup", "bubblewrap"))
    Gradebook(tmp_path).write_record("ann.json", record)
    assert (tmp_path / "results" / "ann.json").read_text() == json.dumps(record.to_json(), indent=1)
    for value in [*VARIED, VARIED, {"deep": [[[VARIED]]]}]:
        assert gradebook.indented_json(value) == json.dumps(value, indent=1)
    for bad in (object(), {(1,): 2}, [1, {"s": {1}}]):
        with pytest.raises(TypeError) as ours:
            gradebook.indented_json(bad)
        with pytest.raises(TypeError) as theirs:
            json.dumps(bad, indent=1)
        assert str(ours.value) == str(theirs.value)


def test_a_summary_round_trips_and_a_minimal_one_reads(tmp_path: Path) -> None:
    book = Gradebook(tmp_path)
    summary = Summary(2, {"graded": 1, "not graded": 1}, {"q": 1.0}, {"q": 2.0}, {"q": 0}, 1.0, 2.0, 0.0, None, [],
                      [SummaryRow("ann", "ann.json", "graded", ""), SummaryRow("bob", None, "not graded", "why")])
    book.write_summary(summary)
    assert book.read_summary() == summary
    (tmp_path / "summary.json").write_text(json.dumps({"rows": [{"id": "ann", "result": "ann.json"}]}))
    assert [r.result for r in book.read_summary().rows] == ["ann.json"]
    (tmp_path / "summary.json").write_text(json.dumps({"rows": [{"id": "ann", "result": 3}]}))
    with pytest.raises(TypeError):
        book.read_summary()


@pytest.mark.sandbox
def test_one_grade_run_reads_back_nothing_it_wrote(demo_course: Course, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """grade writes each record once and makes the tables, the feedback and its summary from what it holds; a
    re-run reads each stored record once (to reuse it), and nothing else of the grades folder."""
    calls: Counter[str] = Counter()
    for name in ("read_record", "record_data", "read_summary", "stored_record", "write_record"):
        original = getattr(Gradebook, name)

        def counted(self: Gradebook, *args: object, _name: str = name, _original: object = original) -> object:
            calls[_name] += 1
            return _original(self, *args)  # type: ignore[operator]

        monkeypatch.setattr(Gradebook, name, counted)
    samples, out = demo_course.lesson.root / "dist" / "samples", tmp_path / "grades"
    first = grade_batch(samples, out=out, course=demo_course, progress=False)
    n = len(first.rows)
    assert n >= 2 and first.graded_now == n and (out / "feedback").is_dir()
    assert calls == Counter(stored_record=n, write_record=n), calls  # the reuse check finds no record; no read
    calls.clear()
    again = grade_batch(samples, out=out, course=demo_course, progress=False)
    assert again.reused == n and calls == Counter(stored_record=n), calls
    assert (out / "grades.csv").read_bytes() and again.rows == first.rows
