"""Judging: probe outputs in, per-case verdicts and per-question scores out (runs in the clean grader)."""

from __future__ import annotations

import ast
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import nbformat

from autograder import lesson83_checks as checks
from autograder.config import DEFAULT_CONFIG, GradingConfig, load_config
from autograder.content import Question, expected_values, load_questions, mc_answers


@dataclass
class CaseResult:
    """The verdict on one test case."""

    id: str
    question: str
    points: float
    max_points: float
    passed: bool
    hidden: bool
    message: str = ""


@dataclass
class SubmissionResult:
    """Everything the grader concluded about one submission."""

    submission: str
    status: str
    cases: list[CaseResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def question_scores(self) -> dict[str, float]:
        scores: dict[str, float] = {}
        for c in self.cases:
            scores[c.question] = round(scores.get(c.question, 0.0) + c.points, 4)
        return scores

    @property
    def total(self) -> float:
        return round(sum(c.points for c in self.cases), 4)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"total": self.total, "questions": self.question_scores()}


@dataclass(frozen=True)
class Suite:
    """All graded cases with their reference values: the single definition both graders use."""

    config: GradingConfig
    questions: tuple[Question, ...]
    cases: tuple[dict[str, Any], ...]
    expected: dict[str, dict[str, Any]]

    @property
    def auto_points(self) -> float:
        return round(sum(c["points"] for c in self.cases), 4)


@cache
def load_suite(config_path: Path = DEFAULT_CONFIG) -> Suite:
    config = load_config(config_path)
    questions = load_questions(config)
    cases = tuple(c for q in questions for c in q.cases)
    return Suite(config, tuple(questions), cases, expected_values(questions))


def judge_outputs(suite: Suite, outputs: dict[str, dict[str, Any]]) -> list[CaseResult]:
    """Judge probe outputs (case id -> plain data); a case with no output fails with a clear message."""
    results = []
    for case in suite.cases:
        got = outputs.get(case["id"])
        if got is None:
            verdict = checks.Verdict(False, f"{case['id']}: no result: the submission stopped before this "
                                     "case could run.")
        else:
            verdict = checks.judge(case, got, suite.expected[case["id"]])
        results.append(CaseResult(case["id"], case["question"], case["points"] if verdict.passed else 0.0,
                                  case["points"], verdict.passed, case["hidden"], verdict.message))
    return results


def probe_namespace(suite: Suite, env: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Run every probe against a namespace in this process (for trusted code: the reference, templates)."""
    return {c["id"]: checks.run_probe(env, c["probe"], c["args"]) for c in suite.cases}


def grade_namespace(suite: Suite, env: dict[str, Any], *, name: str) -> SubmissionResult:
    return SubmissionResult(name, "graded", judge_outputs(suite, probe_namespace(suite, env)))


def reference_env(suite: Suite) -> dict[str, Any]:
    from reference.mistakes import reference_namespace

    return reference_namespace() | mc_answers(list(suite.questions))


def _is_otter_cell(source: str) -> bool:
    return "otter" in source or "grader." in source


def notebook_env(path: Path) -> tuple[dict[str, Any], list[str]]:
    """Execute a trusted notebook's code cells in this process (Otter's own cells skipped).

    Used for the committed student template in the self-check; student submissions go through the
    sandboxed executor instead. A cell that raises is recorded and execution continues.
    """
    nb = nbformat.read(str(path), as_version=4)
    env: dict[str, Any] = {"__name__": "__main__"}
    errors = []
    for n, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or _is_otter_cell(cell.source):
            continue
        try:
            exec(compile(ast.parse(cell.source), f"{path.name}[cell {n}]", "exec"), env)  # noqa: S102
        except Exception as exc:  # noqa: BLE001 - a failing cell is recorded, the next cells still run
            errors.append(f"cell {n}: {type(exc).__name__}: {exc}")
    return env, errors
