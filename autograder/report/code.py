"""The student's code as the report shows it: a submission's notebook re-read as data (never run), its code
cells and written answers, and the AST analysis of which statement bound each graded name (bindings, stubs)."""

from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from autograder.authoring.questions import Question
from autograder.config import ROOT
from autograder.grading.submissions import read_cells
from autograder.report.text import clip_text
from autograder.sandbox import SKIP_TAGS

STUB_WORDS = "the stub is not filled in yet"  # what the probes say when a stub returned None or ...
CODE_CHARS = 20_000  # per cell
ANSWER_PLACEHOLDERS = ("_Type your answer here, replacing this text._", "YOUR ANSWER HERE")


def _resolve(path: str | None, grades: Path) -> Path | None:
    if not path:
        return None
    p = Path(path)
    candidates = [p] if p.is_absolute() else [Path.cwd() / p, ROOT / p, grades.parent / p]
    return next((c for c in candidates if os.path.lexists(c)), None)


def read_notebook(path: str | None, grades: Path, *, limits: Any = None) -> tuple[list[dict[str, Any]], str]:
    """The cells of a submission's notebook, read as data only (never run), or why there are none.

    Read with the grader's own reader (regular files only, never a link, under the same caps).
    """
    file = _resolve(path, grades)
    if file is None:
        return [], f"the submission file {path!r} was not found" if path else "the result does not name its file"
    return read_cells(file, limits=limits)


def _source(cell: dict[str, Any]) -> str:
    src = cell.get("source", "")
    return "".join(str(s) for s in src) if isinstance(src, list) else str(src)


def code_cells(cells: list[dict[str, Any]]) -> list[tuple[int, str]]:
    """The code cells the grader runs (index in the notebook, source): not those tagged to be skipped."""
    def tags(c: dict[str, Any]) -> list[Any]:
        meta = c.get("metadata")
        found = meta.get("tags") if isinstance(meta, dict) else None
        return found if isinstance(found, list) else []

    return [(n, _source(c)) for n, c in enumerate(cells)
            if c.get("cell_type") == "code" and not set(SKIP_TAGS) & {t for t in tags(c) if isinstance(t, str)}]


def _prompt_marker(part: str) -> str:
    return f"**`{part}`.**"  # how the builder heads each written part (Otter and nbgrader alike)


def written_answers(cells: list[dict[str, Any]], parts: list[str]) -> dict[str, str | None]:
    """Each written part's answer as the student left it ("" when left as the template had it; None when the
    notebook has no answer cell for it): the nbgrader cell with that grade_id, else the cells after the part's
    prompt, up to the next locked cell, prompt or heading."""
    out: dict[str, str | None] = {}
    markers = [_prompt_marker(p) for p in parts]
    for part in parts:
        meta = [c for c in cells if isinstance(c.get("metadata"), dict) and isinstance(c["metadata"].get("nbgrader"),
                                                                                     dict)
                and c["metadata"]["nbgrader"].get("grade_id") == part]
        found: list[str] | None = [_source(c) for c in meta] if meta else None
        if found is None:
            start = next((n for n, c in enumerate(cells) if _prompt_marker(part) in _source(c)), None)
            if start is not None:
                found = []
                for c in cells[start + 1:]:
                    text = _source(c)
                    meta_c = c.get("metadata") if isinstance(c.get("metadata"), dict) else {}
                    if (meta_c.get("editable") is False or any(m in text for m in markers)
                            or "<!-- END QUESTION -->" in text or text.lstrip().startswith("## ")):
                        break
                    found.append(text)
        if found is None:
            out[part] = None
            continue
        text = "\n\n".join(t.strip() for t in found if t.strip())
        for marker in ("# BEGIN SOLUTION", "# END SOLUTION", *ANSWER_PLACEHOLDERS):
            text = text.replace(marker, "")
        out[part] = text.strip()
    return out


@lru_cache(maxsize=4096)
def _tree(source: str) -> ast.Module | None:
    """The parsed cell (never run), or None when it is not plain Python (a syntax error, too big). Lines that
    IPython runs as magics or shell commands (%, %%, !) are read as blank lines."""
    for text in (source, re.sub(r"^[ \t]*[%!].*$", "", source, flags=re.M)):
        try:
            return ast.parse(text[:200_000])
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


def _statement_bindings(body: list[ast.stmt], only: set[str] | None = None
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
                       for n, k, s, a in _statement_bindings(stmt.body, declared))
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
                out.extend(_statement_bindings(inner, only))
        for handler in getattr(stmt, "handlers", []):
            if handler.name:
                add([handler.name], "except ... as", stmt)
            out.extend(_statement_bindings(handler.body, only))
        for case in getattr(stmt, "cases", []):
            out.extend(_statement_bindings(case.body, only))
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
        tree = _tree(src)
        if tree is None:
            for m in _FALLBACK.finditer(src):
                line = src.count("\n", 0, m.start()) + 1
                out.append(Binding(m.group(1) or m.group(2), n, line, line, "definition (cell not parsed)", len(out)))
            continue
        for name, kind, stmt, alias in _statement_bindings(tree.body):
            out.append(Binding(name, n, stmt.lineno, stmt.end_lineno or stmt.lineno, kind, len(out), alias, stmt))
    return out


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


def _first_line(src: str, b: Binding) -> str:
    lines = src.split("\n")
    return clip_text(lines[b.line - 1].strip(), 120) if 0 < b.line <= len(lines) else ""


@dataclass
class CodeView:
    """What the report shows of the student's code for one question (code.html.j2 draws it)."""

    names: list[str]  # the names the question grades
    why: str = ""  # why the notebook could not be read, when it could not
    warnings: list[str] = field(default_factory=list)
    blocks: list[tuple[int, str, list[tuple[str, bool]]]] = field(default_factory=list)  # cell, binds, lines
    old: list[tuple[int, str]] = field(default_factory=list)  # cells of replaced bindings: (index, source)
    missing: list[str] = field(default_factory=list)  # names no cell binds


def _lines(src: str, marked: set[int]) -> list[tuple[str, bool]]:
    """A cell's source (clipped) line by line, with whether each line (1-based) is in `marked`."""
    return [(line, n in marked) for n, line in enumerate(clip_text(src, CODE_CHARS).split("\n"), start=1)]


def code_view(cells: list[tuple[int, str]], q: Question, why: str = "") -> CodeView:
    """The student's code for question `q`, as the grader probed it: for each name the question grades, the
    statement bound to it when the notebook ended (the last binding in the order the cells run, following
    `name = other` to the code of `other`), its cell with those lines marked; a warning when a name was
    bound more than once or when a later cell may rebind names at run time (exec, globals()); the cells of the
    bindings that were replaced."""
    view = CodeView(list(q.solution) or [c.var for c in q.choices], why)
    if not view.names:
        return view
    found = bindings(cells)
    source = dict(cells)
    marks: dict[int, set[int]] = {}
    labels: dict[int, list[str]] = {}
    warnings, replaced = [], set()
    for name in view.names:
        chain = graded_bindings(found, name)
        if not chain or chain[0].kind == "del":
            view.missing.append(name if not chain else f"{name} (deleted in {chain[0].where})")
            continue
        for b in chain:
            marks.setdefault(b.cell, set()).update(range(b.line, b.end + 1))
            labels.setdefault(b.cell, []).append(f"{b.name} ({b.kind}, {b.where.split(', ')[1]})")
        every = [b for b in found if b.name == name]
        replaced |= {b.cell for b in every if b not in chain}
        via = "".join(f"; it is `{_first_line(source[b.cell], b)}`, so the code is that of {b.alias}, bound in "
                      f"{chain[i + 1].where}" for i, b in enumerate(chain[:-1]))
        if len(every) > 1:
            warnings.append(f"{name} is bound {len(every)} times (" + "; ".join(f"{b.where}: {b.kind}" for b in every)
                            + f"): the grader probed the last one, in {chain[0].where}{via}.")
        elif via:
            warnings.append(f"{name} is bound in {chain[0].where}{via}.")
        late = [d for d in found if d.name == DYNAMIC and d.seq > chain[0].seq]
        if late:
            warnings.append(f"After that, {', '.join(f'{d.where} ({d.kind})' for d in late[:3])} may rebind "
                            f"{name} at run time: read {'it' if len(late) == 1 else 'them'}.")
            for d in late[:3]:
                marks.setdefault(d.cell, set()).update(range(d.line, d.end + 1))
                labels.setdefault(d.cell, []).append(f"{d.kind}, {d.where.split(', ')[1]}")
    view.warnings = list(dict.fromkeys(warnings))
    view.blocks = [(n, "; ".join(dict.fromkeys(labels[n])), _lines(source[n], marks[n])) for n in sorted(marks)]
    view.old = [(n, clip_text(source[n], CODE_CHARS)) for n in sorted(replaced) if n not in marks]
    return view
