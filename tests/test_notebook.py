"""One notebook decoder: the report reads a submission's cells exactly when grading can read its notebook."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autograder.grading.submissions import read_cells
from autograder.sandbox.notebook import NotebookError, read_notebook

CELLS = [{"cell_type": "code", "source": "x = 1", "metadata": {}, "outputs": [], "execution_count": None}]
PLAIN = json.dumps({"cells": CELLS, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}).encode()


@pytest.mark.parametrize("name, source, readable", [
    ("plain", PLAIN, True),
    ("byte_order_mark", b"\xef\xbb\xbf" + PLAIN, True),  # Windows editors write one: grading reads it
    ("not_utf8", PLAIN.replace(b"x = 1", b"x = '\xff'"), False),  # grading refuses it: nothing to show either
    ("empty", b"  \n", False),
    ("no_cells", b'{"worksheets": []}', False),
])
def test_the_report_reads_what_grading_reads(tmp_path: Path, name: str, source: bytes, readable: bool) -> None:
    path = tmp_path / f"{name}.ipynb"
    path.write_bytes(source)
    cells, problem = read_cells(path)
    if readable:
        assert read_notebook(source)[0] == [(0, "x = 1")]
        assert (cells, problem) == (CELLS, "")
    else:
        with pytest.raises(NotebookError) as err:
            read_notebook(source)
        assert cells == [] and problem == f"the notebook could not be read: {err.value}"
