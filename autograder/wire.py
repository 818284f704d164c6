"""The sandbox's message format: plain data to bytes and back without pickle, strict on every byte it reads.

Messages between the grader and the sandboxed student process are JSON, numpy arrays as base64 bytes with
dtype and shape: the layout of the package's one codec of plain data (autograder/runtime/plain_codec.py:
ARRAY_TAG, array_plain, to_plain), which also writes the case JSON and the stored results. The reader treats its
input as hostile: sizes, depth, tags and dtypes are checked before anything is allocated (the codec's own
from_plain is for trusted data only).
"""

from __future__ import annotations

import _json
import base64
import binascii
import json
import math
import re
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from autograder import MIB, UPLOAD_CAP_MB
from autograder.runtime.plain_codec import ARRAY_TAG, array_plain

MAX_BYTES = UPLOAD_CAP_MB * MIB
MAX_DEPTH = 64
MAX_DIMS = 32
_ARRAY_KEYS = {ARRAY_TAG, "dtype", "shape"}
_DTYPE_RE = re.compile(r"[<>|=]?[biufc][0-9]{1,2}")
_NUMERIC_KINDS = "biufc"


class WireError(ValueError):
    """Data that is not plain, too large, too deep or malformed."""


def encode(obj: Any, *, max_bytes: int = MAX_BYTES) -> bytes:
    """Encode plain data (None, bool, int, float, str, list, tuple, dict with str keys, numeric ndarray)."""
    try:
        text = json.dumps(_pack(obj, 0), allow_nan=True, ensure_ascii=True, separators=(",", ":"))
    except RecursionError as exc:
        raise WireError("data nested too deeply") from exc
    data = text.encode("ascii")
    if len(data) > max_bytes:
        raise WireError(f"encoded data is {len(data)} bytes, over the cap of {max_bytes}")
    return data


def trusted_encoder() -> Callable[[Any, int], bytes]:
    """encode() built now from C functions and methods of built-in types only, for the sandbox's child.

    The zygote calls this before any student code runs. Nothing the returned function calls is looked up in a
    module or class that student code can patch later (json.JSONEncoder, base64, numpy's module functions): it
    holds its own references to _json's C string escaper, binascii, numpy's C functions and the methods of the
    built-in types, so a patched encoder cannot strip or rewrite what the child reports. (Its code and closure
    can still be reached with gc: the child checks their identity before every frame, see sandbox.child._child.)
    """
    escape, b2a, contiguous, tobytes = _json.encode_basestring_ascii, binascii.b2a_base64, np.ascontiguousarray, \
        np.ndarray.tobytes
    float_repr, int_repr, join, decode_ascii, isnan = float.__repr__, int.__repr__, str.join, bytes.decode, math.isnan
    typeof, length, numbered, ndarray, error, tag = type, len, enumerate, np.ndarray, WireError, escape(ARRAY_TAG)
    inf = math.inf
    kinds, limit, dims = _NUMERIC_KINDS, MAX_DEPTH, MAX_DIMS

    def pack(obj: Any, depth: int, out: list[str]) -> None:
        t = typeof(obj)
        if obj is None:
            out.append("null")
        elif t is bool:
            out.append("true" if obj else "false")
        elif t is int:
            out.append(int_repr(obj))
        elif t is float:
            out.append("NaN" if isnan(obj) else "Infinity" if obj == inf else "-Infinity" if obj == -inf
                       else float_repr(obj))
        elif t is str:
            out.append(escape(obj))
        elif depth >= limit:
            raise error("data nested too deeply")
        elif t is list or t is tuple:
            out.append("[")
            for i, v in numbered(obj):
                if i:
                    out.append(",")
                pack(v, depth + 1, out)
            out.append("]")
        elif t is dict:
            out.append("{")
            for i, (k, v) in numbered(obj.items()):
                if typeof(k) is not str:
                    raise error(f"dict keys must be str, got {typeof(k).__name__}")
                if k[:2] == "__":
                    raise error(f"dict key {k[:40]!r} is reserved (starts with '__')")
                out.append("," if i else "")
                out.append(escape(k))
                out.append(":")
                pack(v, depth + 1, out)
            out.append("}")
        elif t is ndarray:
            dtype = obj.dtype
            if dtype.kind not in kinds or dtype.hasobject or dtype.fields is not None or obj.ndim > dims:
                raise error(f"ndarray dtype {dtype} is not numeric or bool")
            arr = contiguous(obj)  # array_plain's layout: C order, at least one dimension (a 0-d array is [1])
            data = decode_ascii(b2a(tobytes(arr), newline=False), "ascii")
            shape = join(",", [int_repr(n) for n in arr.shape])
            out.append(f"{{{tag}:\"{data}\",\"dtype\":{escape(arr.dtype.str)},\"shape\":[{shape}]}}")
        else:
            raise error(f"not plain data: {_type_name(t)}")

    def encode_trusted(obj: Any, max_bytes: int = MAX_BYTES) -> bytes:
        out: list[str] = []
        pack(obj, 0, out)
        data = join("", out).encode("ascii")
        if length(data) > max_bytes:
            raise error(f"encoded data is {length(data)} bytes, over the cap of {max_bytes}")
        return data

    return encode_trusted


def decode(data: bytes, *, max_bytes: int = MAX_BYTES) -> Any:
    """Decode bytes made by encode(); anything else (unknown tags, object dtypes, bad sizes): WireError."""
    if type(data) is not bytes:
        raise WireError(f"expected bytes, got {type(data).__name__}")
    if len(data) > max_bytes:
        raise WireError(f"{len(data)} bytes, over the cap of {max_bytes}")
    # data with no more brackets than MAX_DEPTH cannot nest deeper: its arrays are read as the parser meets them,
    # with no second walk over the result (most frames; brackets inside strings only make this rarer)
    shallow = data.count(b"[") + data.count(b"{") <= MAX_DEPTH
    try:
        raw = json.loads(data.decode("utf-8"), object_pairs_hook=_arrays_read if shallow else object_pairs,
                         parse_constant=json_constant)
    except WireError:
        raise
    except (ValueError, RecursionError) as exc:
        raise WireError(f"not valid wire data: {exc}") from exc
    return raw if shallow else unpack(raw, 0)


def sanitize(obj: Any, *, depth: int = 0) -> Any:
    """Best-effort copy of untrusted obj as plain data that encode() takes: numpy scalars become Python scalars,
    other objects a marker str.

    Only exact built-in types pass (an int subclass with a custom __eq__ does not), so no object with
    behaviour of its own ever reaches encode().
    """
    t = type(obj)
    if obj is None or t in (bool, int, float, str):
        return obj
    if depth >= MAX_DEPTH:
        return "<not plain data: nested too deeply>"
    if t in (list, tuple):
        return [sanitize(v, depth=depth + 1) for v in obj]
    if t is dict:
        if not all(type(k) is str and not k.startswith("__") for k in obj):
            return "<not plain data: dict keys must be str not starting with '__'>"
        return {k: sanitize(v, depth=depth + 1) for k, v in obj.items()}
    if t is np.ndarray:
        return obj if _plain_dtype(obj.dtype) else f"<not plain data: ndarray of dtype {obj.dtype}>"
    if isinstance(obj, np.generic) and t.__module__ == "numpy" and _plain_dtype(obj.dtype):
        kind = obj.dtype.kind
        if kind == "c":
            return np.asarray(obj)
        return bool(obj) if kind == "b" else int(obj) if kind in "iu" else float(obj)
    return f"<not plain data: {_type_name(t)}>"


def _type_name(t: type) -> str:
    try:
        return f"{type.__getattribute__(t, '__module__')}.{type.__getattribute__(t, '__qualname__')}"[:200]
    except Exception:
        return "unknown type"


def _plain_dtype(dtype: np.dtype) -> bool:
    return dtype.kind in _NUMERIC_KINDS and not dtype.hasobject and dtype.fields is None


def _pack(obj: Any, depth: int) -> Any:
    t = type(obj)
    if obj is None or t in (bool, int, float, str):
        return obj
    if depth >= MAX_DEPTH:
        raise WireError("data nested too deeply")
    if t in (list, tuple):
        return [_pack(v, depth + 1) for v in obj]
    if t is dict:
        for k in obj:
            if type(k) is not str:
                raise WireError(f"dict keys must be str, got {type(k).__name__}")
            if k.startswith("__"):
                raise WireError(f"dict key {k[:40]!r} is reserved (starts with '__')")
        return {k: _pack(v, depth + 1) for k, v in obj.items()}
    if t is np.ndarray:
        if not _plain_dtype(obj.dtype):
            raise WireError(f"ndarray dtype {obj.dtype} is not numeric or bool")
        return array_plain(obj)
    raise WireError(f"not plain data: {_type_name(t)}")


def object_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise WireError(f"duplicate key {k[:40]!r}")
        out[k] = v
    if any(k.startswith("__") for k in out) and set(out) != _ARRAY_KEYS:
        raise WireError(f"unknown tag in {sorted(out)[:5]}")
    return out


def _arrays_read(pairs: list[tuple[str, Any]]) -> Any:
    """object_pairs, and a tagged array read at once (what unpack does in a second walk)."""
    out = object_pairs(pairs)
    return _array(out) if ARRAY_TAG in out else out


def json_constant(name: str) -> float:
    return {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}[name]


def unpack(raw: Any, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise WireError("data nested too deeply")
    if type(raw) is list:
        return [unpack(v, depth + 1) for v in raw]
    if type(raw) is dict:
        if ARRAY_TAG in raw:
            return _array(raw)
        return {k: unpack(v, depth + 1) for k, v in raw.items()}
    return raw


def _strict_b64decode(text: str) -> bytes:
    """Base64 text to bytes, refusing any character outside the alphabet and misplaced padding: binascii's strict
    mode on the text itself (Python 3.11+; base64.b64decode would first copy it to bytes), else b64decode's check."""
    if sys.version_info >= (3, 11):
        return binascii.a2b_base64(text, strict_mode=True)
    return base64.b64decode(text, validate=True)


def _array(tag: dict[str, Any]) -> np.ndarray:
    """A tagged array, checked before anything is allocated: dims count, every dim, and that shape times
    item size is exactly the data's length (so no declared shape can ask for more than the bytes sent)."""
    b64, dtype_str, shape = tag[ARRAY_TAG], tag["dtype"], tag["shape"]
    if type(b64) is not str or type(dtype_str) is not str or not _DTYPE_RE.fullmatch(dtype_str):
        raise WireError(f"bad array tag (dtype {str(dtype_str)[:20]!r})")
    if type(shape) is not list or len(shape) > MAX_DIMS or not all(type(n) is int and 0 <= n <= MAX_BYTES
                                                                    for n in shape):
        raise WireError(f"bad array shape (at most {MAX_DIMS} dims, each 0..{MAX_BYTES})")
    try:
        dtype = np.dtype(dtype_str)
    except (TypeError, ValueError) as exc:
        raise WireError(f"bad array dtype: {exc}") from exc
    if not _plain_dtype(dtype):
        raise WireError(f"array dtype {dtype_str!r} is not numeric or bool")
    size = math.prod(shape) * dtype.itemsize
    if len(b64) != 4 * math.ceil(size / 3) or size > MAX_BYTES:
        raise WireError(f"array of shape {shape[:8]} and dtype {dtype_str} does not match its data")
    try:
        raw = _strict_b64decode(b64)
    except (TypeError, ValueError) as exc:
        raise WireError(f"bad array data: {exc}") from exc
    if size != len(raw):
        raise WireError(f"array of shape {shape[:8]} and dtype {dtype_str} does not match {len(raw)} bytes")
    if dtype.kind == "b" and raw.translate(None, b"\x00\x01"):
        raise WireError("bool array holds bytes other than 0 and 1")
    try:
        return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
    except ValueError as exc:  # a zero-size array with absurd dims
        raise WireError(f"bad array shape: {exc}") from exc
