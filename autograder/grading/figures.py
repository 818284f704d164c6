"""The verified figures a stored result holds (each checkpoint part's `leaderboard`, which the lesson's checkpoint
reader computed itself and gives only to parts whose claims it verified), and Gradescope's `leaderboard` list made
of them. The TA report's leaderboard pages are autograder/report/leaderboard.py."""

from __future__ import annotations

import math
from typing import Any

from autograder.authoring.suite import Suite

DEFAULT_META = {"metric": "figure", "order": "asc", "axis": "", "part": "part", "note": ""}


def meta(suite: Suite) -> dict[str, str]:
    """What the figure is (the lesson plug-in's LEADERBOARD: metric, order, axis, part, note); the defaults when
    the lesson grades no checkpoint or says nothing."""
    if not suite.checkpoint_cases:
        return dict(DEFAULT_META)
    return DEFAULT_META | dict(getattr(suite.lesson.plugin, "LEADERBOARD", {}))


def axis_key(a: str) -> tuple[float, str]:
    try:
        return float(a), a
    except ValueError:
        return math.inf, a


def figures_of(suite: Suite, record: dict[str, Any]) -> dict[str, dict[str, float]]:
    """A stored result's verified figures per part ({} when it has none): the `leaderboard` of each checkpoint
    case's stored verdict, finite numbers only, axis values in order."""
    parts = {c.id: c.part for c in suite.checkpoint_cases}
    out: dict[str, dict[str, float]] = {}
    for case in record.get("cases") or []:
        got = case.get("received") if isinstance(case, dict) else None
        board = got.get("leaderboard") if isinstance(got, dict) else None
        part = parts.get(case.get("id")) if isinstance(case, dict) else None
        if part is None or not isinstance(board, dict):
            continue
        values = {str(a): float(v) for a, v in board.items()
                  if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)}
        if values:
            out[part] = dict(sorted(values.items(), key=lambda kv: axis_key(kv[0])))
    return out


def gradescope_entries(suite: Suite, record: dict[str, Any]) -> list[dict[str, Any]]:
    """Gradescope's `leaderboard` list for one result: {"name", "value", "order"} per part and axis value."""
    m = meta(suite)
    return [{"name": f"{part} {m['metric']}" + (f" ({m['axis']} {a})" if m["axis"] else ""),
             "value": round(v, 4), "order": m["order"]}
            for part, row in figures_of(suite, record).items() for a, v in row.items()]
