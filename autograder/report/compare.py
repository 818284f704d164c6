"""Expected versus received, for one failed case: array windows with the wrong cells marked, key rows, the
checkpoint table, a gated case's own verdict and the traceback of what the student's code raised."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from autograder.authoring.suite import Suite
from autograder.model import Case, CaseResult, Reason, SubmissionResult
from autograder.report.text import as_text, clip_text, num_text
from autograder.runtime.plain_codec import dumps, from_plain, to_plain

GRID = 8  # at most GRID x GRID values of an array are shown


def _window(n: int, at: int) -> range:
    start = min(max(0, at - 2), max(0, n - GRID))
    return range(start, min(n, start + GRID))


def _plane(arr: np.ndarray, at: tuple[int, ...]) -> tuple[np.ndarray, tuple[int, ...], int, int]:
    """The 2-D slice of `arr` that holds index `at`: (slice, leading index, row, column)."""
    if arr.ndim == 0:
        return arr.reshape(1, 1), (), 0, 0
    if arr.ndim == 1:
        return arr.reshape(1, -1), (), 0, at[0]
    return arr[at[:-2]], at[:-2], at[-2], at[-1]


def _grid(arr: np.ndarray, bad: np.ndarray | None, at: tuple[int, ...], caption: str) -> dict[str, Any]:
    """A GRID x GRID window of `arr` around index `at`: its caption and rows of (value, whether `bad` marks it)."""
    if arr.size == 0:
        return {"caption": f"{caption}: empty, shape {list(arr.shape)}", "rows": []}
    plane, _, row, col = _plane(arr, at)
    plane_bad = None if bad is None else _plane(bad, at)[0]
    rows = [[(num_text(plane[i, j]), bool(plane_bad is not None and plane_bad[i, j]))
             for j in _window(plane.shape[1], col)] for i in _window(plane.shape[0], row)]
    return {"caption": caption, "rows": rows}


def _span(r: range, n: int, what: str) -> str:
    return f"{what} {r.start}–{r.stop - 1} of {n}" if len(r) < n else f"all {n} {what}"


def _compare_arrays(key: str, want: np.ndarray, got: np.ndarray, atol: float, rtol: float) -> list[dict[str, Any]]:
    """Blocks (see `detail`) for two arrays: their shapes when they differ, else where they differ, and both
    windows around the first wrong value."""
    if want.shape != got.shape:
        return [_kv([key, "expected", "received"], [(["shape", list(want.shape), list(got.shape)], True)]),
                {"kind": "grids", "grids": [_grid(want, None, (0,) * want.ndim, "expected " + key),
                                            _grid(got, None, (0,) * got.ndim, "received " + key)]}]
    with np.errstate(invalid="ignore", over="ignore"):
        bad = ~np.isclose(got.astype(np.float64), want.astype(np.float64), atol=atol, rtol=rtol)
    if want.size == 0:
        return [{"kind": "array", "name": key, "text": f"empty arrays of shape {list(want.shape)}"}]
    at = tuple(int(i) for i in np.argwhere(bad)[0]) if bad.any() else (0,) * want.ndim
    plane, lead, row, col = _plane(want, at)
    shown = [_span(_window(plane.shape[0], row), plane.shape[0], "rows")] if want.ndim >= 2 else []
    shown.append(_span(_window(plane.shape[1], col), plane.shape[1], "columns" if want.ndim >= 2 else "values"))
    name = f"{key}[{', '.join(map(str, lead))}, :, :]" if lead else key
    summary = f"{int(bad.sum())} of {bad.size} values differ (atol {atol:g}, rtol {rtol:g})"
    if bad.any():
        summary += f"; first at index {list(at)}"
    text = f"shape {list(want.shape)} · showing {', '.join(shown)} · {summary}"
    return [{"kind": "array", "name": name, "text": text},
            {"kind": "grids", "grids": [_grid(want, bad, at, "expected"), _grid(got, bad, at, "received")]}]


def _kv(head: list[str], rows: list[tuple[list[Any], bool]]) -> dict[str, Any]:
    """A table of key rows: its header, and rows of cells with whether the row is wrong."""
    return {"kind": "kv", "head": head, "rows": rows}


def _note(text: str) -> dict[str, Any]:
    return {"kind": "note", "text": text}


class _Missing:
    def __repr__(self) -> str:
        return "(not returned)"


_MISSING = _Missing()


def _short(value: Any) -> str:
    if value is _MISSING:
        return repr(value)
    if isinstance(value, np.ndarray):
        return f"array {list(value.shape)} {value.dtype}"
    if isinstance(value, dict) and set(value) >= {"type", "message"}:
        where = f" ({value['where']})" if value.get("where") else ""
        return f"{value['type']}: {value['message']}{where}"
    try:
        text = json.dumps(to_plain(_arrays_named(value)))
    except (TypeError, ValueError, RecursionError):
        text = repr(value)
    return clip_text(text, 300)


def _arrays_named(value: Any) -> Any:
    """`value` with each array inside it replaced by its shape and dtype (its bytes say nothing to a reader)."""
    if isinstance(value, np.ndarray):
        return f"array {list(value.shape)} {value.dtype}"
    if isinstance(value, dict):
        return {k: _arrays_named(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_arrays_named(v) for v in value]
    return value


def _same(a: Any, b: Any, atol: float, rtol: float) -> bool:
    numbers = (float, int)
    if isinstance(a, numbers) and isinstance(b, numbers) and not isinstance(a, bool) and not isinstance(b, bool):
        return bool(np.isclose(float(b), float(a), atol=atol, rtol=rtol))
    if a is _MISSING or b is _MISSING:
        return False
    try:
        return dumps(a) == dumps(b)
    except TypeError:
        return False


def compare(case: Case | None, expected: Any, received: Any, *, atol: float, rtol: float) -> list[dict[str, Any]]:
    """Expected versus received for one failed case: key rows and array windows, wrong ones marked (`received` as
    stored: plain data of the runtime's codec)."""
    if received is None:
        return [_note("No output was recorded for this case (the submission stopped before it ran).")]
    try:
        got = from_plain(received)
    except (TypeError, ValueError, KeyError) as exc:
        return [_note(f"The stored output could not be decoded: {as_text(exc)}")]
    if not isinstance(expected, dict) or not isinstance(got, dict):
        expected, got = {"value": expected}, {"value": got}
    if set(got) == {"error"}:
        return []  # nothing came back but the exception, shown on its own below
    labels = {"first": case.first, "second": case.second} if case is not None else {}
    parts, rows = [], []
    for key in [*expected, *(k for k in got if k not in expected)]:
        want, have = expected.get(key), got.get(key, _MISSING)
        name = f"{key} — {labels[key]}" if labels.get(key) else key
        if isinstance(want, np.ndarray) and isinstance(have, np.ndarray):
            parts += _compare_arrays(name, want, have, atol, rtol)
            continue
        if key == "error" and want is None:
            rows.append(([name, "no error", _short(have)], True))
            continue
        rows.append(([name, _short(want) if key in expected else "(not expected)", _short(have)],
                     not _same(want, have, atol, rtol)))
    return ([_kv(["key", "expected", "received"], rows)] if rows else []) + parts


def checkpoint_rows(received: Any, *, rel_tol: float) -> list[dict[str, Any]]:
    """Per context: the value the grader re-evaluated from the checkpoint, the one the student's record claims and
    the bound (failures marked); nothing when the output holds no such values."""
    if not isinstance(received, dict) or not received.get("ppl"):
        return []
    ppl, claimed, bound = (received.get(k) or {} for k in ("ppl", "claimed", "thresholds"))
    rows = []
    for c, value in ppl.items():
        said, limit = claimed.get(c), bound.get(c)
        bad = (limit is not None and not value <= limit) or (said is not None and abs(value - said) > rel_tol * said)
        cells = [c, f"{value:.2f}", "—" if said is None else f"{said:.2f}", "—" if limit is None else f"{limit:g}"]
        rows.append((cells, bad))
    return [_kv(["context", "re-evaluated", "claimed", "bound"], rows)]


def gate_of(suite: Suite, result: SubmissionResult, c: CaseResult) -> tuple[list[str], Any]:
    """Why a failed case failed, when it is gated: the cases it requires that failed (their ids), and the
    verdict of its own check on its stored output against its stored expected value (None when that cannot be
    judged: no output, no stored expected value). ([], None) for a case that waits for nothing."""
    case = next((x for x in suite.cases if x.id == c.id), None)
    if case is None or not case.requires:
        return [], None
    failed = {x.id for x in result.failed()}
    blocked = [rid for rid in case.required if rid in failed]
    checks = suite.lesson.checks
    if not blocked or c.received is None or (c.expected is None and case.check in checks.USES_EXPECTED):
        return blocked, None
    try:
        expected = {"value": None if c.expected is None else from_plain(c.expected), "variants": []}
        return blocked, checks.judge(case.plain(), from_plain(c.received), expected)
    except Exception:  # noqa: BLE001 - stored data of any shape: the case is shown as stored
        return blocked, None

# What the page says under a failed case with no output to compare, by its reason (model.Reason).
NO_OUTPUT = {
    Reason.HELD: "This case passed; its points are held for review (see “Held for review” above).",
    Reason.TIME_LIMIT: "Not run: a time limit stopped the checks first (the notes above say which).",
    Reason.UNSHOWN: "This case passed; it pays once a hidden case of its question holds.",
    Reason.STOPPED: "No output was recorded for this case (the submission stopped before it ran).",
}


def detail(case: Case | None, expected: Any, received: Any, *, atol: float, rtol: float,
           rel_tol: float, reason: str = "") -> list[dict[str, Any]]:
    """What the page shows under one failed case (compare.html.j2 draws each block by its kind): expected versus
    received and the traceback; a note when the stored data cannot be shown.

    `expected` is the reference value stored with the result (plain data), the one the case was judged against;
    a result stored without it (by an older grader) shows a note instead: the report never recomputes it.
    """
    if received is None and reason in NO_OUTPUT:  # nothing to compare, and the reason says why
        return [_note(NO_OUTPUT[reason])]
    try:
        if case is None:  # a checkpoint case
            shown = checkpoint_rows(received, rel_tol=rel_tol)
        elif expected is None and received is not None:
            shown = [_note("The expected value was not stored with this result (it was graded by an older version "
                           "of the grader); grade the batch again to see it.")]
        else:
            shown = compare(case, from_plain(expected), received, atol=atol, rtol=rtol)
        return shown + _traceback(received)
    except Exception as exc:  # noqa: BLE001 - stored data of any shape: the page is written all the same
        return [_note(f"The stored output of this case could not be shown ({type(exc).__name__}: "
                      f"{clip_text(as_text(exc), 300)}).")]


def _traceback(received: Any) -> list[dict[str, Any]]:
    err = received.get("error") if isinstance(received, dict) else None
    if not isinstance(err, dict):
        return []
    where = f"\n  at {err.get('where')}" if err.get("where") else ""
    raised = f"{as_text(err.get('type', '?'))}: {clip_text(str(err.get('message', '')), 1000)}"
    return [{"kind": "raised", "text": f"{raised}{as_text(where)}"}]
