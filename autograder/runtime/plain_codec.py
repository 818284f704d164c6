"""The package's one codec of plain data (case arguments, expected values, probe outputs, stored results): the
engine's own module, shipped beside the checks runtime as plain_codec.py, which imports it from there.

The JSON form of case data is written by the release and read in the notebook (checks_runtime imports this module
by its top-level name, from the copy shipped next to it); the engine imports it as autograder.runtime.plain_codec
for the stored results, the expected-values cache, the generated test files and the report, and the sandbox's strict
wire format (autograder/wire.py) takes its array layout from it. Its input is trusted: what a student's process
sends the grader goes through the wire format, with this layout. Python and numpy alone are needed.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import numpy as np

ARRAY_TAG = "__ndarray__"  # an array in plain data: {ARRAY_TAG: base64 bytes, "dtype": dtype string, "shape": list}


def array_plain(arr: np.ndarray) -> dict[str, Any]:
    """An array as plain data: its bytes in C order as base64, its dtype string and its shape (at least one
    dimension: a 0-d array is stored as shape [1]). The one layout of an array in every JSON the package writes;
    non-finite floats are JSON's NaN, Infinity and -Infinity (json's default)."""
    arr = np.ascontiguousarray(arr)
    return {ARRAY_TAG: base64.b64encode(arr.tobytes()).decode(), "dtype": arr.dtype.str, "shape": list(arr.shape)}


def to_plain(value: Any, *, array: Callable[[np.ndarray], Any] = array_plain) -> Any:
    """JSON-ready form of case data: arrays become tagged base64 blobs (array_plain), numpy scalars Python ones;
    any other object is a TypeError. array=own_array gives from_plain(to_plain(value)) without the base64 trip."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "biuf":
            raise TypeError(f"arrays of dtype {value.dtype} are not plain data")
        return array(value)
    if isinstance(value, dict):
        return {str(k): to_plain(v, array=array) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_plain(v, array=array) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not plain data")


def own_array(arr: np.ndarray) -> np.ndarray:
    """arr as from_plain(array_plain(arr)) reads it back: a C-ordered copy, at least 1-d, of the same dtype."""
    return np.array(arr, order="C", copy=True, ndmin=1)


def from_plain(value: Any) -> Any:
    """Inverse of `to_plain`, for trusted case JSON (it does not bound sizes: never feed it a student's bytes)."""
    if isinstance(value, dict):
        if ARRAY_TAG in value:
            dtype = np.dtype(value["dtype"])
            if dtype.kind not in "biuf":
                raise TypeError(f"refusing array of dtype {dtype}")
            raw = base64.b64decode(value[ARRAY_TAG])
            return np.frombuffer(raw, dtype=dtype).reshape(value["shape"]).copy()
        return {k: from_plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_plain(v) for v in value]
    return value


def dumps(value: Any) -> str:
    """Case data as canonical JSON text (sorted keys, no spaces), as the release writes it into the notebook's tests."""
    return json.dumps(to_plain(value), sort_keys=True, separators=(",", ":"))


def loads(text: str) -> Any:
    """Inverse of `dumps`."""
    return from_plain(json.loads(text))


__all__ = ["ARRAY_TAG", "array_plain", "dumps", "from_plain", "loads", "own_array", "to_plain"]
