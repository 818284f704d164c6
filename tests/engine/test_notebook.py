"""One notebook decoder: the report reads a submission's cells exactly when grading can read its notebook."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest

from autograder.config import ROOT
from autograder.grading.submissions import read_cells
from autograder.sandbox import NotebookError, read_notebook

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


IPYTHON_SYNTAX = ["%time x = 1\ny = 2", "a = !ls\nb = 1", "def f():\n    return 1\nf?", "\n\nx = 1\ny = 2",
                  "  x = 1\n  y = 2", "pwd", "x = 1\n%matplotlib inline", ">>> x = 1\n>>> y = 2", "%%time\nx = 1"]
PLAIN_CELLS = ["x = 1\ny = 2", "s = '''%time\n!x'''\nt = 1", "x = 1  # why?\ny = 2", "class A:\n    pass\n"]


def test_the_sandbox_skips_ipython_transforms_only_where_they_change_nothing() -> None:
    """The child's fast path (sandbox/child.py) gives exactly what IPython's transform gives, on IPython syntax
    (magics, shell escapes, help, prompts, blank or indented starts, a bare name) and on every code cell of the
    student release; and it does skip IPython on plain multi-line cells."""
    from IPython.core.interactiveshell import InteractiveShell

    from autograder.sandbox.child import transform_cell

    shell = InteractiveShell.instance()
    templates = sorted(ROOT.glob("student_templates/*/*.ipynb"))  # every committed student release
    assert templates
    cells = [*IPYTHON_SYNTAX, *PLAIN_CELLS, *("".join(c["source"]) for t in templates for c in read_cells(t)[0]
                                              if c["cell_type"] == "code")]
    for cell in cells:
        assert transform_cell(shell.transform_cell, cell) == shell.transform_cell(cell), cell
    calls: list[str] = []
    for cell in PLAIN_CELLS:
        transform_cell(calls.append, cell)
    assert calls == []


ASYNC_CELLS = ["import asyncio\nawait asyncio.sleep(0)\nx = 1", "async def f():\n    return 1\ny = await f()",
               "s = 'await'\nt = 2", "async_total = 3\nu = async_total"]


def test_the_sandbox_parses_each_cell_once_and_asks_ipython_about_await_only_where_it_may_be(tmp_path: Path) -> None:
    """The child's shell answers IPython's parse of a cell from its own fast-path parse (the same syntax tree) and
    its top-level-await check without compiling where the words await and async are absent; on every cell of the
    student releases, IPython syntax and cells with top-level await, the answers and the resulting namespaces are
    IPython's own."""
    import ast

    from IPython.core.interactiveshell import InteractiveShell

    from autograder.sandbox.child import make_shell

    templates = sorted(ROOT.glob("student_templates/*/*.ipynb"))
    cells = [*IPYTHON_SYNTAX, *PLAIN_CELLS, *ASYNC_CELLS,
             *("".join(c["source"]) for t in templates for c in read_cells(t)[0] if c["cell_type"] == "code")]
    ours = make_shell()
    stock = InteractiveShell()
    for cell in cells:
        transformed = ours.transform_cell(cell)
        assert transformed == stock.transform_cell(cell), cell
        assert ours.should_run_async(cell, transformed_cell=transformed) == \
            stock.should_run_async(cell, transformed_cell=transformed), cell
        try:
            expected = ast.dump(stock.compile.ast_parse(transformed))
        except SyntaxError:
            continue
        assert ast.dump(ours.compile.ast_parse(transformed)) == expected, cell
    parse, check = ours.compile.ast_parse, ours.should_run_async
    asked: list[str] = []  # the cells handed on to IPython's own parse or await check
    ours.compile.ast_parse = partial(parse.func, lambda s, *a: asked.append(s) or parse.args[0](s, *a),
                                     **parse.keywords)
    ours.should_run_async = partial(check.func, lambda s, **k: asked.append(s) or check.args[0](s, **k))
    for cell in PLAIN_CELLS:
        transformed = ours.transform_cell(cell)
        ours.should_run_async(cell, transformed_cell=transformed)
        ours.compile.ast_parse(transformed)
    assert asked == []
    ours.compile.ast_parse, ours.should_run_async = parse, check
    for shell in (ours, stock):
        for cell in ASYNC_CELLS + PLAIN_CELLS:
            assert shell.run_cell(cell).success, cell
    assert {k: ours.user_ns[k] for k in ("x", "y", "t", "u")} == {k: stock.user_ns[k] for k in ("x", "y", "t", "u")}
