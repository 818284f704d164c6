"""docs/layout.md's picture of the layers is the import contract's (pyproject.toml [tool.importlinter], run by
`lint-imports` in `make check`): the picture's left column names the contract's layers, in its order."""

from __future__ import annotations

import re

from autograder.config import ROOT


def contract_layers() -> list[str]:
    """The layers contract's `layers = [...]` list (read as text: tomllib needs Python 3.11)."""
    text = (ROOT / "pyproject.toml").read_text().split("[tool.importlinter]", 1)[1]
    block = re.search(r'type = "layers"\n(?:.*\n)*?layers = \[\n(.*?)\n\]', text, re.S)
    assert block, "no layers contract in pyproject.toml"
    return re.findall(r'^\s*"([^"]+)",?\s*$', block.group(1), re.M)


def pictured_layers() -> list[str]:
    """The left column of layout.md's first picture: each line that starts in column 0, its module names with the
    contract's separators (`.py` and a trailing `/` dropped)."""
    picture = (ROOT / "docs" / "layout.md").read_text().split("```\n", 2)[1]
    names = []
    for line in picture.splitlines():
        if line[:1].isalpha():
            head = re.split(r"\s{2,}", line)[0]
            names.append(re.sub(r"\.py\b|/(?=\s|$)", "", head))
    return names


def test_the_pictured_layers_are_the_contracts() -> None:
    assert pictured_layers() == contract_layers()
    assert len(contract_layers()) > 8
