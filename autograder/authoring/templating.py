"""The question texts' templating: Jinja2 over the reference, the helpers a text calls (`fmt`, `table`), and a
template error that names the line and the expression."""

from __future__ import annotations

import re
from typing import Any

import jinja2
import numpy as np

_EXPRESSION = re.compile(r"\{\{.*?\}\}|\{%.*?%\}")


class TemplateError(ValueError):
    """A text that cannot be rendered: `line` (1-based, in the rendered text) and `expression` where known."""

    def __init__(self, message: str, *, line: int | None, expression: str | None) -> None:
        super().__init__(message)
        self.line, self.expression = line, expression


def fmt(x: Any, digits: int = 4) -> str:
    """One number as text with `digits` decimals (default 4); -0 is written as 0.

    `x` is one number: a Python float or int, a numpy scalar, or an array or torch tensor of exactly one element
    (a tensor is detached first). A list, or an array or tensor of several elements, is an error: pick the number
    first (`fmt(v[0])`, `fmt(v.sum())`) or write several with `table(header, rows)`.

    Example: `{{ fmt(ref.rms_norm(torch.tensor([[3.0, 4.0]]))[0, 0], 3) }}` gives `0.849`.
    """
    if not isinstance(x, float):
        array = np.asarray(getattr(x, "detach", lambda: x)())
        if array.size != 1:
            kind = f"a {type(x).__name__} of {len(x)}" if isinstance(x, list | tuple) else \
                f"an array of shape {list(array.shape)}"
            raise TypeError(f"fmt takes one number, not {kind}: pick one (fmt(v[0])) or use table(header, rows)")
        x = float(array.item())
    text = f"{x:.{digits}f}"
    return "0." + "0" * digits if text == "-0." + "0" * digits else text


def table(header: list[str], rows: Any, index: list[Any] | None = None) -> str:
    """A Markdown table: `header` (the column titles), `rows` (a list of rows, or a 2-d array or tensor) and an
    optional `index` put before each row as its first cell; strings and ints are written as they are, every other
    value with `fmt`.

    Example: `{{ table(["t", "value"], [[0, 0.5], [1, 0.25]]) }}`.
    """
    def cell(v: Any) -> str:
        if isinstance(v, str | int) and not isinstance(v, bool):
            return str(v)
        return fmt(v)

    rows = [list(r) for r in (rows.tolist() if hasattr(rows, "tolist") else rows)]
    if index is not None:
        rows = [[index[i], *r] for i, r in enumerate(rows)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def render(text: str, names: dict[str, Any]) -> str:
    """`text` rendered by Jinja2 (undefined names are errors) with `names`; any error becomes a TemplateError with
    the line of `text` it happened on and the expression there (the line itself when it holds several)."""
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    try:
        return env.from_string(text).render(**names)
    except Exception as exc:  # noqa: BLE001 - any template error is reported with its line
        line = exc.lineno if isinstance(exc, jinja2.TemplateSyntaxError) else _template_line(exc)
        expression = None
        if line is not None and 0 < line <= len(lines := text.splitlines()):
            found = _EXPRESSION.findall(lines[line - 1])
            named = [e for e in found if any(re.search(rf"\b{w}\b", e) for w in re.findall(r"'(\w+)'", str(exc)))]
            found = found if len(found) == 1 else named
            expression = found[0] if len(found) == 1 else lines[line - 1].strip()[:200]
        raise TemplateError(f"{type(exc).__name__}: {exc}", line=line, expression=expression) from exc


def _template_line(exc: BaseException) -> int | None:
    """The template's line in an error's traceback (Jinja2 rewrites its frames to the template's lines)."""
    tb, line = exc.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line
