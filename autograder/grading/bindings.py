"""Which cell binds each name of a student's notebook, read from its AST (never run): what the failure causes
(grading/causes.py) and the report's code pages (report/code.py) share."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from functools import lru_cache

from autograder.pyast import parse


@lru_cache(maxsize=4096)
def _tree(source: str) -> ast.Module | None:
    """The parsed cell (never run), or None when it is not plain Python (a syntax error, too big). Lines that
    IPython runs as magics or shell commands (%, %%, !) are read as blank lines."""
    for text in (source, re.sub(r"^[ \t]*[%!].*$", "", source, flags=re.M)):
        try:
            return parse(text[:200_000])
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
    return None


DYNAMIC = "*"  # the name of a binding that cannot be read statically (exec, globals() with a computed key, import *)


@dataclass(frozen=True)
class Binding:
    """One statement of a code cell that binds a name of the notebook's global namespace, read without running it.

    `seq` orders every binding of the notebook as the grader runs them (cell by cell, line by line); `alias` is the
    other name a plain `name = other` binds it to; `node` the statement (None when the cell could not be parsed)."""

    name: str
    cell: int
    line: int
    end: int
    kind: str
    seq: int
    alias: str | None = None
    node: ast.AST | None = field(default=None, compare=False, repr=False)

    @property
    def where(self) -> str:
        lines = f"line {self.line}" if self.end <= self.line else f"lines {self.line}–{self.end}"
        return f"cell {self.cell}, {lines}"


def _names_in(target: ast.AST) -> list[str]:
    """The names an assignment target binds (`a`, `a, (b, *c)`); attributes and subscripts bind none."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, ast.Starred):
        return _names_in(target.value)
    if isinstance(target, ast.Tuple | ast.List):
        return [n for t in target.elts for n in _names_in(t)]
    return []


def _is_globals_call(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("globals", "vars")
            and not node.args)


def _expression_bindings(stmt: ast.stmt) -> list[tuple[str, str]]:
    """(name, kind) bound by the expressions of one statement, outside nested functions: `name := ...`, and the
    run-time ways (exec, eval, globals().update(...), setattr on the module)."""
    found: list[tuple[str, str]] = []
    todo: list[ast.AST] = [v for f, v in ast.iter_fields(stmt) if f not in ("body", "orelse", "finalbody", "handlers",
                                                                             "cases")
                           for v in (v if isinstance(v, list) else [v]) if isinstance(v, ast.AST)]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Lambda | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        if isinstance(node, ast.NamedExpr) and isinstance(node.target, ast.Name):
            found.append((node.target.id, "assignment expression"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("exec", "eval",
                                                                                                "setattr"):
            found.append((DYNAMIC, f"{node.func.id}(...)"))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("update", "setdefault", "__setitem__") and _is_globals_call(node.func.value)):
            found.append((DYNAMIC, f"globals().{node.func.attr}(...)"))
        todo.extend(ast.iter_child_nodes(node))
    return found


def statement_bindings(body: list[ast.stmt], only: set[str] | None = None
                        ) -> list[tuple[str, str, ast.stmt, str | None]]:
    """(name, kind, statement, alias) of every global binding in `body`, in order, nested blocks included (if,
    for, with, try, match); inside a function only the names it declares `global` (`only`)."""
    out: list[tuple[str, str, ast.stmt, str | None]] = []

    def add(names: list[str], kind: str, stmt: ast.stmt, alias: str | None = None, *, anywhere: bool = False) -> None:
        out.extend((n, kind, stmt, alias) for n in names if only is None or n in only or n == DYNAMIC or anywhere)

    for stmt in body:
        for name, kind in _expression_bindings(stmt):
            add([name], kind, stmt)
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            add([stmt.name], "class" if isinstance(stmt, ast.ClassDef) else "def", stmt)
            # a body runs later (when called, or as the class is made), but what it binds globally counts then
            declared = set() if isinstance(stmt, ast.ClassDef) else {
                n for g in ast.walk(stmt) if isinstance(g, ast.Global) for n in g.names}
            out.extend((n, f"{k} in {stmt.name} (bound when it runs)", s, a)
                       for n, k, s, a in statement_bindings(stmt.body, declared))
            continue
        if isinstance(stmt, ast.Assign):
            alias = stmt.value.id if isinstance(stmt.value, ast.Name) else None
            for t in stmt.targets:
                add(_names_in(t), "assignment", stmt, alias)
                if isinstance(t, ast.Subscript) and _is_globals_call(t.value):
                    key = t.slice.value if isinstance(t.slice, ast.Constant) else None
                    add([key if isinstance(key, str) else DYNAMIC], "globals()[...] assignment", stmt, anywhere=True)
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            add(_names_in(stmt.target), "assignment", stmt, stmt.value.id if isinstance(stmt.value, ast.Name) else None)
        elif isinstance(stmt, ast.AugAssign):
            add(_names_in(stmt.target), "augmented assignment", stmt)
        elif isinstance(stmt, ast.Import | ast.ImportFrom):
            for a in stmt.names:
                add([DYNAMIC if a.name == "*" else a.asname or a.name.split(".")[0]], "import", stmt)
        elif isinstance(stmt, ast.Delete):
            add([n for t in stmt.targets for n in _names_in(t)], "del", stmt)
        elif isinstance(stmt, ast.For | ast.AsyncFor):
            add(_names_in(stmt.target), "for loop", stmt)
        elif isinstance(stmt, ast.With | ast.AsyncWith):
            add([n for item in stmt.items if item.optional_vars for n in _names_in(item.optional_vars)], "with",
                stmt)
        for block in ("body", "orelse", "finalbody"):
            inner = getattr(stmt, block, None)
            if isinstance(inner, list) and not isinstance(stmt, ast.ClassDef):
                out.extend(statement_bindings(inner, only))
        for handler in getattr(stmt, "handlers", []):
            if handler.name:
                add([handler.name], "except ... as", stmt)
            out.extend(statement_bindings(handler.body, only))
        for case in getattr(stmt, "cases", []):
            out.extend(statement_bindings(case.body, only))
    return out


_FALLBACK = re.compile(r"^(?:(?:async\s+)?def|class)\s+([A-Za-z_]\w*)|^([A-Za-z_]\w*)\s*(?::[^=\n]*)?=(?!=)", re.M)


def bindings(cells: list[tuple[int, str]]) -> list[Binding]:
    """`cell_bindings` of the cells, read once per notebook (the report asks for each question)."""
    return list(_bindings(tuple(cells)))


@lru_cache(maxsize=64)
def _bindings(cells: tuple[tuple[int, str], ...]) -> tuple[Binding, ...]:
    return tuple(cell_bindings(list(cells)))


def cell_bindings(cells: list[tuple[int, str]]) -> list[Binding]:
    """Every binding of a global name in the cells (index, source), in the order the grader runs them: def,
    class, assignment (plain, augmented, annotated, :=, globals()[...]), import, for, with, except ... as and del,
    in nested blocks too, and inside functions for names they declare global. A cell that does not parse is read
    line by line (top-level def, class and `name =`); exec, eval, setattr, globals().update and `import *` are
    recorded under DYNAMIC: what they bind is only known when they run."""
    out: list[Binding] = []
    for n, src in cells:
        for name, line, end, kind, alias, stmt in _cell_statements(src):
            out.append(Binding(name, n, line, end, kind, len(out), alias, stmt))
    return out


@lru_cache(maxsize=4096)
def _cell_statements(src: str) -> tuple[tuple[str, int, int, str, str | None, ast.stmt | None], ...]:
    """One cell's bindings (name, line, end, kind, alias, statement), in order: a class shares most cells."""
    tree = _tree(src)
    if tree is None:
        return tuple((m.group(1) or m.group(2), line, line, "definition (cell not parsed)", None, None)
                     for m in _FALLBACK.finditer(src) for line in (src.count("\n", 0, m.start()) + 1,))
    return tuple((name, stmt.lineno, stmt.end_lineno or stmt.lineno, kind, alias, stmt)
                 for name, kind, stmt, alias in statement_bindings(tree.body))


def in_effect(found: list[Binding], name: str, *, before: int | None = None) -> Binding | None:
    """The binding of `name` in effect when the notebook ended (or just before binding number `before`)."""
    return next((b for b in reversed(found) if b.name == name and (before is None or b.seq < before)), None)


def _is_stub(node: ast.AST | None) -> bool:
    """A definition still as the template left it: a body of only a docstring and `...` (or pass)."""
    if isinstance(node, ast.ClassDef):
        return any(_is_stub(n) for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        body = [n for n in node.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)
                                             and isinstance(n.value.value, str))]
        return all(isinstance(n, ast.Pass) or (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)
                                               and n.value.value is Ellipsis) for n in body)
    if isinstance(node, ast.Assign):
        return isinstance(node.value, ast.Constant) and node.value.value in (Ellipsis, None)
    return False


def stub_state(cells: list[tuple[int, str]], names: set[str]) -> dict[str, bool]:
    """For each of `names` the cells bind: whether the binding in effect at the end is a stub."""
    found = bindings(cells)
    last = {name: in_effect(found, name) for name in names}
    return {name: b.kind in ("def", "class", "assignment") and _is_stub(b.node) for name, b in last.items() if b}


def graded_bindings(found: list[Binding], name: str) -> list[Binding]:
    """The bindings that made `name` what the grader probed: the one in effect at the end, then, while it is a
    plain `name = other`, the binding of `other` in effect at that point (at most five steps)."""
    chain: list[Binding] = []
    b = in_effect(found, name)
    while b is not None and b not in chain and len(chain) < 5:
        chain.append(b)
        b = in_effect(found, b.alias, before=b.seq) if b.alias else None
    return chain
