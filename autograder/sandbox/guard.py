"""The tamper guard: identities recorded before student code runs, reported and undone after each step."""

from __future__ import annotations

import ast
import contextlib
import functools
import gc
import importlib
import importlib.util
import itertools
import logging
import operator
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from autograder import wire
from autograder.runtime import runtime_modules
from autograder.sandbox.frames import CANARY

log = logging.getLogger(__name__)

_GUARDED = (
    ("numpy", "allclose"), ("numpy", "isclose"), ("numpy", "array_equal"), ("numpy", "ndarray"),
    ("numpy", "asarray"), ("numpy", "array"), ("numpy", "ascontiguousarray"), ("numpy", "frombuffer"),
    ("numpy", "abs"), ("numpy", "isnan"), ("numpy", "isfinite"), ("numpy", "concatenate"),
    ("numpy", "diagonal"), ("numpy", "empty"), ("numpy", "arange"), ("numpy", "sin"), ("numpy", "cos"),
    ("numpy", "dtype"), ("numpy", "generic"), ("numpy.linalg", "norm"),
    ("numpy.testing", "assert_allclose"), ("numpy.testing", "assert_array_equal"),
    ("numpy.testing", "assert_array_almost_equal"), ("numpy.testing", "assert_equal"),
    ("torch", "allclose"), ("torch", "isclose"), ("torch", "equal"), ("torch", "Tensor"),
    ("torch", "tensor"), ("torch", "randn"), ("torch", "randint"), ("torch", "randperm"),
    ("torch", "zeros"), ("torch", "zeros_like"), ("torch", "arange"), ("torch", "manual_seed"),
    ("torch", "Generator"), ("torch", "no_grad"), ("torch", "float64"), ("torch", "float32"),
    ("torch.testing", "assert_close"), ("torch", "Tensor.__eq__"), ("torch", "Tensor.allclose"),
    *(("torch", f"Tensor.{m}") for m in ("detach", "cpu", "clone", "numpy", "float", "to", "norm", "pow",
                                          "sum", "backward", "__matmul__", "__getitem__", "__array__")),
    ("torch.nn", "Parameter"), ("torch.nn", "Embedding"), ("torch.nn", "Module"),
    *(("torch.nn", f"Module.{m}") for m in ("__call__", "_call_impl", "parameters", "named_parameters",
                                             "named_buffers", "buffers", "modules", "state_dict", "to",
                                             "eval", "__getattr__", "__setattr__")),
    *(("torch.nn", f"Module.{m}") for m in ("_apply", "named_modules", "children", "named_children",
                                             "__getattribute__", "_save_to_state_dict")),
    ("json", "dumps"), ("json", "loads"), ("base64", "b64encode"), ("base64", "b64decode"),
    ("json", "JSONEncoder.encode"), ("json", "JSONEncoder.iterencode"), ("json", "JSONEncoder.default"),
    ("json.encoder", "c_make_encoder"), ("json.encoder", "encode_basestring_ascii"),
    ("json.encoder", "c_encode_basestring_ascii"), ("_json", "make_encoder.__call__"),
    ("_json", "encode_basestring_ascii"), ("binascii", "b2a_base64"),
    ("os", "write"), ("os", "read"), ("os", "_exit"),
)

SERVER_MODULE = "autograder.sandbox.zygote"  # what a worker starts: everything the child holds is imported from it


def _source(module: str) -> Path | None:
    """The file of an autograder module (a package's __init__.py), None when there is none."""
    base = Path(__file__).resolve().parents[1].joinpath(*module.split(".")[1:])
    return next((f for f in (base.with_suffix(".py"), base / "__init__.py")
                 if f.is_file() and (module != "autograder" or f.name == "__init__.py")), None)


def _imported(module: str) -> set[str]:
    """The autograder modules that `module` imports, at any depth of its code (a function's import too: it may run in
    the fork server before any student code), with the packages above them (imported with them)."""
    path = _source(module)
    text = path.read_text() if path else ""
    found: set[str] = set()
    for node in _run_time_imports(ast.parse(text)) if "autograder" in text else ():
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        else:
            continue
        for name in names:
            parts = name.split(".")
            found |= {".".join(parts[:n]) for n in range(1, len(parts) + 1)
                      if parts[0] == "autograder" and _source(".".join(parts[:n]))}
    return found


def _run_time_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of a module's tree, at any depth of its statements (an import is a statement: no
    expression is walked), but those under `if TYPE_CHECKING:` (imports a type checker alone follows)."""
    found, todo = [], [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
            continue
        skip = isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
        for field in ("orelse",) if skip else ("body", "orelse", "finalbody", "handlers", "cases"):
            value = getattr(node, field, None)
            if type(value) is list:
                todo += value
    return found


@functools.cache
def harness_modules() -> tuple[str, ...]:
    """The grader's own modules in the child, derived from the package: every autograder module that the fork server
    (SERVER_MODULE) imports, directly or through another, and the packages above them (sorted). Their globals (and
    function code) are recorded and restored: a module added to the child's imports is guarded without a list to
    edit (tests/engine/test_harness_modules.py compares it with what a child has loaded)."""
    found, todo = {SERVER_MODULE}, [SERVER_MODULE]
    while todo:
        for name in _imported(todo.pop()) - found:
            found.add(name)
            todo.append(name)
    return tuple(sorted(found))


def guarded_runtime() -> tuple[str, ...]:
    """The checks runtime's modules the probe module imports (autograder.runtime: every module shipped beside the
    lesson's checks), guarded as the harness is."""
    return runtime_modules()


_GUARDED_WHOLE = ("math", "operator")  # every attribute of these modules is recorded
_GUARDED_MODULES = ("builtins", "sys", "os", "json", "json.encoder", "_json", "base64", "binascii", "math",
                    "operator", "numpy", "numpy.testing", "numpy.linalg", "torch", "torch.testing", "torch.nn")


def __getattr__(name: str) -> tuple[str, ...]:
    """HARNESS_MODULES and GUARDED_MODULES (with the harness), derived when first asked for: the grader imports this
    module with the sandbox and never reads them."""
    if name == "HARNESS_MODULES":
        return harness_modules()
    if name == "GUARDED_MODULES":
        return (*_GUARDED_MODULES, *harness_modules())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class TamperGuard:
    """Identities of what a cheat would patch, recorded in the zygote before any student code runs.

    Besides module attributes, builtins, sys.modules and the harness modules' globals, the guard holds the frame
    encoder (wire.trusted_encoder, made here) with the code and closure it was made with, and the torch
    function/dispatch mode stacks. `unguarded` names tables of the probe module that only its local checks fill
    (never read by a probe: a notebook that runs its checks is honest). The guard lives in the child's memory, so
    student code can reach it with gc: what it reports is cross-checked by the grader with a check mark (`plant`),
    and the probes read module state through functions of their own, taken before student code ran.
    """

    _MISSING = object()

    def __init__(self, modules: list[str], *, unguarded: Iterable[str] = ()):
        self.attrs: list[tuple[Any, str, str, Any]] = []
        for mod, dotted in _GUARDED:
            try:
                owner: Any = importlib.import_module(mod)
            except ImportError:
                continue
            *path, attr = dotted.split(".")
            for part in path:
                owner = getattr(owner, part, None)
            if owner is not None:
                self.attrs.append((owner, attr, f"{mod}.{dotted}", owner.__dict__.get(attr, self._MISSING)))
        for mod in _GUARDED_WHOLE:
            module = importlib.import_module(mod)
            self.attrs += [(module, k, f"{mod}.{k}", v) for k, v in vars(module).items() if not k.startswith("__")]
        self.mark = _Mark()
        self.attrs.append((self.mark, "nonce", CANARY, self._MISSING))
        self.modules = {m: sys.modules[m] for m in modules if m in sys.modules}
        self.builtins = vars(self.modules["builtins"])
        self.builtins_snap = dict(self.builtins)
        self.globals = [(vars(self.modules[m]), m, dict(vars(self.modules[m])))
                        for m in dict.fromkeys((*harness_modules(), *guarded_runtime(), modules[-1]))
                        if m in self.modules]
        # the classes these modules define (the probes' helpers, the guard's own): their tables, and their methods'
        self.classes = [(c, len(vars(c)), tuple(vars(c).values()), dict(vars(c))) for _, name, snap in self.globals
                        for c in snap.values() if type(c) is type and c.__module__ == name]
        functions = [f for _, _, snap in self.globals for f in snap.values()]
        functions += [f for c, _, _, table in self.classes for f in table.values()]
        self.code = {id(f): (f, f.__code__, f.__defaults__, f.__kwdefaults__)
                     for f in functions if type(f) is type(_unchanged)}
        self.is_ = operator.is_
        # the same, as tuples for a check that loops in C (most sweeps find nothing changed)
        self.functions = tuple(e[0] for e in self.code.values())
        # What every guarded function refers to (its code, defaults and keyword defaults among them), in one C call
        # that raises one audit event (see _same_parts); reading `__code__` raises one per function and part, each a
        # call of the tripwire's hook.
        self.referents = gc.get_referents
        self.parts = tuple(self.referents(*self.functions))
        skip = {id(snap[k]) for k in unguarded for _, _, snap in self.globals[-1:] if k in snap}
        self.tables = {id(d): (d, dict(d)) for _, _, snap in self.globals
                       for d in snap.values() if type(d) is dict and id(d) not in skip}
        self.encode = wire.trusted_encoder()
        self.encoder_parts = _function_parts(self.encode)
        self.modes = _ModeStacks()
        # keys and values of each snapshot as tuples, for checks that loop in C (most sweeps find nothing changed)
        self.builtins_kv = (tuple(self.builtins_snap), tuple(self.builtins_snap.values()))
        self.globals_kv = [(tuple(snap), tuple(snap.values())) for _, _, snap in self.globals]
        self.tables_kv = {i: (tuple(snap), tuple(snap.values())) for i, (_, snap) in self.tables.items()}
        groups: dict[int, tuple[Any, list[str], list[Any]]] = {}
        self.absent = []
        for owner, attr, _, value in self.attrs:
            if value is self._MISSING:
                self.absent.append((owner.__dict__, attr))
            else:
                group = groups.setdefault(id(owner), (owner.__dict__, [], []))
                group[1].append(attr)
                group[2].append(value)
        self.attr_groups = [(d, tuple(keys), tuple(values)) for d, keys, values in groups.values()]
        # Every table above as one flat (table, key, value) sequence and every table whose size counts: the sweep
        # checks them all in one loop in C and repairs only when something changed (one sweep runs after every
        # cell and probe; the check mark is left out: it changes before every sweep and is checked on its own).
        mark_dict = id(self.mark.__dict__)
        flat = [(ns, k, v) for ns, keys, values in ((self.builtins, *self.builtins_kv),
                                                    *((ns, *kv) for (ns, _, _), kv in zip(self.globals,
                                                                                         self.globals_kv,
                                                                                         strict=True)),
                                                    *((d, *self.tables_kv[i]) for i, (d, _) in self.tables.items()),
                                                    *((vars(c), tuple(table), values) for c, _, values, table
                                                      in self.classes),
                                                    *(g for g in self.attr_groups if id(g[0]) != mark_dict))
                for k, v in zip(keys, values, strict=True)]
        # grouped by table: one itemgetter per table fetches its values in one C call (a single key is asked
        # twice, so that every getter returns a tuple), and one loop compares them all by identity
        by_table: dict[int, tuple[Any, list[Any], list[Any]]] = {}
        for ns, k, v in flat:
            entry = by_table.setdefault(id(ns), (ns, [], []))
            entry[1].append(k)
            entry[2].append(v)
        self.tables_of = tuple(ns for ns, _, _ in by_table.values())
        self.getters = tuple(operator.itemgetter(*(keys if len(keys) > 1 else keys * 2))
                             for _, keys, _ in by_table.values())
        self.flat_values = tuple(v for _, _, values in by_table.values() for v in (values if len(values) > 1
                                                                                    else values * 2))
        self.sized = tuple([d for d, _ in self.tables.values()] + [vars(c) for c, _, _, _ in self.classes])
        self.sizes = tuple([len(snap) for _, snap in self.tables.values()] + [n for _, n, _, _ in self.classes])
        self.module_kv = (tuple(self.modules), tuple(self.modules.values()))
        # What the first check runs with, taken now: student code can rebind builtins.all or this module's helpers,
        # and a check run with its versions would find nothing changed (so it would also skip the repair).
        self.ops = (all, any, map, len, tuple, _chain, _call_getter, sys.modules, Exception)
        self.unchanged = _unchanged
        self.absent_quiet = tuple((d, a) for d, a in self.absent if id(d) != mark_dict)

    def plant(self, nonce: str) -> None:
        """A change only the grader can predict (its nonce): a sweep that does not report it was switched off."""
        self.mark.nonce = nonce

    def check_encoder(self) -> list[str]:
        """Say whether the frame encoder's code or closure changed since the zygote made it, and restore it."""
        changed = False
        for fn, code, cells in self.encoder_parts:
            if fn.__code__ is not code:
                fn.__code__, changed = code, True
            for cell, value in cells:
                if cell.cell_contents is not value:
                    cell.cell_contents, changed = value, True
        return ["the grader's frame encoder was changed"] if changed else []

    def sweep(self) -> list[str]:
        """Say what changed since the snapshot and undo it all, builtins first so the rest can run.

        Most sweeps find nothing changed: one loop in C over every table says so (`_quiet`), and only then is
        each part compared and repaired one by one (`_repair`)."""
        return self._repair() if not self._quiet() else self._mark_and_code() + self.check_encoder() + \
            self.modes.sweep()

    def _quiet(self) -> bool:
        """Whether every recorded table holds what it held at the snapshot (the check mark aside)."""
        all_, any_, map_, len_, tuple_, chain, call, modules, error = self.ops
        is_ = self.is_
        try:
            same = all_(map_(is_, chain(map_(call, self.getters, self.tables_of)), self.flat_values))
            return (same and tuple_(map_(len_, self.sized)) == self.sizes
                    and not any_(a in d for d, a in self.absent_quiet)
                    and all_(map_(is_, map_(modules.__getitem__, self.module_kv[0]), self.module_kv[1])))
        except error:  # a key gone (KeyError), or a table that no longer answers
            return False

    def _mark_and_code(self) -> list[str]:
        """The check mark's report (see plant) and the guarded functions' code and defaults, repaired."""
        facts, mark = [], self.mark
        if mark.__dict__.get("nonce", self._MISSING) is not self._MISSING:
            facts.append(f"{CANARY} {mark.nonce}")
            with contextlib.suppress(AttributeError, TypeError):
                delattr(mark, "nonce")
        return facts + self._code_facts()

    def _same_parts(self) -> bool:
        """Whether every guarded function still refers to what it did at the snapshot, in order and by identity: a
        new code object, defaults or keyword defaults shows as a change (so does a function's `__dict__` made on
        first use, which `_code_facts` then finds harmless)."""
        all_, map_, len_ = self.ops[0], self.ops[2], self.ops[3]
        now = self.referents(*self.functions)
        return len_(now) == len_(self.parts) and all_(map_(self.is_, now, self.parts))

    def _code_facts(self) -> list[str]:
        """The guarded functions whose code or defaults changed, each reported and put back."""
        if self._same_parts():
            return []
        facts = []
        for f, code, defaults, kwdefaults in self.code.values():
            if f.__code__ is not code or f.__defaults__ is not defaults or f.__kwdefaults__ is not kwdefaults:
                facts.append(f"{f.__module__}.{f.__qualname__} was replaced (its code or defaults)")
                f.__code__, f.__defaults__, f.__kwdefaults__ = code, defaults, kwdefaults
        if not facts:  # a change that is not guarded (a `__dict__` made on first use): not compared again
            self.parts = tuple(self.referents(*self.functions))
        return facts

    def _repair(self) -> list[str]:
        """sweep's slow path: each part compared with its snapshot, every change reported and undone."""
        ns, snap, missing = self.builtins, self.builtins_snap, self._MISSING
        # builtins first, with no builtin: the rest of the repair runs with them restored
        facts = [f"builtins.{k} was replaced" for k, v in snap.items() if ns.get(k, missing) is not v]
        if facts:
            ns.update(snap)
        unchanged = self.unchanged  # this module's helper as it was: student code can rebind the global
        same = all(unchanged(d, k, v) for d, k, v in self.attr_groups) and not any(a in d for d, a in self.absent)
        for owner, attr, name, value in () if same else self.attrs:
            if owner.__dict__.get(attr, missing) is not value:
                facts.append(f"{name} was replaced" if owner is not self.mark else f"{name} {self.mark.nonce}")
                with contextlib.suppress(AttributeError, TypeError):
                    if value is missing:
                        delattr(owner, attr)
                    else:
                        setattr(owner, attr, value)
        for name, mod in self.modules.items():
            if sys.modules.get(name) is not mod:
                facts.append(f"sys.modules[{name!r}] was replaced")
                sys.modules[name] = mod
        for (ns, name, snap), kv in zip(self.globals, self.globals_kv, strict=True):
            if not unchanged(ns, *kv):
                facts += [f"{name}.{k} was replaced" for k, v in snap.items() if ns.get(k, missing) is not v]
                ns.update(snap)
        for cls, n, values, table in self.classes:
            now = vars(cls)
            if len(now) == n and all(map(self.is_, now.values(), values)):
                continue
            changed = [k for k, v in table.items() if now.get(k, missing) is not v]
            changed += [k for k in now if k not in table and k != "__slotnames__"]  # copy/pickle caches slot names
            if changed:
                facts.append(f"{cls.__module__}.{cls.__qualname__} was changed ({', '.join(changed[:3])})")
            for k in changed:
                with contextlib.suppress(AttributeError, TypeError):
                    if k in table:
                        setattr(cls, k, table[k])
                    else:
                        delattr(cls, k)
        facts += self._code_facts()
        for i, (d, snap) in self.tables.items():
            if len(d) == len(snap) and unchanged(d, *self.tables_kv[i]):
                continue
            if d.keys() != snap.keys() or any(d[k] is not v for k, v in snap.items()):
                facts.append(f"a table of the grader's modules was changed (keys {sorted(snap)[:3]})")
                d.clear()
                d.update(snap)
        return facts + self.check_encoder() + self.modes.sweep()


_chain = itertools.chain.from_iterable
_call_getter = operator.itemgetter.__call__  # getter(table) as map's function (operator.call is 3.11+)


def _unchanged(table: Any, keys: tuple[Any, ...], values: tuple[Any, ...], is_: Any = operator.is_) -> bool:
    """Whether table[k] is v for every k, v of keys, values (a loop in C; False when a key is gone)."""
    try:
        return all(map(is_, map(table.__getitem__, keys), values))
    except KeyError:
        return False


class _Mark:
    """Holds the grader's nonce between `TamperGuard.plant` and the sweep that must report it."""

    nonce: str | None = None


def _function_parts(fn: Any) -> list[tuple[Any, Any, list[tuple[Any, Any]]]]:
    """(function, its code, [(closure cell, its value)]) for fn and every function in its closure, recursively."""
    parts, todo, seen = [], [fn], set()
    while todo:
        f = todo.pop()
        if id(f) in seen:
            continue
        seen.add(id(f))
        cells = [(c, c.cell_contents) for c in f.__closure__ or ()]
        parts.append((f, f.__code__, cells))
        todo += [v for _, v in cells if type(v) is type(_function_parts)]
    return parts


class _ModeStacks:
    """torch's function and dispatch mode stacks and its torch-function switch, as they were in the zygote: a mode
    left active after a cell (or a torch._C.DisableTorchFunction left entered) changes what every later probe
    sees, so the sweep reports it and puts the stacks back."""

    def __init__(self) -> None:
        torch = sys.modules.get("torch")
        self.c = getattr(torch, "_C", None)
        names = ("_len_torch_function_stack", "_pop_torch_function_stack", "_len_torch_dispatch_stack",
                 "_pop_torch_dispatch_stack", "_get_torch_function_state", "_set_torch_function_state")
        self.fns = tuple(getattr(self.c, n, None) for n in names)
        if not all(self.fns):
            self.fns = ()
            return
        self.state = self.fns[4]()
        self.depths = (self.fns[0](), self.fns[2]())

    def sweep(self) -> list[str]:
        if not self.fns:
            return []
        fn_len, fn_pop, disp_len, disp_pop, get_state, set_state = self.fns
        facts = []
        if fn_len() > self.depths[0]:
            facts.append("a torch function mode (TorchFunctionMode) was left active")
            while fn_len() > self.depths[0]:
                fn_pop()
        if disp_len() > self.depths[1]:
            facts.append("a torch dispatch mode (TorchDispatchMode) was left active")
            while disp_len() > self.depths[1]:
                disp_pop(None)  # the innermost mode (None: of any key)
        if get_state() != self.state:
            facts.append("torch functions were left disabled (DisableTorchFunction)")
            set_state(self.state)
        return facts
