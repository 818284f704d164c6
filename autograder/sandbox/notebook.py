"""Reading a submitted notebook: the one decoder of its bytes into code cells."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from autograder.sandbox.limits import MIB, UPLOAD_CAP_MB

SKIP_TAGS = ("long-running", "milestone-train")
MAX_NOTEBOOK_BYTES = UPLOAD_CAP_MB * MIB


class NotebookError(ValueError):
    """A submission that cannot be read as a Jupyter notebook."""



def notebook_cells(source: bytes) -> list[Any]:
    """The cells of a notebook file's bytes (each as the JSON holds it), or NotebookError saying why there are none:
    the one decoder of a submitted notebook, for grading (read_notebook) and for the report."""
    if type(source) is not bytes:
        raise NotebookError(f"expected the notebook's bytes, got {type(source).__name__}")
    if not source.strip():
        raise NotebookError("the file is empty")
    if len(source) > MAX_NOTEBOOK_BYTES:
        raise NotebookError(f"the file is {len(source)} bytes, over the {MAX_NOTEBOOK_BYTES} byte cap")
    try:
        nb = json.loads(source.decode("utf-8-sig"))
    except UnicodeDecodeError:
        raise NotebookError("not a notebook: the file is not UTF-8 text (a zip, pickle or binary?)") from None
    except (ValueError, RecursionError) as exc:
        raise NotebookError(f"not a notebook: the file is not valid JSON ({str(exc)[:120]})") from None
    if type(nb) is not dict or type(nb.get("cells")) is not list:
        if type(nb) is dict and "worksheets" in nb:
            raise NotebookError("notebook format 3 is not supported: open and save it in Jupyter first")
        raise NotebookError("not a notebook: valid JSON, but without a list of cells")
    return nb["cells"]


def read_notebook(source: bytes, *,
                  skip_tags: Iterable[str] = SKIP_TAGS) -> tuple[list[tuple[int, str]], list[int]]:
    """Code cells to run as (cell index, source), and the indices of cells skipped for their tags."""
    skip = set(skip_tags)
    cells: list[tuple[int, str]] = []
    skipped: list[int] = []
    for i, cell in enumerate(notebook_cells(source)):
        if type(cell) is not dict:
            raise NotebookError(f"not a notebook: cell {i} is not an object")
        if cell.get("cell_type") != "code":
            continue
        src = cell.get("source", "")
        if type(src) is list and all(type(s) is str for s in src):
            src = "".join(src)
        meta = cell.get("metadata", {})
        tags = meta.get("tags", []) if type(meta) is dict else []
        if type(src) is not str or type(tags) is not list:
            raise NotebookError(f"not a notebook: cell {i} has a malformed source or tags")
        if skip.intersection(t for t in tags if type(t) is str):
            skipped.append(i)
        else:
            cells.append((i, src))
    return cells, skipped
