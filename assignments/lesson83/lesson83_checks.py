"""Probes and checks for Lesson 83; shipped to students, so it holds no solution and no hidden case.

The generic machinery (registries, Verdict, the case codec, run_probe, judge, the gate, the local checks) is the
shipped checks runtime (checks_runtime.py, next to this file), and what any PyTorch lesson reuses is the shipped kit
beside it (generic_checks.py: closeness, pairs, raised errors, the multiple-choice trio, the genuine-attempt test;
torch_kit.py: float64 release values, nn.Module readers, the model cache; torch_trace.py: the device trace): this
module holds only the lesson's probes, checks and hooks. A test case has two halves. A *probe* runs inside the
student's process: it calls the student's code on fixed inputs and returns plain data (numbers, strings, numpy
arrays), never a verdict. A *check* runs wherever judging happens (the notebook for local checks, the clean grader
process for grading): it compares the probe's output with the reference output computed by the same probe on the
reference solution, and returns a verdict with a message that says what was expected, what came back and which
idea to revisit. Expected values are never typed in: the release builder computes them from `reference/` and
stores them with the case.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np
from checks_runtime import *  # noqa: F403 - the engine's API (checks_runtime.__all__): this module defines none of it
from checks_runtime import (
    CHECKS,
    NOT_FILLED,
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
from checks_runtime import error_record as _error_record
from checks_runtime import fail as _fail
from checks_runtime import first_mismatch as _where
from checks_runtime import preview as _fmt
from generic_checks import *  # noqa: F403 - the generic checks, the multiple-choice trio, NORMALISATIONS
from generic_checks import TOL as _TOL
from generic_checks import agree as _agree
from generic_checks import attempt_gap_of, close
from torch_kit import Fills, ModelCache, run_probe_exact
from torch_kit import module_facts as _module_facts
from torch_kit import module_state as _module_state
from torch_kit import move as _move
from torch_kit import named_modules as _named_modules
from torch_kit import pristine as _pristine
from torch_kit import seed as _seed
from torch_kit import seeded as _seeded
from torch_kit import tables as _tables
from torch_kit import torch as _torch
from torch_kit import write as _write
from torch_trace import device_finding, trace_devices, trace_devices_as_gpu

# Checks that compare with the reference value; the others judge a property of the student's output alone,
# so their cases carry no reference value (a multiple-choice format check must not carry the answers).
USES_EXPECTED = {"close", "learned_table", "grad_rows", "shape", "pair_close", "long_bias", "choice_correct",
                 "lm_names", "tied_head"}


# --------------------------------------------------------------------------- probe helpers


@hook
def before_probe() -> None:
    """Before every probe: modules with random init give the same values on every run."""
    _seed(0)


@hook
def local_check() -> contextlib.AbstractContextManager[None]:
    """Each local check runs on one torch thread (a check is small, and on a busy machine more threads only wait
    for each other), restoring the student's setting after."""
    return one_torch_thread()


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
def attention(env: dict[str, Any], fn: str, shape: list[int], seed: int, kwargs: dict[str, Any],
              zero_qk: bool = False, heads: int = 0) -> dict[str, Any]:
    """Call an attention function on seeded q, k, v of `shape` (or X and weights for self_attention)."""
    target = _get(env, fn)
    if fn == "self_attention":  # q = X W_q, k = X W_k, v = X W_v: W_q, W_k and W_v stand in for q, k and v
        T, d_in, d_k = shape
        X = _seeded(seed, T, d_in)
        q, k, v = (_seeded(seed + i, d_in, d_k) for i in (1, 2, 3))

        def f(q: Any, k: Any, v: Any) -> Any:
            return target(X, q, k, v, **kwargs)
        moving = (q, k)
    else:
        q, k, v = (_seeded(seed + i, *shape) for i in range(3))
        moving = (q, k)  # with q = k = 0 neither can move the scores alone: the contract moves them from these
        if zero_qk:
            q, k = q * 0, k * 0

        def f(q: Any, k: Any, v: Any) -> Any:
            return target(q, k, v, **kwargs)
    value = as_array(f(q, k, v), fn)
    again = as_array(f(q, k, v), fn)  # the same call twice: a genuine attempt agrees
    calls = _attention_calls(f, q, k, v, seed, fn, rope=fn == "rope_attention", moving=moving)
    return {"value": value, "again": again, "contract": calls}


def _turn(d: int, seed: int, planes: str | None) -> Any:
    """A d x d orthogonal matrix (float64) that turns q and k together: any one (planes None), or a rotation by its
    own angle in each plane RoPE rotates in, `half` (i, i + d/2) or `pairs` (2i, 2i + 1), which commutes with every
    rotation RoPE makes there (so RoPE's scores do not change either)."""
    torch = _torch()
    if planes is None:
        return torch.linalg.qr(_seeded(seed, d, d))[0]
    R = torch.eye(d, dtype=torch.float64)
    for i in range(d // 2):
        a, b = (i, i + d // 2) if planes == "half" else (2 * i, 2 * i + 1)
        c, s = float(np.cos(0.7 + 0.9 * i)), float(np.sin(0.7 + 0.9 * i))
        R[a, a], R[a, b], R[b, a], R[b, b] = c, s, -s, c
    return R


def _attention_calls(f: Callable[..., Any], q: Any, k: Any, v: Any, seed: int, fn: str, *, rope: bool,
                     moving: tuple[Any, Any]) -> dict[str, Any]:
    """The attention contract's calls (`_attention_gap` judges them): f(q R, k R, v) for R that turns q and k together
    (for RoPE, in its planes, both conventions), f(q, k, w) and f(q, k, v + w) (linear in v), and, from q, k =
    `moving` (`base`, where they are not the case's q and k), f(q', k, v) and f(q, k', v) (q and k both matter). A
    call that raises is recorded as the error."""
    out: dict[str, Any] = {}
    try:
        for name, planes in ((("turned", "half"), ("turned_pairs", "pairs")) if rope else (("turned", None),)):
            R = _turn(q.shape[-1], seed + 5, planes).to(q.dtype)
            out[name] = as_array(f(q @ R, k @ R, v), fn)
        w = _seeded(seed + 7, *v.shape).to(v.dtype)
        out["other_v"], out["sum"] = as_array(f(q, k, w), fn), as_array(f(q, k, v + w), fn)
        q0, k0 = moving
        if q0 is not q or k0 is not k:
            out["base"] = as_array(f(q0, k0, v), fn)
        out["other_q"] = as_array(f(_seeded(seed + 8, *q.shape).to(q.dtype), k0, v), fn)
        out["other_k"] = as_array(f(q0, _seeded(seed + 9, *k.shape).to(k.dtype), v), fn)
    except Exception as exc:  # noqa: BLE001 - what raised is the evidence
        return {"error": _error_record(exc)}
    return out


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
    x_shape, what these facts must do to the output, with no method of the module's run but forward: `loaded`,
    forward after the grader writes a table it chose (`chosen_table`) into the module's state-dict entry `pe`, in
    that tensor's own shape, and again after every trainable parameter is nudged by 1; `loaded64`, the same after
    the module is moved to float64 (nn.Module's own _apply) and a table float32 cannot hold is written into its
    own `pe`, saved or not."""
    facts = _module_facts(_get(env, cls)(*args), "pe")
    if x_shape:
        torch = _torch()
        (B, T), (d, max_len) = x_shape, args[:2]
        for key, fine in (("loaded", False), ("loaded64", True)):
            dtype = torch.float64 if fine else torch.float32
            x = torch.from_numpy(chosen_input(B, T, d, seed, fine)).to(dtype)
            facts[key] = _write_and_forward(_get(env, cls)(*args), chosen_table(max_len, d, seed, fine), x,
                                            name="pe", saved=not fine, dtype=dtype if fine else None)
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


def _fit(table: np.ndarray, shape: tuple[int, ...]) -> np.ndarray | None:
    """The 2-D `table` laid out in a tensor of the student's `shape`: the same axes, or transposed, with any axes
    of length 1 added ((1, max_len, d), (max_len, 1, d), (d, max_len)); None when the shape holds no such table."""
    core = [n for n in shape if n != 1]
    if core == list(table.shape):
        return table.reshape(shape)
    if core == list(table.shape[::-1]):
        return np.ascontiguousarray(table.T).reshape(shape)
    return None


def _table_tensor(m: Any, table: np.ndarray, name: str | None, saved: bool) -> Any:
    """The tensor of module m, read from nn.Module's own tables, that holds its table: `name`, an entry of its
    state dict (`saved`) or the module's own buffer or parameter; name None: the one floating parameter or buffer
    whose shape holds `table` (_fit)."""
    P = _pristine()
    state = _module_state(m)
    if name is not None:
        _, params, buffers, _, _ = _tables(m)
        found = state["state_dict"].get(name) if saved else buffers.get(name, params.get(name))
        if found is None:
            where = "entry of the state dict" if saved else "buffer or parameter"
            raise LookupError(f"the module has no {where} named {name!r}")
        return found
    found = [t for t in (*state["parameters"].values(), *state["buffers"].values())
             if P.is_floating(t) and _fit(table, tuple(P.shape(t))) is not None]
    if len(found) != 1:
        raise LookupError(f"expected one parameter or buffer holding a {list(table.shape)} table, found "
                          f"{len(found)}")
    return found[0]


def _write_and_forward(m: Any, table: np.ndarray, x: Any, *, name: str | None, saved: bool,
                       dtype: Any) -> dict[str, Any]:
    """Module m moved to `dtype` (unless None) by nn.Module's own _apply, `table` written into the tensor that
    holds it (_table_tensor), in that tensor's shape (_fit), then m(x); then every trainable parameter + 1 and
    m(x) again. No method of the module's runs but forward (no load_state_dict, _apply, .to or hook of the
    student's). What raised, else both outputs and the first one's dtype: the grader checks them against the
    output it predicts."""
    torch, P = _torch(), _pristine()
    try:
        if dtype is not None:
            _move(m, dtype)
        target = _table_tensor(m, table, name, saved)
        values = _fit(table, tuple(P.shape(target)))
        if values is None:
            raise ValueError(f"{name!r} has shape {list(P.shape(target))}, which holds no {list(table.shape)} "
                             "table")
        _write(target, torch.from_numpy(values))
        with torch.no_grad():
            out = m(x)
            first = as_array(out, "forward after the grader's table was written into the module's state")
            for p in _module_state(m)["parameters"].values():
                if P.requires_grad(p):
                    P.add(p, 1.0)
            second = as_array(m(x), "forward after a step on every trainable parameter")
    except Exception as exc:  # noqa: BLE001 - what raised is the evidence
        return {"raised": type(exc).__name__, "message": str(exc)[:300]}
    return {"raised": None, "value": first, "nudged": second, "dtype": _dtype_name(out)}


@probe
def module_forward(env: dict[str, Any], cls: str, args: list[Any], x_shape: list[int], seed: int,
                   zeros: bool = False, dtype: str = "float32", arange_weights: bool = False,
                   fill: int | None = None) -> dict[str, Any]:
    """Forward a seeded (or zero) input through env[cls](*args) and return the output. With weights to fill (the
    module's one nn.Embedding, found in nn.Module's own tables): `arange_weights`, a fixed public ramp (visible
    cases), or `fill`, values drawn from that seed (hidden cases: the seed is a hidden argument, never shipped);
    then `moved`, the output once the same values are written in reverse order: an output that ignores the
    module's own weights does not move."""
    torch = _torch()
    m = _get(env, cls)(*args)
    x = _seeded(seed, *x_shape).to(getattr(torch, dtype))
    if zeros:
        x = torch.zeros_like(x)
    weight = _embedding_weight(m, cls) if arange_weights or fill is not None else None
    if weight is not None:
        P = _pristine()
        shape = tuple(P.shape(weight))
        n = P.numel(weight)
        values = (_seeded(fill, *shape) if fill is not None else
                  torch.arange(n, dtype=torch.float64).reshape(shape) / n)
        _write(weight, values)
    try:
        with torch.no_grad():
            out = m(x)
        found = {"value": as_array(out, f"{cls}.forward"), "dtype": _dtype_name(out)}
    except Exception as exc:  # noqa: BLE001 - it raised here; the contract's calls (shorter) may still show an attempt
        return {"error": _error_record(exc), "contract": _module_calls(m, x, weight, args, seed, cls)}
    found["contract"] = _module_calls(m, x, weight, args, seed, cls)
    if weight is not None:
        _write(weight, values.flatten().flip(0).reshape(shape))
        with torch.no_grad():
            found["moved"] = as_array(m(x), f"{cls}.forward with other weights")
    return found


def _module_calls(m: Any, x: Any, weight: Any, args: list[Any], seed: int, cls: str) -> dict[str, Any]:
    """The module contract's calls (`_module_gap` judges them), on x cut to T - 1 positions (so that a length check off
    by one at T = max_len still shows the attempt): forward of it (`base`), of another input (`other`), and, for a
    module with a table of weights, forward of it once the entries of position 1 change (`row1`: row 1, or column 1
    of a table stored transposed). The weights are as they were after. A call that raises is recorded as the error."""
    torch = _torch()
    T = x.shape[1]
    short = x[:, : T - 1] if T > 2 else x
    x2 = _seeded(seed + 7, *short.shape).to(short.dtype)
    try:
        with torch.no_grad():
            found = {"x": short.numpy(), "base": as_array(m(short), f"{cls}.forward"), "x2": x2.numpy(),
                     "other": as_array(m(x2), f"{cls}.forward")}
            if weight is not None:
                P = _pristine()
                kept = weight.detach().clone()
                changed = kept.clone().double()
                if P.shape(weight)[0] == args[0]:  # (max_len, d): row 1 holds position 1 (not a shift of it:
                    changed[1] += _seeded(seed + 11, changed.shape[1])  # a LayerNorm after would undo that)
                else:  # (d, max_len): column 1 does
                    changed[:, 1] += _seeded(seed + 11, changed.shape[0])
                _write(weight, changed)
                try:
                    found["row1"] = as_array(m(short), f"{cls}.forward")
                finally:
                    _write(weight, kept)
    except Exception as exc:  # noqa: BLE001 - what raised is the evidence
        return {"error": _error_record(exc)}
    return found


def _embedding_weight(m: Any, cls: str) -> Any:
    """The weight of module m's one nn.Embedding, read from nn.Module's own tables."""
    P = _pristine()
    found = [_tables(mod)[1].get("weight") for _, mod in _named_modules(m) if P.issubclass(P.type(mod), P.Embedding)]
    if len(found) != 1 or not P.issubclass(P.type(found[0]), P.TensorBase):
        raise TypeError(f"{cls} should hold exactly one nn.Embedding, found {len(found)}")
    return found[0]


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
    the grader writes a (max_len, d_model) table it chose (`chosen_table`) into the one parameter or buffer that
    holds such a table, in its own shape, then after a nudge of 1 (no method of the module's runs but forward)."""
    P = _pristine()
    m = _get(env, "LearnedPE")(max_len, d_model)
    weights = [_tables(mod)[1].get("weight") for _, mod in _named_modules(m) if P.issubclass(P.type(mod), P.Embedding)]
    tables = [list(P.shape(w)) if P.issubclass(P.type(w), P.TensorBase) else [] for w in weights]
    params = _module_state(m)["parameters"].values()
    facts = {"tables": tables, "trainable": int(sum(P.numel(p) for p in params if P.requires_grad(p)))}
    if x_shape:
        torch = _torch()
        (B, T), table = x_shape, chosen_table(max_len, d_model, seed)
        x = torch.from_numpy(chosen_input(B, T, d_model, seed)).float()
        facts["loaded"] = _write_and_forward(_get(env, "LearnedPE")(max_len, d_model), table, x, name=None,
                                             saved=False, dtype=None)
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


# --------------------------------------------------------------------------- milestone probes

LM_VOCAB = 28  # <unk>, space, a-z
LM_SMALL = {"num_hiddens": 32, "num_heads": 4, "num_blks": 2, "max_len": 256}  # cheap to run on a CPU


# TinyCharLM(vocab_size=LM_VOCAB, pos=pos, **LM_SMALL) per scheme, built right after torch.manual_seed(0) and handed
# out again while provably as built (the kit's ModelCache): one local check builds the five models 17 times, one
# graded job 20 times, and an ALiBi model builds (4, 256, 256) tables. lm_device runs them as they are.
MODELS = ModelCache("TinyCharLM", lambda pos: {"vocab_size": LM_VOCAB, "pos": pos, **LM_SMALL})


def _lm(env: dict[str, Any], pos: str, seed: int = 0) -> Any:
    """The student's TinyCharLM for pos, small, in eval mode, every trainable parameter filled from its name.

    Filling by name (not by creation order) gives every correct model the same weights. Embeddings get
    std 1 and projections std 1/sqrt(fan_in), so attention is far from uniform and positions matter. What the
    student made non-trainable (a frozen nn.Parameter holding a fixed table) keeps its values: that storage
    mistake is the state-dict case's to judge, not every logits case's.
    """
    torch = _torch()
    model = MODELS.build(env, pos)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if p.requires_grad:
                p.copy_(_fill(seed, name, tuple(p.shape)))
    return model.eval()


def _fill(seed: int, name: str, shape: tuple[int, ...]) -> Any:
    """The float64 values a tensor called `name` of `shape` is filled with for `seed` (drawn from the name, std 1
    for embeddings and vectors, 1/sqrt(fan_in) otherwise), drawn once per process (FILLS)."""
    import zlib

    key = (seed, name, shape)
    fill = FILLS.values.get(key)
    if fill is None:
        torch = _torch()
        gen = torch.Generator().manual_seed(seed + zlib.crc32(name.encode()))
        std = 1.0 if len(shape) < 2 or "emb" in name else shape[-1] ** -0.5
        fill = FILLS.values[key] = torch.randn(shape, generator=gen, dtype=torch.float64) * std
    return fill


FILLS = Fills()  # the values _lm fills parameters with, per (seed, name, shape): drawn once per process


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
    return {"value": value, "context": _logits(model, Y)[:, -1], "contract": _lm_calls(model, X[:1], pos)}


def _lm_calls(model: Any, X: Any, pos: str) -> dict[str, Any]:
    """The model contract's calls (`_lm_gap` judges them), on X (the batch's first sequence): the logits once every
    block's queries and keys turn together in each head (`_turn`; for RoPE in its planes, both conventions), and once
    its queries are doubled (`hot`): the weights of every block's qkv (the skeleton's layout: q, k, v stacked, heads in
    order) are written in place, and put back after. A call that raises is recorded as the error."""
    torch = _torch()
    D, heads = LM_SMALL["num_hiddens"], LM_SMALL["num_heads"]
    params = _module_state(model)["parameters"]
    qkv = [p for name, p in sorted(params.items()) if name.startswith("blks.") and name.endswith(".qkv.weight")]
    kept = [(p, p.detach().clone()) for p in qkv]
    found: dict[str, Any] = {}
    try:
        if not qkv or any(tuple(w.shape) != (3 * D, D) for _, w in kept):
            raise LookupError(f"TinyCharLM has no blks.<i>.qkv.weight of shape ({3 * D}, {D})")
        for name, planes in ((("turned", "half"), ("turned_pairs", "pairs")) if pos == "rope" else (("turned", None),)):
            turn = torch.block_diag(*[_turn(D // heads, 5, planes).T] * heads)
            for p, w in kept:
                new = w.double().clone()
                new[:D], new[D:2 * D] = turn @ new[:D], turn @ new[D:2 * D]
                _write(p, new.to(w.dtype))
            found[name] = _logits(model, X)
        for p, w in kept:
            new = w.clone()
            new[:D] *= 2
            _write(p, new)
        found["hot"] = _logits(model, X)
    except Exception as exc:  # noqa: BLE001 - what raised is the evidence
        return {"error": _error_record(exc)}
    finally:
        for p, w in kept:
            _write(p, w)
    return found


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
    """The logits before and after row 0 of the parameter token_emb.weight (token 0 never occurs in the input) is
    set to a vector the grader chooses (`chosen_table`), written into the parameter found in nn.Module's own
    tables: a tied head moves token 0's logits, and only those, by what the grader predicts from the reference
    under the same change. Then `grad`: row 0 of that parameter's gradient after a backward pass of the logits
    weighted by values the grader chooses. Only the head reaches row 0, so a head that reads the embedding
    matrix itself puts there what the grader predicts; a copy of it (detached, refreshed in every forward) or a
    separate layer puts nothing."""
    torch, P = _torch(), _pristine()
    model, X = _lm(env, pos, seed), _tokens(seed, T)
    before = _logits(model, X)
    d = LM_SMALL["num_hiddens"]
    params = _module_state(model)["parameters"]
    emb = params.get("token_emb.weight")
    if emb is None:
        raise LookupError("TinyCharLM has no parameter token_emb.weight")
    _write(emb, torch.from_numpy(chosen_table(1, d, seed)[0] * 2), row=0)
    after = _logits(model, X)
    for p in params.values():
        P.set_grad(p, None)
    try:
        with torch.enable_grad():
            out = model(X)
            if not isinstance(out, torch.Tensor) or tuple(out.shape) != before.shape:
                raise TypeError("TinyCharLM.forward returned other logits with gradients on")
            (out * _seeded(seed + 1, *before.shape).to(out.dtype)).sum().backward()
        grad = P.grad(emb)
        row = np.zeros(d) if grad is None else as_array(P.item(grad, 0), "the gradient of token_emb.weight")
    finally:
        for p in params.values():
            P.set_grad(p, None)
    return {"before": before, "after": after, "grad": row}


NUDGE = 0.125  # what lm_structure adds to every trainable parameter after the chosen load (exact in float32)


def _chosen_state(env: dict[str, Any], pos: str, T: int, seed: int) -> dict[str, Any]:
    """The model of scheme `pos` (MODELS) after the grader writes values it chooses into every floating entry of
    its state dict (the tensors of nn.Module's own tables, in their own shapes: no load_state_dict, load hook or
    other method of the student's runs), drawn from the entry's name as `_lm` fills parameters (a persistent table
    or a layer of the student's own gets values that nothing predicts), its logits on seeded tokens (`value`), then
    the same after every trainable parameter is nudged by NUDGE (`nudged`: a fixed table kept as a parameter
    moves). What raised, else both: the grader compares them with the reference's under the same writes and
    nudge. Every tensor of the state gets its values back after, so the model is as built again."""
    torch, P = _torch(), _pristine()
    model = MODELS.build(env, pos)
    held = _module_state(model)
    kept = [(t, t.detach().clone()) for t in {id(t): t for t in (*held["state_dict"].values(),
                                                                 *held["parameters"].values())}.values()
            if P.issubclass(P.type(t), P.TensorBase)]
    try:
        for name, v in held["state_dict"].items():
            if P.issubclass(P.type(v), P.TensorBase) and (P.is_floating(v) or P.is_complex(v)):
                _write(v, _fill(seed, name, tuple(P.shape(v))))
        model.eval()
        X = _tokens(seed, T, batch=1)
        first = _logits(model, X)
        with torch.no_grad():
            for p in _module_state(model)["parameters"].values():
                if P.requires_grad(p):
                    P.add(p, NUDGE)
        second = _logits(model, X)
    except Exception as exc:  # noqa: BLE001 - what raised is the evidence
        return {"raised": type(exc).__name__, "message": str(exc)[:300]}
    finally:  # the model as built again (its frozen tables too), so that MODELS may hand it out
        for t, values in kept:
            _write(t, values)
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


@probe
def fn_device(env: dict[str, Any], fn: str, shape: list[int], args: list[Any] | None = None) -> dict[str, Any]:
    """The first op of fn(q, k, v) that would mix devices on a GPU, with q, k, v real values on the CPU shown as
    cuda (the kit's trace_on_cpu), or None. With `args`, fn is a module class: fn(*args) called on x of `shape`."""
    torch = _torch()
    target = _get(env, fn)

    class Call(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            return target(x, x * 1.0, x * 1.0)

    def build() -> Any:
        if args is not None:
            _seed(0)
        return Call() if args is None else target(*args)

    return device_finding(build, torch.randn(*shape, generator=torch.Generator().manual_seed(0)))


@probe
def lm_device(env: dict[str, Any], schemes: list[str], T: int,
              earlier: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Per scheme, the first op of a forward pass that would mix devices on a GPU (None: clean), traced on real
    values on the CPU shown as cuda (the kit's trace_on_cpu). A pass that raises anything else decides nothing
    and its error is the probe's, except where the scheme's earlier question (`earlier`: the basis of its logits
    cases) raises that very error in its own probe: that scheme is left out here (its note says why), as the
    judge leaves out a case that raises an earlier question's error, while another scheme decides."""
    torch = _torch()
    out: dict[str, Any] = {}
    first: Exception | None = None
    for pos in schemes:
        try:
            out[pos] = device_finding(lambda p=pos: MODELS.build(env, p), torch.arange(2 * T).reshape(2, T) % LM_VOCAB)
        except Exception as exc:  # noqa: BLE001 - undecided: raised below unless the earlier question raises it
            basis = (earlier or {}).get(pos)
            if not isinstance(basis, dict) or not _raised_there(env, exc, basis):
                raise
            first = first or exc
            out[pos] = {"finding": None, "note": f"left out: your {basis['what']} raises "
                                                 f"{type(exc).__name__} there too"}
    if first is not None and all(r["note"] for r in out.values()):
        raise first  # no scheme decided
    return out


def _raised_there(env: dict[str, Any], exc: Exception, basis: dict[str, Any]) -> bool:
    """Whether `basis` (an earlier question's probe) raises exc itself: the same type at the same line of one of
    the functions it names, or the same type and message (the judge's test for an earlier question's error)."""
    err, own = error_record(exc), run_probe(env, basis["probe"], basis["args"]).get("error")
    if not isinstance(own, dict) or err["type"] != own.get("type"):
        return False
    where = str(own.get("where", ""))
    return (where == err["where"] and where.rsplit(" in ", 1)[-1] in basis.get("names", [])) or \
        err["message"] == own.get("message")


# --------------------------------------------------------------------------- checks


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
    arguments alone (`chosen_table`, `chosen_input`): once the chosen table is written into the tensor of the
    module's state that holds it (in that tensor's own shape, by the probe, with no method of the module's run but
    forward), every row of forward(x) - x is exactly a row of that table (which rows is the value cases'
    business), float64 for `loaded64`; after every trainable parameter is nudged by 1 the output moves by exactly
    `shift` (0 for a buffer, 1 for one trainable table; None: not asked). A fact the child reports earns nothing
    without it."""
    a = case["args"]
    rows, d = (a["args"][1], a["args"][0]) if "cls" in a else (a["max_len"], a["d_model"])
    (B, T), fine = a["x_shape"], key == "loaded64"
    x, table = chosen_input(B, T, d, a["seed"], fine), chosen_table(rows, d, a["seed"], fine)
    run = got.get(key) or {"raised": "KeyError", "message": f"the probe returned no {key!r}"}
    step = (f"{'moving the module to float64 and ' if fine else ''}writing a table the grader chose into the "
            "module's own state")
    what = f"after {step}, forward(x)"
    if run["raised"]:
        return _fail(case, f"{step[0].upper()}{step[1:]}, then forward(x), raised {run['raised']}: "
                     f"{run['message'].rstrip('. ')}. The table must be the module's own state: saved and loaded by "
                     "state_dict() and moved by .to().")
    out = np.asarray(run["value"], dtype=np.float64)
    if out.shape != x.shape:
        return _fail(case, f"{what} has shape {list(out.shape)}, expected {list(x.shape)}.")
    added = (out - x).reshape(-1, 1, d)
    if not np.isclose(added, table[None], atol=1e-12, rtol=0.0).all(-1).any(-1).all():
        return _fail(case, f"{what} - x is {_fmt(added)}, not rows of the written table ({_fmt(table)}): the "
                     "output must come from the table the module keeps in its state (a buffer or parameter), not "
                     "from a copy of it.")
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
def long_bias(case: dict[str, Any], got: dict[str, Any], expected: dict[str, Any]) -> Verdict:
    """A long alibi_bias has the right shape and values (no fixed-length table)."""
    verdict = close(case, got, expected)
    if verdict.passed and got.get("shape") != expected["value"]["shape"]:
        return _fail(case, f"shape {got.get('shape')}, expected {expected['value']['shape']}")
    return verdict


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
    grad, want_grad = np.asarray(got.get("grad", []), dtype=np.float64), np.asarray(expected["value"]["grad"])
    if grad.shape != want_grad.shape or not _close(grad, want_grad, case["atol"], case["rtol"]):
        return _fail(case, "after a backward pass of the logits, row 0 of token_emb.weight's gradient (token 0 is "
                     f"not in the input, so only the head reaches it) is {_fmt(grad)}, expected {_fmt(want_grad)}: "
                     "the head must read the embedding matrix itself, with its gradient, in every pass, "
                     "F.linear(H, self.token_emb.weight), not a copy of it or a separate layer.",
                     case.get("known_cause"))
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
    what = f"pos={pos!r}: after the grader wrote values it chose into every entry of your state dict,"
    if run["raised"]:
        return _fail(case, f"{what} the model raised {run['raised']}: {run['message'].rstrip('. ')}. Its tables "
                     "must be the module's own state, loaded by name.")
    atol, rtol = case["atol"], case["rtol"]
    for key, after in (("value", "the logits"), ("nudged", f"the logits after {NUDGE} is added to every "
                                                           "trainable parameter")):
        mine, theirs = np.asarray(run[key], dtype=np.float64), np.asarray(want[key])
        if mine.shape != theirs.shape or not _close(mine, theirs, atol, rtol):
            rule = ("a table the model keeps outside its state, or an entry it does not use" if key == "value" else
                    "a fixed table kept as a trainable parameter, or a parameter the model does not use")
            detail = _where(mine, theirs, atol, rtol) if mine.shape == theirs.shape else f"shape {list(mine.shape)}"
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
    cause = case.get("known_cause") or {}  # the case's `diagnosis:` (the catalogue's lm_tables_on_cpu)
    for pos, result in got.items():
        if result.get("finding"):
            return Verdict(False, _fail(case, device_message(pos, result["finding"])).message, cause.get("id"))
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
            return _with_note(verdict, f"This comes from {label}, which is {NOT_FILLED}: fill it in {where} "
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
# A property case `requires` value cases of its question, whose outputs must be genuine attempts (generic_checks:
# attempt_gap_of). What is Lesson 83's: the inputs a value case's probe gives the function (x, q, k, v, X or
# X @ W_v: returning one is an identity), and the contract its output meets (`_contract_gap`), judged from the
# calls the probe recorded beside it: attention does not change when q and k turn together (a rotation that commutes
# with the positional scheme), is linear in v and moves with q and with k; a positional module moves with x, adds
# what changes with the position, and reads one row of its table per position; an ALiBi bias depends on the
# distance at a constant rate per head; a TinyCharLM's logits change with the first token, do not change when every
# block's queries and keys turn together, and change when its queries are doubled. A table, RoPE's cache and scores
# have no contract beyond a few necessary tests here: their cases' `within:` decides.


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


@hook
def attempt_gap(case: dict[str, Any], got: Any, expected: dict[str, Any]) -> str:
    """Why the output `got` of value case `case` does not open the gates of the cases that require it ("" when it
    does): generic_checks' test of a genuine attempt, with this lesson's inputs and contracts."""
    if isinstance(got, dict) and "moved" in got and "error" not in got:  # before `near`: a public fill is public
        value, moved = np.asarray(got.get("value"), dtype=float), np.asarray(got["moved"], dtype=float)
        if value.shape == moved.shape and _close(moved, value, _TOL, 0.0):
            return "its output does not change when the values of its own nn.Embedding change"
    return attempt_gap_of(case, got, expected, inputs=_inputs, contract=_contract_gap)


def _contract_gap(case: dict[str, Any], got: dict[str, Any], value: np.ndarray | None) -> str | None:
    """Whether the output meets its function's contract (4. of generic_checks), judged here from what the probe
    recorded: "" when it does, why not, or None where this lesson has no contract for the probe (the case's
    `within:` decides). `value` None: the call raised, and the probe's contract calls alone are judged."""
    probe, args = case.get("probe"), case.get("args", {})
    calls = got.get("contract")
    if value is None:
        return _module_gap(calls, args.get("cls")) if probe == "module_forward" else None
    if probe == "attention":
        return _attention_gap(calls, value)
    if probe == "module_forward":
        return _module_gap(calls, args.get("cls"))
    if probe == "lm_logits":
        if _close(np.asarray(got.get("context"), dtype=float), value[:, -1], _TOL, 0.0):
            return "its logits at the last position do not change with the first token: attention reads no other token"
        return _lm_gap(calls, value[:1])
    if probe == "call" and args.get("fn") == "alibi_bias":
        return _bias_gap(value)
    if probe == "call" and value.ndim == 2 and value.shape[0] > 1 and float(np.ptp(value, axis=0).max()) <= _TOL:
        return "its rows are all the same: it does not change with the position"
    if probe == "rope_scores":
        torch = _torch()
        gen = torch.Generator().manual_seed(args["seed"])  # the draws of rope_scores (float64, cast to float32)
        q, k = (torch.randn(args["T"], args["d"], generator=gen, dtype=torch.float64).float() for _ in range(2))
        if _close(value, (q @ k.T).numpy(), 1e-4, 1e-4):
            return "the scores are those of q and k unrotated"
    return None


def _calls_gap(calls: Any, keys: tuple[str, ...]) -> str:
    """Why the contract's recorded calls cannot be judged ("" when they can)."""
    if not isinstance(calls, dict):
        return "the contract's calls were not recorded"
    if "error" in calls:
        err = calls["error"]
        return f"it raised {err.get('type')} on the contract's inputs" if isinstance(err, dict) else "it raised"
    missing = [k for k in keys if k not in calls]
    return f"the contract's calls {missing} were not recorded" if missing else ""


def _attention_gap(calls: Any, value: np.ndarray) -> str:
    """Attention's contract: the output does not change when q and k turn together (by a rotation that commutes with
    the positional scheme), is linear in v, and moves with q and with k."""
    if gap := _calls_gap(calls, ("turned", "other_v", "sum", "other_q", "other_k")):
        return gap
    if not any(_agree(calls[k], value) for k in ("turned", "turned_pairs") if k in calls):
        return "it changes when q and k turn together, which leaves their dot products as they are"
    if not _agree(calls["sum"], value + np.asarray(calls["other_v"], dtype=float)):
        return "it is not linear in v: attention mixes the rows of v with weights from q and k"
    base = calls.get("base", value)
    for key, name in (("other_q", "q"), ("other_k", "k")):
        if _agree(calls[key], base):
            return f"it does not change when {name} does"
    return ""


def _module_gap(calls: Any, cls: Any) -> str:
    """A positional module's contract, on the shorter input: the output moves with x, what it adds to x changes
    with the position, and, for a table of weights, changing one row of it moves the output at one position alone
    (each position reads one row); for a fixed table, forward adds the same table to any x, with values
    in [-1, 1]."""
    if gap := _calls_gap(calls, ("x", "base", "x2", "other")):
        return gap
    x, base, x2, other = (np.asarray(calls[k], dtype=float) for k in ("x", "base", "x2", "other"))
    if base.shape != x.shape or other.shape != x2.shape or base.ndim < 2:
        return f"it returned shape {list(base.shape)} for x of shape {list(x.shape)}"
    added = base - x
    if not (np.isfinite(base).all() and np.isfinite(other).all()):
        return "it returned NaN or infinite values"
    if _agree(other, base):
        return "its output does not change with x"
    if base.shape[-2] > 1 and float(np.ptp(added, axis=-2).max()) <= _TOL:
        return "what it adds to x does not change with the position"
    if "row1" in calls:
        moved = np.abs(np.asarray(calls["row1"], dtype=float) - base) > 1e-6
        moved = moved.reshape(-1, *moved.shape[-2:]).any(axis=(0, -1))  # per position
        if int(moved.sum()) != 1:
            return (f"a change to one row of its table moves {int(moved.sum())} positions of the output, not one: "
                    "each position reads one row")
        return ""
    if cls == "SinusoidalPE":
        if not _agree(other - x2, added):
            return "what it adds to x depends on x: forward adds a fixed table"
        if float(np.abs(added).max()) > 1 + 1e-5:
            return "what it adds to x has values outside [-1, 1], which no sine or cosine takes"
    return ""


def _lm_gap(calls: Any, value: np.ndarray) -> str:
    """A TinyCharLM's contract: its logits do not change when every block's queries and keys turn together in each
    head (by a rotation that commutes with the positional scheme), and change when the queries are doubled (the
    attention weights read the scores)."""
    if gap := _calls_gap(calls, ("turned", "hot")):
        return gap
    if not any(_agree(calls[k], value) for k in ("turned", "turned_pairs") if k in calls):
        return "its logits change when the queries and keys turn together, which leaves their dot products as they are"
    if _agree(calls["hot"], value):
        return "its logits do not change when the queries are doubled: its attention reads no scores"
    return ""


def _bias_gap(value: np.ndarray) -> str:
    """An ALiBi bias's contract, on the keys at or before each query: each head's bias depends on the distance i - j
    alone and changes with it at a constant rate (a slope per head), not zero for every head."""
    if value.ndim != 3 or value.shape[-1] != value.shape[-2] or value.shape[-1] < 3:
        return f"it returned shape {list(value.shape)}, not (heads, T, T)"
    T = value.shape[-1]
    diagonals = [np.diagonal(value, offset=-d, axis1=1, axis2=2) for d in range(T)]  # (heads, T - d) each
    if not all(np.isfinite(g).all() for g in diagonals):
        return "it returned NaN or infinite values for keys at or before the query"
    scale = max(float(np.abs(value[:, np.tril_indices(T)[0], np.tril_indices(T)[1]]).max()), 1e-12)
    if any(float(np.ptp(g, axis=-1).max()) > 1e-5 * scale for g in diagonals if g.shape[-1] > 1):
        return "its value for a key at or before the query depends on more than their distance"
    by_distance = np.stack([g[:, 0] for g in diagonals], axis=-1)  # (heads, T): bias at distance 0, 1, ...
    if float(np.abs(np.diff(by_distance, n=2, axis=-1)).max()) > 1e-5 * scale:
        return "it does not change with the distance at a constant rate (a slope per head)"
    if float(np.abs(np.diff(by_distance, axis=-1)).max()) <= _TOL:
        return "it does not change with the distance"
    return ""


# Besides the engine's API (checks_runtime.__all__), which `from checks_runtime import *` brings.
__all__ = ["run_probe_exact", "attempt_gap", "builds_on", "trace_devices", "trace_devices_as_gpu", "device_message"]
