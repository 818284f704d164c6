"""Fingerprints of the code a student wrote, for the similarity report: each cell normalised on its own (IPython's
magics and shell lines blanked; a cell that does not parse is read token by token, so it never switches the
normalisation off for the other cells), split into units (each top-level function, each method, each run of other
statements), each unit's tokens normalised (local names, comments, docstrings, annotations and the contents of
strings do not count; `@` and a call to `matmul`/`mm`/`bmm` read alike) and winnowed into k-gram hashes."""

from __future__ import annotations

import ast
import builtins
import copy
import hashlib
import io
import keyword
import re
import tokenize
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from autograder.pyast import parse

K = 15  # a fingerprint is the hash of K consecutive normalised tokens
WINDOW = 3  # winnowing keeps the smallest of every WINDOW consecutive k-gram hashes: every shared run of
#            K + WINDOW - 1 tokens is found
MATMUL = {"matmul", "mm", "bmm", "__matmul__"}  # a call of one of these with two operands reads as `a @ b`
_BUILTINS = set(dir(builtins))
_MAGIC = re.compile(r"^[ \t]*(?:[%!]|\?).*$|^.*\?\?[ \t]*$|^[ \t]*\w[\w.]*\?[ \t]*$", re.M)
_ASSIGNED_MAGIC = re.compile(r"^([ \t]*[\w.,\[\] ()]+=[ \t]*)[%!].*$", re.M)
_SKIP = {tokenize.COMMENT, tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING, tokenize.ENDMARKER}
_IMPORT = re.compile(r"^[ \t]*(?:from[ \t]+([\w.]+)[ \t]+)?import[ \t]+(.+)$", re.M)


@dataclass
class Unit:
    """One unit of a student's code: where it is (cell number in the list given, first and last line there) and its
    fingerprints."""

    cell: int
    first: int
    last: int
    hashes: set[int] = field(default_factory=set)


def strip_magics(source: str) -> str:
    """The cell with IPython's line magics, shell lines and help lines blanked (line numbers kept), `x = %magic` and
    `x = !cmd` made `x = None`, and a cell magic's first line blanked (its body is Python)."""
    source = _ASSIGNED_MAGIC.sub(lambda m: m.group(1) + "None", source)
    return _MAGIC.sub("", source)


def aliases(cells: Sequence[str]) -> dict[str, str]:
    """The names the student's imports bind to modules and their members (`np` -> `numpy`, `F` ->
    `torch.nn.functional`, `nn` -> `torch.nn`): read line by line, so a cell that does not parse still counts."""
    out: dict[str, str] = {}
    for cell in cells:
        for m in _IMPORT.finditer(cell):
            base = m.group(1)
            for part in m.group(2).strip("() \t").split(","):
                words = part.split()
                if not words or not re.fullmatch(r"[\w.]+", words[0]):
                    continue
                full = f"{base}.{words[0]}" if base else words[0]
                name = words[2] if len(words) >= 3 and words[1] == "as" else words[0].split(".")[0]
                out[name] = full if (base or len(words) >= 3) else name
                out.setdefault(full.split(".")[0], full.split(".")[0])
    return out


def _normalised(tokens: Iterator[tokenize.TokenInfo], names: dict[str, str]) -> list[str]:
    """Tokens as compared: names of the student's own become V (builtins, keywords, modules and attributes stay),
    strings S, numbers by value; comments and layout dropped, the end of each statement kept."""
    out: list[str] = []
    prev, depth = "", 0
    toks = list(tokens)
    for n, t in enumerate(toks):
        if t.type in _SKIP:
            continue
        text = t.string
        if t.type == tokenize.NAME:
            nxt = next((u.string for u in toks[n + 1:n + 2]), "")
            if keyword.iskeyword(text) or prev == "." or text in _BUILTINS or (depth and nxt == "="):
                word = text
            else:
                word = names.get(text, "V")
        elif t.type == tokenize.STRING:
            word = "S"
        elif t.type == tokenize.NUMBER:
            try:
                word = repr(ast.literal_eval(text))
            except (ValueError, SyntaxError):
                word = text
        elif t.type == tokenize.NEWLINE:
            word = ";"
        else:
            word = text
            depth += text in "([{"
            depth -= text in ")]}" and depth > 0
        out.append(word)
        prev = text
    return out


def _tokens(source: str) -> Iterator[tokenize.TokenInfo]:
    """Python's tokens of `source`, as far as it tokenizes; after an error, each later line on its own."""
    lines = source.splitlines(keepends=True)
    done = 0
    try:
        for t in tokenize.generate_tokens(io.StringIO(source).readline):
            done = t.end[0]
            yield t
        return
    except (tokenize.TokenError, SyntaxError, ValueError):
        pass
    for line in lines[done:]:
        try:
            yield from tokenize.generate_tokens(io.StringIO(line).readline)
        except (tokenize.TokenError, SyntaxError, ValueError):
            continue


def _matmul(node: ast.AST) -> ast.AST | None:
    """`a @ b` for a call of matmul/mm/bmm with two operands (`torch.matmul(a, b)`, `a.matmul(b)`), else None."""
    if not isinstance(node, ast.Call) or node.keywords or not isinstance(node.func, ast.Attribute | ast.Name):
        return None
    name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
    if name not in MATMUL:
        return None
    if len(node.args) == 2:
        return ast.BinOp(node.args[0], ast.MatMult(), node.args[1])
    if len(node.args) == 1 and isinstance(node.func, ast.Attribute):
        return ast.BinOp(node.func.value, ast.MatMult(), node.args[0])
    return None


_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_ENDS = (ast.Return, ast.Raise, ast.Continue, ast.Break)


def _live(body: list[ast.stmt], read: set[str]) -> list[ast.stmt]:
    """A block without its dead code: what follows a return/raise/continue/break, `if False:` (its else stays),
    assignments to names the function never reads, and `pass` among other statements."""
    out: list[ast.stmt] = []
    for stmt in body:
        if isinstance(stmt, ast.If) and isinstance(stmt.test, ast.Constant) and not stmt.test.value:
            out += stmt.orelse
            continue
        if isinstance(stmt, ast.Assign | ast.AugAssign | ast.AnnAssign) and all(
                isinstance(t, ast.Name) and t.id not in read
                for t in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target])):
            continue
        if isinstance(stmt, ast.Pass) and len(body) > 1:
            continue
        out.append(stmt)
        if isinstance(stmt, _ENDS):
            break
    return out


def _reads(function: ast.AST) -> set[str]:
    """The names a function reads (anywhere in it, nested functions too), and those it declares global."""
    out = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Store):
            out.add(node.id)
        elif isinstance(node, ast.Global | ast.Nonlocal):
            out.update(node.names)
    return out


Helpers = dict[str, tuple[list[str], ast.expr]]


def one_line_helpers(trees: Sequence[ast.Module]) -> Helpers:
    """The student's top-level functions whose body is one `return <expression>` (after a docstring) and whose
    parameters are plain: name -> (parameters, expression). Their calls are read as the expression written out,
    so inlining a helper (or writing one) changes nothing. A helper whose expression calls a helper is left be."""
    found: Helpers = {}
    for tree in trees:
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or node.decorator_list:
                continue
            body = _live([s for s in node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))],
                         _reads(node))
            args = node.args
            if (len(body) == 1 and isinstance(body[0], ast.Return) and body[0].value is not None
                    and not (args.vararg or args.kwarg or args.kwonlyargs or args.posonlyargs or args.defaults)):
                found[node.name] = ([a.arg for a in args.args], body[0].value)
    calls = {n.func.id for _, e in found.values() for n in ast.walk(e)
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    return {k: v for k, v in found.items() if k not in calls}


class _Substitute(ast.NodeTransformer):
    def __init__(self, args: dict[str, ast.expr]) -> None:
        self.args = args

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return copy.deepcopy(self.args[node.id]) if node.id in self.args else node


def _inlined(node: ast.AST, helpers: Helpers) -> ast.AST | None:
    """A call of a one-line helper with its arguments put in its expression, else None."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in helpers
            and not node.keywords and not any(isinstance(a, ast.Starred) for a in node.args)):
        return None
    params, expr = helpers[node.func.id]
    if len(params) != len(node.args):
        return None
    return _Substitute(dict(zip(params, node.args))).visit(copy.deepcopy(expr))


def _rewritten(node: ast.AST, helpers: Helpers) -> ast.AST:
    for _ in range(8):
        new = _matmul(node) or _inlined(node, helpers)
        if new is None:
            break
        node = new
    return node


def _canonical(tree: ast.AST, helpers: Helpers) -> None:
    """Rewrite the tree in place (iteratively: a deeply nested expression cannot exhaust the stack): docstrings and
    bare strings dropped, annotations dropped, matmul calls as `@`, one-line helpers written out at their calls."""
    todo: list[tuple[ast.AST, set[str] | None]] = [(tree, None)]
    while todo:
        node, read = todo.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            node.returns = None
            read = _reads(node)
        if isinstance(node, ast.arg):
            node.annotation = None
        for name, value in ast.iter_fields(node):
            if isinstance(value, list):
                if name in ("body", "orelse", "finalbody") and value and isinstance(value[0], ast.stmt):
                    kept = [s for s in value if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
                                                     and isinstance(s.value.value, str))]
                    kept = [ast.Assign([s.target], s.value, lineno=s.lineno) if isinstance(s, ast.AnnAssign)
                            and s.value is not None else s for s in kept
                            if not (isinstance(s, ast.AnnAssign) and s.value is None)]
                    kept = _live(kept, read) if read is not None else kept
                    value[:] = kept or ([ast.Pass()] if name == "body" else [])
                value[:] = [_rewritten(v, helpers) if isinstance(v, ast.expr) else v for v in value]
                todo.extend((v, read) for v in value if isinstance(v, ast.AST))
            elif isinstance(value, ast.AST):
                if isinstance(value, ast.expr):
                    value = _rewritten(value, helpers)
                    setattr(node, name, value)
                todo.append((value, read))


def _spans(tree: ast.Module) -> list[tuple[ast.stmt, int, int]]:
    """The units of a parsed cell: (statement, first line, last line) per top-level function and per method, and
    one per run of other top-level statements (a class's own statements are one unit)."""
    out: list[tuple[ast.stmt, int, int]] = []

    def first(node: ast.stmt) -> int:
        return min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])

    defs = (ast.FunctionDef, ast.AsyncFunctionDef)
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            methods = [m for m in node.body if isinstance(m, defs)]
            rest = [m for m in node.body if not isinstance(m, defs)]
            shell = copy.copy(node)
            shell.body = rest or [ast.Pass()]
            out.append((shell, first(node), node.end_lineno or node.lineno))
            out += [(m, first(m), m.end_lineno or m.lineno) for m in methods]
        else:
            out.append((node, first(node), node.end_lineno or node.lineno))
    return out


def parsed(source: str) -> ast.Module | None:
    """The cell parsed, its magics blanked; None when it does not parse (a syntax error, a tree too deep)."""
    try:
        return parse(strip_magics(source))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def unit_tokens(source: str, names: dict[str, str], helpers: Helpers | None = None,
                tree: ast.Module | None = None, dead: set[str] = frozenset()) -> list[tuple[int, int, list[str]]]:
    """One cell's units as (first line, last line, normalised tokens); `tree`: the cell already parsed; `dead`: the
    names of top-level functions and classes left out."""
    code = strip_magics(source)
    try:
        tree = tree or parse(code)
        tree.body = [n for n in tree.body if getattr(n, "name", None) not in dead]
        _canonical(tree, helpers or {})
        units = _spans(tree)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return [(1, max(1, code.count("\n") + 1), _normalised(_tokens(code), names))]
    lines = code.splitlines(keepends=True)
    out: list[list] = []
    defs = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    for node, a, b in units:
        try:
            text = ast.unparse(node) + "\n"
        except (RecursionError, ValueError, MemoryError):
            text = "".join(lines[a - 1:b])
        toks = _normalised(_tokens(text), names)
        if not isinstance(node, defs) and out and out[-1][3]:  # a run of other statements is one unit
            out[-1][1], out[-1][2] = b, out[-1][2] + toks
        else:
            out.append([a, b, toks, not isinstance(node, defs)])
    return [(a, b, toks) for a, b, toks, _ in out]


def _hash(gram: Sequence[str]) -> int:
    return int.from_bytes(hashlib.blake2b("\x1f".join(gram).encode("utf-8", "surrogatepass"),
                                          digest_size=8).digest(), "big") >> 1


def winnow(tokens: Sequence[str], *, k: int = K, window: int = WINDOW) -> set[int]:
    """The winnowed fingerprints of a token sequence: of every `window` consecutive k-gram hashes the smallest
    (a sequence shorter than k gives the hash of the whole when it holds at least k // 2 tokens)."""
    if len(tokens) < k:
        return {_hash(tokens)} if len(tokens) >= k // 2 else set()
    grams = [_hash(tokens[i:i + k]) for i in range(len(tokens) - k + 1)]
    if window <= 1 or len(grams) <= window:
        return set(grams) if window <= 1 else {min(grams)}
    return {min(grams[i:i + window]) for i in range(len(grams) - window + 1)}


def defined_names(cells: Sequence[str]) -> set[str]:
    """The top-level functions and classes of `cells` (the template's: a helper of that name is never left out)."""
    out = set()
    for tree in map(parsed, cells):
        out.update(n.name for n in (tree.body if tree else []) if isinstance(n, _DEFS))
    return out


def fingerprint(cells: Sequence[str], *, names: dict[str, str] | None = None, keep: set[str] = frozenset()
                ) -> list[Unit]:
    """A student's units with their fingerprints (cells: the code cells they wrote, in order; keep: the names of
    the template's functions and classes, whose units are never left out)."""
    names = aliases(cells) if names is None else names
    trees = [parsed(cell) for cell in cells]
    helpers = one_line_helpers([t for t in trees if t is not None])
    called = {n.func.id for t in trees if t is not None for n in ast.walk(t)
              if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    dead = (set(helpers) & called) - keep  # their expression is written out at their calls
    out = []
    for n, cell in enumerate(cells):
        for first, last, toks in unit_tokens(cell, names, helpers, trees[n], dead):
            hashes = winnow(toks)
            if hashes:
                out.append(Unit(n, first, last, hashes))
    return out
