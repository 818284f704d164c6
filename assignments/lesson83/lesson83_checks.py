"""Probes and checks for Lesson 83; shipped to students, so it holds no solution and no hidden case.

The generic machinery (registries, Verdict, the case codec, run_probe, judge, the gate, the local checks) is the
shipped checks runtime (checks_runtime.py, next to this file): this module holds only the lesson's probes, checks
and hooks. A test case has two halves. A *probe* runs inside the student's process: it calls the student's code
on fixed inputs and returns plain data (numbers, strings, numpy arrays), never a verdict. A *check*
runs wherever judging happens (the notebook for local checks, the clean grader process for grading):
it compares the probe's output with the reference output computed by the same probe on the reference
solution, and returns a verdict with a message that says what was expected, what came back and which
idea to revisit. Expected values are never typed in: the release builder computes them from
`reference/` and stores them with the case.
"""

from __future__ import annotations

import collections
import contextlib
import math
import operator
import sys
import types
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
from checks_runtime import *  # noqa: F403 - the engine's API (checks_runtime.__all__): this module defines none of it
from checks_runtime import (
    CHECKS,
    MEMO,
    STUB,
    Verdict,
    as_array,
    check,
    error_record,
    hook,
    one_torch_thread,
    probe,
    run_probe,
)
from checks_runtime import catch as _catch
from checks_runtime import close_to as _close
from checks_runtime import defined as _get
from checks_runtime import dtype_name as _dtype_name
from checks_runtime import error_message as _error_message
from checks_runtime import fail as _fail
from checks_runtime import first_mismatch as _where
from checks_runtime import match_mistake as _match
from checks_runtime import preview as _fmt
from checks_runtime import row_text as _row
from checks_runtime import teaching_row as _teaching_row

LETTERS = ("A", "B", "C", "D")
# Checks that compare with the reference value; the others judge a property of the student's output alone,
# so their cases carry no reference value (a multiple-choice format check must not carry the answers).
USES_EXPECTED = {"close", "learned_table", "grad_rows", "shape", "pair_close", "long_bias", "choice_correct",
                 "lm_names", "tied_head"}


# --------------------------------------------------------------------------- probe helpers


def run_probe_exact(env: dict[str, Any], name: str, args: dict[str, Any]) -> dict[str, Any]:
    """`run_probe` with every floating-point tensor op computed in float64, for the values the release stores.

    The release rounds stored floats to a few significant digits. A float32 result's last bits differ between
    CPUs (vector widths, fused multiply-adds, polynomial sin, cos and exp), and about one stored value in a
    hundred would round the other way on another machine. Here each torch op first copies its float32 (or
    float16, bfloat16) tensor arguments to float64, so a float64 error of 1e-16 is all that is left. The inputs,
    the weights and every cast the code makes explicitly (`.float()`, `dtype=torch.float32`) are as in
    `run_probe`, and in-place ops still write into the tensors they name. The output has run_probe's keys and
    shapes; its float arrays are float64 and a dtype it reports may read float64: the builder takes those from
    run_probe's output (the engine's hook: autograder/authoring/content.py, `expected_values`).
    """
    with _float64_mode():
        return run_probe(env, name, args)


# Tensor methods named with these dunders compute a value: they take float64 copies like any other op. Every other
# dunder (__getitem__, __setitem__, __hash__, __get__ of an attribute such as .grad) and every in-place method
# (name ending in "_") gets the tensors themselves, so that views, identities and writes stay what they were.
_COMPUTING_DUNDERS = frozenset(f"__{op}__" for op in (
    "add", "radd", "sub", "rsub", "mul", "rmul", "truediv", "rtruediv", "floordiv", "rfloordiv", "mod", "rmod",
    "pow", "rpow", "matmul", "rmatmul", "neg", "abs", "array", "float", "lt", "le", "gt", "ge", "eq", "ne"))
# Random ops whose draw depends on the dtype of a tensor argument: they draw as run_probe does.
_DRAWS_LIKE = frozenset({"rand_like", "randn_like", "randint_like", "normal", "bernoulli", "multinomial",
                         "poisson", "dropout", "randperm"})
_KEEPS_TENSORS = frozenset({"backward", "retain_grad", "register_hook", "data_ptr", "untyped_storage", "storage",
                            "is_set_to", "requires_grad_"})


def _float64_mode() -> Any:
    """A torch function mode (entered with `with`) that runs each op on float64 copies of its float arguments."""
    torch = _torch()
    low = (torch.float32, torch.float16, torch.bfloat16)

    def up(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dtype in low:
            return value.to(torch.float64)
        if type(value) in (list, tuple):
            return type(value)(up(v) for v in value)
        if type(value) is dict:
            return {k: up(v) for k, v in value.items()}
        return value

    class Float64(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            kwargs = kwargs or {}
            name = getattr(func, "__name__", "")
            dunder = name.startswith("__")
            if (name not in _COMPUTING_DUNDERS if dunder else name.endswith("_")) \
                    or name in _DRAWS_LIKE or name in _KEEPS_TENSORS:
                return func(*args, **kwargs)
            return func(*up(args), **{k: v if k == "out" else up(v) for k, v in kwargs.items()})

    return Float64()


def _torch():
    import torch

    return torch


@hook
def before_probe() -> None:
    """Before every probe: modules with random init give the same values on every run."""
    _seed(0)


@hook
def local_check() -> contextlib.AbstractContextManager[None]:
    """Each local check runs on one torch thread (a check is small, and on a busy machine more threads only wait
    for each other), restoring the student's setting after."""
    return one_torch_thread()


def _seed(seed: int) -> None:
    """torch.manual_seed(seed) for the CPU generator, the one probes draw from. torch.manual_seed itself also queues
    the seed for each accelerator backend not yet started and formats a stack trace for each, every call: about a
    millisecond, and probes seed about ninety times per notebook."""
    _torch().default_generator.manual_seed(seed)


def _seeded(seed: int, *shape: int):
    torch = _torch()
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen, dtype=torch.float64)


class _Pristine(NamedTuple):
    """torch's own functions for reading a module's state, taken once, when torch is already imported as this
    module is (in the grader's sandbox that is before any student code runs), else at the first probe.

    The storage, parameter and structure probes read nn.Module's own tables (`_parameters`, `_buffers`,
    `_modules`, read from the instance's __dict__ with object.__getattribute__) and move a module with
    nn.Module._apply called unbound: a class that overrides named_buffers, state_dict, _apply or __getattr__, or
    a patch of nn.Module's methods, cannot change what they report. A tuple, so that its entries cannot be
    rebound (the grader's guard watches the module global and this class).
    """

    getattribute: Any
    type: Any
    issubclass: Any
    dict: Any
    set: Any
    Module: Any
    Parameter: Any
    Embedding: Any
    TensorBase: Any
    apply: Any
    to: Any
    numel: Any
    is_floating: Any
    is_complex: Any
    shape: Any
    dtype: Any
    requires_grad: Any
    grad: Any
    float64: Any

    @staticmethod
    def take() -> _Pristine:
        torch = _torch()
        base = torch._C.TensorBase
        return _Pristine(object.__getattribute__, type, issubclass, dict, set, torch.nn.Module, torch.nn.Parameter,
                         torch.nn.Embedding, base, torch.nn.Module.__dict__["_apply"], base.to, base.numel,
                         base.is_floating_point, base.is_complex,
                         *(base.__dict__[n].__get__ for n in ("shape", "dtype", "requires_grad", "grad")),
                         torch.float64)


_PRISTINE: _Pristine | None = _Pristine.take() if "torch" in sys.modules else None


def _pristine() -> _Pristine:
    """The functions _Pristine took as this module was imported, or (torch was not imported yet) taken now: the
    module global is never rebound, which the grader's guard would read as tampering."""
    return _PRISTINE if _PRISTINE is not None else _Pristine.take()


def _tables(m: Any) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any], set[str]]:
    """nn.Module's own tables of module m: its __dict__, parameters, buffers, submodules and non-persistent
    buffer names, as nn.Module keeps them (a TypeError when m is not an nn.Module or a table was replaced)."""
    P = _pristine()
    t = P.type(m)
    if not P.issubclass(t, P.Module):
        raise TypeError(f"expected an nn.Module, got {t.__name__}")
    own = P.getattribute(m, "__dict__")
    tables = [own.get(k) for k in ("_parameters", "_buffers", "_modules")]
    if not all(P.type(x) is P.dict for x in tables):
        raise TypeError(f"{t.__name__} replaced nn.Module's own tables (_parameters, _buffers, _modules)")
    skip = own.get("_non_persistent_buffers_set")
    return own, *tables, skip if P.type(skip) is P.set else P.set()


def _named_modules(m: Any) -> list[tuple[str, Any]]:
    """(name, module) for m and its submodules, each once, in the order of nn.Module.named_modules."""
    out, seen, todo = [], set(), [("", m)]
    while todo:
        prefix, mod = todo.pop()
        if id(mod) in seen:
            continue
        seen.add(id(mod))
        out.append((prefix, mod))
        kids = [(f"{prefix}.{k}" if prefix else k, v) for k, v in _tables(mod)[3].items() if v is not None]
        todo += kids[::-1]
    return out


def _module_state(m: Any) -> dict[str, dict[str, Any]]:
    """Parameters and buffers (each tensor once, as named_parameters and named_buffers list them) and the
    state_dict's entries (parameters and persistent buffers of every path to a module) of module m, read from
    nn.Module's own tables (see _Pristine)."""
    params: dict[str, Any] = {}
    buffers: dict[str, Any] = {}
    seen: set[int] = set()
    for prefix, mod in _named_modules(m):
        _, p_table, b_table, _, _ = _tables(mod)
        for table, out in ((p_table, params), (b_table, buffers)):
            for k, v in table.items():
                if v is not None and id(v) not in seen:
                    seen.add(id(v))
                    out[f"{prefix}.{k}" if prefix else k] = v
    state: dict[str, Any] = {}

    def walk(mod: Any, prefix: str, path: tuple[int, ...]) -> None:
        if id(mod) in path or len(path) > 100:
            raise TypeError("a module contains itself: it has no state_dict")
        _, p_table, b_table, kids, transient = _tables(mod)
        state.update((prefix + k, v) for k, v in p_table.items() if v is not None)
        state.update((prefix + k, v) for k, v in b_table.items() if v is not None and k not in transient)
        for k, kid in kids.items():
            if kid is not None:
                walk(kid, f"{prefix}{k}.", (*path, id(mod)))

    walk(m, "", ())
    return {"parameters": params, "buffers": buffers, "state_dict": state}


def _own_attribute(m: Any, name: str) -> Any:
    """m.name as nn.Module finds it for a plain class: an instance attribute, parameter, buffer or submodule
    (never a property or a __getattr__ of the student's); None when there is none."""
    own, p_table, b_table, kids, _ = _tables(m)
    for table in (own, p_table, b_table, kids):
        if name in table:
            return table[name]
    return None


# --------------------------------------------------------------------------- probes


@probe
def call(env: dict[str, Any], fn: str, args: list[Any], seed_inputs: dict[str, list[int]] | None = None,
         torch_args: bool = False) -> dict[str, Any]:
    """Call env[fn](*args) and return the result as an array with its dtype."""
    torch = _torch()
    call_args = [torch.tensor(a, dtype=torch.float64) if torch_args and isinstance(a, list) else a
                 for a in args]
    for pos, shape in (seed_inputs or {}).items():
        call_args.insert(int(pos), _seeded(1000 + int(pos), *shape))
    out = _get(env, fn)(*call_args)
    return {"value": as_array(out, fn), "dtype": _dtype_name(out)}


@probe
def call_pair(env: dict[str, Any], fn: str, args: list[Any]) -> dict[str, Any]:
    """Call env[fn](*args) for a function returning two tensors (rope_cache)."""
    out = _get(env, fn)(*args)
    if not isinstance(out, tuple | list) or len(out) != 2:
        raise TypeError(f"{fn} should return a pair (cos, sin), got {type(out).__name__}")
    return {"first": as_array(out[0], f"{fn}[0]"), "second": as_array(out[1], f"{fn}[1]")}


@probe
def raises(env: dict[str, Any], fn: str, args: list[Any]) -> dict[str, Any]:
    """Call env[fn](*args) and report which exception it raised, if any."""
    target = _get(env, fn)
    return _catch(lambda: target(*args))


@probe
def attention(env: dict[str, Any], fn: str, shape: list[int], seed: int, kwargs: dict[str, Any],
              zero_qk: bool = False, heads: int = 0) -> dict[str, Any]:
    """Call an attention function on seeded q, k, v of `shape` (or X and weights for self_attention)."""
    target = _get(env, fn)
    if fn == "self_attention":
        T, d_in, d_k = shape
        X, Wq, Wk, Wv = (_seeded(seed, T, d_in), _seeded(seed + 1, d_in, d_k),
                         _seeded(seed + 2, d_in, d_k), _seeded(seed + 3, d_in, d_k))
        out = target(X, Wq, Wk, Wv, **kwargs)
    else:
        q, k, v = (_seeded(seed + i, *shape) for i in range(3))
        if zero_qk:
            q, k = q * 0, k * 0
        out = target(q, k, v, **kwargs)
    value = as_array(out, fn)
    if fn == "self_attention":
        again = target(X, Wq, Wk, Wv, **kwargs)
    else:
        again = target(q, k, v, **kwargs)
    return {"value": value, "again": as_array(again, fn)}  # the same call twice: a genuine attempt agrees


@probe
def permutation_pair(env: dict[str, Any], T: int, d: int, seed: int, causal: bool) -> dict[str, Any]:
    """Outputs f(PX) and P f(X) for a fixed random permutation P of the rows of X."""
    torch = _torch()
    f = _get(env, "self_attention")
    X, Wq, Wk, Wv = (_seeded(seed, T, d), _seeded(seed + 1, d, d), _seeded(seed + 2, d, d),
                     _seeded(seed + 3, d, d))
    perm = torch.randperm(T, generator=torch.Generator().manual_seed(seed))
    out = as_array(f(X, Wq, Wk, Wv, causal=causal), "self_attention")
    out_perm = as_array(f(X[perm], Wq, Wk, Wv, causal=causal), "self_attention")
    return {"first": out_perm, "second": out[perm.numpy()], "perm": perm.numpy()}


@probe
def relative_identity(env: dict[str, Any], d: int, pos: int, k: int) -> dict[str, Any]:
    """PE[pos + k] directly, and as the rotation of PE[pos] by the angles k / w_i, for every pair i."""
    pe = as_array(_get(env, "sinusoidal_pe")(pos + k + 1, d), "sinusoidal_pe")
    w = 10000.0 ** (np.arange(0, d, 2) / d)
    s, c = pe[pos, 0::2], pe[pos, 1::2]
    rotated = np.empty(d)
    rotated[0::2] = s * np.cos(k / w) + c * np.sin(k / w)
    rotated[1::2] = c * np.cos(k / w) - s * np.sin(k / w)
    return {"first": pe[pos + k], "second": rotated}


@probe
def module_storage(env: dict[str, Any], cls: str, args: list[Any], x_shape: list[int] | None = None,
                   seed: int = 0) -> dict[str, Any]:
    """Where a module keeps its table `pe`: buffers, parameters, state_dict, and its dtype after .to(); with
    x_shape, what these facts must do to the output: `loaded`, forward after load_state_dict of a table the
    grader chose (`pe` replaced by `chosen_table`) and again after every trainable parameter is nudged by 1, and
    `loaded64`, the same after .to(torch.float64) with a table float32 cannot hold."""
    P = _pristine()
    m = _get(env, cls)(*args)
    state = _module_state(m)
    pe = _own_attribute(m, "pe")
    facts: dict[str, Any] = {
        "buffers": list(state["buffers"]),
        "parameters": list(state["parameters"]),
        "state_dict": list(state["state_dict"]),
        "pe_type": P.type(pe).__name__ if pe is not None else None,
        "pe_is_parameter": P.issubclass(P.type(pe), P.Parameter),
        "pe_dtype_after_to": None,
    }
    P.apply(m, lambda t: P.to(t, P.float64) if P.is_floating(t) or P.is_complex(t) else t)  # m.to(torch.float64)
    pe64 = _own_attribute(m, "pe")
    if P.issubclass(P.type(pe64), P.TensorBase):
        facts["pe_dtype_after_to"] = str(P.dtype(pe64)).replace("torch.", "")
    if x_shape:
        torch = _torch()
        (B, T), (d, max_len) = x_shape, args[:2]
        for key, to, fine in (("loaded", None, False), ("loaded64", torch.float64, True)):
            dtype = torch.float64 if fine else torch.float32
            table = torch.from_numpy(chosen_table(max_len, d, seed, fine)).to(dtype)
            x = torch.from_numpy(chosen_input(B, T, d, seed, fine)).to(dtype)
            facts[key] = _load_and_forward(_get(env, cls)(*args), "pe", table, x, to)
    return facts


def chosen_table(rows: int, cols: int, seed: int, fine: bool = False) -> np.ndarray:
    """Values the grader chooses and so knows: multiples of 1/64 in [-1/2, 1/2), exact in float32; `fine` adds
    multiples of 2**-40, which float32 cannot hold. A sum of two such arrays is exact in float64 (and, without
    `fine`, in float32), so the grader predicts x + table bit for bit."""
    i, j = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    table = ((7 * i + 13 * j + 5 * seed) % 64 - 32) / 64.0
    return table + ((3 * i + 11 * j + seed) % 97 + 1) * 2.0 ** -40 if fine else table


def chosen_input(B: int, T: int, d: int, seed: int, fine: bool = False) -> np.ndarray:
    """The input x of shape (B, T, d) the grader chooses to go with chosen_table(.., seed): multiples of 1/128, so
    no row of x (nor of 2x) is a row of the table."""
    return chosen_table(B * T, d, seed + 1, fine).reshape(B, T, d) / 2


def _load_and_forward(m: Any, key: str | None, table: Any, x: Any, dtype: Any) -> dict[str, Any]:
    """m.to(dtype) (unless None), m.load_state_dict(its state_dict with entry `key` replaced by `table`; key
    None: the one entry of table's shape), m(x); then every trainable parameter + 1 and m(x) again. What
    raised, else both outputs and the first one's dtype: the grader checks them against the output it predicts."""
    torch, P = _torch(), _pristine()
    try:
        if dtype is not None:
            m.to(dtype)
        state = dict(m.state_dict())
        if key is None:
            keys = [k for k, v in state.items() if list(getattr(v, "shape", ())) == list(table.shape)]
            if len(keys) != 1:
                raise LookupError(f"expected one state_dict entry of shape {list(table.shape)}, found {keys}")
            key = keys[0]
        state[key] = table
        m.load_state_dict(state)
        with torch.no_grad():
            out = m(x)
            first = as_array(out, "forward after load_state_dict")
            for p in _module_state(m)["parameters"].values():
                if P.requires_grad(p):
                    p.add_(1.0)
            second = as_array(m(x), "forward after a step on every trainable parameter")
    except Exception as exc:  # noqa: BLE001 - what raised is the evidence
        return {"raised": type(exc).__name__, "message": str(exc)[:300]}
    return {"raised": None, "value": first, "nudged": second, "dtype": _dtype_name(out)}


@probe
def module_forward(env: dict[str, Any], cls: str, args: list[Any], x_shape: list[int], seed: int,
                   zeros: bool = False, dtype: str = "float32",
                   arange_weights: bool = False) -> dict[str, Any]:
    """Forward a seeded (or zero) input through env[cls](*args) and return the output."""
    torch = _torch()
    m = _get(env, cls)(*args)
    x = _seeded(seed, *x_shape).to(getattr(torch, dtype))
    if zeros:
        x = torch.zeros_like(x)
    if arange_weights:
        emb = [mod for mod in m.modules() if isinstance(mod, torch.nn.Embedding)]
        if len(emb) != 1:
            raise TypeError(f"{cls} should hold exactly one nn.Embedding, found {len(emb)}")
        with torch.no_grad():
            w = emb[0].weight
            w.copy_(torch.arange(w.numel(), dtype=w.dtype).reshape(w.shape) / w.numel())
    with torch.no_grad():
        out = m(x)
    return {"value": as_array(out, f"{cls}.forward"), "dtype": _dtype_name(out)}


@probe
def module_raises(env: dict[str, Any], cls: str, args: list[Any], x_shape: list[int]) -> dict[str, Any]:
    """Forward an input longer than max_len and report the exception."""
    torch = _torch()
    m = _get(env, cls)(*args)
    return _catch(lambda: m(torch.zeros(*x_shape)))


@probe
def learned_facts(env: dict[str, Any], max_len: int, d_model: int, x_shape: list[int] | None = None,
                  seed: int = 0) -> dict[str, Any]:
    """Embedding tables inside LearnedPE and its count of trainable values; with x_shape, `loaded`: forward after
    load_state_dict of a (max_len, d_model) table the grader chose (`chosen_table`), then after a nudge of 1."""
    P = _pristine()
    m = _get(env, "LearnedPE")(max_len, d_model)
    weights = [_tables(mod)[1].get("weight") for _, mod in _named_modules(m) if P.issubclass(P.type(mod), P.Embedding)]
    tables = [list(P.shape(w)) if P.issubclass(P.type(w), P.TensorBase) else [] for w in weights]
    params = _module_state(m)["parameters"].values()
    facts = {"tables": tables, "trainable": int(sum(P.numel(p) for p in params if P.requires_grad(p)))}
    if x_shape:
        torch = _torch()
        (B, T), table = x_shape, torch.from_numpy(chosen_table(max_len, d_model, seed)).float()
        x = torch.from_numpy(chosen_input(B, T, d_model, seed)).float()
        facts["loaded"] = _load_and_forward(_get(env, "LearnedPE")(max_len, d_model), None, table, x, None)
    return facts


@probe
def learned_grad(env: dict[str, Any], max_len: int, d_model: int, T: int) -> dict[str, Any]:
    """Gradient norm of each row of the table after one backward pass at length T."""
    import zlib

    torch = _torch()
    m = _get(env, "LearnedPE")(max_len, d_model)
    with torch.no_grad():  # drawn in float64 by name: the same table on every CPU (a float32 normal_ is not)
        for name, p in sorted(m.named_parameters()):
            p.copy_(_seeded(zlib.crc32(name.encode()), *p.shape) * 0.02)
    x = _seeded(7, 2, T, d_model).float()
    m(x).pow(2).sum().backward()
    P = _pristine()
    grads = [g for p in _module_state(m)["parameters"].values() if (g := P.grad(p)) is not None and g.dim() == 2]
    if len(grads) != 1:
        raise TypeError(f"expected one 2-D trainable table with a gradient, found {len(grads)}")
    g = grads[0]
    transposed = g.shape[0] != max_len and g.shape[1] == max_len  # (d_model, max_len): positions are columns
    rows = g.T if transposed else g
    return {"value": as_array(rows.norm(dim=1), "gradient row norms"), "shape": list(g.shape),
            "transposed": bool(transposed)}


@probe
def rope_scores(env: dict[str, Any], T: int, d: int, seed: int, offset: int = 0,
                base: float | None = None) -> dict[str, Any]:
    """Scores q_rot[m] . k_rot[n] for seeded q, k (torch.manual_seed(seed); q = randn(T, d, dtype=float64)
    cast to float32; k = ...): a float32 draw of 16 values or more differs between CPUs in its last bits."""
    torch = _torch()
    cache, rope = _get(env, "rope_cache"), _get(env, "apply_rope")
    _seed(seed)
    q, k = (torch.randn(T, d, dtype=torch.float64).float() for _ in range(2))
    cos, sin = cache(T + offset, d) if base is None else cache(T + offset, d, base)
    cos, sin = cos[offset:offset + T], sin[offset:offset + T]
    qr, kr = rope(q, cos, sin), rope(k, cos, sin)
    return {"value": as_array(qr @ kr.T, "q_rot @ k_rot.T")}


@probe
def rope_shift(env: dict[str, Any], T: int, d: int, seed: int, offset: int) -> dict[str, Any]:
    """Scores at positions 0..T-1 and at offset..offset+T-1 for the same q and k."""
    first = rope_scores(env, T, d, seed)["value"]
    second = rope_scores(env, T, d, seed, offset=offset)["value"]
    return {"first": first, "second": second}


@probe
def rope_norms(env: dict[str, Any], T: int, d: int, seed: int) -> dict[str, Any]:
    """Row norms of x and of apply_rope(x)."""
    cos, sin = _get(env, "rope_cache")(T, d)
    x = _seeded(seed, T, d).float()
    y = as_array(_get(env, "apply_rope")(x, cos, sin), "apply_rope")
    return {"first": np.linalg.norm(y, axis=-1), "second": np.linalg.norm(x.numpy(), axis=-1)}


@probe
def rope_apply(env: dict[str, Any], shape: list[int], seed: int) -> dict[str, Any]:
    """apply_rope on a seeded x of `shape` (..., T, d) with rope_cache(T, d)."""
    cos, sin = _get(env, "rope_cache")(shape[-2], shape[-1])
    x = _seeded(seed, *shape).float()
    return {"value": as_array(_get(env, "apply_rope")(x, cos, sin), "apply_rope")}


@probe
def rope_qk(env: dict[str, Any], shape: list[int], seed: int) -> dict[str, Any]:
    """The student's RoPE (rope_cache and apply_rope) on the seeded q and k that `attention` feeds its function."""
    cos, sin = _get(env, "rope_cache")(shape[-2], shape[-1])
    rope = _get(env, "apply_rope")
    q, k = _seeded(seed, *shape), _seeded(seed + 1, *shape)
    return {"q": as_array(rope(q, cos, sin), "apply_rope"), "k": as_array(rope(k, cos, sin), "apply_rope")}


@probe
def toeplitz(env: dict[str, Any], num_heads: int, seq_len: int) -> dict[str, Any]:
    """alibi_bias shifted by one position along both axes, which must not change it."""
    b = as_array(_get(env, "alibi_bias")(num_heads, seq_len), "alibi_bias")
    if b.ndim != 3:
        raise TypeError(f"alibi_bias returned shape {b.shape}, expected (H, T, T)")
    return {"first": b[:, 1:, 1:], "second": b[:, :-1, :-1]}


@probe
def bias_corners(env: dict[str, Any], num_heads: int, seq_len: int) -> dict[str, Any]:
    """Shape and corner rows of a long alibi_bias (only a formula can make it)."""
    torch = _torch()
    raw = _get(env, "alibi_bias")(num_heads, seq_len)
    if type(raw) is torch.Tensor and raw.dim() == 3:  # copy the corners only, not the whole (H, T, T) bias
        parts = [as_array(p, "alibi_bias") for p in (raw[:, -1, :4], raw[:, :4, 0],
                                                     torch.diagonal(raw, dim1=1, dim2=2)[:, -3:])]
        return {"value": np.concatenate([p.ravel() for p in parts]), "shape": list(raw.shape)}
    b = as_array(raw, "alibi_bias")
    return {"value": np.concatenate([b[:, -1, :4].ravel(), b[:, :4, 0].ravel(), np.diagonal(b, axis1=1,
                                     axis2=2)[:, -3:].ravel()]), "shape": list(b.shape)}


@probe
def answers(env: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """The student's multiple-choice answers, as strings (anything else is described, not returned)."""
    out: dict[str, Any] = {}
    for name in names:
        value = env.get(name)
        out[name] = value.strip().upper() if isinstance(value, str) else f"<{type(value).__name__}>"
    return out


# --------------------------------------------------------------------------- milestone probes

LM_VOCAB = 28  # <unk>, space, a-z
LM_SMALL = {"num_hiddens": 32, "num_heads": 4, "num_blks": 2, "max_len": 256}  # cheap to run on a CPU


def _layout(t: Any) -> tuple:
    """Type, shape, strides, offset, dtype, device and requires_grad of a tensor."""
    return (type(t), tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, t.device, t.requires_grad)


class _Unverifiable(Exception):
    """A model holds something whose state cannot be snapshotted and compared, so it is never reused."""


class _State:
    """Everything a model's behaviour depends on besides its parameter values, as it is now.

    Per module (in the order of named_modules): the module, its class and its __dict__ object, and every entry of
    that __dict__ (the parameter, buffer and submodule tables included), kept by identity; every container reached
    from there (dicts, lists, tuples, sets of str or int) with its entries, by identity too (a set by value);
    buffers and other tensors, and numpy arrays, also by layout and a copy of their values (compared bit for bit);
    parameters by layout (the probes fill their values by name before each use). The model's classes (not
    torch's own) are kept by their attribute tables. Anything else (an object of the student's own, a bound
    method, a tensor subclass) raises _Unverifiable. `same` compares it all in flat loops: a value rebound to an
    equal object (a new float, False for 0) counts as a change, and the model is built afresh.
    """

    def __init__(self, model: Any) -> None:
        torch = _torch()
        self.modules = list(model.named_modules(remove_duplicate=False))
        self.params = {id(p): p for p in model.parameters()}
        known = {id(m) for _, m in self.modules}
        self.owners = tuple((m, type(m), vars(m)) for _, m in self.modules)
        plain = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device)
        # (container, its type, its keys or None, its values): every dict and sequence reached, each once
        self.containers: list[tuple[Any, type, tuple | None, tuple]] = []
        self.sets: list[tuple[Any, type, frozenset]] = []
        self.tensors: list[tuple[Any, tuple, Any]] = []  # (tensor, layout, kept values or None for a parameter)
        self.arrays: list[tuple[Any, Any]] = []
        seen: set[int] = set()
        todo = [vars(m) for _, m in self.modules]
        while todo:
            value = todo.pop()
            if id(value) in seen:
                continue
            seen.add(id(value))
            t = type(value)
            if t in (dict, collections.OrderedDict):
                keys, values = tuple(value), tuple(value.values())
                self.containers.append((value, t, keys, values))
                todo += [k for k in keys if type(k) not in plain]
            elif t in (list, tuple, torch.Size):
                values = tuple(value)
                self.containers.append((value, t, None, values))
            elif t in (set, frozenset) and all(type(v) in (str, int) for v in value):
                self.sets.append((value, t, frozenset(value)))
                continue
            elif t in (torch.Tensor, torch.nn.Parameter) and value.layout == torch.strided and (
                    id(value) in self.params or value.device.type == "cpu"):
                self.tensors.append((value, _layout(value), None if id(value) in self.params else _values(value)))
                continue
            elif t is np.ndarray and value.dtype.kind in "biufc":
                self.arrays.append((value, value.copy()))
                continue
            elif t in plain or t in (types.FunctionType, types.BuiltinFunctionType) or (
                    isinstance(value, torch.nn.Module) and id(value) in known):
                continue
            else:
                raise _Unverifiable(t.__name__)
            todo += [v for v in values if type(v) not in plain]
        classes = {c for _, m in self.modules for c in type(m).__mro__
                   if c is not object and not str(getattr(c, "__module__", "")).startswith("torch")}
        self.classes = [(vars(c), tuple(vars(c)), tuple(vars(c).values())) for c in classes]
        self.flat = tuple(v for _, _, _, values in self.containers for v in values)

    def same(self, model: Any) -> bool:
        """Whether model is still in the state this snapshot holds."""
        is_ = operator.is_
        modules = list(model.named_modules(remove_duplicate=False))
        if not (len(modules) == len(self.modules)
                and all(n == n0 and m is m0 for (n, m), (n0, m0) in zip(modules, self.modules, strict=True))
                and {id(p) for p in model.parameters()} == self.params.keys()
                and all(type(m) is cls and vars(m) is table for m, cls, table in self.owners)):
            return False
        for c, t, keys, values in self.containers:
            if type(c) is not t or len(c) != len(values) or (keys is not None and not all(map(is_, c, keys))):
                return False
        now = [v for c, _, keys, _ in self.containers for v in (c.values() if keys is not None else c)]
        return (all(map(is_, now, self.flat))
                and all(type(c) is t and c == kept for c, t, kept in self.sets)
                and all(_layout(v) == layout and (kept is None or _same_values(v, kept))
                        for v, layout, kept in self.tensors)
                and all(v.dtype == kept.dtype and np.array_equal(v, kept) for v, kept in self.arrays)
                and all(len(table) == len(keys) and all(map(is_, map(table.__getitem__, keys), values))
                        for table, keys, values in self.classes))


_BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}  # an unsigned integer of each element size


def _values(t: Any) -> Any:
    """A copy of a CPU tensor's values for _same_values: a numpy array where numpy has the dtype (numpy reuses
    freed memory, so this is much cheaper than a clone, which faults in fresh pages), else a clone."""
    try:
        return t.detach().numpy().copy()
    except (TypeError, RuntimeError):  # bfloat16 and other dtypes numpy lacks; conjugate or negative views
        return t.detach().clone()


def _same_values(t: Any, kept: Any) -> bool:
    """Whether tensor t holds the values `_values` kept, bit for bit (a NaN equals itself, -0.0 differs from 0.0)."""
    if type(kept) is not np.ndarray:
        return bool(_torch().equal(t.detach(), kept))
    try:
        now = t.detach().numpy()
    except (TypeError, RuntimeError):  # it could be read that way once: not the tensor it was
        return False
    bits = _BITS.get(now.dtype.itemsize)
    if bits is None or now.dtype.kind not in "biuf":
        return now.dtype == kept.dtype and bool(np.array_equal(now, kept))
    return now.dtype == kept.dtype and bool(np.array_equal(now.view(bits), kept.view(bits)))


class ModelCache:
    """TinyCharLM models built by the milestone probes, handed out again while provably as built.

    The milestone probes want `TinyCharLM(vocab_size=LM_VOCAB, pos=pos, **LM_SMALL)` as built right after
    torch.manual_seed(0), then (most of them) fill its parameters by name; one local check builds the five models
    17 times, one graded job 20 times, and an ALiBi model builds (4, 256, 256) tables. A model built once is
    handed out again only while the namespace is the same dict with every public name bound to the same object
    (a re-run cell starts afresh) and while, once model.train() has restored its training flags, everything but
    its parameter values is as it was right after the build (`_State`): a forward pass or a probe that changed a
    buffer, an attribute or a module, or a model holding anything that cannot be compared, means a fresh build.
    The global RNG is left as the build left it. The models live on this object, not in a module-level dict: the
    grader's guard reads a changed module table as tampering. (lm_device moves a twin of each to `meta`.)
    """

    def __init__(self) -> None:
        self.env: dict[str, Any] | None = None
        self.names: dict[str, Any] = {}
        self.models: dict[str, tuple[Any, _State, Any]] = {}  # pos -> (model, its state as built, RNG after)

    def build(self, env: dict[str, Any], pos: str) -> Any:
        """The student's model for pos as built right after torch.manual_seed(0), parameter values aside."""
        torch = _torch()
        cls = _get(env, "TinyCharLM")
        names = {k: v for k, v in env.items() if isinstance(k, str) and not k.startswith("_")}
        settled = (self.env is env and names.keys() == self.names.keys()
                   and all(names[k] is v for k, v in self.names.items()))
        if not settled:  # a namespace seen for the first time keeps nothing yet: the release builder's probes
            self.env, self.names, self.models = env, names, {}  # switch namespaces at every case
        _seed(0)
        kept = self.models.pop(pos, None)
        if kept is not None:
            model, state, rng = kept
            try:  # only what build itself kept: a model of this very class, with a snapshot of ours
                if (type(model) is cls and type(state) is _State and model.train() is model
                        and state.same(model)):
                    torch.set_rng_state(rng)
                    self.models[pos] = kept
                    return model
            except Exception:  # noqa: BLE001 - a model that cannot even be compared is built afresh
                pass
            _seed(0)
        model = cls(vocab_size=LM_VOCAB, pos=pos, **LM_SMALL)
        if settled:
            rng = torch.get_rng_state()
            try:
                self.models[pos] = (model, _State(model), rng)
            except Exception:  # noqa: BLE001 - _Unverifiable, or student code failing here: never reused
                pass
            finally:
                torch.set_rng_state(rng)
        return model


MODELS = ModelCache()


def _lm(env: dict[str, Any], pos: str, seed: int = 0) -> Any:
    """The student's TinyCharLM for pos, small, in eval mode, every trainable parameter filled from its name.

    Filling by name (not by creation order) gives every correct model the same weights. Embeddings get
    std 1 and projections std 1/sqrt(fan_in), so attention is far from uniform and positions matter. What the
    student made non-trainable (a frozen nn.Parameter holding a fixed table) keeps its values: that storage
    mistake is the state-dict case's to judge, not every logits case's.
    """
    import zlib

    torch = _torch()
    model = MODELS.build(env, pos)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if not p.requires_grad:
                continue
            key = (seed, name, tuple(p.shape))
            fill = FILLS.values.get(key)
            if fill is None:
                gen = torch.Generator().manual_seed(seed + zlib.crc32(name.encode()))
                std = 1.0 if p.dim() < 2 or "emb" in name else p.shape[-1] ** -0.5
                fill = FILLS.values[key] = torch.randn(p.shape, generator=gen, dtype=torch.float64) * std
            p.copy_(fill)
    return model.eval()


class _Fills:
    """The values `_lm` fills parameters with, per (seed, name, shape): drawn once per process (a draw depends on
    nothing else), then copied from here, about twenty models a notebook. An attribute of an object, never a
    module-level table (the grader's guard reads a changed module table as tampering)."""

    def __init__(self) -> None:
        self.values: dict[tuple, Any] = {}


FILLS = _Fills()


def _tokens(seed: int, T: int, batch: int = 2):
    torch = _torch()
    return torch.randint(1, LM_VOCAB, (batch, T), generator=torch.Generator().manual_seed(seed))


def _logits(model: Any, X: Any) -> np.ndarray:
    torch = _torch()
    with torch.no_grad():
        out = as_array(model(X), "TinyCharLM.forward")
    if out.ndim != 3 or out.shape[:2] != tuple(X.shape):
        raise TypeError(f"TinyCharLM returned shape {list(out.shape)} for input {list(X.shape)}; expected "
                        f"(batch, T, vocab_size) = {[*X.shape, LM_VOCAB]}")
    return out


@probe
def lm_logits(env: dict[str, Any], pos: str, T: int, seed: int) -> dict[str, Any]:
    """Logits of the filled small model on seeded tokens of shape (2, T), and ("context") those at the last
    position once the first token changes: a model whose attention reads earlier tokens gives other ones."""
    model, X = _lm(env, pos, seed), _tokens(seed, T)
    value = _logits(model, X)
    Y = X.clone()
    Y[:, 0] = X[:, 0] % (LM_VOCAB - 1) + 1
    return {"value": value, "context": _logits(model, Y)[:, -1]}


@probe
def lm_causal(env: dict[str, Any], pos: str, T: int, t: int, seed: int) -> dict[str, Any]:
    """Logits at positions 0..t-1 for two inputs that differ only from position t on."""
    model, X = _lm(env, pos, seed), _tokens(seed, T)
    Y = X.clone()
    Y[:, t:] = X[:, t:] % (LM_VOCAB - 1) + 1  # every later token changes
    return {"first": _logits(model, Y)[:, :t], "second": _logits(model, X)[:, :t]}


@probe
def lm_prefix(env: dict[str, Any], pos: str, T: int, prefix: int, seed: int,
              positions: list[int]) -> dict[str, Any]:
    """Logits at some positions below `prefix`, from a T-token input and from its first `prefix` tokens.

    One sequence, not a batch of two as elsewhere: the property is about positions, every case that waits here
    first needs the scheme's logits on a batch of two, and at T = 256 a second sequence doubles the cost."""
    model, X = _lm(env, pos, seed), _tokens(seed, T, batch=1)
    return {"first": _logits(model, X)[:, positions], "second": _logits(model, X[:, :prefix])[:, positions]}


@probe
def lm_tied_head(env: dict[str, Any], pos: str, T: int, seed: int) -> dict[str, Any]:
    """The logits before and after row 0 of token_emb (token 0 never occurs in the input) is set to a vector the
    grader chooses (`chosen_table`): a tied head moves token 0's logits, and only those, by what the grader
    predicts from the reference under the same change."""
    torch = _torch()
    model, X = _lm(env, pos, seed), _tokens(seed, T)
    before = _logits(model, X)
    d = LM_SMALL["num_hiddens"]
    with torch.no_grad():
        model.token_emb.weight[0] = torch.from_numpy(chosen_table(1, d, seed)[0] * 2)
    return {"before": before, "after": _logits(model, X)}


NUDGE = 0.125  # what lm_structure adds to every trainable parameter after the chosen load (exact in float32)


def _chosen_state(env: dict[str, Any], pos: str, T: int, seed: int) -> dict[str, Any]:
    """The model of scheme `pos` (MODELS) after load_state_dict (strict) of values the grader chooses for every
    floating entry of its state dict, drawn from the entry's name as `_lm` fills parameters (a persistent table or
    a layer of the student's own gets values that nothing predicts), its logits on seeded tokens (`value`), then
    the same after every trainable parameter is nudged by NUDGE (`nudged`: a fixed table kept as a parameter
    moves). What raised, else both: the grader compares them with the reference's under the same load and nudge.
    Every tensor of the state gets its values back after, so the model is as built again."""
    import zlib

    torch, P = _torch(), _pristine()
    model = MODELS.build(env, pos)
    held = _module_state(model)
    kept = [(t, t.detach().clone()) for t in {id(t): t for t in (*held["state_dict"].values(),
                                                                 *held["parameters"].values())}.values()
            if P.issubclass(P.type(t), P.TensorBase)]
    try:
        state = {}
        for name, v in held["state_dict"].items():
            if P.issubclass(P.type(v), P.TensorBase) and (P.is_floating(v) or P.is_complex(v)):
                gen = torch.Generator().manual_seed(seed + zlib.crc32(name.encode()))
                std = 1.0 if len(P.shape(v)) < 2 or "emb" in name else P.shape(v)[-1] ** -0.5
                v = torch.randn(tuple(P.shape(v)), generator=gen, dtype=torch.float64).mul(std).to(P.dtype(v))
            state[name] = v
        model.load_state_dict(state, strict=True)
        model.eval()
        X = _tokens(seed, T, batch=1)
        first = _logits(model, X)
        with torch.no_grad():
            for p in _module_state(model)["parameters"].values():
                if P.requires_grad(p):
                    p.add_(NUDGE)
        second = _logits(model, X)
    except Exception as exc:  # noqa: BLE001 - what raised is the evidence
        return {"raised": type(exc).__name__, "message": str(exc)[:300]}
    finally:  # the model as built again (its frozen tables too), so that MODELS may hand it out
        with torch.no_grad():
            for t, values in kept:
                t.copy_(values)
    return {"raised": None, "value": first, "nudged": second}


@probe
def lm_structure(env: dict[str, Any], schemes: list[str], T: int | None = None, seed: int = 0) -> dict[str, Any]:
    """Per scheme: state-dict entries and parameters with their shapes, and the names of the buffers; with T,
    `loaded`: what these facts must do to the logits (_chosen_state)."""
    out = {}
    for pos in schemes:
        state = _module_state(MODELS.build(env, pos))
        shape = _pristine().shape
        out[pos] = {"state_dict": {k: list(shape(v)) for k, v in state["state_dict"].items()},
                    "parameters": {k: list(shape(v)) for k, v in state["parameters"].items()},
                    "buffers": sorted(state["buffers"])}
        if T is not None:
            out[pos]["loaded"] = _chosen_state(env, pos, T, seed)
    return out


@probe
def lm_values_unrotated(env: dict[str, Any], T: int, seed: int) -> dict[str, Any]:
    """RoPE and none models with the same weights and q = k = 0: only a rotated v could tell them apart."""
    torch = _torch()
    models = [_lm(env, "rope", seed), _lm(env, "none", seed)]
    d = LM_SMALL["num_hiddens"]
    with torch.no_grad():
        for model in models:
            for blk in model.blks:
                blk["qkv"].weight[: 2 * d] = 0.0
    X = _tokens(seed, T)
    return {"first": _logits(models[0], X), "second": _logits(models[1], X)}


# Ops that may take tensors of two devices on a GPU too: they move data, or take CPU indices or values.
_MOVES = {"to", "copy_", "cuda", "cpu", "type", "new_tensor", "__getitem__", "__setitem__", "index_put_",
          "index_put", "as_tensor", "tensor"}


class DeviceMismatch(Exception):
    """Raised inside a traced forward pass at the first op that mixes devices; carries plain data."""

    def __init__(self, finding: dict[str, Any]) -> None:
        super().__init__(finding.get("op", ""))
        self.finding = finding


def _student_line() -> str:
    """Where the student's code made the call being traced: the innermost two frames of student code, read from the
    op outwards and stopping at the probe that called it (never the grader's or the build's own frames, whose line
    numbers would then end up in stored outputs)."""
    ours = ("lesson83_checks.py", "lesson83_milestone.py")
    mine: list[str] = []
    frame = sys._getframe()  # the frames themselves: a traceback.extract_stack would read every file's source
    while frame is not None:
        name = frame.f_code.co_filename.replace("\\", "/")
        if name.endswith(ours) or "/torch/" in name:
            if mine and name.endswith(ours):
                break  # back in the probe: what called it is not the student's
        else:
            mine.append(f"line {frame.f_lineno} in {frame.f_code.co_name}")
        frame = frame.f_back
    return ", called from ".join(mine[:2])


# Ops whose output on `meta` is a new tensor (never a view or an input) with a layout that follows from the
# metadata of their arguments alone; lm_device's traces run each distinct call of these once.
_FRESH_OPS = frozenset({
    "scaled_dot_product_attention", "linear", "embedding", "matmul", "bmm", "mm", "outer", "softmax", "log_softmax",
    "add", "sub", "mul", "div", "true_divide", "neg", "pow", "exp", "sin", "cos", "sqrt", "rsqrt", "where",
    "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__",
    "__matmul__", "__rmatmul__", "__neg__", "__pow__", "__rpow__", "cat", "stack", "masked_fill", "triu", "tril",
    "ones", "zeros", "full", "arange", "ones_like", "zeros_like", "full_like", "clone", "contiguous"})


def _meta_memo(func: Callable[..., Any], args: Any, kwargs: dict[str, Any], layouts: dict[tuple, tuple]) -> Any:
    """An op of _FRESH_OPS on `meta` tensors, from the memo `layouts` when the same call was seen.

    On `meta` nothing is computed, so such an op's output (shape, strides, dtype, whether it needs grad) is a
    function of the op, the inputs' layouts and the other arguments alone; torch still takes from tens of
    microseconds (add) to milliseconds (attention) to derive it, every call, and one model's two blocks repeat
    the same calls. The first call with given metadata runs torch's own kernel (and raises as it does); a later
    one returns an empty tensor of the layout that call produced. A call with an argument of any other kind (an
    object of the student's own, say) is always run. The memo is the caller's (lm_device: one per probe, or
    MEMO.layouts while a local check runs), never a module-level table: the grader's guard reads a changed module
    table as tampering."""
    torch = _torch()
    plain = (type(None), bool, int, float, str, torch.dtype, torch.device, torch.Size, torch.memory_format,
             torch.layout)

    def meta(value: Any) -> Any:
        t = type(value)
        if t in (torch.Tensor, torch.nn.Parameter):
            return ("T", t.__name__, tuple(value.shape), value.stride(), value.storage_offset(), str(value.dtype),
                    value.device.type, value.requires_grad, value.layout == torch.strided)
        if t in (list, tuple):
            return (t.__name__, *(meta(v) for v in value))
        if t in plain:
            return ("V", t.__name__, repr(value))
        raise TypeError(t.__name__)

    try:
        key = (func, meta(args), tuple(sorted((k, meta(v)) for k, v in kwargs.items())), torch.is_grad_enabled(),
               torch.is_inference_mode_enabled())
    except TypeError:
        return func(*args, **kwargs)
    layout = layouts.get(key)
    if layout is None:
        name = getattr(func, "__name__", "")
        out = (_attention_on_meta(func, args, kwargs) if name == _SDPA else
               _shaped_on_cpu(func, name, args, kwargs) if name in _CPU_SHAPED else None)
        if out is None:
            out = func(*args, **kwargs)
        given = [v for a in (*args, *kwargs.values()) for v in (a if type(a) in (list, tuple) else (a,))]
        if (type(out) is torch.Tensor and out.device.type == "meta" and out.layout == torch.strided
                and not out._is_view() and all(out is not v for v in given) and out.storage_offset() == 0
                and _fresh_meta(tuple(out.shape), out.stride(), out.dtype, out.requires_grad).stride() == out.stride()):
            layouts[key] = (tuple(out.shape), out.stride(), out.dtype, out.requires_grad)
        return out
    return _fresh_meta(*layout)


_ELEMENTWISE = frozenset({
    "add", "sub", "mul", "div", "true_divide", "pow", "where", "masked_fill", "neg", "exp", "sin", "cos", "sqrt",
    "rsqrt", "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__",
    "__pow__", "__neg__"})  # not __rpow__: number ** tensor on the CPU is contiguous, on `meta` it keeps the order
_CPU_SHAPED = _ELEMENTWISE | {"triu", "tril", "softmax", "log_softmax", "cat", "stack"}
_SMALL = 1 << 16  # elements: inputs and outputs up to this size are shaped on the CPU (256 KB of float32)


def _shaped_on_cpu(func: Callable[..., Any], name: str, args: Any, kwargs: dict[str, Any], *,
                   contiguous: bool = False) -> Any:
    """The output on `meta` of an op of _CPU_SHAPED whose tensors are all small and on `meta`, taken from the same
    call on CPU zeros of the same layouts, or None to run torch's own `meta` kernel. Those kernels are Python
    reference ops (a hundred microseconds to a millisecond a call); the CPU's take microseconds, and both derive
    the output's shape, dtype and strides by the same rules (tests/lesson83/test_meta_shortcuts.py compares them on
    thousands of calls; only the strides of dimensions of size 1, which address nothing, may differ). A call the
    CPU refuses runs torch's own kernel, so it fails as it does on `meta`. `contiguous`: the output's strides are
    those of a contiguous tensor, as `meta` gives them where the CPU's kernel may choose others (attention)."""
    torch = _torch()
    tensors: list[Any] = []

    def find(value: Any) -> None:
        t = type(value)
        if t in (torch.Tensor, torch.nn.Parameter):
            if value.device.type != "meta" or value.layout != torch.strided:
                raise TypeError(t.__name__)
            tensors.append(value)
        elif t in (list, tuple):
            for v in value:
                find(v)

    def on_cpu(value: Any) -> Any:
        t = type(value)
        if t in (torch.Tensor, torch.nn.Parameter):
            span = 1 + sum((n - 1) * s for n, s in zip(value.shape, value.stride(), strict=True)) \
                if value.numel() else 1
            return torch.zeros(span, dtype=value.dtype).as_strided(value.shape, value.stride())
        if t in (list, tuple):
            return t(on_cpu(v) for v in value)
        return value

    try:
        find((args, tuple(kwargs.values())))
        shapes = [tuple(t.shape) for t in tensors]
        if not tensors or sum(map(math.prod, shapes)) > _SMALL or (
                name in _ELEMENTWISE and math.prod(torch.broadcast_shapes(*shapes)) > _SMALL):
            return None
        cpu_args, cpu_kwargs = on_cpu(args), {k: on_cpu(v) for k, v in kwargs.items()}
        with torch.no_grad():
            out = func(*cpu_args, **cpu_kwargs)
    except Exception:  # noqa: BLE001 - torch's own kernel decides, and raises as it does on `meta`
        return None
    if type(out) is not torch.Tensor:
        return None
    grad = (torch.is_grad_enabled() and (out.dtype.is_floating_point or out.dtype.is_complex)
            and any(t.requires_grad for t in tensors))
    return _fresh_meta(tuple(out.shape), (out.contiguous() if contiguous else out).stride(), out.dtype, grad)


_SDPA = "scaled_dot_product_attention"
_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


def _attention_on_meta(func: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> Any:
    """scaled_dot_product_attention's output on `meta` from the same call on CPU zeros (`_shaped_on_cpu`, with no
    dropout, which would draw random numbers, and a contiguous output, as `meta` gives it), or None to run torch's
    own `meta` kernel: torch's math path in Python reference ops, one to four milliseconds a call. Where the two
    devices' checks differ (a mask with is_causal, which `meta` refuses; a mask of more dimensions than the query,
    which only `meta` broadcasts), or the scores would not be small, torch's own kernel runs."""
    if len(args) > len(_SDPA_ARGS) or any(k not in _SDPA_ARGS for k in kwargs):
        return None
    bound = dict(zip(_SDPA_ARGS, args)) | kwargs
    q, k, v, mask = (bound.get(name) for name in _SDPA_ARGS[:4])
    torch = _torch()
    tensors = (torch.Tensor, torch.nn.Parameter)
    if (not all(type(t) in tensors for t in (q, k, v)) or (mask is not None and type(mask) not in tensors)
            or any(type(bound.get(name)) not in (type(None), bool, int, float) for name in _SDPA_ARGS[4:])):
        return None
    if (mask is not None and (bound.get("is_causal") or mask.dim() > q.dim())) or q.dim() < 2 or k.dim() < 2 \
            or math.prod(q.shape[:-1]) * k.shape[-2] > _SMALL:
        return None
    return _shaped_on_cpu(func, _SDPA, (), bound | {"dropout_p": 0.0}, contiguous=True)


def _fresh_meta(shape: tuple, stride: tuple, dtype: Any, grad: bool) -> Any:
    """An empty `meta` tensor of this layout; with grad, a non-leaf (as an op's output is), so that an in-place
    op on it is allowed as it is on the output of the op it stands for."""
    out = _torch().empty_strided(shape, stride, dtype=dtype, device="meta")
    return out.requires_grad_().clone() if grad else out


def trace_devices(model: Any, X: Any, *, layouts: dict[tuple, tuple] | None = None,
                  disguise: str | None = None) -> dict[str, Any] | None:
    """Run model(X) once and report the first op that combines tensors of different devices, or None.

    X and the model's parameters and buffers live on one device (the probe uses `meta`, so nothing is
    computed). A TorchFunctionMode sees every torch call of the forward pass, so a table made on the CPU
    inside forward (or kept as a plain attribute) is caught even where an op would accept it (on torch 2.13 a
    matmul of a meta tensor with a CPU tensor succeeds). 0-dim CPU tensors count as Python numbers, as they
    do on a GPU. The report says which tensor, made where (module, line, op, shape), met which op. With
    `layouts`, calls of _FRESH_OPS on `meta` reuse the output layout of an identical earlier call (`_meta_memo`).

    With `disguise` (a device type such as "cuda"), the forward pass sees its tensors on `meta` as tensors on that
    device (`_Disguise`), so code that treats `meta` as a special case (`if q.device.type == "meta"`) is traced
    as it runs on a real accelerator; a finding then names that device.
    """
    torch = _torch()
    from torch.overrides import TorchFunctionMode

    device = X.device
    mask = _Disguise(device, disguise) if disguise and device.type == "meta" else None
    origins: dict[int, tuple[Any, str]] = {}  # id -> (tensor, where it was made), for tensors off the device
    for mod_name, mod in model.named_modules():
        for attr, value in vars(mod).items():
            if isinstance(value, torch.Tensor) and value.device != device:
                owner = f"{type(mod).__name__}{f' ({mod_name})' if mod_name else ''}"
                origins[id(value)] = (value, f"the plain attribute self.{attr} of {owner}, which "
                                             "is not a registered buffer and so did not move with the model")
    stack: list[str] = []  # the labels of the model's modules being called, innermost last
    labels = {id(mod): f"{type(mod).__name__}{f' ({mod_name})' if mod_name else ''}"
              for mod_name, mod in model.named_modules()}

    def enter(m: Any, _args: Any) -> None:
        if id(m) in labels:
            stack.append(labels[id(m)])

    def leave(m: Any, _args: Any, _out: Any) -> None:
        if id(m) in labels and stack:
            stack.pop()

    # two hooks for every module call of the pass (torch's global ones), not two registered on each module
    module_hooks = torch.nn.modules.module
    hooks = [module_hooks.register_module_forward_pre_hook(enter), module_hooks.register_module_forward_hook(leave)]

    Tensor, nested = torch.Tensor, (list, tuple, dict)

    def tensors(value: Any) -> list[Any]:
        """The tensors in value, in order, looking into lists, tuples and dicts."""
        if isinstance(value, Tensor):
            return [value]
        out: list[Any] = []
        if isinstance(value, nested):
            for v in value.values() if isinstance(value, dict) else value:
                if isinstance(v, Tensor):
                    out.append(v)
                elif isinstance(v, nested):
                    out += tensors(v)
        return out

    def describe(t: Any) -> str:
        known = origins.get(id(t))
        made = known[1] if known and known[0] is t else "a tensor the forward pass made there"
        return f"a {str(t.dtype).replace('torch.', '')} tensor of shape {list(t.shape)} on {t.device.type}: {made}"

    class Tracker(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            name = getattr(func, "__name__", str(func))
            if mask is not None:
                shown = mask.shown(func, name, args)
                if shown is not _Disguise.REAL:
                    return shown
                func, name, args, kwargs = mask.unmask(func, name, args, kwargs)
            if name == "__get__" and len(args) == 1 and not kwargs:  # a property of one tensor (x.shape, x.T):
                return func(*args)  # one tensor cannot mix devices, and what a property returns is not recorded
            inputs = tensors(args) + tensors(kwargs) if kwargs else tensors(args)
            devices = [t.device for t in inputs]
            off = [t for t, d in zip(inputs, devices, strict=True)
                   if d != device and not (d.type == "cpu" and t.dim() == 0)]
            if off and device in devices and name not in _MOVES:
                raise DeviceMismatch({"op": name, "module": stack[-1] if stack else "",
                                      "line": _student_line(), "device": disguise if mask else device.type,
                                      "tensor": describe(off[0]), "shape": list(off[0].shape)})
            if (layouts is not None and name in _FRESH_OPS and device.type == "meta" and "out" not in kwargs
                    and all(d == device for d in devices)):
                out = _meta_memo(func, args, kwargs, layouts)
            else:
                out = func(*args, **kwargs)
            if type(out) is Tensor:
                made = [out] if out.device != device else []
            else:
                made = [t for t in tensors(out) if t.device != device]
            if made and name not in ("__get__",):
                parent = next((origins[id(t)][1] for t in off if id(t) in origins and origins[id(t)][0] is t),
                              None)
                where = parent or (f"made by torch.{name} at {_student_line() or 'an unknown line'}"
                                   f"{' in ' + stack[-1] if stack else ''}")
                for t in made:
                    origins.setdefault(id(t), (t, where))
            return out

    try:
        with Tracker():
            out = model(X)
        bad = [t for t in tensors(out) if t.device != device]
        if bad:
            return {"op": "the returned logits", "module": type(model).__name__, "line": "",
                    "device": disguise if mask else device.type, "tensor": describe(bad[0]),
                    "shape": list(bad[0].shape)}
    except DeviceMismatch as exc:
        return exc.finding
    finally:
        for h in hooks:
            h.remove()
    return None


class _Disguise:
    """How a traced forward pass on `meta` is shown tensors on another device type (`trace_devices`): the device
    properties of a `meta` tensor read as that device (cuda:0: is_cuda True, is_meta False, get_device 0), and
    that device, passed to any torch call (device=..., .to(...), .cuda()), means `meta` again. The real devices
    are untouched, so a table left on the CPU still meets the `meta` tensors and is caught."""

    REAL = object()  # shown(): nothing to show instead, run the call as it is

    def __init__(self, real: Any, shown_type: str) -> None:
        torch = _torch()
        self.real, self.shown_device, self.shown_type = real, torch.device(shown_type, 0), shown_type
        self.props = {"device": self.shown_device, "is_meta": False, "is_cuda": shown_type == "cuda",
                      "is_cpu": False}
        self.tensors, self.device_types, self.to = (torch.Tensor, torch.nn.Parameter), (torch.device, str), \
            torch.Tensor.to

    def shown(self, func: Any, name: str, args: Any) -> Any:
        """What a device query on one of the traced tensors returns, or REAL for any other call."""
        if not args or type(args[0]) not in self.tensors or args[0].device != self.real:
            return self.REAL
        if name == "__get__" and len(args) == 1:
            return self.props.get(getattr(getattr(func, "__self__", None), "__name__", ""), self.REAL)
        if name == "get_device" and len(args) == 1:
            return 0
        return self.REAL

    def _real(self, value: Any) -> Any:
        if type(value) is self.device_types[0] and value.type == self.shown_type:
            return self.real
        if type(value) is str and value.split(":")[0] == self.shown_type:
            return self.real
        return value

    def unmask(self, func: Any, name: str, args: Any, kwargs: dict[str, Any]) -> tuple[Any, str, Any, dict]:
        """The call with the shown device replaced by the real one (.cuda() becomes .to(meta)); most calls name
        no device at all and are returned as they are."""
        if name in ("cuda", self.shown_type) and args and isinstance(args[0], self.tensors[0]):
            return self.to, "to", (args[0], self.real), {}
        kinds = self.device_types
        if not any(type(a) in kinds for a in args) and not any(type(v) in kinds for v in kwargs.values()):
            return func, name, tuple(args), dict(kwargs)
        return func, name, tuple(self._real(a) for a in args), {k: self._real(v) for k, v in kwargs.items()}


def device_message(pos: str, finding: dict[str, Any]) -> str:
    """What a device finding means for TinyCharLM(pos=pos) and how to fix it (shared with the trainer)."""
    where = ", ".join(w for w in (finding.get("line"), finding.get("module") and f"module {finding['module']}")
                      if w)
    return (f"pos={pos!r}: TinyCharLM runs on the CPU only. With the model and its input on the "
            f"{finding['device']} device, {finding['op']}{f' ({where})' if where else ''} received "
            f"{finding['tensor']}. On a GPU this stops the first training step. Fix: register fixed tables "
            "in __init__ with self.register_buffer(name, table, persistent=False) so that they move with "
            "the model, and create anything you build inside forward on the input's device "
            "(device=q.device, or table.to(q.device)).")


def _meta_model(env: dict[str, Any], pos: str) -> Any:
    """TinyCharLM(vocab_size=LM_VOCAB, pos=pos, **LM_SMALL).to("meta"), leaving the model cache as it was.

    A model MODELS holds (provably as built) is not moved itself but its twin (`_twin`); any other model is
    built for this probe alone and moved itself."""
    model = MODELS.build(env, pos)
    kept = MODELS.models.get(pos)
    if kept is None or kept[0] is not model or any(getattr(c, "__slots__", ()) for c in type(model).__mro__):
        return model.to("meta")
    return _twin(model).to("meta")


def _twin(model: Any) -> Any:
    """A copy of a model that `_State` verified, for `.to("meta")` to move as it would move the model: new module
    objects and containers throughout, every registered parameter a new Parameter over the same values, every
    other tensor (registered buffers included: `.to` replaces them in the twin's own tables) the same object.
    Aliases keep their meaning: a parameter, buffer or module referred to from anywhere else in the model is the
    twin's one there too. Nothing is computed or copied in bulk (building an ALiBi model computes (4, 256, 256)
    tables; copying every tensor of it would cost as much)."""
    torch = _torch()
    modules = list(_modules_of(model))  # the modules `.to` walks: the _modules tables, recursively
    aliases: dict[int, Any] = {id(m): object.__new__(type(m)) for m in modules}
    for module in modules:
        for p in module._parameters.values():
            if p is not None and id(p) not in aliases:
                aliases[id(p)] = torch.nn.Parameter(p.detach(), requires_grad=p.requires_grad)

    def copy(value: Any) -> Any:
        t = type(value)
        if id(value) in aliases:
            return aliases[id(value)]
        if t in (dict, collections.OrderedDict):
            return t((k, copy(v)) for k, v in value.items())
        if t in (list, tuple):
            return t(map(copy, value))
        if t in (set, frozenset):
            return t(value)
        return value  # immutable values, functions, tensors, numpy arrays: shared

    for module in modules:
        aliases[id(module)].__dict__.update({k: copy(v) for k, v in vars(module).items()})
    return aliases[id(model)]


def _modules_of(model: Any) -> Any:
    """The modules reachable through the _modules tables (each once)."""
    seen, todo = set(), [model]
    while todo:
        module = todo.pop()
        if id(module) not in seen:
            seen.add(id(module))
            yield module
            todo += [m for m in module._modules.values() if m is not None]


class _Layouts:
    """The memo of `meta` output layouts (`_meta_memo`) that the probes share in one process: an entry is a fact
    about torch (an op's output layout for given argument layouts), the same whichever probe or notebook made it,
    so the device traces of lm_device and fn_device, public and hidden cases alike, reuse each other's. An
    attribute of an object, never a module-level table (the grader's guard reads a changed module table as
    tampering)."""

    def __init__(self) -> None:
        self.table: dict[tuple, tuple] = {}


LAYOUTS = _Layouts()


def trace_devices_as_gpu(model: Any, X: Any, *, layouts: dict[tuple, tuple]) -> dict[str, Any] | None:
    """trace_devices on `meta` shown as cuda (`_Disguise`), as the forward pass runs on a GPU: its finding, or None.

    Code that treats `meta` as a special case (moves its tables only there) is traced as it runs on a GPU, and
    a table left on the CPU still meets the `meta` tensors. Only when that pass fails for another reason (a
    cuda-only API such as torch.cuda.current_device()) is the forward pass traced again on `meta` as it is."""
    try:
        return trace_devices(model, X, layouts=layouts, disguise="cuda")
    except Exception:  # noqa: BLE001 - not a device mismatch: trace it as plain meta, whose errors are the caller's
        return trace_devices(model, X, layouts=layouts)


@probe
def fn_device(env: dict[str, Any], fn: str, shape: list[int], args: list[Any] | None = None) -> dict[str, Any]:
    """The first op of fn(q, k, v) that mixes devices, with q, k, v on `meta` shown as cuda, or None. With `args`,
    fn is a module class: fn(*args) moved to `meta`, called on x of `shape`."""
    torch = _torch()
    target = _get(env, fn)

    class Call(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            return target(x, x * 1.0, x * 1.0)

    x = torch.zeros(*shape, device="meta")
    try:
        if args is not None:
            _seed(0)
        model = Call() if args is None else target(*args).to("meta")
        return {"finding": trace_devices_as_gpu(model, x, layouts=LAYOUTS.table), "note": ""}
    except Exception as exc:  # noqa: BLE001 - e.g. .item() has no value on meta: nothing to conclude
        text = str(exc).splitlines()[0][:200] if str(exc) else ""
        if "device" in text and ("cpu" in text or "meta" in text):
            return {"finding": {"op": "an operation", "module": "", "line": error_record(exc)["where"],
                                "device": "meta", "tensor": f"a tensor on another device ({text})", "shape": []},
                    "note": ""}
        return {"finding": None, "note": f"{type(exc).__name__}: {text}"}


@probe
def lm_device(env: dict[str, Any], schemes: list[str], T: int) -> dict[str, Any]:
    """Per scheme, the first op of a forward pass on the `meta` device that mixes devices (None: clean)."""
    torch = _torch()
    out: dict[str, Any] = {}
    layouts = MEMO.layouts if MEMO.active else LAYOUTS.table  # one memo for every trace (never a module-level table)
    for pos in schemes:
        model = _meta_model(env, pos)
        X = torch.zeros((2, T), dtype=torch.long, device="meta")
        try:
            out[pos] = {"finding": trace_devices_as_gpu(model, X, layouts=layouts), "note": ""}
        except Exception as exc:  # noqa: BLE001 - e.g. .item() has no value on meta: nothing to conclude
            text = str(exc).splitlines()[0][:200] if str(exc) else ""
            if "device" in text and ("cpu" in text or "meta" in text):
                out[pos] = {"finding": {"op": "an operation", "module": "", "line": error_record(exc)["where"],
                                        "device": "meta", "tensor": f"a tensor on another device ({text})",
                                        "shape": []}, "note": ""}
            else:
                out[pos] = {"finding": None, "note": f"{type(exc).__name__}: {text}"}
    return out


# --------------------------------------------------------------------------- checks


@check
def close(case: dict[str, Any], got: dict[str, Any], expected: dict[str, Any]) -> Verdict:
    """Student value equals the reference value within the case tolerance (and dtype, when asked)."""
    atol, rtol = case["atol"], case["rtol"]
    what = case.get("what", "the result")
    if (msg := _error_message(got)) is not None:
        return _fail(case, f"calling {what} failed: {msg}")
    want, value = np.asarray(expected["value"]["value"]), np.asarray(got["value"])
    if value.shape != want.shape:
        return _fail(case, f"{what} has shape {list(value.shape)}, expected {list(want.shape)}",
                     _match(got, expected, atol, rtol, "value"))
    if case.get("dtype") and got.get("dtype") != case["dtype"]:
        return _fail(case, f"{what} has dtype {got.get('dtype')}, expected {case['dtype']}")
    if np.isnan(value).any():
        return _fail(case, f"{what} contains NaN; expected {_fmt(want)}")
    if _close(value, want, atol, rtol):
        return Verdict(True)
    row = _teaching_row(~np.isclose(value, want, atol=atol, rtol=rtol))
    label = f" row {list(row)}" if row else ""
    text = (f"{what} does not match {case.get('against', 'the reference')}.\n  expected{label}: {_row(want, row)}\n"
            f"  received{label}: {_row(value, row)}\n  {_where(value, want, atol, rtol)}")
    return _fail(case, text, _match(got, expected, atol, rtol, "value"))


@check
def pair_equal(case: dict[str, Any], got: dict[str, Any], expected: dict[str, Any]) -> Verdict:
    """The two arrays of a property probe agree (for example f(PX) and P f(X))."""
    atol, rtol = case["atol"], case["rtol"]
    if (msg := _error_message(got)) is not None:
        return _fail(case, msg)
    a, b = np.asarray(got["first"]), np.asarray(got["second"])
    if a.shape != b.shape:
        return _fail(case, f"{case['first']} has shape {list(a.shape)} but {case['second']} has shape "
                     f"{list(b.shape)}")
    if a.size > 1 and float(np.ptp(a)) <= _TOL and float(np.ptp(b)) <= _TOL:  # zeros equal zeros: no evidence
        return _fail(case, f"{case['first']} and {case['second']} are both constant ({_fmt(a)}): the property "
                     "must hold of values that vary.")
    if _close(a, b, atol, rtol) and not np.isnan(a).any():
        return Verdict(True)
    text = (f"{case['first']} should equal {case['second']}.\n  {case['first']}: {_fmt(a)}\n"
            f"  {case['second']}: {_fmt(b)}")
    if not np.isnan(a).any() and not np.isnan(b).any():
        text += f"\n  {_where(a, b, atol, rtol)}"
    return _fail(case, text, _match(got, expected, atol, rtol, "first") or case.get("known_cause"))


@check
def pair_differ(case: dict[str, Any], got: dict[str, Any], expected: dict[str, Any]) -> Verdict:
    """The two arrays of a property probe must differ (for example when a causal mask breaks symmetry)."""
    if (msg := _error_message(got)) is not None:
        return _fail(case, msg)
    a, b = np.asarray(got["first"]), np.asarray(got["second"])
    if a.shape == b.shape and not _close(a, b, case["atol"], case["rtol"]):
        return Verdict(True)
    return _fail(case, f"{case['first']} and {case['second']} came out identical: {_fmt(a)}.\n  "
                 f"{case['why']}", case.get("known_cause"))


@check
def raises_value_error(case: dict[str, Any], got: dict[str, Any], expected: dict[str, Any]) -> Verdict:
    """The call raised ValueError and its message contains every required word."""
    if (msg := _error_message(got)) is not None:
        return _fail(case, msg)
    what = case.get("what", "the call")
    if got["raised"] is None:
        return _fail(case, f"{what} returned normally; it should raise ValueError.")
    if got["raised"] != "ValueError":
        return _fail(case, f"{what} raised {got['raised']} ({got['message']}); it should raise ValueError "
                     "with a message a student can act on.", case.get("known_cause"))
    missing = [w for w in case.get("words", []) if w.lower() not in got["message"].lower()]
    if missing:
        return _fail(case, f"the ValueError message {got['message']!r} should mention "
                     + ", ".join(repr(w) for w in missing) + ".")
    return Verdict(True)


@check
def buffer_not_parameter(case: dict[str, Any], got: dict[str, Any], expected: dict[str, Any]) -> Verdict:
    """`pe` is a registered buffer: in named_buffers() and state_dict(), not in parameters()."""
    if (msg := _error_message(got)) is not None:
        return _fail(case, msg)
    if got["pe_is_parameter"] or "pe" in got["parameters"]:
        return Verdict(False, _fail(case, "the table `pe` is stored as nn.Parameter, so the optimiser would train "
                                    "a closed-form table. Store it with self.register_buffer('pe', table).").message,
                       "pe_as_parameter")
    if "pe" not in got["buffers"]:
        kind = "a plain attribute" if got["pe_type"] else "missing"
        return Verdict(False, _fail(case, f"the table `pe` is {kind}, not a buffer: it is lost by state_dict() "
                                    "and left behind by .to(). Store it with self.register_buffer('pe', table).")
                       .message, "pe_plain_attribute" if got["pe_type"] else None)
    if "pe" not in got["state_dict"]:
        return _fail(case, "`pe` is a buffer but not in state_dict(); register it with persistent=True.")
    return _consequence(case, got, "loaded", shift=0.0)


@check
def follows_to(case: dict[str, Any], got: dict[str, Any], expected: dict[str, Any]) -> Verdict:
    """After module.to(torch.float64) the table `pe` is float64 too."""
    if (msg := _error_message(got)) is not None:
        return _fail(case, msg)
    if got["pe_dtype_after_to"] == "float64":
        return _consequence(case, got, "loaded64", shift=None)
    cause = case.get("known_cause") if got["pe_type"] is not None else None  # a table exists but stayed behind
    return _fail(case, f"after .to(torch.float64) the table `pe` is {got['pe_dtype_after_to']}, expected "
                 "float64: only registered buffers and parameters move with the module.", cause)


@check
def learned_table(case: dict[str, Any], got: dict[str, Any], expected: dict[str, Any]) -> Verdict:
    """One nn.Embedding of shape (max_len, d_model) and max_len * d_model trainable values."""
    if (msg := _error_message(got)) is not None:
        return _fail(case, msg)
    want = expected["value"]
    if len(got["tables"]) != 1:
        return _fail(case, f"expected exactly one nn.Embedding, found {len(got['tables'])}.")
    if got["tables"][0] != want["tables"][0]:
        transposed = got["tables"][0][::-1] == want["tables"][0]
        verdict = _fail(case, f"the table has shape {got['tables'][0]}, expected {want['tables'][0]}"
                        f"{' (transposed?)' if transposed else ''}: one row per position, "
                        "nn.Embedding(max_len, d_model).")
        return Verdict(False, verdict.message, "learned_transposed" if transposed else None)
    if got["trainable"] != want["trainable"]:
        return _fail(case, f"{got['trainable']} trainable values, expected {want['trainable']} "
                     "(max_len x d_model).")
    return _consequence(case, got, "loaded", shift=1.0)


def _consequence(case: dict[str, Any], got: dict[str, Any], key: str, shift: float | None) -> Verdict:
    """What the reported facts must do to the output, checked against what the grader predicts from the case's
    arguments alone (`chosen_table`, `chosen_input`): after load_state_dict of the chosen table, every row of
    forward(x) - x is exactly a row of that table (which rows is the value cases' business), float64 for
    `loaded64`; after every trainable parameter is nudged by 1 the output moves by exactly `shift` (0 for a
    buffer, 1 for one trainable table; None: not asked). A fact the child reports earns nothing without it."""
    a = case["args"]
    rows, d = (a["args"][1], a["args"][0]) if "cls" in a else (a["max_len"], a["d_model"])
    (B, T), fine = a["x_shape"], key == "loaded64"
    x, table = chosen_input(B, T, d, a["seed"], fine), chosen_table(rows, d, a["seed"], fine)
    run = got.get(key) or {"raised": "KeyError", "message": f"the probe returned no {key!r}"}
    what = (f"after {'.to(torch.float64) and ' if fine else ''}load_state_dict() with a table the grader chose,"
            " forward(x)")
    if run["raised"]:
        return _fail(case, f"{what} raised {run['raised']}: {run['message'].rstrip('. ')}. The table must be "
                     "the module's own state: saved and loaded by state_dict() and moved by .to().")
    out = np.asarray(run["value"], dtype=np.float64)
    if out.shape != x.shape:
        return _fail(case, f"{what} has shape {list(out.shape)}, expected {list(x.shape)}.")
    added = (out - x).reshape(-1, 1, d)
    if not np.isclose(added, table[None], atol=1e-12, rtol=0.0).all(-1).any(-1).all():
        return _fail(case, f"{what} - x is {_fmt(added)}, not rows of the loaded table ({_fmt(table)}): the "
                     "output must come from the table the module keeps in its state.")
    if shift is not None and not _close(run["nudged"], out + shift, 1e-12, 0.0):
        rule = "moves by exactly 1: its one table is trainable" if shift else "stays: no optimiser step changes it"
        return _fail(case, f"{what} after a step of 1 on every trainable parameter is {_fmt(run['nudged'])}, "
                     f"before it {_fmt(out)}; the output {rule}.")
    if fine and run["dtype"] != "float64":
        return _fail(case, f"{what} has dtype {run['dtype']}, expected float64.")
    return Verdict(True)


@check
def grad_rows(case: dict[str, Any], got: dict[str, Any], expected: dict[str, Any]) -> Verdict:
    """Rows below T get a gradient, rows at or above T get none."""
    if (msg := _error_message(got)) is not None:
        return _fail(case, msg)
    got_rows, want_rows = np.asarray(got["value"]) > 0, np.asarray(expected["value"]["value"]) > 0
    if got_rows.shape == want_rows.shape and (got_rows == want_rows).all():
        return Verdict(True)
    max_len, shape = case["args"]["max_len"], got.get("shape")
    if shape and max_len not in shape[:2]:  # neither its rows nor its columns are the positions
        return _fail(case, f"the trainable table has shape {shape}, so it has {shape[0]} rows, not one per "
                     f"position: expected max_len = {max_len} rows, nn.Embedding(max_len, d_model).")
    kind = "positions (columns of your transposed table)" if got.get("transposed") else "rows"
    return _fail(case, f"{kind} with a non-zero gradient: {np.flatnonzero(got_rows).tolist()}, expected rows "
                 f"{np.flatnonzero(want_rows).tolist()}: a sequence of length T reads rows 0..T-1 only.")


@check
def shape(case: dict[str, Any], got: dict[str, Any], expected: dict[str, Any]) -> Verdict:
    """Shapes of returned arrays match the reference."""
    if (msg := _error_message(got)) is not None:
        return _fail(case, msg)
    want = expected["value"]
    for key in ("first", "second"):
        if list(np.shape(got[key])) != list(np.shape(want[key])):
            return _fail(case, f"{case['what']} returned shape {list(np.shape(got[key]))}, expected "
                         f"{list(np.shape(want[key]))}.")
    return Verdict(True)


@check
def pair_close(case: dict[str, Any], got: dict[str, Any], expected: dict[str, Any]) -> Verdict:
    """Both arrays of a pair probe equal the reference pair."""
    atol, rtol = case["atol"], case["rtol"]
    if (msg := _error_message(got)) is not None:
        return _fail(case, msg)
    for key, label in (("first", case["first"]), ("second", case["second"])):
        a, b = np.asarray(got[key]), np.asarray(expected["value"][key])
        if not _close(a, b, atol, rtol):
            detail = _where(a, b, atol, rtol) if a.shape == b.shape else f"shape {list(a.shape)}"
            return _fail(case, f"{label} does not match: expected {_fmt(b)}, received {_fmt(a)}; {detail}",
                         _match(got, expected, atol, rtol, key))
    return Verdict(True)


@check
def long_bias(case: dict[str, Any], got: dict[str, Any], expected: dict[str, Any]) -> Verdict:
    """A long alibi_bias has the right shape and values (no fixed-length table)."""
    verdict = close(case, got, expected)
    if verdict.passed and got.get("shape") != expected["value"]["shape"]:
        return _fail(case, f"shape {got.get('shape')}, expected {expected['value']['shape']}")
    return verdict


@check
def choices_valid(case: dict[str, Any], got: dict[str, Any], expected: dict[str, Any]) -> Verdict:
    """Every answer variable holds one of the letters A-D."""
    if (msg := _error_message(got)) is not None:
        return _fail(case, msg)
    bad = {k: v for k, v in got.items() if v not in LETTERS}
    if not bad:
        return Verdict(True)
    listing = ", ".join(f"{k} = {v!r}" for k, v in bad.items())
    return _fail(case, f"set each answer to one of 'A', 'B', 'C', 'D' as a string; found {listing}.")


@check
def choice_correct(case: dict[str, Any], got: dict[str, Any], expected: dict[str, Any]) -> Verdict:
    """The answer variable holds the right letter."""
    if (msg := _error_message(got)) is not None:
        return _fail(case, msg)
    name = case["args"]["names"][0]
    if got.get(name) == expected["value"][name]:
        return Verdict(True)
    return _fail(case, f"{name} = {got.get(name)!r} is not the right answer.")


@check
def tied_head(case: dict[str, Any], got: dict[str, Any], expected: dict[str, Any]) -> Verdict:
    """Setting embedding row 0 moves every logit of token 0 and no other logit, and the logits after it are the
    reference's under the same change."""
    if (msg := _error_message(got)) is not None:
        return _fail(case, msg)
    before, after = np.asarray(got["before"], dtype=np.float64), np.asarray(got["after"], dtype=np.float64)
    want = np.asarray(expected["value"]["after"])
    if before.shape != after.shape or after.shape != want.shape:
        return _fail(case, f"the logits have shape {list(after.shape)}, expected {list(want.shape)}.")
    own = float(np.abs(after[..., 0] - before[..., 0]).min())
    other = float(np.abs(after[..., 1:] - before[..., 1:]).max())
    if not (own > 1e-3 and other < 1e-4):
        return _fail(case, "after a new token_emb.weight[0] the logits of token 0 moved by at least "
                     f"{own:.4g} and the other logits by up to {other:.4g}; a head tied to the embedding moves "
                     "only token 0's logits. Compute the logits as F.linear(H, self.token_emb.weight), with no "
                     "separate output layer.", case.get("known_cause"))
    if not _close(after, want, case["atol"], case["rtol"]):
        return _fail(case, "after a new token_emb.weight[0] the logits are not the reference's under the same "
                     f"change.\n  {_where(after, want, case['atol'], case['rtol'])}\n  The head must read the "
                     "embedding matrix itself: F.linear(H, self.token_emb.weight).")
    return Verdict(True)


@check
def lm_names(case: dict[str, Any], got: dict[str, Any], expected: dict[str, Any]) -> Verdict:
    """Per scheme, the state dict and the parameters have exactly the reference names and shapes."""
    if (msg := _error_message(got)) is not None:
        return _fail(case, msg)
    want = {pos: facts for pos, facts in expected["value"].items() if pos != "basis"}  # basis: builds_on's
    for pos, facts in want.items():
        mine = got[pos]
        if "pe" in mine["parameters"]:
            return Verdict(False, _fail(case, f"pos={pos!r}: `pe` is an nn.Parameter, so the optimiser would "
                                        "train the closed-form table. Register it with "
                                        "self.register_buffer('pe', table).").message, "lm_pe_parameter")
        extra = sorted(set(mine["state_dict"]) - set(facts["state_dict"]))
        missing = sorted(set(facts["state_dict"]) - set(mine["state_dict"]))
        if extra and all(k in mine["buffers"] for k in extra):
            return Verdict(False, _fail(case, f"pos={pos!r}: the state dict holds the buffers {extra}, which "
                                        "the grader's model does not have, so your checkpoint would not "
                                        "load. Register precomputed RoPE/ALiBi tables with "
                                        "persistent=False.").message, "lm_tables_in_state_dict")
        vocab_shaped = [k for k in extra if mine["state_dict"][k][:1] == [LM_VOCAB] and k not in mine["buffers"]]
        if vocab_shaped:
            return Verdict(False, _fail(case, f"pos={pos!r}: {vocab_shaped} is a separate output layer; the "
                                        "head must reuse token_emb.weight (tied).").message, "lm_untied_head")
        if extra or missing:
            return _fail(case, f"pos={pos!r}: state-dict names differ from the skeleton's: unexpected {extra}, "
                         f"missing {missing}. Keep the names token_emb, pos_emb, pe and blks: the grader "
                         "loads your weights by name.")
        shapes = {k: (mine["state_dict"][k], v) for k, v in facts["state_dict"].items()
                  if mine["state_dict"][k] != v}
        if shapes:
            name, (have, need) = next(iter(shapes.items()))
            return _fail(case, f"pos={pos!r}: {name} has shape {have}, expected {need}.")
        if set(mine["parameters"]) != set(facts["parameters"]):
            return _fail(case, f"pos={pos!r}: trainable parameters {sorted(mine['parameters'])}, expected "
                         f"{sorted(facts['parameters'])}: rope, alibi and none add no parameters.")
        if "loaded" in facts and (failed := _loaded_differs(case, pos, mine.get("loaded"), facts["loaded"])):
            return failed
    return Verdict(True)


def _loaded_differs(case: dict[str, Any], pos: str, run: dict[str, Any] | None, want: dict[str, Any]) -> Verdict | None:
    """What the state-dict facts must do to the logits (lm_structure's `loaded`), against the reference under the
    same load and nudge: a failing verdict, or None when they do it. A fact the child reports earns nothing
    without it."""
    run = run or {"raised": "KeyError", "message": "the probe returned no 'loaded'"}
    what = f"pos={pos!r}: after load_state_dict() of values the grader chose for every entry of your state dict,"
    if run["raised"]:
        return _fail(case, f"{what} the model raised {run['raised']}: {run['message'].rstrip('. ')}. Its tables "
                     "must be the module's own state, loaded by name.")
    atol, rtol = case["atol"], case["rtol"]
    for key, after in (("value", "the logits"), ("nudged", f"the logits after {NUDGE} is added to every "
                                                           "trainable parameter")):
        mine, ref = np.asarray(run[key], dtype=np.float64), np.asarray(want[key])
        if mine.shape != ref.shape or not _close(mine, ref, atol, rtol):
            rule = ("a table the model keeps outside its state, or an entry it does not use" if key == "value" else
                    "a fixed table kept as a trainable parameter, or a parameter the model does not use")
            detail = _where(mine, ref, atol, rtol) if mine.shape == ref.shape else f"shape {list(mine.shape)}"
            return _fail(case, f"{what} {after} are not the reference's ({detail}): {rule}.")
    return None


@check
def fn_same_device(case: dict[str, Any], got: dict[str, Any], expected: dict[str, Any]) -> Verdict:
    """The function keeps to the device of its inputs (its tables made there, or moved there)."""
    if (msg := _error_message(got)) is not None:
        return _fail(case, msg)
    finding = got.get("finding")
    if not finding:
        return Verdict(True)
    where = ", ".join(w for w in (finding.get("line"),) if w)
    module = "args" in case["args"]  # a module class, called on x
    inputs, fix = ("the module and x", "device=x.device") if module else ("q, k and v", "device=q.device")
    return _fail(case, f"with {inputs} on the {finding['device']} device, {finding['op']}"
                 f"{f' ({where})' if where else ''} received {finding['tensor']}. On a GPU this call fails, and so "
                 f"does a model that reuses it. Fix: make what it builds on the inputs' device ({fix}, or "
                 "table.to(x.device)).", _device_cause(case, finding, expected, fix))


def _device_cause(case: dict[str, Any], finding: dict[str, Any], expected: dict[str, Any], fix: str) -> dict:
    """The catalogued mistake whose device finding is this one (the same op meeting a tensor of the same type
    and shape; the case's own diagnosis first), else a cause that names the tensor the finding names: a mask
    made on the CPU is not a table."""
    def key(f: Any) -> tuple:
        return (f.get("op"), str(f.get("tensor", "")).split(":")[0]) if isinstance(f, dict) else ()

    found = [v for v in expected.get("variants", []) if key(v.get("output", {}).get("finding")) == key(finding)]
    known = case.get("known_cause")
    if found:
        return known if known and known["id"] in {v["id"] for v in found} else found[0]
    tensor = str(finding.get("tensor", "")).split(":")[0]
    return {"id": None, "description": f"{tensor}, which {finding['op']} received, is made or kept off the "
                                       f"inputs' device: create it with {fix}, or move it there with .to()."}


@check
def lm_same_device(case: dict[str, Any], got: dict[str, Any], expected: dict[str, Any]) -> Verdict:
    """Every scheme's forward pass keeps to the device of its input and parameters."""
    if (msg := _error_message(got)) is not None:
        return _fail(case, msg)
    for pos, result in got.items():
        if result.get("finding"):
            return Verdict(False, _fail(case, device_message(pos, result["finding"])).message,
                           "lm_tables_on_cpu")
    return Verdict(True)


# --------------------------------------------------------------------------- earlier questions
#
# Q3 adds the table of Q2, Q6 uses the RoPE of Q5 and the milestone uses Q2, Q5 and Q7. A mistake costs points on
# the question where it is made: such a case names under args["basis"] a probe of the student's own earlier
# function, and the probe returns that output alongside. Where the expected value follows from it ("own": how),
# a case that misses the reference passes when it matches what the student's own earlier output gives, computed
# here (in the grader's process, or in the student's notebook for a local check), never with reference code or
# tables shipped for the purpose. Only a genuine attempt stands in for the reference: the right shape, finite,
# and not degenerate (a table must change with position; RoPE must turn q and k and keep their lengths), so code
# that computes nothing still earns nothing. Where the expected value cannot follow (the milestone model), the
# basis mirrors a public case of the earlier question, and a failure whose earlier output differs from that
# case's expected value says so: "This comes from your Q2 `sinusoidal_pe`".

def _label(spec: dict[str, Any]) -> str:
    """ "your Q2 `sinusoidal_pe`" for a basis spec."""
    names = " and ".join(f"`{n}`" for n in spec.get("names", []))
    return f"your {str(spec.get('question', '')).split('_')[0].upper()} {names}"


def _own_table_add(case: dict[str, Any], mine: dict[str, Any]) -> tuple[np.ndarray | None, str]:
    """x + the student's own table[:T], which SinusoidalPE's forward returns: (value, "") or (None, why not)."""
    torch = _torch()
    args = case["args"]
    T, d = args["x_shape"][-2], args["x_shape"][-1]
    table = np.asarray(mine["value"], dtype=float)
    if table.ndim != 2 or table.shape[1] != d or table.shape[0] < T:
        return None, f"returned shape {list(table.shape)}, not (max_len, {d})"
    if not np.isfinite(table).all():
        return None, "returned NaN or infinite values"
    if float(np.ptp(table, axis=0).max()) <= 1e-6:
        return None, "returned a table whose rows are all the same: it does not change with position"
    x = _seeded(args["seed"], *args["x_shape"]).to(getattr(torch, args.get("dtype", "float32")))
    if args.get("zeros"):
        x = torch.zeros_like(x)
    return (x + torch.tensor(table[:T], dtype=torch.float32)).numpy(), ""


def _own_rope_attention(case: dict[str, Any], mine: dict[str, Any]) -> tuple[np.ndarray | None, str]:
    """Causal softmax attention over the student's own rotated q and k (v as it is): (value, "") or (None, why)."""
    torch = _torch()
    args = case["args"]
    shape, seed = args["shape"], args["seed"]
    q0, k0 = _seeded(seed, *shape).numpy(), _seeded(seed + 1, *shape).numpy()
    q, k = np.asarray(mine["q"], dtype=float), np.asarray(mine["k"], dtype=float)
    if q.shape != q0.shape or k.shape != k0.shape:
        return None, f"returned shape {list(q.shape)} for q of shape {list(shape)}"
    if not (np.isfinite(q).all() and np.isfinite(k).all()):
        return None, "returned NaN or infinite values"
    if np.allclose(q, q0, atol=1e-6) and np.allclose(k, k0, atol=1e-6):
        return None, "left q and k unchanged: nothing was rotated"
    norms = [np.linalg.norm(a, axis=-1) for a in (q, q0, k, k0)]
    if not (np.allclose(norms[0], norms[1], rtol=1e-4, atol=1e-6) and np.allclose(norms[2], norms[3], rtol=1e-4,
                                                                                  atol=1e-6)):
        return None, "changed the lengths of q and k, so it is not a rotation"
    T, width = shape[-2], shape[-1]
    scores = torch.from_numpy(q) @ torch.from_numpy(k).transpose(-2, -1) / width ** 0.5
    if args.get("kwargs", {}).get("causal", True):
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return (torch.softmax(scores, dim=-1) @ _seeded(seed + 2, *shape)).numpy(), ""


OWN: dict[str, Callable[[dict[str, Any], dict[str, Any]], tuple[np.ndarray | None, str]]] = {
    "table_add": _own_table_add, "rope_attention": _own_rope_attention}


def _same(mine: Any, want: Any, atol: float, rtol: float) -> bool:
    """Every array of the reference output `want` is matched by the student's output `mine`."""
    if not isinstance(mine, dict) or "error" in mine or not isinstance(want, dict):
        return False
    arrays = [k for k, v in want.items() if isinstance(v, np.ndarray)]
    return bool(arrays) and all(k in mine and _close(mine[k], want[k], atol, rtol) for k in arrays)


def _with_note(verdict: Verdict, note: str) -> Verdict:
    """The failing verdict with the earlier question named before its hints."""
    text = verdict.message
    cut = min((i for i in (text.find("\n  Likely cause:"), text.find("\n  Revisit:")) if i >= 0), default=len(text))
    return Verdict(False, f"{text[:cut]}\n  {note}{text[cut:]}", verdict.diagnosis, note)


@hook
def builds_on(case: dict[str, Any], got: dict[str, Any], expected: dict[str, Any], verdict: Verdict) -> Verdict:
    """A failing case that builds on an earlier question, judged so that the mistake costs points where it is made."""
    spec = case["args"]["basis"]
    mine, label, where = got.get("basis"), _label(spec), spec["question"]
    atol, rtol = case["atol"], case["rtol"]
    if isinstance(mine, dict) and "error" in mine:
        err = mine["error"]
        if STUB in str(err.get("message", "")):
            return _with_note(verdict, f"This comes from {label}, which is not filled in yet: fill it in {where} "
                                       "first.")
        return _with_note(verdict, f"This comes from {label}: {spec['what']} raised {err['type']}: "
                                   f"{err['message']}. Fix it in {where} first.")
    if not isinstance(mine, dict):
        return verdict
    if not spec.get("own"):  # the milestone: name the earlier function when its output differs
        if _same(mine, expected.get("value", {}).get("basis"), atol, rtol):
            return verdict
        return _with_note(verdict, f"This comes from {label}: {spec['what']} does not match the reference (see "
                                   f"its cases in {where}); fix it there first.")
    own, why = OWN[spec["own"]](case, mine)
    if own is None:
        return _with_note(verdict, f"This comes from {label}: {spec['what']} {why}, so it cannot stand in for the "
                                   f"reference here. Fix it in {where} first.")
    if _close(own, expected["value"]["value"], atol, rtol):
        return verdict  # the earlier function agrees with the reference here: the mistake is in this question
    again = CHECKS[case["check"]](case | {"against": f"what {label} gives"}, got,
                                  {"value": expected["value"] | {"value": own}, "variants": []})
    if again.passed:
        return Verdict(True, f"{case['id']}: judged against {label}, which differs from the reference; that costs "
                             f"points in {where} only.")
    return again


# --------------------------------------------------------------------------- genuine attempts
#
# A property (shuffling the input shuffles the output; PE[pos + k] is a rotation of PE[pos]; only used rows get a
# gradient) also holds of code that computes nothing, so a property case `requires` value cases of its question.
# It does not need them to be right: one wrong value must not zero every property that holds. It needs them to be
# close to right (`attempt_gap`): the output of a required value case is the reference after the case's declared
# normalisations (`near:`), or a catalogued mistake's, or lies within the case's declared closeness (`within:`, a
# relative error) of the reference while being a genuine attempt, which means that it
#   1. ran without an error and has the reference's shape, finite values, and the same value when computed again;
#   2. is not constant (zeros, ones, any single number);
#   3. is not one of its inputs returned (x, q, k, v, X or X @ W_v: an identity);
#   4. depends on its inputs as the function's contract says: a positional table or a module's x + table changes
#      with the position; RoPE scores differ from the unrotated q k^T; attention mixes positions (its output is not
#      the value rows themselves); a TinyCharLM's logits at the last position change with the first token.
# Blank stubs, zeros, constants and returning an input fail 1, 2 or 3; `attempt_gap` says which.

_TOL = 1e-6


def _inputs(case: dict[str, Any]) -> list[np.ndarray]:
    """The inputs a value case's probe gives the function, as arrays (for the identity test)."""
    args, probe = case.get("args", {}), case.get("probe")
    torch = _torch()
    if probe == "attention":
        seed, shape = args["seed"], args["shape"]
        if args.get("fn") == "self_attention":
            T, d_in, d_k = shape
            X, Wq, Wk, Wv = (_seeded(seed, T, d_in), _seeded(seed + 1, d_in, d_k), _seeded(seed + 2, d_in, d_k),
                             _seeded(seed + 3, d_in, d_k))
            return [a.numpy() for a in (X, X @ Wq, X @ Wk, X @ Wv)]
        return [_seeded(seed + i, *shape).numpy() for i in range(3)]
    if probe == "module_forward":
        x = _seeded(args["seed"], *args["x_shape"]).to(getattr(torch, args.get("dtype", "float32")))
        return [(torch.zeros_like(x) if args.get("zeros") else x).numpy()]
    if probe == "call" and args.get("seed_inputs"):
        return [_seeded(1000 + int(p), *shape).numpy() for p, shape in args["seed_inputs"].items()]
    return []


# The normalisations a value case may declare (`near:`): the first half of the last axis (a RoPE cache at full
# width, cos and sin repeated), the leading rows (a table longer than asked). Values are compared as floats, so a
# dtype never matters here.
NORMALISATIONS: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "first_half": lambda a, w: a[..., : w.shape[-1]] if a.ndim == w.ndim and a.shape[-1] == 2 * w.shape[-1] else a,
    "leading_rows": lambda a, w: a[: w.shape[0]] if a.ndim == w.ndim and a.shape[0] > w.shape[0] else a,
}


def _near(case: dict[str, Any], got: dict[str, Any], expected: dict[str, Any], keys: list[str]) -> bool:
    """Whether the output matches a catalogued mistake, or the reference after the case's normalisations."""
    atol, rtol = case["atol"], case["rtol"]
    if all(_match(got, expected, atol, rtol, key) is not None for key in keys):
        return True
    want = expected["value"]
    for key in keys:
        mine = np.asarray(got.get(key), dtype=float)
        for name in case.get("near", []):
            mine = NORMALISATIONS[name](mine, np.asarray(want[key]))
        if not _close(mine, want[key], atol, rtol):
            return False
    return True


def _relative_error(mine: Any, want: Any) -> float:
    a, b = np.asarray(mine, dtype=float), np.asarray(want, dtype=float)
    if a.shape != b.shape or not np.isfinite(a).all():
        return math.inf
    return float(np.linalg.norm(a - b) / max(float(np.linalg.norm(b)), 1e-12))


@hook
def attempt_gap(case: dict[str, Any], got: Any, expected: dict[str, Any]) -> str:
    """Why the output `got` of value case `case` does not open the gates of the cases that require it ("" when it
    does): it must be the reference after the case's normalisations, a catalogued mistake, or a genuine attempt
    within the case's declared closeness (`within`: a relative error) of the reference; see above."""
    if not isinstance(got, dict) or "error" in got:
        return "it raised an error" if isinstance(got, dict) else "it returned nothing"
    want = expected.get("value", {}) if isinstance(expected, dict) else {}
    keys = [k for k, v in want.items() if isinstance(v, np.ndarray) and k in ("value", "first", "second")]
    if not keys:
        return "its output cannot be judged"
    if _near(case, got, expected, keys):
        return ""
    gap = _degenerate(case, got, want, keys)
    within = case.get("within")
    if gap or (within and all(_relative_error(got.get(k), want[k]) <= within for k in keys)):
        return gap
    return ("its values are far from the reference's" + (f" (more than {within:.0%} off)" if within else "")
            + " and match no known mistake")


def _degenerate(case: dict[str, Any], got: dict[str, Any], want: dict[str, Any], keys: list[str]) -> str:
    """Why the output computes nothing (1. to 4. above), or ""."""
    for key in keys:
        mine = np.asarray(got.get(key), dtype=float)
        if mine.shape != np.shape(want[key]):
            return f"it returned shape {list(mine.shape)}, not {list(np.shape(want[key]))}"
        if not np.isfinite(mine).all():
            return "it returned NaN or infinite values"
        if mine.size > 1 and float(np.ptp(mine)) <= _TOL:
            return "it returned a constant"
    value = np.asarray(got[keys[0]], dtype=float)
    if "again" in want and not _close(got.get("again"), value, _TOL, 0.0):
        return "it returned another value when called again on the same inputs"
    for given in _inputs(case):
        if given.shape == value.shape and _close(value, given, _TOL, _TOL):
            return "it returned one of its inputs unchanged"
    return _contract_gap(case, got, value)


def _contract_gap(case: dict[str, Any], got: dict[str, Any], value: np.ndarray) -> str:
    """Whether value depends on the inputs as the function's contract says (4. above): "" or why not."""
    probe, args = case.get("probe"), case.get("args", {})
    if probe == "module_forward":
        added = value - _inputs(case)[0]
        if value.ndim >= 2 and value.shape[-2] > 1 and float(np.ptp(added, axis=-2).max()) <= _TOL:
            return "what it adds to x does not change with the position"
    if probe == "call" and value.ndim == 2 and value.shape[0] > 1 and float(np.ptp(value, axis=0).max()) <= _TOL:
        return "its rows are all the same: it does not change with the position"
    if probe == "rope_scores":
        torch = _torch()
        gen = torch.Generator().manual_seed(args["seed"])  # the draws of rope_scores (float64, cast to float32)
        q, k = (torch.randn(args["T"], args["d"], generator=gen, dtype=torch.float64).float() for _ in range(2))
        if _close(value, (q @ k.T).numpy(), 1e-4, 1e-4):
            return "the scores are those of q and k unrotated"
    if probe == "lm_logits" and _close(np.asarray(got.get("context"), dtype=float), value[:, -1], _TOL, 0.0):
        return "its logits at the last position do not change with the first token: attention reads no other token"
    return ""


# Besides the engine's API (checks_runtime.__all__), which `from checks_runtime import *` brings.
__all__ = ["run_probe_exact", "attempt_gap", "builds_on", "trace_devices", "trace_devices_as_gpu", "device_message"]
