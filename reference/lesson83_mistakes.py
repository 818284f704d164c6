"""Catalogue of typical Lesson 83 mistakes, each a wrong redefinition applied on top of the reference.

The catalogue's rows live in lesson83_mistakes.yaml next to this file; this module turns each into a Mistake,
with the correct definitions that most rows edit (two of them read from the reference).
"""

from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REFERENCE_SOURCE = Path(__file__).with_name("lesson83.py")
CATALOGUE = Path(__file__).with_suffix(".yaml")


@dataclass(frozen=True)
class Mistake:
    """A named wrong implementation: `code` redefines one or more reference names."""

    id: str
    question: str
    description: str
    code: str


def reference_namespace(mistake: Mistake | None = None) -> dict[str, Any]:
    """Namespace of the reference solution as a notebook would hold it, optionally with one mistake applied."""
    ns: dict[str, Any] = {"__name__": "lesson83_reference"}
    exec(compile(REFERENCE_SOURCE.read_text(), str(REFERENCE_SOURCE), "exec"), ns)  # noqa: S102
    if mistake is not None:
        exec(compile(mistake.code, f"<mistake {mistake.id}>", "exec"), ns)  # noqa: S102
    return ns


def _edit(base: str, *edits: tuple[str, str]) -> str:
    """`base` with each (old, new) replacement made in turn; each old text must occur exactly once."""
    for old, new in edits:
        if base.count(old) != 1:
            raise ValueError(f"{old!r} occurs {base.count(old)} times, not once, in:\n{base}")
        base = base.replace(old, new)
    return base


_LM_METHODS = {  # method -> (its signature, what runs before the override, the fallback after it)
    "attend": ("attend(self, q, k, v)", "", "return super().attend(q, k, v)"),
    "add_positions": ("add_positions(self, H)", "", "return super().add_positions(H)"),
    "__init__": ("__init__(self, *args, **kwargs)", "super().__init__(*args, **kwargs)", ""),
}


def _lm_subclass(method: str, pos: str, body: str) -> str:
    """Source of a TinyCharLM subclass whose `method` runs `body` under the scheme `pos` and the reference's
    own method otherwise (`__init__` runs the reference's first, then `body`)."""
    signature, before, after = _LM_METHODS[method]
    lines = ["", "class TinyCharLM(TinyCharLM):", f"    def {signature}:", *([f"        {before}"] if before else []),
             f'        if self.pos == "{pos}":', textwrap.indent(textwrap.dedent(body).strip("\n"), " " * 12),
             *([f"        {after}"] if after else [])]
    return "\n".join(lines) + "\n"


def _solution(name: str) -> str:
    """The reference's top-level function `name` without its docstring and its solution markers."""
    source = REFERENCE_SOURCE.read_text()
    fn = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == name)
    doc = fn.body[0]
    assert ast.get_docstring(fn) is not None and doc.end_lineno is not None and fn.end_lineno is not None
    lines = source.splitlines()
    body = [*lines[fn.lineno - 1:doc.lineno - 1], *lines[doc.end_lineno:fn.end_lineno]]
    return "".join(f"\n{line}" for line in body if line.strip() not in ("# BEGIN SOLUTION", "# END SOLUTION")) + "\n"


_CATALOGUE: dict[str, Any] = yaml.safe_load(CATALOGUE.read_text())

# Correct definitions as the catalogue's rows edit them (`base:`), so that the edit is the mistake: the
# reference's own where the rows write it as it is (but for self_attention's causal mask, on one line and on the
# default device: Q1 has no device check), and the catalogue's own compact ones.
_BASES: dict[str, str] = {
    "self_attention": _edit(_solution("self_attention"), (
        "future = torch.ones(T, T, dtype=torch.bool, device=X.device).triu(1)\n"
        "        scores = scores.masked_fill(future,",
        "scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1),")),
    "rope_attention": _solution("rope_attention"),
    **{name: "\n" + code for name, code in _CATALOGUE["bases"].items()},
}


def _code(row: dict[str, Any]) -> str:
    """The source of one catalogue row: its code, its base with its edits, or its TinyCharLM override."""
    if "base" in row:
        return _edit(_BASES[row["base"]], *(tuple(pair) for pair in row["edits"]))
    if "override" in row:
        return _lm_subclass(row["override"]["method"], row["override"]["when"], row["body"])
    return "\n" + row["code"]  # like the other two: a blank line first, then the definitions


def _mistake(row: dict[str, Any]) -> Mistake:
    """One catalogue row as a Mistake; a row with a key it does not know, or with none of code, base or
    override, is an error that names the row."""
    known = {"id", "question", "description", "code", "base", "edits", "override", "body"}
    if set(row) - known or sum(k in row for k in ("code", "base", "override")) != 1:
        raise ValueError(f"{CATALOGUE}: row {row.get('id')!r}: keys {sorted(row)}; it needs id, question, "
                         "description and one of code, base (with edits) or override (with body)")
    return Mistake(row["id"], row["question"], row["description"], _code(row))


MISTAKES: tuple[Mistake, ...] = tuple(_mistake(row) for row in _CATALOGUE["mistakes"])
