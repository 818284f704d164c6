"""The review's reading of a cell, kept per cell text across a class (autograder/grading/review.py): a class shares
most cells, so a notebook whose cells were all read before is not parsed again; and what a reading depends on
beyond its own text (the modules the cells before it imported, the notebook's other cells for a computed name or a
scope) still gives each notebook its own flags, in either order. Pure review on small sources."""

from __future__ import annotations

import ast

import pytest

import autograder.grading.review as review
from autograder.grading.review import ALL, review_cells

GRADED = {"qa": ["alpha"]}


def texts(*cells: str) -> list[tuple[str, str, object]]:
    return [(f.kind, f.code, f.scope) for f in review_cells(list(enumerate(cells)), graded=GRADED)]


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every cell text the review parses from now on."""
    seen: list[str] = []

    def counting(source: str, filename: str = "<unknown>") -> ast.Module:
        seen.append(source)
        return ast.parse(source, filename)

    monkeypatch.setattr(review, "parse", counting)
    return seen


def test_a_notebook_read_before_is_not_parsed_again(parses: list[str]) -> None:
    cells = ["import numpy as np\nTAG_9f3 = 1\n", "def alpha_9f3(x):\n    return np.asarray(x)\n", "alpha_9f3(1)\n"]
    first = texts(*cells)
    assert len(parses) == 3
    assert texts(*cells) == first == []
    assert len(parses) == 3  # the second student with the same cells: no parse, no walk


def test_two_notebooks_differing_in_one_cell_get_their_own_flags() -> None:
    head = "import numpy as np\nimport torch\n"
    honest = texts(head, "y_4c1 = np.allclose(1, 1)\n", "z_4c1 = torch.zeros(2)\n")
    rebinds = texts(head, "np.allclose = lambda *a, **k: True\n", "z_4c1 = torch.zeros(2)\n")
    assert honest == []
    assert rebinds == [("rebinding", "np.allclose = lambda *a, **k: True", ALL)]
    assert texts(head, "y_4c1 = np.allclose(1, 1)\n", "z_4c1 = torch.zeros(2)\n") == []


def test_the_same_cell_after_other_imports_is_read_again() -> None:
    cell = "np.allclose = lambda *a, **k: True  # 7e2\n"
    assert texts("np = object()\n", cell) == []  # np is no module here: nothing of a library is rebound
    assert [k for k, _, _ in texts("import numpy as np\n", cell)] == ["rebinding"]
    assert texts("np = object()\n", cell) == []


def test_a_cell_whose_reading_needs_the_other_cells_is_read_in_its_notebook() -> None:
    cell = "import torch\nfn_b83 = getattr(torch, name_b83)\n"
    assert texts('name_b83 = "zeros"\n', cell) == []  # the name resolves to a harmless attribute
    assert [k for k, _, _ in texts("name_b83 = input()\n", cell)] == ["dynamic"]
    assert [k for k, _, _ in texts('name_b83 = "_C"\n', cell)] == ["torch internals"]
    assert texts('name_b83 = "zeros"\n', cell) == []


def test_a_cached_flag_takes_the_scope_of_its_own_notebook() -> None:
    helper = "import gc\n\n\ndef helper_5d0():\n    return gc.get_objects()\n"
    graded = texts(helper, "def alpha(x):\n    return helper_5d0()\n")
    ungraded = texts(helper, "def other_5d0(x):\n    return helper_5d0()\n")
    assert [(k, s) for k, _, s in graded] == [("interpreter", ("qa",))]
    assert [(k, s) for k, _, s in ungraded] == [("interpreter", ALL)]


def test_a_long_cell_is_read_afresh_in_each_notebook(parses: list[str]) -> None:
    long = "np.allclose = lambda *a, **k: True\n" + "x_a19 = 1\n" * (review.CACHED_CELL_CHARS // 10)
    assert len(long) > review.CACHED_CELL_CHARS
    for _ in range(2):
        assert [k for k, _, _ in texts("import numpy as np\n", long)] == ["rebinding"]
        assert texts("np = object()\n", long) == []
    assert parses.count(long) == 4  # never kept: each notebook parses it again
