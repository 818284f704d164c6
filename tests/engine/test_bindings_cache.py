"""A cell's bindings are read once per cell text across a class (autograder/grading/bindings.py): the same cell in
another notebook, at another index or after other cells, gets its own cell number and order; a cell that does not
parse is read line by line as before."""

from __future__ import annotations

import pytest

import autograder.grading.bindings as bindings_module
from autograder.grading.bindings import cell_bindings, in_effect


def test_a_shared_cell_is_walked_once_and_numbered_in_each_notebook(monkeypatch: pytest.MonkeyPatch) -> None:
    shared = "import math\n\n\ndef alpha_c71(x):\n    return math.sqrt(x)\n"
    first = cell_bindings([(0, "y_c71 = 1\n"), (1, shared)])
    walks: list[int] = []
    real = bindings_module.statement_bindings

    def counting(body: list, only: set[str] | None = None) -> list:
        walks.append(len(body))
        return real(body, only)

    monkeypatch.setattr(bindings_module, "statement_bindings", counting)
    second = cell_bindings([(3, shared), (4, "alpha_c71 = None\n"), (7, "y_c71 = 1\n")])
    assert walks == [1]  # only the one new cell's text was walked
    assert [(b.name, b.cell, b.line, b.kind, b.seq) for b in first] == [
        ("y_c71", 0, 1, "assignment", 0), ("math", 1, 1, "import", 1), ("alpha_c71", 1, 4, "def", 2)]
    assert [(b.name, b.cell, b.seq) for b in second] == [
        ("math", 3, 0), ("alpha_c71", 3, 1), ("alpha_c71", 4, 2), ("y_c71", 7, 3)]
    assert in_effect(second, "alpha_c71").kind == "assignment"  # type: ignore[union-attr]
    assert in_effect(first, "alpha_c71").kind == "def"  # type: ignore[union-attr]


def test_a_cell_that_does_not_parse_is_read_line_by_line_in_each_notebook() -> None:
    broken = "def beta_c71(:\n    pass\ngamma_c71 = 2\n"
    for cells in ([(0, broken)], [(5, "x_c71 = 0\n"), (6, broken)]):
        found = [(b.name, b.cell, b.line, b.kind, b.node) for b in cell_bindings(cells) if b.name != "x_c71"]
        index = cells[-1][0]
        assert found == [("beta_c71", index, 1, "definition (cell not parsed)", None),
                         ("gamma_c71", index, 3, "definition (cell not parsed)", None)]
