"""The report's pages beyond the failure report (the leaderboard, the page to post, the similarity report): which
exist for a batch, and the index's links to them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from markupsafe import Markup

from autograder.authoring.suite import Suite
from autograder.grading.gradebook import Gradebook
from autograder.report.leaderboard import leaderboard_pages

LABELS = {"leaderboard.html": "leaderboard (verified figures)", "public_leaderboard.html": "leaderboard to post",
          "similarity.html": "similarity (for TAs: evidence, not scores)",
          "compare.html": "before and after (what moved since the earlier run)"}


def class_pages(suite: Suite, students: list[Any], *, grades: Path, title: str,
                roster: Path | None = None) -> dict[str, str]:
    """File name -> page, for each extra page this batch has (`roster`: the leaderboard's roster file; default:
    grades/leaderboard_roster.csv when present)."""
    if roster is None and Gradebook(grades).roster_path.is_file():
        roster = Gradebook(grades).roster_path
    from autograder.report.similarity_page import similarity_pages

    pages = guarded("leaderboard.html", f"{title}: leaderboard",
                    lambda: leaderboard_pages(suite, students, title=title, roster=roster))
    pages |= guarded("similarity.html", f"{title}: similarity",
                     lambda: similarity_pages(suite, students, grades=grades, title=title))
    return pages


def guarded(name: str, title: str, build: Callable[[], dict[str, str]]) -> dict[str, str]:
    """The pages `build` makes; when it fails, the page `name` saying so (the rest of the report is written)."""
    try:
        return build()
    except Exception as exc:  # noqa: BLE001 - one page never stops the report
        from autograder.report.render import failed_page

        return {name: failed_page(title, exc, what="This page", where="the class report and the students' pages "
                                  "are written all the same; write the report again after fixing the cause.")}


def link_pages(index: str, pages: dict[str, str]) -> str:
    """The index page with a line of links to the extra pages under its title (unchanged when none)."""
    if not pages:
        return index
    links = " · ".join(f'<a href="{Markup.escape(name)}">{Markup.escape(LABELS.get(name, name))}</a>'
                       for name in pages if name.endswith(".html"))
    line = f'<p class="note" id="extra-pages">Also: {links}</p>'
    at = "</h1>" if "</h1>" in index else "<main>"
    return index.replace(at, at + line, 1)
