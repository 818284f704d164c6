"""Expected values: every case's reference output, and the outputs of the catalogued mistakes it catches, rounded
to the case's tolerances so that a build is byte-identical on every machine."""

from __future__ import annotations

import ast
import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from autograder.authoring.questions import ContentError, Question, mc_answers
from autograder.lesson import Lesson
from autograder.model import Case


def stored_precision(*, atol: float, rtol: float) -> tuple[int, int]:
    """Decimal places and significant digits kept of a stored float for a case with these tolerances.

    Two more digits than the tolerances resolve: the rounding moves a value by at most 1% of atol plus
    5% of rtol * |value|, so a correct answer still passes, and the ulp noise of a machine, a thread count
    or a SIMD width (1e-16 in float64, 1e-7 in float32) almost never reaches a rounding boundary.
    """
    decimals = math.ceil(-math.log10(atol) - 1e-9) + 2
    digits = min(math.ceil(-math.log10(rtol) - 1e-9) + 2, 15) if rtol > 0 else 15
    return max(decimals, 0), max(digits, 1)


_NO_EXACT = object()  # canonical's `exact` when there is no float64 output: the floats of `value` are rounded


def canonical(value: Any, *, atol: float, rtol: float, exact: Any = _NO_EXACT) -> Any:
    """Probe data with every float rounded to `stored_precision` (Python's exact decimal rounding, so the
    stored bytes are the same on every machine); integers, booleans and strings are left as they are.

    With `exact` (the same probe's output computed in float64: the checks' `run_probe_exact`), each float is
    rounded from exact's float instead, and an array is stored in value's dtype: the last bits of a float32
    result differ between CPUs and would move about one rounded value in a hundred, those of a float64 result
    practically never. Everything but the floats comes from `value`, which exact must match in keys and shapes.
    """
    decimals, digits = stored_precision(atol=atol, rtol=rtol)
    has_exact = exact is not _NO_EXACT

    def one(x: float) -> float:
        if not math.isfinite(x):
            return x
        return float(f"{float(f'{x:.{decimals}f}'):.{digits - 1}e}") + 0.0  # + 0.0 turns -0.0 into 0.0

    def mismatch() -> ValueError:
        return ValueError(f"the float64 output {_shape_of(exact)} does not match the output {_shape_of(value)}")

    if isinstance(value, np.ndarray) and value.dtype.kind == "f":
        source = value
        if has_exact:
            if not isinstance(exact, np.ndarray) or exact.dtype.kind != "f" or exact.shape != value.shape:
                raise mismatch()
            source = exact
        flat = [one(x) for x in source.astype(np.float64).ravel().tolist()]
        return np.array(flat, dtype=np.float64).reshape(value.shape).astype(value.dtype)
    if isinstance(value, dict):
        if has_exact and (not isinstance(exact, dict) or exact.keys() != value.keys()):
            raise mismatch()
        return {k: canonical(v, atol=atol, rtol=rtol, **({"exact": exact[k]} if has_exact else {}))
                for k, v in value.items()}
    if isinstance(value, list | tuple):
        if has_exact and (not isinstance(exact, list | tuple) or len(exact) != len(value)):
            raise mismatch()
        return [canonical(v, atol=atol, rtol=rtol, **({"exact": exact[i]} if has_exact else {}))
                for i, v in enumerate(value)]
    if isinstance(value, float | np.floating):
        if has_exact and not isinstance(exact, float | np.floating):
            raise mismatch()
        return one(float(exact if has_exact else value))
    return value


def _shape_of(value: Any) -> str:
    """A short description of probe data's structure, for an error message."""
    if isinstance(value, np.ndarray):
        return f"array {value.dtype} {list(value.shape)}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_shape_of(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return f"list of {len(value)}"
    return type(value).__name__


def expected_values(questions: list[Question], *, lesson: Lesson) -> dict[str, dict[str, Any]]:
    """Reference output of every case, plus the outputs of the catalogued mistakes that this case catches.

    Every stored float is rounded by `canonical` to the case's tolerances, the same values whether they
    go into a generated test file or stay in the grader's memory, so a build is byte-identical on every
    machine and thread count; the reference must still pass its own case after the rounding.

    The hook: where the lesson's checks define `run_probe_exact(env, name, args)` (run_probe's output with
    its floats computed in float64: the same keys and shapes), the stored floats are rounded from that output,
    so that the last bits of a float32 result, which differ between CPUs, cannot move a stored digit; the
    float32 output of run_probe must still pass against them, as a student's does. Without the hook they are
    rounded from run_probe's output.
    """
    with lesson.runtime.one_torch_thread():  # the lesson's own copy of the runtime, as its checks use
        return _expected_values(questions, lesson)


class _ReadLog(dict[str, Any]):
    """A namespace that records the names read from it, by a probe (`env[name]`, `env.get`, `in`) and by the
    functions defined in it (a function whose globals are not a plain dict looks its globals up through
    `__getitem__`). Reading it whole (iterating, keys, values, items, copying) records "*"."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.names: set[str] = set()

    def __getitem__(self, key: str) -> Any:
        self.names.add(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self.names.add(key)
        return super().get(key, default)

    def __contains__(self, key: object) -> bool:
        self.names.add(str(key))
        return super().__contains__(key)

    def _whole(self) -> None:
        self.names.add("*")

    def __iter__(self) -> Iterator[str]:
        self._whole()
        return super().__iter__()

    def keys(self) -> Any:
        self._whole()
        return super().keys()

    def values(self) -> Any:
        self._whole()
        return super().values()

    def items(self) -> Any:
        self._whole()
        return super().items()

    def copy(self) -> dict[str, Any]:
        self._whole()
        return dict(super().items())


def _redefined(code: str) -> set[str] | None:
    """The names a catalogued mistake's code (re)defines, or None when it does anything else at top level (it
    may then change an object the reference shares, so it has to run on every case)."""
    names: set[str] = set()
    for node in ast.parse(code).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and not node.decorator_list:
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        else:
            return None
    return names


def _reference_log(lesson: Lesson, answers: dict[str, str]) -> _ReadLog:
    """The reference namespace (as `Lesson.namespace()` builds it, plus the answers) as a _ReadLog, its
    functions' globals included."""
    ns = lesson.namespace(into=_ReadLog())
    ns.update(answers)
    return ns


def _stored(lesson: Lesson, ns: dict[str, Any], case: Case, got: dict[str, Any], *, where: str) -> Any:
    """A probe's output `got` on the namespace `ns` as it is stored: rounded by `canonical`, from its float64 twin
    where the lesson's checks compute one (`run_probe_exact`: see `expected_values`)."""
    tol = {"atol": case.atol, "rtol": case.rtol}
    unstored = set(getattr(lesson.checks, "UNSTORED", ()))  # keys a check reads from the student's output alone
    got = {k: v for k, v in got.items() if k not in unstored} if isinstance(got, dict) else got
    run_exact = getattr(lesson.checks, "run_probe_exact", None)
    if run_exact is None:
        return canonical(got, **tol)
    exact = run_exact(ns, case.probe, case.args)
    exact = {k: v for k, v in exact.items() if k not in unstored} if isinstance(exact, dict) else exact
    if "error" in exact:
        raise ContentError(f"{where} fails only when computed in float64 (run_probe_exact in "
                           f"{lesson.checks_file}): {exact['error']}")
    try:
        return canonical(got, **tol, exact=exact)
    except ValueError as exc:
        raise ContentError(f"{where}: run_probe_exact in {lesson.checks_file} returns another structure than "
                           f"run_probe: {exc}"[:2000]) from None


def _expected_values(questions: list[Question], lesson: Lesson) -> dict[str, dict[str, Any]]:
    """A mistake only redefines names; a probe that reads none of them on the reference (every read of the
    namespace is logged) takes the same path on the mistake and returns the same output, which its case does
    not catch, so that run is skipped. Every other mistake runs, in the catalogue's order."""
    checks, mistakes = lesson.checks, lesson.mistakes
    answers = mc_answers(questions)
    ref_ns = _reference_log(lesson, answers)
    redefined = {m.id: _redefined(m.code) for m in mistakes}
    mutant_ns: dict[str, dict[str, Any]] = {}
    out: dict[str, dict[str, Any]] = {}
    for q in questions:
        for case in q.cases:
            ref_ns.names = set()
            value = checks.run_probe(ref_ns, case.probe, case.args)
            read = ref_ns.names
            if "error" in value:
                raise ContentError(f"{q.path}: question {q.id}: the reference fails case {case.name}: "
                                   f"{value['error']}")
            where = f"{q.path}: question {q.id}: case {case.name}"
            reference = _stored(lesson, ref_ns, case, value, where=f"{where}: the reference")
            expected: dict[str, Any] = {"value": reference, "variants": []}
            plain = case.plain()  # the lesson's checks read a case as plain data
            verdict = checks.judge(plain, value, expected)
            if not verdict.passed:
                raise ContentError(f"{q.path}: question {q.id}: the reference does not pass its own case "
                                   f"{case.name} (its expected value rounded to the case's tolerances): "
                                   f"{verdict.message}")
            for m in mistakes:
                names = redefined[m.id]
                if names is not None and "*" not in read and not names & read:
                    continue  # the same output as the reference's, which passes
                if m.id not in mutant_ns:
                    mutant_ns[m.id] = lesson.namespace(m) | answers
                got = checks.run_probe(mutant_ns[m.id], case.probe, case.args)
                if "error" not in got and not checks.judge(plain, got, expected).passed:
                    expected["variants"].append({"id": m.id, "description": m.description,
                                                 "output": _stored(lesson, mutant_ns[m.id], case, got,
                                                                   where=f"{where}: mistake {m.id}")})
            out[case.id] = expected
    return out
