"""Generic probes and checks shipped beside a lesson's checks (generic_checks.py): numpy only, registered on import.

A lesson's checks module that starts with `from generic_checks import *` has, registered in its runtime: the
checks `close`, `pair_equal`, `pair_differ`, `raises_value_error`, `shape`, `pair_close`; the probe `raises` (which
exception a call raised); the multiple-choice trio (LETTERS, the probe `answers`, the checks `choices_valid` and
`choice_correct`, which the engine's choice cases name); and the genuine-attempt test's skeleton (`attempt_gap_of`,
NORMALISATIONS, `agree`), which the lesson's own `attempt_gap` hook calls with what its probes give a function. A lesson
defines a check of the same name after the import to replace one. Case keys the checks read: `atol`, `rtol`,
`what`, `against`, `dtype` (close); `first`, `second`, `why`, `known_cause` (the pairs); `words` (raised errors).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from checks_runtime import (
    Verdict,
    catch,
    check,
    close_to,
    defined,
    error_message,
    fail,
    first_mismatch,
    match_mistake,
    preview,
    probe,
    row_text,
    teaching_row,
)

LETTERS = ("A", "B", "C", "D")  # a multiple-choice answer is one of these, as a string
TOL = 1e-6  # below this spread an output is constant; within this an output equals its input


# --------------------------------------------------------------------------- probes


@probe
def raises(env: dict[str, Any], fn: str, args: list[Any]) -> dict[str, Any]:
    """Call env[fn](*args) and report which exception it raised, if any."""
    target = defined(env, fn)
    return catch(lambda: target(*args))


@probe
def answers(env: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """The student's multiple-choice answers, as strings (anything else is described, not returned)."""
    out: dict[str, Any] = {}
    for name in names:
        value = env.get(name)
        out[name] = value.strip().upper() if isinstance(value, str) else f"<{type(value).__name__}>"
    return out


# --------------------------------------------------------------------------- checks


@check
def close(case: dict[str, Any], got: dict[str, Any], expected: dict[str, Any]) -> Verdict:
    """Student value equals the reference value within the case tolerance (and dtype, when asked)."""
    atol, rtol = case["atol"], case["rtol"]
    what = case.get("what", "the result")
    if (msg := error_message(got)) is not None:
        return fail(case, f"calling {what} failed: {msg}")
    want, value = np.asarray(expected["value"]["value"]), np.asarray(got["value"])
    if value.shape != want.shape:
        return fail(case, f"{what} has shape {list(value.shape)}, expected {list(want.shape)}",
                    match_mistake(got, expected, atol, rtol, "value"))
    if case.get("dtype") and got.get("dtype") != case["dtype"]:
        return fail(case, f"{what} has dtype {got.get('dtype')}, expected {case['dtype']}")
    if np.isnan(value).any():
        return fail(case, f"{what} contains NaN; expected {preview(want)}")
    if close_to(value, want, atol, rtol):
        return Verdict(True)
    row = teaching_row(~np.isclose(value, want, atol=atol, rtol=rtol))
    label = f" row {list(row)}" if row else ""
    text = (f"{what} does not match {case.get('against', 'the reference')}.\n  expected{label}: "
            f"{row_text(want, row)}\n  received{label}: {row_text(value, row)}\n  "
            f"{first_mismatch(value, want, atol, rtol)}")
    return fail(case, text, match_mistake(got, expected, atol, rtol, "value"))


@check
def pair_equal(case: dict[str, Any], got: dict[str, Any], expected: dict[str, Any]) -> Verdict:
    """The two arrays of a property probe agree (for example f(PX) and P f(X))."""
    atol, rtol = case["atol"], case["rtol"]
    if (msg := error_message(got)) is not None:
        return fail(case, msg)
    a, b = np.asarray(got["first"]), np.asarray(got["second"])
    if a.shape != b.shape:
        return fail(case, f"{case['first']} has shape {list(a.shape)} but {case['second']} has shape "
                    f"{list(b.shape)}")
    if a.size > 1 and float(np.ptp(a)) <= TOL and float(np.ptp(b)) <= TOL:  # zeros equal zeros: no evidence
        return fail(case, f"{case['first']} and {case['second']} are both constant ({preview(a)}): the property "
                    "must hold of values that vary.")
    if close_to(a, b, atol, rtol) and not np.isnan(a).any():
        return Verdict(True)
    text = (f"{case['first']} should equal {case['second']}.\n  {case['first']}: {preview(a)}\n"
            f"  {case['second']}: {preview(b)}")
    if not np.isnan(a).any() and not np.isnan(b).any():
        text += f"\n  {first_mismatch(a, b, atol, rtol)}"
    return fail(case, text, match_mistake(got, expected, atol, rtol, "first") or case.get("known_cause"))


@check
def pair_differ(case: dict[str, Any], got: dict[str, Any], expected: dict[str, Any]) -> Verdict:
    """The two arrays of a property probe must differ (for example when a causal mask breaks symmetry)."""
    if (msg := error_message(got)) is not None:
        return fail(case, msg)
    a, b = np.asarray(got["first"]), np.asarray(got["second"])
    if a.shape == b.shape and not close_to(a, b, case["atol"], case["rtol"]):
        return Verdict(True)
    return fail(case, f"{case['first']} and {case['second']} came out identical: {preview(a)}.\n  "
                f"{case['why']}", case.get("known_cause"))


@check
def raises_value_error(case: dict[str, Any], got: dict[str, Any], expected: dict[str, Any]) -> Verdict:
    """The call raised ValueError and its message contains every required word."""
    if (msg := error_message(got)) is not None:
        return fail(case, msg)
    what = case.get("what", "the call")
    if got["raised"] is None:
        return fail(case, f"{what} returned normally; it should raise ValueError.")
    if got["raised"] != "ValueError":
        return fail(case, f"{what} raised {got['raised']} ({got['message']}); it should raise ValueError "
                    "with a message a student can act on.", case.get("known_cause"))
    missing = [w for w in case.get("words", []) if w.lower() not in got["message"].lower()]
    if missing:
        return fail(case, f"the ValueError message {got['message']!r} should mention "
                    + ", ".join(repr(w) for w in missing) + ".")
    return Verdict(True)


@check
def shape(case: dict[str, Any], got: dict[str, Any], expected: dict[str, Any]) -> Verdict:
    """Shapes of returned arrays match the reference."""
    if (msg := error_message(got)) is not None:
        return fail(case, msg)
    want = expected["value"]
    for key in ("first", "second"):
        if list(np.shape(got[key])) != list(np.shape(want[key])):
            return fail(case, f"{case['what']} returned shape {list(np.shape(got[key]))}, expected "
                        f"{list(np.shape(want[key]))}.")
    return Verdict(True)


@check
def pair_close(case: dict[str, Any], got: dict[str, Any], expected: dict[str, Any]) -> Verdict:
    """Both arrays of a pair probe equal the reference pair."""
    atol, rtol = case["atol"], case["rtol"]
    if (msg := error_message(got)) is not None:
        return fail(case, msg)
    for key, label in (("first", case["first"]), ("second", case["second"])):
        a, b = np.asarray(got[key]), np.asarray(expected["value"][key])
        if not close_to(a, b, atol, rtol):
            detail = first_mismatch(a, b, atol, rtol) if a.shape == b.shape else f"shape {list(a.shape)}"
            return fail(case, f"{label} does not match: expected {preview(b)}, received {preview(a)}; {detail}",
                        match_mistake(got, expected, atol, rtol, key))
    return Verdict(True)


@check
def choices_valid(case: dict[str, Any], got: dict[str, Any], expected: dict[str, Any]) -> Verdict:
    """Every answer variable holds one of the letters A-D."""
    if (msg := error_message(got)) is not None:
        return fail(case, msg)
    bad = {k: v for k, v in got.items() if v not in LETTERS}
    if not bad:
        return Verdict(True)
    listing = ", ".join(f"{k} = {v!r}" for k, v in bad.items())
    return fail(case, f"set each answer to one of {', '.join(map(repr, LETTERS))} as a string; found {listing}.")


@check
def choice_correct(case: dict[str, Any], got: dict[str, Any], expected: dict[str, Any]) -> Verdict:
    """The answer variable holds the right letter."""
    if (msg := error_message(got)) is not None:
        return fail(case, msg)
    name = case["args"]["names"][0]
    if got.get(name) == expected["value"][name]:
        return Verdict(True)
    return fail(case, f"{name} = {got.get(name)!r} is not the right answer.")


# --------------------------------------------------------------------------- genuine attempts
#
# A property (shuffling the input shuffles the output; only used rows get a gradient) also holds of code that
# computes nothing, so a property case `requires` value cases of its question. It does not need them to be right:
# one wrong value must not zero every property that holds. It needs them to be genuine attempts (`attempt_gap_of`):
# the output of a required value case is the reference after the case's declared normalisations (`near:`), or a
# catalogued mistake's, or a genuine attempt by the question's contract, which means that it
#   1. ran without an error and has the reference's shape, the same value when computed again, and finite values in
#      at least half of its rows (a NaN row fails its value case only, where the reference is finite);
#   2. is not constant (zeros, ones, any single number);
#   3. is not one of its inputs returned (the lesson's `inputs(case)` lists them: an identity);
#   4. meets the function's contract (the lesson's `contract(case, got, value)`), judged here from what the probe
#      recorded: what is true of every correct answer, every catalogued mistake and every variant, and of no garbage
#      (attention: unchanged when q and k turn together, linear in v, moved by q and by k; a module: its positions
#      each read their own row of its table). Where the lesson has no contract for a probe (None), the output must lie
#      within the case's declared closeness (`within:`, a relative error) of the reference instead.
# A value case whose call raised still opens its gates when the probe recorded, beside the error, the contract's own
# calls (`contract`: a shorter input, say) and they meet the contract: it holds back only what needs its output.
# Blank stubs, zeros, constants and returning an input fail 1, 2 or 3; `attempt_gap_of` says which.

# The normalisations a value case may declare (`near:`): the first half of the last axis (a table at full width,
# repeated), the leading rows (a table longer than asked). Values are compared as floats, so a dtype never matters.
NORMALISATIONS: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "first_half": lambda a, w: a[..., : w.shape[-1]] if a.ndim == w.ndim and a.shape[-1] == 2 * w.shape[-1] else a,
    "leading_rows": lambda a, w: a[: w.shape[0]] if a.ndim == w.ndim and a.shape[0] > w.shape[0] else a,
}

Inputs = Callable[[dict[str, Any]], list[np.ndarray]]
# What a probe records for the contract alone, never stored with the expected values (the release builder drops it):
# the contract judges the student's own calls, not the reference's.
UNSTORED = ("contract",)
# Why `value` (None: the call raised; the probe's `contract` calls alone are judged) breaks the contract; "" when it
# meets it; None when the lesson has no contract for this probe (then only `within:` opens the gate).
Contract = Callable[[dict[str, Any], dict[str, Any], "np.ndarray | None"], "str | None"]


def near(case: dict[str, Any], got: dict[str, Any], expected: dict[str, Any], keys: list[str]) -> bool:
    """Whether the output matches a catalogued mistake, or the reference after the case's normalisations."""
    atol, rtol = case["atol"], case["rtol"]
    if all(match_mistake(got, expected, atol, rtol, key) is not None for key in keys):
        return True
    want = expected["value"]
    for key in keys:
        mine = np.asarray(got.get(key), dtype=float)
        for name in case.get("near", []):
            mine = NORMALISATIONS[name](mine, np.asarray(want[key]))
        if not close_to(mine, want[key], atol, rtol):
            return False
    return True


def relative_error(mine: Any, want: Any) -> float:
    """|mine - want| / |want| (inf when the shapes differ or mine is not finite)."""
    a, b = np.asarray(mine, dtype=float), np.asarray(want, dtype=float)
    if a.shape != b.shape or not np.isfinite(a).all():
        return math.inf
    return float(np.linalg.norm(a - b) / max(float(np.linalg.norm(b)), 1e-12))


def finite_rows(a: Any) -> np.ndarray:
    """Which rows (along the last axis) of `a` are finite throughout: a mask of a's shape without its last axis."""
    arr = np.asarray(a, dtype=float)
    return np.isfinite(arr).all(axis=-1) if arr.ndim else np.isfinite(arr)


def agree(a: Any, b: Any, *, rtol: float = 1e-3, atol: float = 1e-5) -> bool:
    """a equals b on the rows where both are finite, relative to b's scale, and both are non-finite in the same
    rows; at least half of the rows finite (a NaN row of a causal mask that hides the diagonal, say, is skipped)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.size == 0:
        return False
    ok_a, ok_b = finite_rows(a), finite_rows(b)
    if not np.array_equal(ok_a, ok_b) or 2 * int(ok_a.sum()) < ok_a.size:
        return False
    x, y = a[ok_a], b[ok_b]
    scale = float(np.abs(y).max()) if y.size else 0.0
    return bool(np.allclose(x, y, rtol=rtol, atol=atol * max(scale, 1.0)))


def attempt_gap_of(case: dict[str, Any], got: Any, expected: dict[str, Any], *, inputs: Inputs,
                   contract: Contract) -> str:
    """Why the output `got` of value case `case` does not open the gates of the cases that require it ("" when it
    does): it must be the reference after the case's normalisations, a catalogued mistake, or a genuine attempt by
    the question's contract (or, where the lesson has none for the probe, within the case's declared closeness);
    see above. A lesson's `attempt_gap` hook calls this with its `inputs` and `contract`."""
    if not isinstance(got, dict):
        return "it returned nothing"
    if "error" in got:  # it raised: only the contract's own calls, if the probe recorded them, can show an attempt
        own = contract(case, got, None) if isinstance(got.get("contract"), dict) else None
        return "" if own == "" else "it raised an error" + (f", and {own}" if own else "")
    want = expected.get("value", {}) if isinstance(expected, dict) else {}
    keys = [k for k, v in want.items() if isinstance(v, np.ndarray) and k in ("value", "first", "second")]
    if not keys:
        return "its output cannot be judged"
    if near(case, got, expected, keys):
        return ""
    gap = degenerate(case, got, want, keys, inputs=inputs)
    if gap:
        return gap
    own = contract(case, got, np.asarray(got[keys[0]], dtype=float))
    if own is not None:
        return own
    within = case.get("within")
    if within and all(relative_error(got.get(k), want[k]) <= within for k in keys):
        return ""
    return ("its values are far from the reference's" + (f" (more than {within:.0%} off)" if within else "")
            + " and match no known mistake")


def degenerate(case: dict[str, Any], got: dict[str, Any], want: dict[str, Any], keys: list[str], *,
               inputs: Inputs) -> str:
    """Why the output computes nothing (1. to 3. above), or ""."""
    for key in keys:
        mine = np.asarray(got.get(key), dtype=float)
        if mine.shape != np.shape(want[key]):
            return f"it returned shape {list(mine.shape)}, not {list(np.shape(want[key]))}"
        rows = finite_rows(mine)
        if rows.size == 0 or 2 * int(rows.sum()) < rows.size:
            return "it returned NaN or infinite values"
        if mine.size > 1 and float(np.ptp(mine[rows])) <= TOL:
            return "it returned a constant"
    value = np.asarray(got[keys[0]], dtype=float)
    if "again" in want:
        again = np.asarray(got.get("again"), dtype=float)
        if again.shape != value.shape or not np.allclose(again, value, atol=TOL, rtol=0.0, equal_nan=True):
            return "it returned another value when called again on the same inputs"
    for given in inputs(case):
        if given.shape == value.shape and close_to(value, given, TOL, TOL):
            return "it returned one of its inputs unchanged"
    return ""


__all__ = ["LETTERS", "TOL", "raises", "answers", "close", "pair_equal", "pair_differ", "raises_value_error",
           "shape", "pair_close", "choices_valid", "choice_correct", "NORMALISATIONS", "near", "relative_error",
           "UNSTORED", "finite_rows", "agree", "attempt_gap_of", "degenerate"]
