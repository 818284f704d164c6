"""Small text helpers of the report: UTF-8-safe text, HTML escaping, clipping, and how numbers and scores are
written."""

from __future__ import annotations

import html
from typing import Any

import numpy as np


def as_text(value: Any) -> str:
    """str(value) that can be written as UTF-8: lone surrogates become escapes."""
    return str(value).encode("utf-8", "backslashreplace").decode("utf-8")


def esc(value: Any) -> str:
    return html.escape(as_text(value), quote=True)


def clip_text(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n… ({len(text) - limit} more characters)"


def num_text(v: Any) -> str:
    if isinstance(v, bool | np.bool_):
        return str(bool(v))
    if isinstance(v, int | np.integer):
        return str(int(v))
    f = float(v)
    if not np.isfinite(f):
        return str(f)
    return f"{f:.4f}" if abs(f) < 1e5 else f"{f:.4g}"


def score_text(v: float) -> str:
    return f"{v:.2f}".rstrip("0").rstrip(".") if v % 1 else f"{v:g}"
