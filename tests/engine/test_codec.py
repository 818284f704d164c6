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


def _walked(data: bytes):
    """wire.decode's general path: parse, then one walk that checks the depth and reads the arrays."""
    return wire.unpack(json.loads(data.decode(), object_pairs_hook=wire.object_pairs,
                                   parse_constant=wire.json_constant), 0)


def _nested(depth: int, inner: str) -> bytes:
    return ("[" * depth + inner + "]" * depth).encode()


ARRAY = wire.encode(np.arange(3.0)).decode()
FRAMES = [wire.encode(v) for v in VALUES] + [
    _nested(wire.MAX_DEPTH, "1"), _nested(wire.MAX_DEPTH - 1, ARRAY), _nested(30, ARRAY),
    _nested(wire.MAX_DEPTH + 1, "1"), _nested(wire.MAX_DEPTH + 1, ""), _nested(200, ARRAY),
    b'{"a": 1, "a": 2}', b'{"__evil__": 1}', b'{"__ndarray__": "AAAA", "dtype": "<f8", "shape": [9]}',
    b'{"__ndarray__": "AA==", "dtype": "|b1", "shape": [1], "x": 1}', b'{"s": "[[[[{{{{"}',
    ('{"s": "' + "[" * 100 + '", "v": ' + ARRAY + "}").encode(),
]


@pytest.mark.parametrize("data", FRAMES, ids=range(len(FRAMES)))
def test_shallow_frames_read_their_arrays_as_parsed_and_decode_as_the_walk_does(data: bytes) -> None:
    """decode reads the arrays of data with at most MAX_DEPTH brackets while parsing; the result, or the error,
    is the general path's (parse, then walk) for shallow and deep data, hostile or not."""
    try:
        want = ("ok", codec.dumps(_walked(data)))
    except wire.WireError as exc:
        want = ("error", str(exc))
    try:
        got = ("ok", codec.dumps(wire.decode(data)))
    except wire.WireError as exc:
        got = ("error", str(exc))
    assert got == want
    assert ("nested too deeply" in got[1]) == (data in (_nested(wire.MAX_DEPTH + 1, "1"), _nested(200, ARRAY)))
