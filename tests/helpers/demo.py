"""The demo lesson (tests/fixtures/lesson_demo) as the tests use it: its folder, its milestone question, a fitted
line."""

from __future__ import annotations

from autograder.config import ROOT

FIXTURE = ROOT / "tests" / "fixtures" / "lesson_demo"


MILESTONE = """---
id: q4_line
kind: milestone
title: Fit a line
solution: [center]
checkpoint: {id: q4_checkpoint, title: "Q4 — the fitted line", files: [fit.json]}
cases:
  - name: small
    probe: call
    args: {fn: center, args: [[[1.0, 2.0], [3.0, 6.0]]]}
    check: close
    what: center([[1, 2], [3, 6]])
    revisit: subtract the mean of each column (axis=0) from that column.
---
## Q4. Fit a line (`q4_line`)

Fit a line to the course's points and upload `fit.json` (slope, intercept, mse) next to the notebook.

<!-- solution -->
<!-- tests -->
"""


def fitted_line(points: list[list[float]]) -> tuple[float, float, float]:
    """The least-squares line through the points and its mean squared error (what save_fit would write)."""
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
    intercept = my - slope * mx
    return slope, intercept, sum((y - slope * x - intercept) ** 2 for x, y in points) / n
