"""One codec of plain data: the runtime's (autograder/runtime/checks_runtime.py) writes the case JSON, the stored
results and the expected-values cache, and the sandbox's wire format takes its array layout from it, so an array
or a non-finite float is spelled one way in every JSON the package writes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from autograder import wire
from autograder.config import ROOT
from autograder.runtime import checks_runtime as codec

VALUES = [
    np.arange(6, dtype=np.int32).reshape(2, 3), np.array([True, False]), np.zeros((0, 4)),
    np.array(2.5, dtype=np.float32), np.arange(4.0)[::2], np.arange(3, dtype=">u2"),
    [math.nan, math.inf, -math.inf, np.array([np.nan, -np.inf])],
    {"value": np.eye(2, dtype=np.float16), "again": [1, "x", None, True, -0.0]},
]


@pytest.mark.parametrize("value", VALUES, ids=range(len(VALUES)))
def test_the_wire_and_the_case_json_spell_plain_data_alike(value) -> None:
    """The grader's frames (wire.encode), the child's trusted encoder and the runtime's codec give the same bytes
    (the runtime's with the wire's separators), and each reads the other's back."""
    canonical = json.dumps(codec.to_plain(value), separators=(",", ":")).encode("ascii")
    assert wire.encode(value) == canonical
    assert wire.trusted_encoder()(value) == canonical
    assert codec.dumps(wire.decode(canonical)) == codec.dumps(codec.from_plain(json.loads(canonical)))


def test_the_array_layout_is_defined_once() -> None:
    """Only the runtime spells the array tag; the wire imports it (and its layout) from there."""
    assert wire.ARRAY_TAG is codec.ARRAY_TAG
    spelled = [str(p.relative_to(ROOT)) for p in sorted(Path(ROOT / "autograder").rglob("*.py"))
               if codec.ARRAY_TAG in p.read_text(encoding="utf-8")]
    assert spelled == ["autograder/runtime/checks_runtime.py"], spelled
