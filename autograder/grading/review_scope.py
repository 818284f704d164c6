"""What the source review knows of a notebook as a whole (read, never run): which question's graded code each
top-level function or class is (its scope), and which computed attribute names resolve to a fixed set of strings.

Scope: a question's graded code is each top-level function or class its `solution:` names, and the notebook's
top-level functions and classes that code calls by plain name, transitively; a line outside all of them (top-level
statements, other functions) belongs to every question (`ALL`).

A name resolves when it is a string literal, a name bound only to string literals, a loop variable over a literal
tuple, list, set or dict (directly, or through a name bound once at top level to one and never changed), or a
literal-key subscript of a dict literal bound once at top level and never assigned into; `self`'s attribute named
by an f-string with a plain prefix (`f"block{i}"`) resolves to a name of the module's own. Anything else does not.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator, Mapping

ALL = "all"  # a flag's scope outside every question's graded code: it holds every question's claim cases
Scope = tuple[str, ...] | str  # question ids, or ALL

_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
# How a name's value may be read without being changed or handed on (anything else: it may be changed elsewhere).
_READ_METHODS = frozenset({"get", "keys", "values", "items", "copy", "index", "count"})
_MUTATORS = frozenset({"update", "setdefault", "pop", "popitem", "clear", "append", "extend", "insert", "remove",
                       "sort", "reverse", "__setitem__", "__delitem__", "__ior__", "__iadd__", "add", "discard"})
_PURE_BUILTINS = frozenset({"print", "len", "repr", "str", "sorted", "list", "tuple", "set", "frozenset", "dict",
                            "enumerate", "zip", "iter", "reversed", "any", "all", "min", "max", "sum", "isinstance"})


def top_defs(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef]:
    """The functions and classes a cell defines at top level (also under a top-level if, for, with or try)."""
    todo = list(ast.iter_child_nodes(tree))
    while todo:
        node = todo.pop(0)
        if isinstance(node, _DEFS):
            yield node
        elif isinstance(node, (ast.stmt, ast.excepthandler, ast.match_case)):
            todo += [n for n in ast.iter_child_nodes(node) if isinstance(n, (ast.stmt, ast.excepthandler,
                                                                               ast.match_case))]


def def_lines(node: ast.AST) -> tuple[int, int]:
    """The lines a definition spans, its decorators included."""
    first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])  # type: ignore[attr-defined]
    return first, getattr(node, "end_lineno", None) or node.lineno  # type: ignore[attr-defined]


def question_scopes(trees: Iterable[ast.AST], graded: Mapping[str, Iterable[str]]) -> dict[str, tuple[str, ...]]:
    """Top-level name -> the questions whose graded code it is: the names a question's solution gives, and the
    notebook's functions and classes they call by plain name, transitively (`graded`: question id -> names)."""
    defs: dict[str, list[ast.AST]] = {}
    for tree in trees:
        for node in top_defs(tree):
            defs.setdefault(node.name, []).append(node)
    calls = {name: {n.func.id for d in nodes for n in ast.walk(d)
                    if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in defs}
             for name, nodes in defs.items()}
    owners: dict[str, set[str]] = {}
    for qid, names in graded.items():
        seen = {n for n in names if n in defs}
        todo = list(seen)
        while todo:
            for callee in calls[todo.pop()] - seen:
                seen.add(callee)
                todo.append(callee)
        for name in seen:
            owners.setdefault(name, set()).add(qid)
    return {name: tuple(sorted(q)) for name, q in owners.items()}


def line_scope(tree: ast.AST | None, line: int, scopes: Mapping[str, tuple[str, ...]]) -> Scope:
    """The scope of a cell's line: the questions of the top-level definition that spans it, else ALL."""
    for node in top_defs(tree) if tree is not None else ():
        first, last = def_lines(node)
        if first <= line <= last:
            return scopes.get(node.name, ALL)
    return ALL


# --------------------------------------------------------------------------- names that resolve

class Names:
    """Every binding of every name in a notebook's cells, by scope (the module's, merged over cells; each function,
    lambda and class), and the names that may change where no binding shows (mutated, handed on, global)."""

    def __init__(self, trees: Iterable[ast.AST]) -> None:
        self.bindings: dict[int, dict[str, list[tuple[str, ast.AST | None, ast.AST | None]]]] = {0: {}}
        self.unsafe: set[str] = set()  # declared global or nonlocal somewhere: bound where no binding shows
        self.changed: set[str] = set()  # written into, mutated or handed on: a container literal no longer known
        self.parents: dict[int, ast.AST] = {}
        self.globals_written = False
        for tree in trees:
            for node in ast.walk(tree):
                for child in ast.iter_child_nodes(node):
                    self.parents[id(child)] = node
            self._collect(tree, 0)
            for node in ast.walk(tree):
                self._watch(node)

    # ------------------------------------------------------------------ collecting
    def _bind(self, scope: int, name: str, kind: str, value: ast.AST | None = None,
              target: ast.AST | None = None) -> None:
        self.bindings.setdefault(scope, {}).setdefault(name, []).append((kind, value, target))

    def _targets(self, scope: int, target: ast.AST, value: ast.AST | None, loop: bool) -> None:
        if isinstance(target, ast.Name):
            self._bind(scope, target.id, "loop" if loop else "value", value, target)
        elif loop and isinstance(target, (ast.Tuple, ast.List)):
            for name in (n.id for n in ast.walk(target) if isinstance(n, ast.Name)):
                self._bind(scope, name, "loop", value, target)
        elif isinstance(target, (ast.Tuple, ast.List)):
            same = isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts)
            for i, elt in enumerate(target.elts):
                self._targets(scope, elt, value.elts[i] if same else None, False)  # type: ignore[union-attr]
        elif isinstance(target, ast.Starred):
            self._targets(scope, target.value, None, loop)

    def _collect(self, tree: ast.AST, top: int) -> None:
        todo = [(tree, top)]  # a stack, not recursion: a cell nested past the recursion limit is read all the same
        while todo:
            node, scope = todo.pop()
            self._collect_children(node, scope, todo)

    def _collect_children(self, node: ast.AST, scope: int, todo: list[tuple[ast.AST, int]]) -> None:
        for child in ast.iter_child_nodes(node):
            inner = scope
            if isinstance(child, _SCOPES):
                if not isinstance(child, ast.Lambda):
                    self._bind(scope, child.name, "other")
                inner = id(child)
                self.bindings.setdefault(inner, {})
                if not isinstance(child, ast.ClassDef):
                    for arg in ast.walk(child.args):
                        if isinstance(arg, ast.arg):
                            self._bind(inner, arg.arg, "other")
            elif isinstance(child, ast.Assign):
                for target in child.targets:
                    self._targets(scope, target, child.value, False)
            elif isinstance(child, ast.AnnAssign) and child.value is not None:
                self._targets(scope, child.target, child.value, False)
            elif isinstance(child, (ast.For, ast.AsyncFor, ast.comprehension)):
                self._targets(scope, child.target, child.iter, True)
            elif isinstance(child, (ast.Global, ast.Nonlocal)):
                self.unsafe.update(child.names)
            elif isinstance(child, (ast.AugAssign, ast.NamedExpr)) and isinstance(child.target, ast.Name):
                self._bind(scope, child.target.id, "other")
            elif isinstance(child, (ast.Import, ast.ImportFrom)):
                for alias in child.names:
                    self._bind(scope, (alias.asname or alias.name).split(".")[0], "import")
            elif isinstance(child, ast.ExceptHandler) and child.name:
                self._bind(scope, child.name, "other")
            elif isinstance(child, ast.withitem) and child.optional_vars is not None:
                for n in ast.walk(child.optional_vars):
                    if isinstance(n, ast.Name):
                        self._bind(scope, n.id, "other")
            elif isinstance(child, (ast.MatchAs, ast.MatchStar)) and child.name:
                self._bind(scope, child.name, "other")
            elif isinstance(child, ast.MatchMapping) and child.rest:
                self._bind(scope, child.rest, "other")
            elif isinstance(child, ast.Delete):
                for n in child.targets:
                    if isinstance(n, ast.Name):
                        self._bind(scope, n.id, "other")
            todo.append((child, inner))

    def _watch(self, node: ast.AST) -> None:
        """Mark the names whose value may change where no binding shows: written into, mutated, handed on."""
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del)):
            if isinstance(node.value, ast.Name):
                self.changed.add(node.value.id)
            elif isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name) \
                    and node.value.func.id in ("globals", "vars", "locals"):
                self.globals_written = True
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _MUTATORS:
            if isinstance(node.func.value, ast.Name):
                self.changed.add(node.func.value.id)
            elif isinstance(node.func.value, ast.Call) and isinstance(node.func.value.func, ast.Name) \
                    and node.func.value.func.id in ("globals", "vars", "locals"):
                self.globals_written = True
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and not self._read_only(node):
            self.changed.add(node.id)

    def _read_only(self, node: ast.Name) -> bool:
        """Whether this use of a name reads its value without handing the object on (so it cannot change)."""
        parent = self.parents.get(id(node))
        if isinstance(parent, ast.Subscript) and parent.value is node:
            return True
        if isinstance(parent, ast.Attribute) and parent.value is node:
            call = self.parents.get(id(parent))
            return parent.attr in _READ_METHODS and isinstance(call, ast.Call) and call.func is parent
        if isinstance(parent, ast.Call) and parent.func is node:
            return True
        if isinstance(parent, ast.Call) and any(a is node for a in parent.args):
            return self._library_call(parent.func)
        if isinstance(parent, (ast.keyword, ast.Starred)):
            return isinstance(parent, ast.keyword) and parent.arg is None or \
                isinstance(self.parents.get(id(parent)), ast.Call)
        return isinstance(parent, (ast.For, ast.AsyncFor, ast.comprehension, ast.Compare, ast.FormattedValue,
                                   ast.If, ast.IfExp, ast.BoolOp, ast.UnaryOp, ast.BinOp, ast.Expr, ast.Assert))

    def _library_call(self, fn: ast.AST) -> bool:
        """A call that does not change what it is given: a plain builtin (print, len, sorted, ...) or a function of
        an imported module (json.dumps, pprint.pprint, display), none of them redefined by the notebook."""
        root = fn
        while isinstance(root, ast.Attribute):
            root = root.value
        if not isinstance(root, ast.Name) or root.id in self.unsafe:
            return False
        kinds = {kind for kind, _, _ in self.bindings[0].get(root.id, [])}
        if isinstance(fn, ast.Name) and fn.id in _PURE_BUILTINS and not kinds:
            return True
        return kinds == {"import"}

    # ------------------------------------------------------------------ resolving
    def _lookup(self, name: str, chain: list[ast.AST]) -> tuple[list[tuple[str, ast.AST | None, ast.AST | None]],
                                                                bool] | None:
        """The bindings that reach `name` from the innermost scope of `chain`, and whether they are the module's."""
        if name in self.unsafe:
            return None
        for i, scope in enumerate(reversed(chain)):
            if isinstance(scope, ast.ClassDef) and i:
                continue  # a class body's names are not seen from the functions inside it
            found = self.bindings.get(id(scope), {}).get(name)
            if found:
                return found, False
        if self.globals_written:
            return None
        found = self.bindings[0].get(name)
        return (found, True) if found else None

    def _literal(self, name: str, chain: list[ast.AST]) -> ast.AST | None:
        """The tuple, list, set or dict literal a name is bound to once at top level, never changed."""
        got = self._lookup(name, chain)
        if got is None or not got[1] or len(got[0]) != 1 or name in self.changed:
            return None
        kind, value, _ = got[0][0]
        return value if kind == "value" and isinstance(value, (ast.Tuple, ast.List, ast.Set, ast.Dict)) else None

    def elements(self, expr: ast.AST, chain: list[ast.AST]) -> list[ast.AST] | None:
        """What iterating `expr` gives, as literal nodes, when it is a literal (or a name bound to one, or its
        keys, values, items, enumerate, sorted or reversed); None otherwise."""
        if isinstance(expr, ast.Name):
            literal = self._literal(expr.id, chain)
            return self.elements(literal, chain) if literal is not None else None
        if isinstance(expr, (ast.Tuple, ast.List, ast.Set)):
            return None if any(isinstance(e, ast.Starred) for e in expr.elts) else list(expr.elts)
        if isinstance(expr, ast.Dict):
            return None if any(k is None for k in expr.keys) else list(expr.keys)  # type: ignore[arg-type]
        if not isinstance(expr, ast.Call) or expr.keywords:
            return None
        fn = expr.func
        if isinstance(fn, ast.Attribute) and fn.attr in ("keys", "values", "items") and not expr.args:
            d = fn.value if isinstance(fn.value, ast.Dict) else \
                self._literal(fn.value.id, chain) if isinstance(fn.value, ast.Name) else None
            if not isinstance(d, ast.Dict) or any(k is None for k in d.keys):
                return None
            pairs = list(zip(d.keys, d.values, strict=True))
            return [k for k, _ in pairs] if fn.attr == "keys" else [v for _, v in pairs] if fn.attr == "values" \
                else [ast.Tuple(elts=[k, v], ctx=ast.Load()) for k, v in pairs]
        if isinstance(fn, ast.Name) and fn.id in ("enumerate", "sorted", "reversed", "list", "tuple") \
                and len(expr.args) == 1:
            inner = self.elements(expr.args[0], chain)
            if inner is None or fn.id != "enumerate":
                return inner
            return [ast.Tuple(elts=[ast.Constant(i), e], ctx=ast.Load()) for i, e in enumerate(inner)]
        return None

    def strings(self, expr: ast.AST | None, chain: list[ast.AST], *, owner: ast.AST | None = None,
                reach: frozenset[str] = frozenset()) -> set[str] | None:
        """The names `expr` can be, when it resolves (see the module's docstring); None when it does not. `owner`:
        the object whose attribute it names (`self` allows an f-string with a plain prefix that begins no name in
        `reach`)."""
        if isinstance(expr, ast.Constant):
            return {expr.value} if isinstance(expr.value, str) else None
        if isinstance(expr, ast.IfExp):
            a, b = self.strings(expr.body, chain), self.strings(expr.orelse, chain)
            return a | b if a is not None and b is not None else None
        if isinstance(expr, ast.JoinedStr) and isinstance(owner, ast.Name) and owner.id == "self" and expr.values:
            head = expr.values[0]
            prefix = head.value if isinstance(head, ast.Constant) and isinstance(head.value, str) else ""
            if prefix[:1].isalpha() and not any(r.startswith(prefix) for r in reach):
                return {prefix + "*"}
            return None
        if isinstance(expr, ast.Subscript) and isinstance(expr.value, ast.Name):
            d, key = self._literal(expr.value.id, chain), expr.slice
            if not isinstance(d, ast.Dict) or not isinstance(key, ast.Constant):
                return None
            hits = [v for k, v in zip(d.keys, d.values, strict=True)
                    if isinstance(k, ast.Constant) and k.value == key.value]
            return self.strings(hits[-1], chain) if hits and isinstance(hits[-1], ast.Constant) else None
        if not isinstance(expr, ast.Name):
            return None
        got = self._lookup(expr.id, chain)
        if got is None:
            return None
        out: set[str] = set()
        for kind, value, target in got[0]:
            if kind == "value" and isinstance(value, ast.Constant) and isinstance(value.value, str):
                out.add(value.value)
                continue
            elements = self.elements(value, chain) if kind == "loop" and value is not None else None
            if elements is None:
                return None
            for element in elements:
                picked = _pick(target, element, expr.id)
                if picked is None:
                    return None
                for node in picked:
                    if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                        return None
                    out.add(node.value)
        return out


def _pick(target: ast.AST | None, element: ast.AST, name: str) -> list[ast.AST] | None:
    """The parts of one iterated element a loop target binds to `name`; None when the shapes do not match."""
    if isinstance(target, ast.Name):
        return [element] if target.id == name else []
    if isinstance(target, (ast.Tuple, ast.List)):
        if not any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(target)):
            return []
        if not isinstance(element, (ast.Tuple, ast.List)) or len(element.elts) != len(target.elts):
            return None
        out: list[ast.AST] = []
        for t, e in zip(target.elts, element.elts, strict=True):
            got = _pick(t, e, name)
            if got is None:
                return None
            out += got
        return out
    return None
