"""The first real cause of a question's failures, read from the notebook itself (never run): a cell with a syntax
error that should have defined what the question grades, or a definition still as the template left it. Its
failed cases then say that cause, once per question, instead of what it led to (a name not defined, a None
returned, an error inside a library)."""

from __future__ import annotations

import re

from autograder.authoring.suite import Suite
from autograder.grading.bindings import Binding, bindings, in_effect, stub_state
from autograder.model import CaseResult, Reason
from autograder.pyast import parse
from autograder.sandbox import NotebookError, read_notebook

_SYNTAX = ("SyntaxError", "IndentationError", "TabError")


def syntax_errors(cells: list[tuple[int, str]], notes: list[str]) -> dict[int, tuple[int, str]]:
    """Cells the sandbox reported a syntax error for (its notes: "cell N: SyntaxError: ..."), each with the line
    and message of the grader's own parse of the cell (lines IPython runs as magics or shell commands read as
    blank); a cell the grader parses without error is left out, whatever the notes say."""
    said = {int(m.group(1)) for n in notes if (m := re.match(rf"cell (\d+): ({'|'.join(_SYNTAX)}): ", n))}
    found = {}
    for i, src in cells:
        if i not in said:
            continue
        try:
            parse(re.sub(r"^[ \t]*[%!].*$", "", src, flags=re.M))
        except SyntaxError as exc:
            msg = " ".join(str(exc.msg).split())[:120]
            found[i] = (int(exc.lineno or 0), f"{type(exc).__name__}: {msg}")
        except (ValueError, RecursionError, MemoryError):
            continue
    return found


def first_causes(suite: Suite, source: bytes, cases: list[CaseResult], notes: list[str]) -> list[str]:
    """Rewrite the messages of failed cases whose first cause is a syntax error or a blank stub (in place); the
    sentences the student is told first (one per broken cell)."""
    if all(c.passed for c in cases) and not any(re.match(rf"cell \d+: ({'|'.join(_SYNTAX)}): ", n) for n in notes):
        return []  # nothing to explain: a full-marks notebook is not parsed again
    try:
        cells, _ = read_notebook(source)
    except NotebookError:
        return []
    broken = syntax_errors(cells, notes)
    words = suite.lesson.runtime.NOT_FILLED  # a blank stub's words, as the lesson's runtime spells them
    found = bindings(cells)
    said = [f"Cell {i} has a syntax error on line {line} ({msg}): nothing in it ran, so what it defines does not "
            "exist and every check that uses it fails. Fix that line, then run the cell." for i, (line, msg)
            in sorted(broken.items())]
    for q in suite.questions:
        names = sorted(q.solution)
        failed = [c for c in cases if c.question == q.id and not c.passed and c.reason != Reason.TIME_LIMIT]
        if not names or not failed:
            continue
        broke = _broken_cause(names, found, broken)
        cause = (broke, failed) if broke else _stub_cause(names, cells, failed, words=words)
        if cause is None:
            continue
        text, which = cause
        reason = Reason.SYNTAX_ERROR if broke else Reason.BLANK
        again = words if reason == Reason.BLANK else "the same syntax error"
        for n, c in enumerate(which):
            c.message = f"{c.id}: {text}" if n == 0 else f"{c.id}: {again} (see {which[0].id})"
            c.reason = reason
    return said


def _broken_cause(names: list[str], found: list[Binding], broken: dict[int, tuple[int, str]]) -> str:
    """Why a question's names are missing when the cell that defines one of them has a syntax error."""
    for name in names:
        b = in_effect(found, name)
        if b is not None and b.cell in broken:
            line, msg = broken[b.cell]
            return (f"`{name}` was never defined: cell {b.cell} has a syntax error on line {line} ({msg}). Fix it "
                    "and run the cell.")
    return ""


def _stub_cause(names: list[str], cells: list[tuple[int, str]], failed: list[CaseResult], *,
                words: str) -> tuple[str, list[CaseResult]] | None:
    """The question's definitions still as the template left them, and the failed cases they explain: every one
    when all of them are blank, else those that raised or wait for another case."""
    stubs = [n for n, blank in stub_state(cells, set(names)).items() if blank]
    if not stubs:
        return None
    every = len(stubs) == len(names)
    which = [c for c in failed if every or (isinstance(c.received, dict) and "error" in c.received)
             or c.reason in (Reason.BLANK, Reason.WAITS)]
    listed = " and ".join(f"`{n}`" for n in sorted(stubs))
    return f"{words}: {listed} still {'has' if len(stubs) == 1 else 'have'} the template's `...` body.", which


def named_functions(suite: Suite, notes: list[str]) -> list[str]:
    """The sandbox's time notes with each question whose checks ran out of time followed by the functions it grades
    (its solution names): the check that was slow names its probe; the student reads which function to speed up."""
    out = []
    for note in notes:
        for q in suite.questions:
            if q.solution and f"checks of {q.id} " in note:
                names = " and ".join(f"`{n}`" for n in sorted(q.solution))
                note = note.replace(f"checks of {q.id} ", f"checks of {q.id} (they call {names}) ", 1)
        out.append(note)
    return out
