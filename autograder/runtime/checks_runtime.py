"""The checks runtime: the generic half of every lesson's checks module, shipped next to it as checks_runtime.py.

A lesson's checks module (assignments/NAME/NAME_checks.py) holds only its probes, its checks and a few hooks; it
starts with `from checks_runtime import *` (`__all__` below: the registries and their decorators, Verdict, the case
codec, run_probe, judge, the gate, the local checks and their summary). The case codec is the engine's (plain_codec.py,
shipped beside this file and imported from there by its top-level name, as the kit modules import this one). Python
and numpy alone are needed (torch only where a lesson's probes imported it), so a notebook imports it without the
autograder package.
A *probe* (@probe) runs inside the student's process: it calls the student's code on fixed inputs and returns plain
data, never a verdict. A *check* (@check) runs wherever judging happens (the notebook's local checks, the clean
grader process): it compares the probe's output with the reference's and returns a Verdict.
Loaded from: the student's copy next to the notebook; in the grader, each lesson's own copy of the engine's file
(autograder/lesson.py: Lesson.checks), so registries never mix and no file of a student's folder is imported; in the
sandbox, the staged copy of the engine's file (autograder/sandbox/guard.py), watched like the checks module.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from plain_codec import dumps, from_plain, loads, own_array, to_plain  # the engine's codec: the copy shipped beside

PROBES: dict[str, Callable[..., dict[str, Any]]] = {}
CHECKS: dict[str, Callable[..., Verdict]] = {}
NOT_FILLED = "not filled in yet"  # the words of a blank stub, spelled here once: the grader's messages say them
STUB = f"the stub is {NOT_FILLED}"  # what a probe says when a stub returned None or ...
# Probe outputs that are not plain arrays (subclasses, objects with __array__), as the sandbox reports them.
SUSPICIOUS: list[str] = []


@dataclass
class Verdict:
    """Outcome of one check: pass or fail, with the message shown to the student."""

    passed: bool
    message: str = ""
    diagnosis: str | None = None  # id of the catalogued mistake the failure matches, if any
    upstream: str | None = None  # "This comes from your Q2 `f`: ..." when an earlier question is the cause
    # Why the output is not a genuine attempt ("" when it is; None: not known, as for a case that never ran): a
    # property case that requires this one earns its points only next to a genuine attempt (`attempt_gap`).
    not_genuine: str | None = None


def probe(fn: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    """Register fn as the probe named like it (a case's `probe:`)."""
    PROBES[fn.__name__] = fn
    return fn


def check(fn: Callable[..., Verdict]) -> Callable[..., Verdict]:
    """Register fn as the check named like it (a case's `check:`)."""
    CHECKS[fn.__name__] = fn
    return fn


# --------------------------------------------------------------------------- a lesson's hooks
# Optional functions a lesson registers with @hook, under these names; the defaults change nothing.


def _no_setup() -> None:
    """before_probe(): called before every probe (a lesson seeds its random generators here)."""


def _as_judged(case: dict[str, Any], got: dict[str, Any], expected: dict[str, Any], verdict: Verdict) -> Verdict:
    """builds_on(case, got, expected, verdict): a failing case whose args name a `basis` (an earlier question's
    probe), judged so that a mistake costs points where it is made."""
    return verdict


def _not_known(case: dict[str, Any], got: Any, expected: dict[str, Any]) -> str | None:
    """attempt_gap(case, got, expected): why a failing value case's output is not a genuine attempt ("" when it
    is, None when not known: then a property that requires it waits for it to pass)."""
    return None


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """torch on one thread for the block, the caller's setting restored after: a check is small (on a busy machine
    more threads only wait for each other), and a reduction split across threads can change a result's last bit."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def _as_is() -> Iterator[None]:
    """local_check(): a context manager around each of the notebook's local checks (one torch thread, say)."""
    yield


HOOKS: dict[str, Callable[..., Any]] = {"before_probe": _no_setup, "builds_on": _as_judged,
                                        "attempt_gap": _not_known, "local_check": _as_is}


def hook(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Register fn as the lesson's hook named like it (one of HOOKS' keys)."""
    if fn.__name__ not in HOOKS:
        raise NameError(f"{fn.__name__} is not a hook of checks_runtime: name it one of {', '.join(HOOKS)}")
    HOOKS[fn.__name__] = fn
    return fn


# --------------------------------------------------------------------------- probe helpers


def run_probe(env: dict[str, Any], name: str, args: dict[str, Any]) -> dict[str, Any]:
    """Run probe `name` on the namespace `env`; a student error becomes data, never an exception.

    A case whose value builds on an earlier question names, under args["basis"], a probe of the student's own
    earlier function ({"probe", "args", "question", "names", "own"}); its output comes back alongside, under
    "basis", so that the check can tell a mistake made here from one made in the earlier question.
    """
    basis = args.get("basis") if isinstance(args, dict) else None
    out = _run_one(env, name, {k: v for k, v in args.items() if k != "basis"})
    if isinstance(basis, dict):
        out["basis"] = _run_one(env, basis["probe"], basis["args"])
    return out


def _run_one(env: dict[str, Any], name: str, args: dict[str, Any]) -> dict[str, Any]:
    try:
        HOOKS["before_probe"]()  # a lesson seeds its generators here
        out = PROBES[name](env, **args)
        return to_plain(out, array=own_array)  # plain data, arrays copied
    except Exception as exc:  # noqa: BLE001 - any student error is recorded, not raised
        return {"error": error_record(exc)}


def error_record(exc: BaseException) -> dict[str, str]:
    """A student error as data: its type, message and the innermost line outside the checks (the student's)."""
    frames = list(traceback.walk_tb(exc.__traceback__))  # frames and line numbers; no source file is read
    where = next((f"line {lineno} in {f.f_code.co_name}" for f, lineno in reversed(frames)
                  if not f.f_code.co_filename.endswith(("_checks.py", "checks_runtime.py", "plain_codec.py"))), "")
    return {"type": type(exc).__name__, "message": str(exc)[:300], "where": where}


def defined(env: dict[str, Any], name: str) -> Any:
    """env[name], or a NameError that asks the student to run its cell."""
    obj = env.get(name)
    if obj is None:
        raise NameError(f"`{name}` is not defined: run its cell first")
    return obj


def as_array(value: Any, what: str) -> np.ndarray:
    """Student output as a numpy array of numbers, copied, or a TypeError that says what came back.

    The copy is taken at once, so student code that keeps the returned tensor and changes it later cannot
    change what the probe saw. Only plain tensors (an nn.Parameter too), plain ndarrays and Python
    numbers or lists pass; a subclass or an object of its own with __array__ earns nothing and is
    recorded in SUSPICIOUS for the grader's report.
    """
    if value is None or value is Ellipsis:
        raise TypeError(f"{what} returned {value!r}: {STUB}")
    odd = _odd_array(value)
    if odd:
        SUSPICIOUS.append(f"{what} returned {odd}")
        raise TypeError(f"{what} returned {odd}; return a plain torch.Tensor or numpy array")
    torch = sys.modules.get("torch")  # a tensor exists only where torch is imported
    if torch is not None and isinstance(value, torch.Tensor):
        value = value.detach().cpu().clone()
        if str(value.dtype) == "torch.bfloat16":
            value = value.float()
        arr = np.asarray(value.numpy())  # the clone is already the probe's own copy: no second one
    else:
        arr = np.array(value, copy=True)
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"{what} returned {type(value).__name__} of dtype {arr.dtype}, expected numbers")
    return arr


def _odd_array(value: Any) -> str:
    """How value differs from a plain array, tensor or Python number/list ('' when it does not)."""
    t = type(value)
    torch = sys.modules.get("torch")  # without torch no tensor exists: numpy's and Python's types alone are plain
    tensors = (torch.Tensor, torch.nn.Parameter, getattr(torch.nn, "Buffer", torch.Tensor)) if torch else ()
    if t in (*tensors, np.ndarray) or t in (list, tuple, int, float, bool) or (isinstance(value, np.generic)
                                                                            and t.__module__ == "numpy"):
        return ""
    name = f"{t.__module__}.{t.__qualname__}"[:80]
    if issubclass(t, (*tensors[:1], np.ndarray)):
        base = "torch.Tensor" if tensors and issubclass(t, tensors[0]) else "numpy.ndarray"
        return f"a {name} (a subclass of {base})"
    if any(hasattr(t, a) for a in ("__array__", "__array_interface__", "__array_struct__", "__torch_function__",
                                   "detach", "numpy")):
        return f"a {name} that poses as an array"
    return ""


def dtype_name(value: Any) -> str:
    """A value's dtype as a short name (float32), or its type's name."""
    return str(getattr(value, "dtype", type(value).__name__)).replace("torch.", "")


def catch(fn: Callable[[], Any]) -> dict[str, Any]:
    """What calling fn raised ({"raised": type name or None, "message"})."""
    try:
        fn()
    except Exception as exc:  # noqa: BLE001
        return {"raised": type(exc).__name__, "message": str(exc)[:300]}
    return {"raised": None, "message": ""}


# --------------------------------------------------------------------------- message helpers


def preview(a: Any, n: int = 6) -> str:
    """The first n values of a, flattened, to 4 decimals."""
    arr = np.asarray(a, dtype=float).ravel()
    body = ", ".join(f"{v:.4f}" for v in arr[:n])
    return f"[{body}{', ...' if arr.size > n else ''}]"


def first_mismatch(a: np.ndarray, b: np.ndarray, atol: float, rtol: float) -> str:
    """Where a first differs from b, and how many values differ."""
    bad = ~np.isclose(a, b, atol=atol, rtol=rtol, equal_nan=False)
    idx = tuple(int(i) for i in np.argwhere(bad)[0])
    return (f"first mismatch at index {list(idx)}: expected {float(b[idx]):.4f}, got {float(a[idx]):.4f} "
            f"({int(bad.sum())} of {bad.size} values differ)")


def teaching_row(bad: np.ndarray) -> tuple[int, ...]:
    """The row to show for a mismatch: the first row that differs; but in a square (..., T, T) table of queries
    by keys (a bias or a mask), the last query row of that block that differs, whose keys are all past or
    present (row 0 of a causal bias holds only future keys, which the mask removes anyway)."""
    if bad.ndim < 2:
        return ()
    idx = tuple(int(i) for i in np.argwhere(bad)[0])
    if bad.shape[-1] == bad.shape[-2]:
        rows = np.flatnonzero(bad[idx[:-2]].any(axis=-1))
        return (*idx[:-2], int(rows[-1]))
    return idx[:-1]


def row_text(arr: np.ndarray, index: tuple[int, ...]) -> str:
    """The row of arr at index (a teaching_row), formatted."""
    return preview(arr[index]) if arr.ndim > 1 else preview(arr)


def error_message(got: dict[str, Any]) -> str | None:
    """What a probe's error record says to the student (None: the probe ran)."""
    if "error" not in got:
        return None
    err = got["error"]
    where = f" ({err['where']})" if err.get("where") else ""
    return f"your code raised {err['type']}: {err['message']}{where}"


def close_to(a: Any, b: Any, atol: float, rtol: float) -> bool:
    """Same shape and allclose within atol and rtol."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return a.shape == b.shape and bool(np.allclose(a, b, atol=atol, rtol=rtol))


def match_mistake(got: dict[str, Any], expected: dict[str, Any], atol: float, rtol: float, key: str) -> dict | None:
    """The catalogued mistake whose output on this case matches what the student returned, if any.

    When several catalogued mistakes give this very output (two different mistakes can give the same
    scores), this case cannot tell which one it is: the cause lists each, and names no
    single mistake (diagnosis None); a case where their outputs differ names the one that matches."""
    found = []
    for variant in expected.get("variants", []):  # a local check keeps their outputs in JSON form (`_decoded`)
        output = variant["output"]
        if key in got and key in output and close_to(got[key], from_plain(output[key]), atol, rtol):
            found.append(variant)
    if len(found) > 1:
        return {"id": None, "description": "one of these (this case cannot tell them apart): "
                + " OR ".join(f"({n}) {v['description']}" for n, v in enumerate(found, 1))}
    return found[0] if found else None


def fail(case: dict[str, Any], text: str, cause: dict[str, Any] | None = None) -> Verdict:
    """A failing verdict: the case id, what went wrong, the likely cause if known, and what to revisit."""
    if cause:
        text += f"\n  Likely cause: {cause['description']}"
    revisit = case.get("revisit")
    tail = f"\n  Revisit: {revisit}" if revisit else ""
    return Verdict(False, f"{case['id']}: {text}{tail}", cause["id"] if cause else None)


# --------------------------------------------------------------------------- entry points


def judge(case: dict[str, Any], got: dict[str, Any], expected: dict[str, Any]) -> Verdict:
    """Apply the case's check; a check that trips over odd student data fails the case, never crashes.

    A stub that is not filled in gets one line, not a traceback and a hint. A case that builds on an earlier
    question (args["basis"]) is judged as `builds_on` says."""
    try:
        err = got.get("error") if isinstance(got, dict) else None
        if isinstance(err, dict) and STUB in str(err.get("message", "")):
            return Verdict(False, f"{case['id']}: {err['message']}.", not_genuine=f"it is {NOT_FILLED}")
        verdict = CHECKS[case["check"]](case, got, expected)
        basis = case.get("args", {}).get("basis") if isinstance(case.get("args"), dict) else None
        verdict = HOOKS["builds_on"](case, got, expected, verdict) if basis and not verdict.passed else verdict
        verdict.not_genuine = "" if verdict.passed else HOOKS["attempt_gap"](case, got, expected)
        return verdict
    except Exception as exc:  # noqa: BLE001 - malformed student data is a failure, not a grader crash
        return fail(case, f"the result could not be judged ({type(exc).__name__}: {exc}).")


def gate_message(case_id: str, blocked: list[str], note: str | None = None, why: str | None = None) -> str:
    """Why a property earns nothing yet, in one short sentence: the value cases it requires are not a genuine
    attempt (`why`: how the first falls short; and, if known, the earlier question they fail because of)."""
    names = [f"`{b.split('/', 1)[-1]}`" for b in blocked]  # the cases' names, never the grader's ids
    text = (f"{case_id}: counts once {' and '.join(names)} {'gives' if len(names) == 1 else 'give'} a real answer"
            f"{f' ({names[0]}: {why})' if why else ''}: work on {names[0]} first.")
    return f"{text}\n  {note}" if note else text


def attempted(verdict: Verdict) -> bool:
    """Whether a required value case opens the gate: it passed, or its output is a genuine attempt."""
    return verdict.passed or verdict.not_genuine == ""


def gated(case: dict[str, Any], verdict: Verdict, blocked: list[tuple[str, Verdict]]) -> Verdict:
    """The verdict on a case once the value cases it requires (id, verdict) are judged; one rule for the grader
    and the local checks. While a required case fails, the case earns nothing and its message is the gate's:
    a property that fails next to wrong values is no evidence of any particular mistake, so none is named."""
    if not blocked:
        return verdict
    note = next((v.upstream for _, v in blocked if v.upstream), None)
    why = blocked[0][1].not_genuine
    return Verdict(False, gate_message(case["id"], [cid for cid, _ in blocked], note, why), None, note)


class CheckFailed(AssertionError):
    """A local check that failed: Otter shows its message alone (see `_otter_shows_message_only`)."""

    checks_message = True


def _otter_shows_message_only() -> None:
    """Make Otter show a failed check as its message alone, without "Error at line 13 in test q7_x: run_case(env,
    case)" (a line of the generated test file); any other exception is reported as Otter reports it."""
    cls = getattr(sys.modules.get("otter.test_files.exception_test"), "ExceptionTestFile", None)
    original = getattr(cls, "_generate_error_message", None)
    if original is None or getattr(original, "checks_runtime", False):
        return

    def message(self: Any, excp: BaseException, context: int = 0) -> str:
        if getattr(excp, "checks_message", False):
            return str(excp)
        return original(self, excp, context)

    message.checks_runtime = True  # type: ignore[attr-defined]
    cls._generate_error_message = message  # type: ignore[union-attr]


class VerdictMemo:
    """Verdicts of the cases already judged in the current local check, so that a gate reuses them (the grader too
    judges each case once and gates with that verdict). A verdict is reused only while the check is the same: same
    question, same `env`, every public name in env bound to the same object as when it was made; the memo empties
    when any of these changes, when a case is checked again, and at the question's summary (`check_summary`)."""

    def __init__(self) -> None:
        self.active = False  # True while check_case runs
        self.layouts: dict[tuple, tuple] = {}  # meta-device attention call -> its output's layout (_meta_sdpa)
        self.clear()

    def clear(self) -> None:
        self.question: str | None = None
        self.env: dict[str, Any] | None = None
        self.names: dict[str, Any] = {}
        self.verdicts: dict[str, Verdict] = {}
        self.checked: set[str] = set()

    @staticmethod
    def key(raw: dict[str, Any]) -> str:
        """Everything that decides a verdict: the probe, its arguments, the check and the expected values, from
        the case as its JSON reads (arrays still as text: serialising them again would cost more than most
        probes)."""
        return json.dumps({k: v for k, v in raw.items() if k != "gate"}, sort_keys=True, separators=(",", ":"))

    def start(self, env: dict[str, Any], case: dict[str, Any]) -> None:
        """Called before case is checked as a case of its own: keeps the memo only if the check is the same."""
        question = str(case["id"]).split("/")[0]
        names = {k: v for k, v in env.items() if isinstance(k, str) and not k.startswith("_")}
        same = (self.env is env and self.question == question and case["id"] not in self.checked
                and names.keys() == self.names.keys() and all(names[k] is v for k, v in self.names.items()))
        if not same:
            self.clear()
            self.env, self.question, self.names = env, question, names
        self.checked.add(case["id"])

    def get(self, key: str) -> Verdict | None:
        return self.verdicts.get(key)

    def put(self, key: str, verdict: Verdict) -> None:
        self.verdicts[key] = verdict


MEMO = VerdictMemo()  # used by check_case (the notebook's checks); run_case alone never reuses a verdict


def _decoded(raw: dict[str, Any]) -> dict[str, Any]:
    """from_plain of a case's JSON (its gates too), leaving each catalogued mistake's output in JSON form: `_match`
    decodes them when a case fails; a case that passes never reads them, and they are most of a milestone case."""
    case = from_plain({k: v for k, v in raw.items() if k not in ("expected", "gate")})
    expected = raw.get("expected")
    if isinstance(expected, dict) and isinstance(expected.get("variants"), list):
        case["expected"] = from_plain({k: v for k, v in expected.items() if k != "variants"})
        case["expected"]["variants"] = expected["variants"]
    elif "expected" in raw:
        case["expected"] = from_plain(expected)
    if isinstance(raw.get("gate"), list):
        case["gate"] = [_decoded(g) for g in raw["gate"]]
    return case


def run_case(env: dict[str, Any], case_json: str, *, memo: VerdictMemo | None = None) -> None:
    """Local check used by the notebook's test files: probe, judge, and raise CheckFailed with the message. A case
    carries the value cases it requires under "gate" and passes only when they pass too, as in the grader; with
    `memo`, a case already judged in the same check reuses that verdict (one checked again runs its probe again)."""
    _run_raw(env, json.loads(case_json), memo=memo)


def _run_raw(env: dict[str, Any], raw: dict[str, Any], *, memo: VerdictMemo | None) -> None:
    """run_case on the case's JSON, already parsed."""
    case = _decoded(raw)
    if memo is not None:
        memo.start(env, case)

    def verdict_of(c: dict[str, Any], c_raw: dict[str, Any]) -> Verdict:
        """c's verdict: from the memo when judged earlier in this check (as a gate, say), else by its probe."""
        key = memo.key(c_raw) if memo is not None else ""
        v = memo.get(key) if memo is not None else None
        if v is None:
            began = _clocks()
            got = run_probe(env, c["probe"], c["args"])
            took = _since(began)
            _warn_slow(f"the check {c['id']}", took, "probe_s")
            SPENT.setdefault(str(c["id"]).split("/")[0], []).append(took)
            v = judge(c, got, c["expected"])
            if memo is not None:
                memo.put(key, v)
        return v

    verdict = verdict_of(case, raw)
    gate = [(g["id"], verdict_of(g, g_raw)) for g, g_raw in zip(case.get("gate", []), raw.get("gate", []), strict=True)]
    verdict = gated(case, verdict, [(cid, v) for cid, v in gate if not attempted(v)])
    if not verdict.passed:
        _otter_shows_message_only()
        question = str(case["id"]).split("/")[0]  # the student reads its cases by name, not the grader's ids
        raise CheckFailed(verdict.message.replace(f"{question}/", ""))


# --------------------------------------------------------------------------- local checks: one thread, a summary

LOCAL_RESULTS: dict[str, bool] = {}  # case id -> whether its latest local check passed (read by the summary)
# the grader's time limits in CPU seconds (cell_s, probe_s, question_s) and the factor of their wall-clock backstop
# (backstop), as each case carries them
LIMITS: dict[str, float] = {}
SPENT: dict[str, list[tuple[float, float]]] = {}  # question -> (CPU s, wall s) of each check here, since its summary


def _clocks() -> tuple[float, float]:
    return time.process_time(), time.perf_counter()


def _since(began: tuple[float, float]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) since `began` (_clocks())."""
    now = _clocks()
    return now[0] - began[0], now[1] - began[1]


def _over_half(took: tuple[float, float], cap: float) -> str:
    """Which half `took` (CPU s, wall s) passed: of the CPU limit `cap`, of its wall-clock backstop, or ""."""
    backstop = LIMITS.get("backstop", 3.0) * cap
    if took[0] > cap / 2:
        return f"{took[0]:.1f} s of CPU here; the grader allows {cap:g} s of CPU"
    if took[1] > backstop / 2:
        return f"{took[1]:.1f} s here (waiting, mostly); the grader stops it after {backstop:g} s on the clock"
    return ""


def _warn_slow(what: str, took: tuple[float, float], limit: str) -> None:
    """Say when `what` took more than half the grader's limit `limit` (a cell, one check) in CPU time, or half its
    wall-clock backstop: graded, it may stop."""
    cap = LIMITS.get(limit)
    said = _over_half(took, cap) if cap else ""
    if said:
        kind = "a cell" if limit == "cell_s" else "one check"
        print(f"Warning: {what} took {said} for {kind}, on a machine that may be slower. Make it faster (or tag a "
              "long experiment `long-running`).", file=sys.stderr)


def _watch_cells() -> None:
    """From now on, time every cell the notebook runs (but check cells) and warn when one is slow (_warn_slow)."""
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    if shell is None or getattr(shell, "_checks_runtime_timer", False) or not hasattr(shell, "events"):
        return
    # when the cell began, and whether it is a check cell (1.0): the running cell, which registers the timer from a
    # check, is one, and its end is not timed (it began before the timer existed)
    began: list[Any] = [_clocks(), 1.0]
    shell.events.register("pre_run_cell", lambda info=None: began.__setitem__(slice(None), [
        _clocks(), float("grader.check" in str(getattr(info, "raw_cell", "")))]))
    shell.events.register("post_run_cell", lambda result=None: began[1] or _warn_slow(
        "this cell", _since(began[0]), "cell_s"))
    shell._checks_runtime_timer = True
# Tables that only the local checks fill and no probe reads: the grader's guard does not read a change to them as
# tampering (an nbgrader notebook runs check_case in the student's process, and that is honest).
UNGUARDED = ("LOCAL_RESULTS",)


def check_case(env: dict[str, Any], case_json: str) -> None:
    """run_case as the notebook's checks call it: inside the lesson's local_check hook (one torch thread, say),
    and recorded for the question's summary."""
    raw = json.loads(case_json)
    case_id = raw["id"]
    LIMITS.update(raw.get("limits") or {})
    _watch_cells()
    LOCAL_RESULTS[case_id] = False
    with HOOKS["local_check"]():
        MEMO.active = True
        try:
            _run_raw(env, raw, memo=MEMO)
        finally:
            MEMO.active = False
    LOCAL_RESULTS[case_id] = True


def summary_line(*, public: int, hidden: int, failed: int = 0, answers: bool = False) -> str:
    """What a question's local check covered: its public tests, and how many more are graded after submission."""
    if failed:
        done = f"{failed} of {public} public {'test' if public == 1 else 'tests'} did not pass (see above)"
    else:  # Otter shows it beside failed tests too: it says what was checked, never that all passed
        done = f"{public} public {'test' if public == 1 else 'tests'} checked here"
    after = (f"{hidden} more {'test is' if hidden == 1 else 'tests are'} graded after you submit" if hidden
             else "no other test is graded")
    note = (" Only the format of your answers is checked here: whether they are right is checked after you "
            "submit.") if answers else ""
    return f"{done}; {after}.{note}"


def _failed(public: list[str]) -> int:
    """How many of the public cases `public` (ids) did not pass their latest local check (not run: not passed)."""
    return sum(not LOCAL_RESULTS.get(cid, False) for cid in public)


def _warn_question(public: list[str], hidden: int) -> None:
    """Say when a question's checks, at the pace its public checks took here, would use more than half of the share
    of checking time the grader gives the question (its public and hidden checks together): graded, the checks
    that have not run by then earn nothing."""
    question = public[0].split("/")[0] if public else ""
    spent, cap = SPENT.pop(question, []), LIMITS.get("question_s")
    if not spent or not cap:
        return
    pace = (len(public) + hidden) / len(spent)
    said = _over_half((sum(s[0] for s in spent) * pace, sum(s[1] for s in spent) * pace), cap)
    if said:
        print(f"Warning: at the pace of its checks here, the {len(public) + hidden} graded checks of {question} take "
              f"{said} for them together, on a machine that may be slower: the checks not run by then earn nothing. "
              "Make it faster.", file=sys.stderr)


def public_summary(public: list[str], *, hidden: int, answers: bool = False) -> str:
    """summary_line for the public cases `public` (ids), from their latest local checks."""
    _warn_question(public, hidden)
    failed = _failed(public)
    return summary_line(public=len(public), hidden=hidden, failed=failed, answers=answers)


def check_summary(public: list[str], *, hidden: int, answers: bool = False) -> None:
    """Otter's last case of a question (worth 0): it passes when every public case passed (Otter then prints
    summary_line, what was checked and what is graded later, as its message) and fails, saying how many did not,
    when one did not: its row never says "passed" under failed tests."""
    _warn_question(public, hidden)
    MEMO.clear()  # the question's check is over
    failed = _failed(public)
    if failed:
        raise AssertionError(summary_line(public=len(public), hidden=hidden, failed=failed, answers=answers))


# The engine's API: what `from checks_runtime import *` gives a lesson's checks module (autograder/lesson.py).
__all__ = ["PROBES", "CHECKS", "HOOKS", "STUB", "SUSPICIOUS", "LOCAL_RESULTS", "UNGUARDED", "MEMO", "Verdict",
           "CheckFailed", "VerdictMemo", "probe", "check", "hook", "to_plain", "from_plain", "dumps", "loads",
           "run_probe", "error_record", "judge", "gate_message", "attempted", "gated", "run_case", "check_case",
           "summary_line", "public_summary", "check_summary"]
