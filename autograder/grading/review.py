"""Reviewing a notebook's source outside the sandbox (in the grader process, never executing it): a reading of its
AST that flags reach (what can touch the grader's harness or the process's own machinery), not style.

Inside one CPython process nothing is out of reach (`gc`, `ctypes`, frame locals, closure cells, `as_strided`
writes), so a fact the student's process reports (how a module stores a table, where a tensor lives, whether the
guard saw tampering) is a claim. A case whose points rest on such a claim (`claim: true`) pays only when no flag
holds it, or once a TA has cleared the flags (a decisions file, read on every run); otherwise it is held for
review: not zeroed, not paid, and said in the results JSON, grades.csv and the TA report.

What it flags (each with its cell, line, source line and scope):
- `interpreter`: frames and the call stack (`sys._getframe`, `inspect.currentframe`/`stack`, `traceback`'s stack
  walks, `f_back`, `f_locals`, `tb_frame`, `gi_frame`), `gc`'s object walks (`get_objects`, `get_referrers`; not
  `gc.collect()`), `ctypes` and other reach through an attribute (`os.sys`, `np.ctypeslib`), `sys.modules` (but a
  membership test), `settrace`, audit hooks, code and frame types, processes and file descriptors (`os.system`,
  `os.write`, `subprocess`), `/proc/` paths;
- `dunder`: code and function objects (`__code__`, `__globals__`, `__closure__`, `__defaults__`, `__self__`,
  `__builtins__`, `__subclasses__`, a module's `__dict__`), any write to a dunder but a name or docstring, and the
  hooks that intercept the harness (`__getattribute__`, `__del__`, `__instancecheck__`, numpy's overrides);
- `rebinding`: a write to another module's attribute or into one (`np.allclose = ...`, `sys.modules[k] = ...`,
  `nn.Module.forward = ...`, `setattr` on one, a mutating call), configuration surfaces excepted (`os.environ`,
  `torch.backends`, `rcParams`, `pandas.options`); `global` naming an imported module;
- `torch internals`: torch's dispatch and override machinery (modes, `__torch_function__`, `torch.overrides`,
  `torch.library`, global module hooks), `as_strided`, a private attribute of a library (`torch._C`);
- `harness`: the grader's package (`autograder`) and the harness's names (`run_probe`, `PROBES`, `TamperGuard`);
- `dynamic`: exec, eval, compile, `__import__`, breakpoint; getattr, setattr, delattr (and attrgetter,
  `object.__getattribute__`, ...) with a name that does not resolve (review_scope.Names; on `self`, any name is
  one's own); those builtins used as
  values; `vars()` of a module; `importlib` beyond `reload`/`import_module` of a literal; `get_ipython()` kept;
- `import`: importing a module that is reach by itself (`ctypes`, `autograder`, `subprocess`, `torch.overrides`),
  a private module, a reaching name (`from gc import get_objects`), or `*` (but from math);
- `magic`: an IPython magic outside a short allow-list; `unreviewable`: a cell nested too deeply to walk;
- `tripwire`: a reach event the sandbox's run-time tripwire recorded (reviewed(events=...)).
Not flagged: imports of standard modules for ordinary use (sys, inspect, logging, IPython.display), `type(x).__name__`
and `self.__class__.__name__`, `vars()` of one's own objects, `getattr(nn, cfg["act"])` where the name resolves,
and device queries (`torch.cuda.is_available()`, `x.is_cuda`, `x.device`): device cases are decided at run time.

Scope (review_scope): a flag inside a question's graded code (the function or class its `solution:` names and the
notebook functions it calls) holds that question's claim cases only; a flag anywhere else holds every question's.
"""

from __future__ import annotations

import ast
import hashlib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

from autograder.grading.gradebook import REVIEW_DECISIONS_FILE, Gradebook
from autograder.grading.review_rules import (
    AS_VALUES,
    CONFIG_SURFACES,
    DUNDER_WRITES_OK,
    DYNAMIC_CALLS,
    HARNESS_NAMES,
    MUTATORS,
    NAMED,
    REACH_ATTRS,
    REACH_DUNDERS,
    REACH_METHODS,
    REACH_NAMES,
    STAR_OK,
    TORCH_REACH,
    UNBOUND,
    is_dunder,
    module_rule,
    reach_module,
)
from autograder.grading.review_scope import ALL, Names, Scope, line_scope, question_scopes
from autograder.model import Reason
from autograder.pyast import parse
from autograder.sandbox import NotebookError, read_notebook

MAX_EVENTS = 100  # run-time tripwire records turned into flags one by one (a run may record many)
_MAGIC = re.compile(r"^\s*[%!]")
_CODE_MAGICS = frozenset({"time", "timeit", "capture", "prun"})  # their text is Python code, reviewed as such
_PLAIN_MAGICS = frozenset({"matplotlib", "load_ext", "autoreload", "config", "pip", "env", "precision", "ls",
                           "pwd", "who", "whos"})


@dataclass(frozen=True)
class Flag:
    """One reviewed line a TA should look at; `scope`: the questions whose claim cases it holds, or ALL."""

    kind: str
    cell: int
    line: int
    code: str
    why: str
    scope: Scope = ALL

    def text(self) -> str:
        where = "" if self.scope == ALL else f" (holds {', '.join(self.scope)} only)"
        return f"cell {self.cell} line {self.line}: {self.kind}: {self.why}: {self.code}{where}"


class _Reader(ast.NodeVisitor):
    """One cell's flags; `modules` (names bound to imported modules) carries over from the cells before."""

    def __init__(self, lines: list[str], *, modules: dict[str, str], attrs: set[str],
                 names: Callable[[], Names]) -> None:
        self.lines, self.modules, self._names = lines, modules, names
        self.attrs = attrs  # the names in `modules` bound to a module's attribute (from-imports, aliases)
        self.flags: list[_Raw] = []
        self.chain: list[ast.AST] = []  # the functions, lambdas and classes around the node visited
        self.owner: str | None = None  # the top-level definition around the node visited (None: outside every one)
        self.shell_calls: set[int] = set()  # get_ipython() calls IPython's transformer wrote for a magic or `!`
        self.handled: set[int] = set()  # attribute nodes a call already judged (object.__setattr__(self, "x", v))

    @property
    def names(self) -> Names:
        """The notebook's names (review_scope.Names): the one part of a cell's reading that depends on other cells."""
        return self._names()

    def flag(self, node: ast.AST, kind: str, why: str) -> None:
        line = getattr(node, "lineno", 0)
        code = self.lines[line - 1].strip() if 0 < line <= len(self.lines) else ""
        self.flags.append((kind, line, code[:160], why, self.owner))

    # ------------------------------------------------------------------ imports and names
    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            rule = reach_module(alias.name)
            if rule is not None:
                self.flag(node, *rule)
            self.modules[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else \
                alias.name.split(".")[0]
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        if node.level:  # relative: a notebook has no package, nothing is imported
            return
        rule = reach_module(base)
        if rule is not None:
            self.flag(node, *rule)
        for alias in node.names:
            if alias.name == "*":
                if base not in STAR_OK:
                    self.flag(node, "import", f"imports * from {base} (names the review cannot follow)")
                continue
            rule = module_rule(base, alias.name) or reach_module(f"{base}.{alias.name}")
            if alias.name in TORCH_REACH:
                rule = ("torch internals", f"imports {alias.name} from {base}")
            elif alias.name in HARNESS_NAMES:
                rule = ("harness", f"imports the harness's {alias.name}")
            elif alias.name in REACH_DUNDERS or alias.name in REACH_ATTRS:
                rule = ("import", f"imports {alias.name} from {base}")
            if rule is not None:
                self.flag(node, rule[0], f"imports {alias.name} from {base}")
            self.modules[alias.asname or alias.name] = f"{base}.{alias.name}"  # its attributes are a library's
            self.attrs.add(alias.asname or alias.name)
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        """`P = mod.TABLE` makes P another module's object (a write into it is a write into the module's);
        `name = <anything else>` ends what the name was."""
        self.generic_visit(node)
        path = self._library_path(node.value) if isinstance(node.value, (ast.Name, ast.Attribute, ast.Subscript)) \
            else None
        for target in node.targets:
            if isinstance(target, ast.Name):
                if path is not None:
                    self.modules[target.id] = path
                    self.attrs.add(target.id)
                else:
                    self.modules.pop(target.id, None)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in ("__builtins__", "__import__", "__loader__", "__spec__"):
            self.flag(node, "dunder", f"reads {node.id}")
        elif node.id in AS_VALUES and isinstance(node.ctx, ast.Load) and id(node) not in self.handled:
            self.flag(node, "dynamic", f"uses {node.id} as a value")
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str):
            if "/proc/" in node.value or "/dev/mem" in node.value:
                self.flag(node, "interpreter", "names a process's memory or state under /proc")
            parts = node.value.split(".") if node.value.replace(".", "").replace("_", "").isalnum() else []
            hit = [p for p in parts if p in REACH_DUNDERS or p in REACH_ATTRS - {"sys", "gc", "inspect"}]
            if hit:
                self.flag(node, "dunder" if is_dunder(hit[0]) else "interpreter", f"names {hit[0]}")
            elif any(p in HARNESS_NAMES for p in parts):
                self.flag(node, "harness", f"names the harness's {node.value}")
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            path = self._inside_library(node.value)
            if path is not None:
                self.flag(node, "rebinding", f"writes into {path}, another module's")
        self.generic_visit(node)

    def visit_Global(self, node: ast.Global) -> None:
        hit = [n for n in node.names if n in self.modules]
        if hit:
            self.flag(node, "rebinding", f"rebinds the module name {', '.join(hit)}")
        self.generic_visit(node)

    # ------------------------------------------------------------------ attributes
    def _inside_library(self, node: ast.AST) -> str | None:
        """The dotted path of `node` when it is an object held by an imported module (`sys.modules`, a from-imported
        table), not a module itself, and no configuration surface (CONFIG_SURFACES)."""
        path, depth = self._library_path(node), 0
        while isinstance(node, (ast.Attribute, ast.Subscript)):
            depth, node = depth + 1, node.value
        if path is None or path.startswith(CONFIG_SURFACES):
            return None
        return path if depth or (isinstance(node, ast.Name) and node.id in self.attrs) else None

    def _library_path(self, node: ast.AST) -> str | None:
        """The dotted path of an imported module (or a library class) and the attributes read off it: `nn.Module`
        -> "torch.nn.Module"; None when `node` is not rooted at an imported name (subscripts are passed over)."""
        attrs: list[str] = []
        while isinstance(node, (ast.Attribute, ast.Subscript)):
            if isinstance(node, ast.Attribute):
                attrs.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name) or node.id not in self.modules:
            return None
        return ".".join([self.modules[node.id], *reversed(attrs)])

    def _attribute(self, node: ast.AST, owner: ast.AST | None, attr: str, *, write: bool) -> None:
        """Judge reading (or writing) `owner.attr` (owner None: an object the review cannot see)."""
        path = self._library_path(owner) if owner is not None else None
        if is_dunder(attr):
            if write and attr not in DUNDER_WRITES_OK:
                self.flag(node, "dunder", f"writes {attr}")
            elif attr in ("__torch_function__", "__torch_dispatch__"):
                self.flag(node, "torch internals", f"reaches {attr}")
            elif attr in REACH_DUNDERS or (attr == "__dict__" and path is not None):
                self.flag(node, "dunder", f"reaches {attr}")
        elif attr in TORCH_REACH:
            self.flag(node, "torch internals", f"uses {attr}")
        elif attr in REACH_ATTRS:
            self.flag(node, "interpreter", f"reaches {attr}")
        elif attr in HARNESS_NAMES:
            self.flag(node, "harness", f"reaches the harness's {attr}")
        elif path is not None and attr.startswith("_"):
            self.flag(node, "torch internals", f"reads the private {attr} of a library")
        elif path is not None and (rule := module_rule(path, attr)) is not None:
            if not (attr == "modules" and self._membership(node)):
                self.flag(node, rule[0], f"{rule[1]} ({attr})")
        if write and path is not None and not f"{path}.{attr}".startswith(CONFIG_SURFACES):
            self.flag(node, "rebinding", f"rebinds {attr} of a library module or class")

    def _membership(self, node: ast.AST) -> bool:
        parent = self.names.parents.get(id(node))
        return isinstance(parent, ast.Compare) and all(isinstance(o, (ast.In, ast.NotIn)) for o in parent.ops) \
            and node in parent.comparators

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if id(node) not in self.handled:
            self._attribute(node, node.value, node.attr, write=isinstance(node.ctx, (ast.Store, ast.Del)))
        self.generic_visit(node)

    # ------------------------------------------------------------------ calls
    def _magic(self, node: ast.Call, method: str) -> None:
        """IPython's magics, as its transformer writes them: the code of %time, %%capture and the like is read as
        the cell's own; a magic outside the allow-list is flagged (it may run code the review cannot see)."""
        args = [a.value if isinstance(a, ast.Constant) and isinstance(a.value, str) else None for a in node.args]
        name = args[0] if args else None
        code = (args[2] if method == "run_cell_magic" and len(args) > 2 else args[1] if len(args) > 1 else None)
        if name in _CODE_MAGICS and code is not None:
            tree = _parsed(code)
            if tree is not None:
                self.visit(tree)
        elif name not in _PLAIN_MAGICS:
            self.flag(node, "magic", f"runs the magic {name or 'named at run time'}")

    def _named(self, node: ast.Call, fn: str, owner: ast.AST | None, key: ast.AST | None, write: bool) -> None:
        """getattr-like calls: the name must resolve; each name it can be is judged as `owner.name` is."""
        got = self.names.strings(key, self.chain, owner=owner, reach=REACH_NAMES) if key is not None else None
        if got is None and fn in ("getattr", "setattr", "hasattr", "delattr") and isinstance(owner, ast.Name) \
                and owner.id == "self":
            return  # one's own attributes (`setattr(self, k, v)` over kwargs): what they lead to is judged where used
        if got is None:
            self.flag(node, "dynamic", f"{fn} with a name that does not resolve")
            return
        for name in sorted(got):
            parts = name.split(".") if fn == "attrgetter" else [name]
            for part in parts:
                self._attribute(node, owner, part, write=write)

    def _shell(self, node: ast.Call, fn: ast.expr, name: str | None) -> None:
        shell = isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Call) and \
            isinstance(fn.value.func, ast.Name) and fn.value.func.id == "get_ipython"
        if shell:
            self.shell_calls.add(id(fn.value))
            self.handled.add(id(fn.value.func))  # type: ignore[union-attr]
            if fn.attr in ("run_line_magic", "run_cell_magic"):  # type: ignore[union-attr]
                self._magic(node, fn.attr)  # type: ignore[union-attr]
            elif fn.attr not in ("system", "getoutput"):  # type: ignore[union-attr]  # `!cmd` and `x = !cmd`
                self.flag(node, "dynamic", f"uses the shell's {fn.attr}")  # type: ignore[union-attr]
        elif name == "get_ipython" and id(node) not in self.shell_calls:
            self.flag(node, "dynamic", "keeps IPython's shell (get_ipython())")

    def visit_Call(self, node: ast.Call) -> None:
        fn = node.func
        name = fn.id if isinstance(fn, ast.Name) else None
        if isinstance(fn, ast.Name):
            self.handled.add(id(fn))
        self._shell(node, fn, name)
        if name in DYNAMIC_CALLS:
            self.flag(node, "dynamic", f"calls {name}")
        if name == "vars" and node.args and self._library_path(node.args[0]) is not None:
            self.flag(node, "dynamic", "vars() of a module or library class")
        if name == "open" and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, int):
            self.flag(node, "interpreter", "opens a file descriptor by number")
        called = name or (fn.attr if isinstance(fn, ast.Attribute) else "")
        if called == "import_module" and node.args:
            got = self.names.strings(node.args[0], self.chain)
            rule = None if got is None else next(filter(None, map(reach_module, sorted(got))), None)
            if got is None or rule is not None:
                self.flag(node, "dynamic", "imports a module named at run time" if got is None else rule[1])
        if called in NAMED and (name is not None or self._library_path(fn) is not None):
            at, key, write = NAMED[called]
            if isinstance(fn, ast.Attribute):
                self.handled.add(id(fn))
            args = node.args
            if len(args) > key:
                self._named(node, called, args[at] if at is not None else None, args[key], write)
            elif at is not None or not args:
                self.flag(node, "dynamic", f"{called} with a name that does not resolve")
        elif isinstance(fn, ast.Attribute) and fn.attr in UNBOUND:
            self.handled.add(id(fn))
            unbound = isinstance(fn.value, ast.Name) and fn.value.id in ("object", "type") or \
                self._library_path(fn.value) is not None
            owner, args = (node.args[0] if node.args else None, node.args[1:]) if unbound else (fn.value, node.args)
            self._named(node, fn.attr, owner, args[0] if args else None, UNBOUND[fn.attr])
        if called in MUTATORS:
            targets = [fn.value] if isinstance(fn, ast.Attribute) else []
            targets += node.args[:1] if called in ("setitem", "delitem", "__setitem__", "__delitem__", "update") \
                else []
            for target in targets:
                path = self._inside_library(target)
                if path is not None:
                    self.flag(node, "rebinding", f"changes {path}, another module's")
                    break
        self.generic_visit(node)

    # ------------------------------------------------------------------ definitions and their scope
    def _definition(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda) -> None:
        outer = self.owner
        if not self.chain and not isinstance(node, ast.Lambda) and self.owner is None:
            self.owner = node.name  # its flags hold the questions whose graded code it is (resolved in review_cells)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in REACH_METHODS:
            kind = "torch internals" if "torch" in node.name else "dunder"
            self.flag(node, kind, f"defines {node.name}")
        for deco in getattr(node, "decorator_list", []):
            self.visit(deco)
        self.chain.append(node)
        for field, value in ast.iter_fields(node):
            if field == "decorator_list":
                continue
            for child in value if isinstance(value, list) else [value]:
                if isinstance(child, ast.AST):
                    self.visit(child)
        self.chain.pop()
        self.owner = outer

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = visit_Lambda = _definition


CACHED_CELL_CHARS = 20_000  # a longer cell (rare) is parsed and read afresh in each notebook: the caches stay small


def _parsed(source: str) -> ast.Module | None:
    """_parse_cell, kept per cell text for the cells of ordinary length (a class shares most of them)."""
    return _parsed_kept(source) if len(source) <= CACHED_CELL_CHARS else _parse_cell(source)


def _parse_cell(source: str) -> ast.Module | None:
    """A cell's AST as IPython runs it (magics, shell escapes and `x = !cmd` turned into Python by IPython's own
    transformer, only for a cell plain Python cannot parse); None: it does not parse, so it never ran."""
    try:
        return parse(source)
    except (SyntaxError, ValueError):
        pass
    except (RecursionError, MemoryError):
        return None
    try:
        from IPython.core.inputtransformer2 import TransformerManager  # the sandbox's own shell: installed

        return parse(TransformerManager().transform_cell(source))
    except Exception:  # noqa: BLE001 - IPython cannot run it either: the cell raised SyntaxError and ran nothing
        text = "\n".join("" if _MAGIC.match(line) else line for line in source.splitlines())
        try:
            return parse(text)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None


_parsed_kept = lru_cache(maxsize=2048)(_parse_cell)


def _tripwire_flag(event: Any, *, lines: Mapping[int, list[str]], trees: Mapping[int, ast.AST | None],
                   scopes: Callable[[], Mapping[str, tuple[str, ...]]]) -> Flag:
    """A run-time tripwire record ({"event", "cell", "line", "detail"}: the sandbox's) as a flag on the line it
    names, scoped as a static flag on that line would be; a record the grader cannot read holds every question."""
    data = event if isinstance(event, dict) else {}
    cell, line = data.get("cell"), data.get("line")
    cell = cell if type(cell) is int else -1
    line = line if type(line) is int else 0
    source = lines.get(cell, [])
    code = source[line - 1].strip()[:160] if 0 < line <= len(source) else ""
    what = " ".join(str(data.get("event", "an unreadable record")).split())[:80]
    detail = " ".join(str(data.get("detail", "")).split())[:160]
    scope = line_scope(trees.get(cell), line, scopes()) if code else ALL
    return Flag("tripwire", cell, line, code, f"the run-time tripwire saw {what}" + (f" ({detail})" if detail else ""),
                scope)


_Raw = tuple[str, int, str, str, str | None]  # a flag as a cell's reading finds it: kind, line, code, why, owner
_Reading = tuple[tuple[_Raw, ...], frozenset[tuple[str, str]], frozenset[str]]  # flags, the modules and attrs after


class _NeedsNames(Exception):  # noqa: N818 - a signal, not an error: the reading depends on other cells
    """A cell's reading asked for the notebook's names: it is not the cell's own, so it is not kept."""


def _no_names() -> Names:
    raise _NeedsNames


@lru_cache(maxsize=4096)
def _cell_reading(tree_source: str, source: str, modules: frozenset[tuple[str, str]],
                  attrs: frozenset[str]) -> _Reading:
    """One cell's flags and the modules and attributes bound after it, given those bound before it, kept per cell
    text (a class shares most cells). Every input of the reading is in the key but the notebook's names (the other
    cells), which a few calls need (getattr with a computed name, a membership test of sys.modules): such a cell
    raises _NeedsNames and is read afresh in its notebook. A cell nested too deeply to walk is read afresh too."""
    tree = _parsed(tree_source)
    if tree is None:
        return (), modules, attrs
    reader = _Reader(source.splitlines(), modules=dict(modules), attrs=set(attrs), names=_no_names)
    try:
        reader.visit(tree)
    except RecursionError:
        raise _NeedsNames from None
    return tuple(reader.flags), frozenset(reader.modules.items()), frozenset(reader.attrs)


def review_cells(cells: Iterable[tuple[int, str]], *, graded: Mapping[str, Iterable[str]],
                 events: Sequence[Any] = ()) -> list[Flag]:
    """The flags of a notebook's code cells (cell index, source), each scoped; `graded`: question id -> the names
    of its graded functions and classes (its `solution:`); `events`: the run-time tripwire's records of its run.
    A cell's reading is kept per cell text and what the cells before it imported (_cell_reading); the notebook's
    parse, names and scopes are made only when something needs them."""
    cells = list(cells)
    sources = {index: source for index, source in cells}
    made: dict[str, Any] = {}

    def trees() -> dict[int, ast.Module | None]:
        if "trees" not in made:
            made["trees"] = {index: _parsed(source) for index, source in sources.items()}
        return made["trees"]  # type: ignore[no-any-return]

    def names() -> Names:
        if "names" not in made:
            made["names"] = Names([t for t in trees().values() if t is not None])
        return made["names"]  # type: ignore[no-any-return]

    def scopes() -> dict[str, tuple[str, ...]]:
        if "scopes" not in made:
            made["scopes"] = question_scopes([t for t in trees().values() if t is not None], graded)
        return made["scopes"]  # type: ignore[no-any-return]

    bound: dict[str, str] = {}
    attrs: set[str] = set()
    raw: list[tuple[int, _Raw]] = []
    for index, source in cells:
        try:
            if len(source) > CACHED_CELL_CHARS or len(sources[index]) > CACHED_CELL_CHARS:
                raise _NeedsNames
            found, after, named = _cell_reading(sources[index], source, frozenset(bound.items()), frozenset(attrs))
        except _NeedsNames:
            found = _read_here(_parsed(sources[index]), source, modules=bound, attrs=attrs, names=names)
        else:
            bound.clear()
            bound.update(after)
            attrs.clear()
            attrs.update(named)
        raw += [(index, r) for r in found]
    flags = [Flag(kind, index, line, code, why, ALL if owner is None else scopes().get(owner, ALL))
             for index, (kind, line, code, why, owner) in raw]
    lines = {index: source.splitlines() for index, source in cells}
    flags += [_tripwire_flag(e, lines=lines, trees=trees(), scopes=scopes) for e in list(events)[:MAX_EVENTS]]
    if len(events) > MAX_EVENTS:  # the first ones name the lines; the rest are counted, held for every question
        flags.append(Flag("tripwire", -1, 0, "", f"and {len(events) - MAX_EVENTS} more run-time tripwire records"))
    seen: dict[tuple[str, int, int, str], Flag] = {}  # one flag per kind and line: the first reason found
    for f in flags:
        seen.setdefault((f.kind, f.cell, f.line, f.code), f)
    return list(seen.values())


def _read_here(tree: ast.Module | None, source: str, *, modules: dict[str, str], attrs: set[str],
               names: Callable[[], Names]) -> list[_Raw]:
    """One cell's reading in its notebook (its names at hand), changing `modules` and `attrs` in place."""
    if tree is None:
        return []
    reader = _Reader(source.splitlines(), modules=modules, attrs=attrs, names=names)
    try:
        reader.visit(tree)
    except RecursionError:  # nested past what a walk can read: unreviewed is not clean
        reader.owner = None
        reader.flag(tree, "unreviewable", "the cell is nested too deeply to review")
    return reader.flags


def review_notebook(source: bytes | None, *, graded: Mapping[str, Iterable[str]],
                    events: Sequence[Any] = ()) -> list[Flag]:
    """review_cells over a submitted notebook's bytes (every code cell the sandbox runs; none when unreadable: then
    only its tripwire records, held for every question)."""
    cells: list[tuple[int, str]] = []
    if source is not None:
        try:
            cells, _ = read_notebook(source)
        except NotebookError:
            cells = []
    return review_cells(cells, graded=graded, events=events)


def digest(flags: list[Flag]) -> str:
    """What a TA's decision clears: the flagged lines (kind and code, not their positions), so a re-run keeps the
    decision and a changed flagged line asks again."""
    text = "\n".join(sorted(f"{f.kind}\0{f.code}" for f in flags))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# --------------------------------------------------------------------------- a TA's decisions

DECISIONS_FILE = REVIEW_DECISIONS_FILE  # in the grades folder: submission id -> the digest a TA cleared
DECISIONS_HELP = (f"to clear a submission's review flags, add a line `<submission id>: <digest>` (the digest its "
                  f"results JSON gives under review) to {DECISIONS_FILE} in the output folder and grade again")


def review_decisions(book: Gradebook) -> dict[str, str]:
    """The TA's review decisions of a grades folder (submission id -> cleared digest); an unreadable file is an
    error naming it."""
    return book.review_decisions(help_text=DECISIONS_HELP)


def review_record(flags: list[Flag], *, cleared: str | None) -> dict[str, Any]:
    """The results JSON's `review` block."""
    d = digest(flags)
    return {"flags": [asdict(f) for f in flags], "digest": d, "cleared": bool(flags) and cleared == d,
            "decision": cleared}


def held_questions(flags: Iterable[Flag]) -> set[str] | None:
    """The questions whose claim cases `flags` hold; None: every question's."""
    held: set[str] = set()
    for f in flags:
        if f.scope == ALL:
            return None
        held.update(f.scope)
    return held


def hold_claims(result: Any, claims: set[str], flags: list[Flag], *, cleared: str | None) -> dict[str, Any]:
    """Hold the passed claim cases of `result` (a SubmissionResult) of the questions in the flags' scope while the
    flags are not cleared: no points, the message says why and where; a note for the TA and the grades.csv message
    names the lines. Returns the review block for the results JSON."""
    record = review_record(flags, cleared=cleared)
    if not flags or record["cleared"]:
        if flags:
            result.notes.append(f"review: {len(flags)} flag(s) cleared by a TA ({record['digest']})")
        return record
    lines = "; ".join(f.text() for f in flags[:5]) + (f"; and {len(flags) - 5} more" if len(flags) > 5 else "")
    scope = held_questions(flags)
    held = 0
    for case in result.cases:
        if case.id in claims and case.passed and (scope is None or case.question in scope):
            held += 1
            case.points, case.passed, case.reason = 0.0, False, Reason.HELD
            case.message = (f"{case.id}: held for review: this case rests on a fact your code reports about itself, "
                            "and a part of your notebook needs a person's look; its points follow their decision.")
    which = "" if scope is None else f" of {', '.join(sorted(scope))} only"
    result.notes.append(f"review: {len(flags)} flag(s), {held} case(s){which} held for TA review (digest "
                        f"{record['digest']}): {lines}")
    record["held"] = held
    record["scope"] = ALL if scope is None else sorted(scope)
    return record


def reviewed(suite: Any, source: bytes | None, result: Any, *, cleared: str | None,
             events: Sequence[Any] = ()) -> dict[str, Any]:
    """Review a submission's notebook for `suite` (its questions' solutions: the graded code; its claim cases) and
    hold `result`'s claim cases while flags stand; `events`: the sandbox's run-time tripwire records of its run
    (ExecResult.tripwire), each a flag on its line. The results JSON's `review` block."""
    graded = {q.id: list(getattr(q, "solution", ())) for q in suite.questions}
    flags = review_notebook(source, graded=graded, events=events)
    return hold_claims(result, {c.id for c in suite.cases if c.claim}, flags, cleared=cleared)
