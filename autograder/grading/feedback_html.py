"""nbgrader's feedback page readable offline: the maths of markdown cells (`$...$`, `$$...$$`, `\\(...\\)`,
`\\[...\\]`, LaTeX environments, as nbconvert finds them) written as MathML, which browsers show without a script,
in place of MathJax, which nbconvert's page loads from a CDN (so without a network the maths stayed raw LaTeX)."""

from __future__ import annotations

from html import escape
from typing import Any

from jinja2 import pass_context
from latex2mathml.converter import convert
from nbconvert.exporters import HTMLExporter
from nbconvert.filters.markdown_mistune import IPythonRenderer, MarkdownWithMath


def mathml(tex: str, *, display: bool) -> str:
    """`tex` as a MathML element; what the converter cannot read stays as its source, marked as TeX."""
    try:
        return convert(tex.strip(), display="block" if display else "inline")
    except Exception:  # latex2mathml raises many kinds (unknown command, unbalanced braces, ...)
        return f'<code class="tex">{escape(tex)}</code>'


class MathMLRenderer(IPythonRenderer):
    """nbconvert's markdown renderer, with the maths it recognises written as MathML."""

    def inline_math(self, body: str) -> str:
        return mathml(body, display=False)

    def block_math(self, body: str) -> str:
        return mathml(body, display=True)

    def latex_environment(self, name: str, body: str) -> str:
        return mathml(f"\\begin{{{name}}}{body}\\end{{{name}}}", display=True)


class FeedbackExporter(HTMLExporter):
    """The HTML exporter of `nbgrader generate_feedback` (the course's nbgrader_config.py): markdown as nbconvert
    renders it, maths as MathML."""

    @pass_context  # a filter of the template, as HTMLExporter's is
    def markdown2html(self, context: Any, source: str) -> str:
        cell = context.get("cell", {})
        renderer = MathMLRenderer(
            escape=False,
            attachments=cell.get("attachments", {}),
            embed_images=self.embed_images,
            path=context.get("resources", {}).get("metadata", {}).get("path", ""),
            anchor_link_text=self.anchor_link_text,
            exclude_anchor_links=self.exclude_anchor_links,
            **self.lexer_options,
        )
        return MarkdownWithMath(renderer=renderer).render(source)
