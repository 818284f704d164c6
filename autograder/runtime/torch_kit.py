"""The PyTorch kit shipped beside a lesson's checks (torch_kit.py): float64 values, module readers, a model cache.

A torch lesson's probes import what they need from here (`from torch_kit import ...`); torch itself is imported
only when a probe first runs (`torch()`), so a numpy-only lesson never needs it. What lives here:
  * `run_probe_exact`: run_probe with every float op in float64, for the values the release stores;
  * `Pristine`, `tables`, `named_modules`, `module_state`, `own_attribute`, `module_facts`: an nn.Module's
    parameters, buffers and state_dict read from nn.Module's own tables, past any override of the student's;
  * `move`, `write`: a module moved to a dtype, and values written into the tensors of its tables, by torch's own
    functions, so that no method, override or hook of the student's runs (load_state_dict, _apply, .to);
  * `ModelState`, `ModelCache`, `Fills`: a model built by the probes handed out again while provably as built.
Caches live on objects (a ModelCache, a Fills), never in module-level tables: the grader's guard reads a changed
module-level table as tampering.
"""

from __future__ import annotations

import collections
import operator
import sys
import types
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
from checks_runtime import defined, run_probe


def torch() -> Any:
    """The torch module, imported at the first call (a numpy-only lesson never imports it)."""
    import torch

    return torch


def seed(value: int) -> None:
    """torch.manual_seed(value) for the CPU generator, the one probes draw from. torch.manual_seed itself also
    queues the seed for each accelerator backend not yet started and formats a stack trace for each, every call:
    about a millisecond, and probes seed about ninety times per notebook."""
    torch().default_generator.manual_seed(value)


def seeded(value: int, *shape: int) -> Any:
    """A float64 tensor of `shape` drawn from N(0, 1) by its own generator seeded with `value`."""
    t = torch()
    gen = t.Generator().manual_seed(value)
    return t.randn(*shape, generator=gen, dtype=t.float64)


# --------------------------------------------------------------------------- float64 release values


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
    with float64_mode():
        return run_probe(env, name, args)


# Tensor methods named with these dunders compute a value: they take float64 copies like any other op. Every other
# dunder (__getitem__, __setitem__, __hash__, __get__ of an attribute such as .grad) and every in-place method
# (name ending in "_") gets the tensors themselves, so that views, identities and writes stay what they were.
COMPUTING_DUNDERS = frozenset(f"__{op}__" for op in (
    "add", "radd", "sub", "rsub", "mul", "rmul", "truediv", "rtruediv", "floordiv", "rfloordiv", "mod", "rmod",
    "pow", "rpow", "matmul", "rmatmul", "neg", "abs", "array", "float", "lt", "le", "gt", "ge", "eq", "ne"))
# Random ops whose draw depends on the dtype of a tensor argument: they draw as run_probe does.
DRAWS_LIKE = frozenset({"rand_like", "randn_like", "randint_like", "normal", "bernoulli", "multinomial",
                        "poisson", "dropout", "randperm"})
KEEPS_TENSORS = frozenset({"backward", "retain_grad", "register_hook", "data_ptr", "untyped_storage", "storage",
                           "is_set_to", "requires_grad_"})


def float64_mode() -> Any:
    """A torch function mode (entered with `with`) that runs each op on float64 copies of its float arguments."""
    t = torch()
    low = (t.float32, t.float16, t.bfloat16)

    def up(value: Any) -> Any:
        if isinstance(value, t.Tensor) and value.dtype in low:
            return value.to(t.float64)
        if type(value) in (list, tuple):
            return type(value)(up(v) for v in value)
        if type(value) is dict:
            return {k: up(v) for k, v in value.items()}
        return value

    class Float64(t.overrides.TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            kwargs = kwargs or {}
            name = getattr(func, "__name__", "")
            dunder = name.startswith("__")
            if (name not in COMPUTING_DUNDERS if dunder else name.endswith("_")) \
                    or name in DRAWS_LIKE or name in KEEPS_TENSORS:
                return func(*args, **kwargs)
            return func(*up(args), **{k: v if k == "out" else up(v) for k, v in kwargs.items()})

    return Float64()


# --------------------------------------------------------------------------- nn.Module's own tables


class Pristine(NamedTuple):
    """torch's own functions for reading a module's state, taken once, when torch is already imported as this
    module is (in the grader's sandbox that is before any student code runs), else at the first probe.

    The storage, parameter and structure probes read nn.Module's own tables (`_parameters`, `_buffers`,
    `_modules`, read from the instance's __dict__ with object.__getattribute__), move a module with
    nn.Module._apply called unbound and write into its tensors with TensorBase's own copy_ and add_: a class that
    overrides named_buffers, state_dict, load_state_dict, _apply or __getattr__, a tensor class of the student's,
    or a patch of nn.Module's methods, cannot change what they report or where a write lands. A tuple, so that its
    entries cannot be rebound (the grader's guard watches the module global and this class).
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
    set_grad: Any
    copy: Any
    add: Any
    item: Any
    no_grad: Any
    float64: Any

    @staticmethod
    def take() -> Pristine:
        t = torch()
        base = t._C.TensorBase
        return Pristine(object.__getattribute__, type, issubclass, dict, set, t.nn.Module, t.nn.Parameter,
                        t.nn.Embedding, base, t.nn.Module.__dict__["_apply"], base.to, base.numel,
                        base.is_floating_point, base.is_complex,
                        *(base.__dict__[n].__get__ for n in ("shape", "dtype", "requires_grad", "grad")),
                        base.__dict__["grad"].__set__, base.copy_, base.add_, base.__getitem__, t.no_grad,
                        t.float64)


PRISTINE: Pristine | None = Pristine.take() if "torch" in sys.modules else None


def pristine() -> Pristine:
    """The functions Pristine took as this module was imported, or (torch was not imported yet) taken now: the
    module global is never rebound, which the grader's guard would read as tampering."""
    return PRISTINE if PRISTINE is not None else Pristine.take()


def tables(m: Any) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any], set[str]]:
    """nn.Module's own tables of module m: its __dict__, parameters, buffers, submodules and non-persistent
    buffer names, as nn.Module keeps them (a TypeError when m is not an nn.Module or a table was replaced)."""
    P = pristine()
    t = P.type(m)
    if not P.issubclass(t, P.Module):
        raise TypeError(f"expected an nn.Module, got {t.__name__}")
    own = P.getattribute(m, "__dict__")
    found = [own.get(k) for k in ("_parameters", "_buffers", "_modules")]
    if not all(P.type(x) is P.dict for x in found):
        raise TypeError(f"{t.__name__} replaced nn.Module's own tables (_parameters, _buffers, _modules)")
    skip = own.get("_non_persistent_buffers_set")
    return own, *found, skip if P.type(skip) is P.set else P.set()


def named_modules(m: Any) -> list[tuple[str, Any]]:
    """(name, module) for m and its submodules, each once, in the order of nn.Module.named_modules."""
    out, seen, todo = [], set(), [("", m)]
    while todo:
        prefix, mod = todo.pop()
        if id(mod) in seen:
            continue
        seen.add(id(mod))
        out.append((prefix, mod))
        kids = [(f"{prefix}.{k}" if prefix else k, v) for k, v in tables(mod)[3].items() if v is not None]
        todo += kids[::-1]
    return out


def module_state(m: Any) -> dict[str, dict[str, Any]]:
    """Parameters and buffers (each tensor once, as named_parameters and named_buffers list them) and the
    state_dict's entries (parameters and persistent buffers of every path to a module) of module m, read from
    nn.Module's own tables (see Pristine)."""
    params: dict[str, Any] = {}
    buffers: dict[str, Any] = {}
    seen: set[int] = set()
    for prefix, mod in named_modules(m):
        _, p_table, b_table, _, _ = tables(mod)
        for table, out in ((p_table, params), (b_table, buffers)):
            for k, v in table.items():
                if v is not None and id(v) not in seen:
                    seen.add(id(v))
                    out[f"{prefix}.{k}" if prefix else k] = v
    state: dict[str, Any] = {}

    def walk(mod: Any, prefix: str, path: tuple[int, ...]) -> None:
        if id(mod) in path or len(path) > 100:
            raise TypeError("a module contains itself: it has no state_dict")
        _, p_table, b_table, kids, transient = tables(mod)
        state.update((prefix + k, v) for k, v in p_table.items() if v is not None)
        state.update((prefix + k, v) for k, v in b_table.items() if v is not None and k not in transient)
        for k, kid in kids.items():
            if kid is not None:
                walk(kid, f"{prefix}{k}.", (*path, id(mod)))

    walk(m, "", ())
    return {"parameters": params, "buffers": buffers, "state_dict": state}


def own_attribute(m: Any, name: str) -> Any:
    """m.name as nn.Module finds it for a plain class: an instance attribute, parameter, buffer or submodule
    (never a property or a __getattr__ of the student's); None when there is none."""
    own, p_table, b_table, kids, _ = tables(m)
    for table in (own, p_table, b_table, kids):
        if name in table:
            return table[name]
    return None


def module_facts(m: Any, name: str) -> dict[str, Any]:
    """Where module m keeps its tensor `name`, read from nn.Module's own tables: the names of its buffers,
    parameters and state_dict entries, NAME_type and NAME_is_parameter, and NAME_dtype_after_to, its dtype once m
    is moved to float64 (m is moved: build one for this alone)."""
    P = pristine()
    state = module_state(m)
    value = own_attribute(m, name)
    facts: dict[str, Any] = {
        "buffers": list(state["buffers"]),
        "parameters": list(state["parameters"]),
        "state_dict": list(state["state_dict"]),
        f"{name}_type": P.type(value).__name__ if value is not None else None,
        f"{name}_is_parameter": P.issubclass(P.type(value), P.Parameter),
        f"{name}_dtype_after_to": None,
    }
    move(m, P.float64)
    moved = own_attribute(m, name)
    if P.issubclass(P.type(moved), P.TensorBase):
        facts[f"{name}_dtype_after_to"] = str(P.dtype(moved)).replace("torch.", "")
    return facts


def move(m: Any, dtype: Any) -> None:
    """m.to(dtype) as nn.Module does it, with no method of the student's: nn.Module._apply called unbound, without
    recursion, on m and on each submodule found in nn.Module's own tables; floating and complex tensors only."""
    P = pristine()

    def to(t: Any) -> Any:
        return P.to(t, dtype) if P.is_floating(t) or P.is_complex(t) else t

    for _, mod in named_modules(m):
        P.apply(mod, to, False)


def write(t: Any, values: Any, row: int | None = None) -> None:
    """Copy `values` into tensor t (one taken from a module's tables; with `row`, into that row of it), in place
    and with autograd off, by TensorBase's own copy_: no method of the student's module or tensor class runs, so
    the write lands in the tensor the module's state holds."""
    P = pristine()
    with P.no_grad():
        P.copy(P.item(t, row) if row is not None else t, values)


# --------------------------------------------------------------------------- the model cache


def layout(t: Any) -> tuple:
    """Type, shape, strides, offset, dtype, device and requires_grad of a tensor."""
    return (type(t), tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, t.device, t.requires_grad)


class Unverifiable(Exception):
    """A model holds something whose state cannot be snapshotted and compared, so it is never reused."""


class ModelState:
    """Everything a model's behaviour depends on besides its parameter values, as it is now.

    Per module (in the order of named_modules): the module, its class and its __dict__ object, and every entry of
    that __dict__ (the parameter, buffer and submodule tables included), kept by identity; every container reached
    from there (dicts, lists, tuples, sets of str or int) with its entries, by identity too (a set by value);
    buffers and other tensors, and numpy arrays, also by layout and a copy of their values (compared bit for bit);
    parameters by layout (the probes fill their values by name before each use). The model's classes (not
    torch's own) are kept by their attribute tables. Anything else (an object of the student's own, a bound
    method, a tensor subclass) raises Unverifiable. `same` compares it all in flat loops: a value rebound to an
    equal object (a new float, False for 0) counts as a change, and the model is built afresh.
    """

    def __init__(self, model: Any) -> None:
        t = torch()
        self.modules = list(model.named_modules(remove_duplicate=False))
        self.params = {id(p): p for p in model.parameters()}
        known = {id(m) for _, m in self.modules}
        self.owners = tuple((m, type(m), vars(m)) for _, m in self.modules)
        plain = (type(None), bool, int, float, complex, str, bytes, t.dtype, t.device)
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
            k = type(value)
            if k in (dict, collections.OrderedDict):
                keys, values = tuple(value), tuple(value.values())
                self.containers.append((value, k, keys, values))
                todo += [key for key in keys if type(key) not in plain]
            elif k in (list, tuple, t.Size):
                values = tuple(value)
                self.containers.append((value, k, None, values))
            elif k in (set, frozenset) and all(type(v) in (str, int) for v in value):
                self.sets.append((value, k, frozenset(value)))
                continue
            elif k in (t.Tensor, t.nn.Parameter) and value.layout == t.strided and (
                    id(value) in self.params or value.device.type == "cpu"):
                self.tensors.append((value, layout(value), None if id(value) in self.params else values_of(value)))
                continue
            elif k is np.ndarray and value.dtype.kind in "biufc":
                self.arrays.append((value, value.copy()))
                continue
            elif k in plain or k in (types.FunctionType, types.BuiltinFunctionType) or (
                    isinstance(value, t.nn.Module) and id(value) in known):
                continue
            else:
                raise Unverifiable(k.__name__)
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
        for c, k, keys, values in self.containers:
            if type(c) is not k or len(c) != len(values) or (keys is not None and not all(map(is_, c, keys))):
                return False
        now = [v for c, _, keys, _ in self.containers for v in (c.values() if keys is not None else c)]
        return (all(map(is_, now, self.flat))
                and all(type(c) is k and c == kept for c, k, kept in self.sets)
                and all(layout(v) == shape and (kept is None or same_values(v, kept))
                        for v, shape, kept in self.tensors)
                and all(v.dtype == kept.dtype and np.array_equal(v, kept) for v, kept in self.arrays)
                and all(len(table) == len(keys) and all(map(is_, map(table.__getitem__, keys), values))
                        for table, keys, values in self.classes))


BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}  # an unsigned integer of each element size


def values_of(t: Any) -> Any:
    """A copy of a CPU tensor's values for same_values: a numpy array where numpy has the dtype (numpy reuses
    freed memory, so this is much cheaper than a clone, which faults in fresh pages), else a clone."""
    try:
        return t.detach().numpy().copy()
    except (TypeError, RuntimeError):  # bfloat16 and other dtypes numpy lacks; conjugate or negative views
        return t.detach().clone()


def same_values(t: Any, kept: Any) -> bool:
    """Whether tensor t holds the values `values_of` kept, bit for bit (a NaN equals itself, -0.0 differs from 0.0)."""
    if type(kept) is not np.ndarray:
        return bool(torch().equal(t.detach(), kept))
    try:
        now = t.detach().numpy()
    except (TypeError, RuntimeError):  # it could be read that way once: not the tensor it was
        return False
    bits = BITS.get(now.dtype.itemsize)
    if bits is None or now.dtype.kind not in "biuf":
        return now.dtype == kept.dtype and bool(np.array_equal(now, kept))
    return now.dtype == kept.dtype and bool(np.array_equal(now.view(bits), kept.view(bits)))


class ModelCache:
    """Models built by a lesson's probes, handed out again while provably as built.

    `ModelCache(cls_name, kwargs)`: `build(env, key)` wants `env[cls_name](**kwargs(key))` as built right after
    torch.manual_seed(0) (a lesson's model class, `key` one of its configurations); the probes then (most of them)
    fill its parameters by name. A model built once is handed out again only while the namespace is the same dict
    with every public name bound to the same object (a re-run cell starts afresh) and while, once model.train()
    has restored its training flags, everything but its parameter values is as it was right after the build
    (`ModelState`): a forward pass or a probe that changed a buffer, an attribute or a module, or a model holding
    anything that cannot be compared, means a fresh build. The global RNG is left as the build left it. The
    models live on this object, not in a module-level dict: the grader's guard reads a changed module table as
    tampering.
    """

    def __init__(self, cls_name: str, kwargs: Callable[[Any], dict[str, Any]]) -> None:
        self.cls_name, self.kwargs = cls_name, kwargs
        self.env: dict[str, Any] | None = None
        self.names: dict[str, Any] = {}
        self.models: dict[Any, tuple[Any, ModelState, Any]] = {}  # key -> (model, its state as built, RNG after)

    def build(self, env: dict[str, Any], key: Any) -> Any:
        """The student's env[cls_name](**kwargs(key)) as built right after torch.manual_seed(0), parameter values
        aside."""
        t = torch()
        cls = defined(env, self.cls_name)
        names = {k: v for k, v in env.items() if isinstance(k, str) and not k.startswith("_")}
        settled = (self.env is env and names.keys() == self.names.keys()
                   and all(names[k] is v for k, v in self.names.items()))
        if not settled:  # a namespace seen for the first time keeps nothing yet: the release builder's probes
            self.env, self.names, self.models = env, names, {}  # switch namespaces at every case
        seed(0)
        kept = self.models.pop(key, None)
        if kept is not None:
            model, state, rng = kept
            try:  # only what build itself kept: a model of this very class, with a snapshot of ours
                if (type(model) is cls and type(state) is ModelState and model.train() is model
                        and state.same(model)):
                    t.set_rng_state(rng)
                    self.models[key] = kept
                    return model
            except Exception:  # noqa: BLE001 - a model that cannot even be compared is built afresh
                pass
            seed(0)
        model = cls(**self.kwargs(key))
        if settled:
            rng = t.get_rng_state()
            try:
                self.models[key] = (model, ModelState(model), rng)
            except Exception:  # noqa: BLE001 - Unverifiable, or student code failing here: never reused
                pass
            finally:
                t.set_rng_state(rng)
        return model


class Fills:
    """Values a lesson fills parameters with, per key (seed, name, shape, say): drawn once per process (a draw
    depends on nothing else), then copied from here. An attribute of an object, never a module-level table (the
    grader's guard reads a changed module table as tampering)."""

    def __init__(self) -> None:
        self.values: dict[tuple, Any] = {}


__all__ = ["torch", "seed", "seeded", "run_probe_exact", "float64_mode", "Pristine", "pristine", "tables",
           "named_modules", "module_state", "own_attribute", "module_facts", "move", "write", "layout", "Unverifiable",
           "ModelState", "values_of", "same_values", "ModelCache", "Fills"]
