"""The student's code as the report shows it: a submission's notebook re-read as data (never run), its code
cells and written answers, and the AST analysis of which statement bound each graded name (bindings, stubs)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autograder.authoring.questions import Question
from autograder.config import ROOT
from autograder.grading.bindings import DYNAMIC, Binding, bindings, graded_bindings
from autograder.grading.submissions import read_cells
from autograder.report.text import clip_text
from autograder.sandbox import SKIP_TAGS

CODE_CHARS = 20_000  # per cell
ANSWER_PLACEHOLDERS = ("_Type your answer here, replacing this text._", "YOUR ANSWER HERE")


def resolve_path(path: str | None, grades: Path) -> Path | None:
    if not path:
        return None
    p = Path(path)
    candidates = [p] if p.is_absolute() else [Path.cwd() / p, ROOT / p, grades.parent / p]
    return next((c for c in candidates if os.path.lexists(c)), None)


def submission_cells(path: str | None, grades: Path, *, limits: Any = None) -> tuple[list[dict[str, Any]], str]:
    """The cells of a submission's notebook, from the path its result records, read as data only (never run), or
    why there are none (the report's view; what the grader runs of a notebook's bytes is the sandbox's read_notebook).

    Read with the grader's own reader (regular files only, never a link, under the same caps).
    """
    file = resolve_path(path, grades)
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
