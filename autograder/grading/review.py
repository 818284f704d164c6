"""Reviewing a notebook's source outside the sandbox (in the grader process, never executing it): an allow-list
reading of its AST that flags interpreter reach and checks that can tell a probe from a real run.

Inside one CPython process nothing is out of reach (`gc`, `ctypes`, frame locals, closure cells, `as_strided`
writes), so a fact the student's process reports (how a module stores a table, where a tensor lives, whether the
guard saw tampering) is a claim. A case whose points rest on such a claim (`claim: true`) pays only when this
review raises no flag, or once a TA has cleared the flags (a decisions file, read on every run); otherwise it is
held for review: not zeroed, not paid, and said in the results JSON, grades.csv and the TA report.

What it flags (each with its cell, line and source line):
- `import`: a module outside the allow-list (ctypes, gc, sys, inspect, importlib, threading, ...);
- `dunder`: a dunder attribute, or a dunder method defined, outside the allow-list (`__code__`, `__globals__`,
  `__dict__`, `__class__`, `__torch_function__`, `__torch_dispatch__`, ...);
- `dynamic`: exec, eval, compile, __import__, locals, vars, breakpoint (globals() is the notebook's own
  namespace: a dunder key read from anything is flagged); getattr, setattr, delattr and
  hasattr with a computed or dunder name;
- `rebinding`: an assignment to an attribute of an imported module or of a library class (`np.allclose = ...`,
  `nn.Module.state_dict = ...`), setattr on one, or a `global` statement naming an imported module;
- `torch internals`: a private attribute of an imported module (`torch._C`), torch's overrides and dispatch modes
  (TorchFunctionMode, TorchDispatchMode), `as_strided`;
- `magic`: an IPython magic outside a short allow-list (the code of %time, %%capture and the like is reviewed
  as the cell's own; `!cmd` is allowed, its text read for /proc paths); `get_ipython()` kept or used otherwise;
- `unreviewable`: a cell nested too deeply to walk;
- `probe branch`: inside a graded function or class (the lesson's solution names), a branch on device
  availability, an active mode or the call stack (`torch.cuda.is_available()`, `x.is_meta`, `sys._getframe`).
A top-level `device = "cuda" if torch.cuda.is_available() else "cpu"` is not inside a graded function: no flag.
"""

from __future__ import annotations

import ast
import hashlib
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from autograder.grading.gradebook import REVIEW_DECISIONS_FILE, Gradebook
from autograder.model import Reason
from autograder.sandbox import NotebookError, read_notebook

# Modules a notebook may import: the numerical stack, the standard library's plain-data modules, the course's
# notebook tools; the lesson's shipped modules are added by the caller.
ALLOWED_MODULES = frozenset({
    "__future__", "math", "cmath", "numpy", "torch", "torch.nn", "torch.nn.functional", "torch.optim",
    "torch.utils.data", "torch.nn.init", "matplotlib", "matplotlib.pyplot", "collections", "itertools",
    "functools", "operator", "typing", "dataclasses", "random", "time", "string", "re", "json", "pathlib", "os",
    "os.path", "zipfile", "statistics", "fractions", "decimal", "copy", "warnings", "tqdm", "tqdm.auto", "pandas",
    "einops", "otter", "textwrap", "enum", "abc", "heapq", "bisect", "datetime", "pprint"})
# Dunder attributes and methods that reach nothing: construction, naming, the operators.
_OPERATORS = ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "neg", "pos", "abs", "radd",
              "rsub", "rmul", "rtruediv", "rmatmul", "iadd", "isub", "imul", "itruediv", "eq", "ne", "lt", "le",
              "gt", "ge", "hash", "bool", "len", "iter", "next", "contains", "getitem", "setitem", "delitem")
ALLOWED_DUNDERS = frozenset({f"__{n}__" for n in (
    "init", "name", "doc", "qualname", "repr", "str", "call", "enter", "exit", "post_init", "version", "main",
    "file", "all", *_OPERATORS)})
# globals() is the notebook's own namespace (the student's already); a dunder key read from it is flagged below.
_DYNAMIC_CALLS = frozenset({"exec", "eval", "compile", "__import__", "locals", "vars", "breakpoint"})
_NAMED_ATTR_CALLS = frozenset({"getattr", "setattr", "delattr", "hasattr"})
_TORCH_REACH = frozenset({"TorchFunctionMode", "TorchDispatchMode", "as_strided", "as_strided_", "overrides",
                          "_python_dispatch", "_C", "set_", "untyped_storage", "is_torch_function_mode_enabled",
                          "handle_torch_function", "has_torch_function"})
# Attributes that reach the interpreter from any object or module (os.sys, np.ctypeslib, a frame's locals).
_REACH_ATTRS = frozenset({"sys", "gc", "ctypes", "ctypeslib", "inspect", "builtins", "importlib", "_getframe",
                          "f_back", "f_locals", "f_globals", "f_code", "f_builtins", "gi_frame", "cr_frame",
                          "ag_frame", "tb_frame", "tb_next", "co_code", "mro"})
# In a graded function or class: what tells a probe or a trace from a real run.
_PROBE_TELLS = frozenset({"is_available", "device_count", "current_device", "is_initialized", "is_meta",
                          "is_fake", "_getframe", "currentframe", "extract_stack", "f_back", "f_code",
                          "f_locals", "_get_current_dispatch_mode", "_len_torch_function_stack",
                          "get_default_device", "is_compiling", "is_tracing", "is_scripting"})
_BRANCHES = (ast.If, ast.IfExp, ast.While, ast.Assert, ast.BoolOp, ast.comprehension, ast.Match)
_MAGIC = re.compile(r"^\s*[%!]")
_CODE_MAGICS = frozenset({"time", "timeit", "capture", "prun"})  # their text is Python code, reviewed as such
_PLAIN_MAGICS = frozenset({"matplotlib", "load_ext", "autoreload", "config", "pip", "env", "precision", "ls",
                           "pwd", "who", "whos"})


@dataclass(frozen=True)
class Flag:
    """One reviewed line a TA should look at."""

    kind: str
    cell: int
    line: int
    code: str
    why: str

    def text(self) -> str:
        return f"cell {self.cell} line {self.line}: {self.kind}: {self.why}: {self.code}"


def _dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


class _Reader(ast.NodeVisitor):
    """One cell's flags; `modules` (names bound to imported modules) carries over from the cells before."""

    def __init__(self, cell: int, lines: list[str], *, modules: dict[str, str], allowed: frozenset[str],
                 graded: frozenset[str]) -> None:
        self.cell, self.lines, self.modules, self.allowed, self.graded = cell, lines, modules, allowed, graded
        self.flags: list[Flag] = []
        self.in_graded = 0
        self.shell_calls: set[int] = set()  # get_ipython() calls IPython's transformer wrote for a magic or `!`

    def flag(self, node: ast.AST, kind: str, why: str) -> None:
        line = getattr(node, "lineno", 0)
        code = self.lines[line - 1].strip() if 0 < line <= len(self.lines) else ""
        self.flags.append(Flag(kind, self.cell, line, code[:160], why))

    # ------------------------------------------------------------------ imports and names
    def _module_allowed(self, name: str) -> bool:
        """On the allow-list: the name itself, or (outside torch, whose submodules are listed one by one) its top
        package; never a private part (torch.utils._python_dispatch)."""
        parts = name.split(".")
        if name != "__future__" and any(p.startswith("_") for p in parts):
            return False
        return name in self.allowed or (parts[0] != "torch" and parts[0] in self.allowed)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if not self._module_allowed(alias.name):
                self.flag(node, "import", f"imports {alias.name}")
            self.modules[alias.asname or alias.name.split(".")[0]] = alias.name
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        if node.level or not self._module_allowed(base):
            self.flag(node, "import", f"imports from {base or '.'}")
        for alias in node.names:
            if alias.name in _TORCH_REACH or alias.name.startswith("_") or alias.name == "*":
                kind = "torch internals" if alias.name in _TORCH_REACH else "import"
                self.flag(node, kind, f"imports {alias.name} from {base}")
            self.modules[alias.asname or alias.name] = f"{base}.{alias.name}"  # its attributes are a library's
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in ("__builtins__", "__import__", "__loader__", "__spec__"):
            self.flag(node, "dunder", f"reads {node.id}")
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and ("/proc/" in node.value or "/dev/mem" in node.value):
            self.flag(node, "interpreter", "names a process's memory or state under /proc")
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        key = node.slice
        if isinstance(key, ast.Constant) and isinstance(key.value, str) and _dunder(key.value) \
                and key.value not in ALLOWED_DUNDERS:
            self.flag(node, "dunder", f"reads the key {key.value}")
        self.generic_visit(node)

    def visit_Global(self, node: ast.Global) -> None:
        hit = [n for n in node.names if n in self.modules]
        if hit:
            self.flag(node, "rebinding", f"rebinds the module name {', '.join(hit)}")
        self.generic_visit(node)

    # ------------------------------------------------------------------ attributes
    def _root(self, node: ast.AST) -> str | None:
        while isinstance(node, ast.Attribute):
            node = node.value
        return node.id if isinstance(node, ast.Name) else None

    def _on_library(self, node: ast.AST) -> bool:
        """node is an imported module or library class, or an attribute of one (torch.nn.Module)."""
        root = self._root(node)
        return root is not None and root in self.modules

    def visit_Attribute(self, node: ast.Attribute) -> None:
        attr = node.attr
        if _dunder(attr) and attr not in ALLOWED_DUNDERS:
            self.flag(node, "dunder", f"reaches {attr}")
        elif attr in _TORCH_REACH:
            self.flag(node, "torch internals", f"uses {attr}")
        elif attr in _REACH_ATTRS:
            self.flag(node, "interpreter", f"reaches {attr}")
        elif attr.startswith("_") and not _dunder(attr) and self._on_library(node.value):
            self.flag(node, "torch internals", f"reads the private {attr} of a library")
        if isinstance(node.ctx, (ast.Store, ast.Del)) and self._on_library(node.value):
            self.flag(node, "rebinding", f"rebinds {attr} of a library module or class")
        if self.in_graded and attr in _PROBE_TELLS:
            self.flag(node, "probe branch", f"asks {attr} inside a graded function")
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

    def visit_Call(self, node: ast.Call) -> None:
        fn = node.func
        name = fn.id if isinstance(fn, ast.Name) else None
        shell = isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Call) and \
            isinstance(fn.value.func, ast.Name) and fn.value.func.id == "get_ipython"
        if shell:
            self.shell_calls.add(id(fn.value))
            if fn.attr in ("run_line_magic", "run_cell_magic"):
                self._magic(node, fn.attr)
            elif fn.attr not in ("system", "getoutput"):  # `!cmd` and `x = !cmd`
                self.flag(node, "dynamic", f"uses the shell's {fn.attr}")
        elif name == "get_ipython" and id(node) not in self.shell_calls:
            self.flag(node, "dynamic", "keeps IPython's shell (get_ipython())")
        if name in _DYNAMIC_CALLS:
            self.flag(node, "dynamic", f"calls {name}")
        if name in _NAMED_ATTR_CALLS and node.args:
            key = node.args[1] if len(node.args) > 1 else None
            if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
                self.flag(node, "dynamic", f"{name} with a computed name")
            elif _dunder(key.value) and key.value not in ALLOWED_DUNDERS:
                self.flag(node, "dunder", f"{name} of {key.value}")
            elif key.value.startswith("_") or key.value in _TORCH_REACH | _REACH_ATTRS:
                self.flag(node, "dynamic", f"{name} of {key.value}")
            elif name != "getattr" and name != "hasattr" and self._on_library(node.args[0]):
                self.flag(node, "rebinding", f"{name} on a library module or class")
        self.generic_visit(node)

    # ------------------------------------------------------------------ graded functions and their branches
    def _graded_scope(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        graded = node.name in self.graded
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _dunder(node.name) \
                and node.name not in ALLOWED_DUNDERS:
            self.flag(node, "dunder", f"defines {node.name}")
        self.in_graded += graded
        self.generic_visit(node)
        self.in_graded -= graded

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _graded_scope

    def generic_visit(self, node: ast.AST) -> None:
        if self.in_graded and isinstance(node, _BRANCHES):
            tests = [getattr(node, "test", None), *getattr(node, "ifs", []),
                     *(getattr(node, "values", []) if isinstance(node, ast.BoolOp) else [])]
            for test in filter(None, tests):
                for sub in ast.walk(test):
                    if isinstance(sub, ast.Constant) and sub.value == "meta":
                        self.flag(sub, "probe branch", "branches on the meta device inside a graded function")
        super().generic_visit(node)


def _parsed(source: str) -> ast.Module | None:
    """A cell's AST as IPython runs it (magics, shell escapes and `x = !cmd` turned into Python by IPython's own
    transformer, only for a cell plain Python cannot parse); None: it does not parse, so it never ran."""
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError):
        pass
    except (RecursionError, MemoryError):
        return None
    try:
        from IPython.core.inputtransformer2 import TransformerManager  # the sandbox's own shell: installed

        return ast.parse(TransformerManager().transform_cell(source))
    except Exception:  # noqa: BLE001 - IPython cannot run it either: the cell raised SyntaxError and ran nothing
        text = "\n".join("" if _MAGIC.match(line) else line for line in source.splitlines())
        try:
            return ast.parse(text)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None


def review_cells(cells: Iterable[tuple[int, str]], *, graded: Iterable[str],
                 modules: Iterable[str] = ()) -> list[Flag]:
    """The flags of a notebook's code cells (cell index, source); `graded`: the names of the graded functions and
    classes, `modules`: the lesson's shipped modules a notebook may import."""
    allowed = ALLOWED_MODULES | frozenset(modules)
    bound: dict[str, str] = {}
    flags: list[Flag] = []
    for index, source in cells:
        tree = _parsed(source)
        if tree is None:
            continue
        reader = _Reader(index, source.splitlines(), modules=bound, allowed=allowed, graded=frozenset(graded))
        try:
            reader.visit(tree)
        except RecursionError:  # nested past what a walk can read: unreviewed is not clean
            reader.flag(tree, "unreviewable", "the cell is nested too deeply to review")
        flags += reader.flags
    return list(dict.fromkeys(flags))


def review_notebook(source: bytes | None, *, graded: Iterable[str], modules: Iterable[str] = ()) -> list[Flag]:
    """review_cells over a submitted notebook's bytes (every code cell the sandbox runs; none when unreadable)."""
    if source is None:
        return []
    try:
        cells, _ = read_notebook(source)
    except NotebookError:
        return []
    return review_cells(cells, graded=graded, modules=modules)


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


def hold_claims(result: Any, claims: set[str], flags: list[Flag], *, cleared: str | None) -> dict[str, Any]:
    """Hold the passed claim cases of `result` (a SubmissionResult) while its flags are not cleared: no points,
    the message says why and where; a note for the TA and the grades.csv message names the lines. Returns the
    review block for the results JSON."""
    record = review_record(flags, cleared=cleared)
    if not flags or record["cleared"]:
        if flags:
            result.notes.append(f"review: {len(flags)} flag(s) cleared by a TA ({record['digest']})")
        return record
    lines = "; ".join(f.text() for f in flags[:5]) + (f"; and {len(flags) - 5} more" if len(flags) > 5 else "")
    held = 0
    for case in result.cases:
        if case.id in claims and case.passed:
            held += 1
            case.points, case.passed, case.reason = 0.0, False, Reason.HELD
            case.message = (f"{case.id}: held for review: this case rests on a fact your code reports about itself, "
                            "and a part of your notebook needs a person's look; its points follow their decision.")
    result.notes.append(f"review: {len(flags)} flag(s), {held} case(s) held for TA review (digest {record['digest']}): "
                        f"{lines}")
    record["held"] = held
    return record


def reviewed(suite: Any, source: bytes | None, result: Any, *, cleared: str | None) -> dict[str, Any]:
    """Review a submission's notebook for `suite` (its graded names: the questions' solutions; its claim cases) and
    hold `result`'s claim cases while flags stand; the results JSON's `review` block."""
    graded = {name for q in suite.questions for name in getattr(q, "solution", ())}
    flags = review_notebook(source, graded=graded, modules=suite.lesson.sandbox_modules)
    return hold_claims(result, {c.id for c in suite.cases if c.claim}, flags, cleared=cleared)
