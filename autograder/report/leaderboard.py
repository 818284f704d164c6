"""The leaderboard of verified figures: each student's figures that the lesson's checkpoint reader computed itself
(a part's `leaderboard` in its stored verdict: only parts whose claims the grader verified have one), ranked per
part; for Gradescope's results.json, the TA report's page (a table and a plot per part) and the opt-in public page
(pseudonyms from the instructor's roster file, opt-outs left out, no code, no ids)."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from markupsafe import Markup

from autograder.authoring.suite import Suite
from autograder.grading.figures import axis_key, figures_of, meta
from autograder.grading.gradebook import ROSTER_FILE

OPT_OUT = {"1", "yes", "y", "true", "x", "opt out", "opt-out"}


class RosterError(ValueError):
    """A roster file that cannot be used; the message names the file and the row."""


@dataclass(frozen=True)
class Entry:
    """One student's verified figures of one part (axis value -> figure), with their rank in that part."""

    sid: str
    page: str
    part: str
    figures: dict[str, float]
    rank: int = 0

    @property
    def id(self) -> str:  # the report's link macro names a student by .id and .page
        return self.sid


def ranked(suite: Suite, students: list[Any], *, unread: dict[str, str] | None = None) -> dict[str, list[Entry]]:
    """Per part, the students with verified figures, best first by the figure at the last axis value (then the
    other axis values from the last, then the id: ties keep one order, and a re-run gives the same one).
    `unread`, when given, receives the students whose figures could not be read (id -> why); the rest are ranked."""
    m, out = meta(suite), {}
    sign = -1.0 if m["order"] == "desc" else 1.0
    by_part: dict[str, list[Entry]] = {}
    for s in students:
        try:
            found = figures_of(suite, s.record)
        except Exception as exc:  # noqa: BLE001 - one record never stops the leaderboard
            if unread is not None:
                unread[s.id] = f"its figures could not be read ({type(exc).__name__}: {str(exc)[:200]})"
            continue
        for part, row in found.items():
            by_part.setdefault(part, []).append(Entry(s.id, s.page, part, row))
    for part, entries in by_part.items():
        def key(e: Entry) -> tuple[Any, ...]:
            return (*(sign * round(e.figures[a], 4) for a in reversed(list(e.figures))), e.sid)
        entries.sort(key=key)
        out[part] = [Entry(e.sid, e.page, e.part, e.figures, n) for n, e in enumerate(entries, start=1)]
    order = [c.part for c in suite.checkpoint_cases]
    return {p: out[p] for p in sorted(out, key=lambda p: (order.index(p) if p in order else len(order), p))}


def plot(entries: list[Entry], *, axis: str, metric: str, width: int = 420, height: int = 240) -> Markup:
    """An inline SVG: one thin line per student (figure against axis value, evenly spaced), the median bold."""
    axes = list(dict.fromkeys(a for e in entries for a in e.figures))
    axes.sort(key=axis_key)
    values = [v for e in entries for v in e.figures.values()]
    if not axes or not values:
        return Markup("")
    low, high = min(values), max(values)
    pad = (high - low) * 0.08 or max(abs(high) * 0.05, 1e-6)
    low, high = low - pad, high + pad
    left, right, top, bottom = 48, width - 12, 12, height - 34

    def x(i: int) -> float:
        return left + (right - left) * (i / (len(axes) - 1) if len(axes) > 1 else 0.5)

    def y(v: float) -> float:
        return bottom - (bottom - top) * (v - low) / (high - low)

    def line(row: dict[str, float], cls: str) -> str:
        pts = " ".join(f"{x(i):.1f},{y(row[a]):.1f}" for i, a in enumerate(axes) if a in row)
        return f'<polyline class="{cls}" points="{pts}"/>'

    median = {a: sorted(vs)[len(vs) // 2] for a in axes if (vs := [e.figures[a] for e in entries if a in e.figures])}
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="plot" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="{Markup.escape(metric)} against '
             f'{Markup.escape(axis)}, one line per student">',
             '<style>.s{fill:none;stroke:#3465a4;stroke-opacity:.35;stroke-width:1}'
             '.m{fill:none;stroke:#a40000;stroke-width:2.5}text{font:11px sans-serif}'
             '.g{stroke:#ccc;stroke-width:1}</style>']
    for t in (low + pad, (low + high) / 2, high - pad):
        parts.append(f'<line class="g" x1="{left}" x2="{right}" y1="{y(t):.1f}" y2="{y(t):.1f}"/>'
                     f'<text x="{left - 4}" y="{y(t) + 4:.1f}" text-anchor="end">{t:.2f}</text>')
    for i, a in enumerate(axes):
        parts.append(f'<text x="{x(i):.1f}" y="{bottom + 16}" text-anchor="middle">{Markup.escape(a)}</text>')
    parts.append(f'<text x="{(left + right) / 2:.1f}" y="{height - 4}" text-anchor="middle">'
                 f'{Markup.escape(axis)}</text>')
    parts += [line(e.figures, "s") for e in entries]
    parts += [line(median, "m"), "</svg>"]
    return Markup("".join(parts))


def read_roster(path: Path) -> dict[str, str]:
    """The roster file: student id -> pseudonym, for the students who opted in (a pseudonym given, opt_out
    blank). Columns: id, pseudonym and, optionally, opt_out (yes, 1, x, ...). RosterError names the file and row."""
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            table = list(csv.reader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise RosterError(f"{path}: cannot be read ({exc})") from None
    header = [h.strip().lower() for h in table[0]] if table else []
    if "id" not in header or "pseudonym" not in header:
        raise RosterError(f"{path}: the first row must name the columns id and pseudonym (and optionally opt_out)")
    out: dict[str, str] = {}
    seen: dict[str, int] = {}
    for n, cells in enumerate(table[1:], start=2):
        row = {h: c.strip() for h, c in zip(header, cells)}
        sid, name = row.get("id", ""), row.get("pseudonym", "")
        if not sid or not name or row.get("opt_out", "").lower() in OPT_OUT:
            continue
        if sid in out:
            raise RosterError(f"{path}: row {n}: student {sid!r} is listed twice")
        if name.lower() in seen:
            raise RosterError(f"{path}: row {n}: pseudonym {name!r} is also on row {seen[name.lower()]}; "
                              "give each student their own")
        out[sid], seen[name.lower()] = name, n
    return out


def public_rows(board: dict[str, list[Entry]], roster: dict[str, str]) -> dict[str, list[tuple[int, str, Entry]]]:
    """The public page's rows per part: the students who opted in, by their pseudonym, ranked among themselves in
    the class's order (nothing else of a student: no id, no code)."""
    out = {}
    for part, entries in board.items():
        shown = [e for e in entries if e.sid in roster]
        out[part] = [(n, roster[e.sid], e) for n, e in enumerate(shown, start=1)]
    return out


def leaderboard_pages(suite: Suite, students: list[Any], *, title: str,
                      roster: Path | None = None) -> dict[str, str]:
    """The report's leaderboard.html and, when a roster file is given (or lies in the grades folder), the page to
    post, public_leaderboard.html; {} when no student has a verified figure."""
    from autograder.report.render import render_template

    unread: dict[str, str] = {}
    board = ranked(suite, students, unread=unread)
    if not board:
        return {}
    m = meta(suite)
    axes = {p: sorted(dict.fromkeys(a for e in es for a in e.figures), key=axis_key) for p, es in board.items()}
    head = {p: [("rank", "rank", "num"), ("student", "student", ""),
                *((f"a{a}", f"{m['axis']} {a}".strip(), "num") for a in axs)] for p, axs in axes.items()}
    ranked_ids = {e.sid for es in board.values() for e in es}
    parts = {c.id for c in suite.checkpoint_cases}
    unverified = [s for s in students if s.id not in ranked_ids and s.id not in unread
                  and any(isinstance(c, dict) and c.get("id") in parts and c.get("received")
                          for c in s.record.get("cases") or [])]
    pages = {}
    if roster is not None:
        public = public_rows(board, read_roster(roster))
        pages["public_leaderboard.html"] = render_template("public_leaderboard.html.j2",
                                                           page_title=f"{title}: leaderboard",
                                                           title=title, meta=m, board=public, axes=axes)
    pages["leaderboard.html"] = render_template(
        "leaderboard.html.j2", page_title=f"{title}: leaderboard", meta=m, board=board, axes=axes, axes_head=head,
        plots={p: plot(es, axis=m["axis"], metric=m["metric"]) for p, es in board.items()},
        n=len(students), n_ranked=len(ranked_ids), unverified=unverified, roster_file=ROSTER_FILE,
        unread=[(s, unread[s.id]) for s in students if s.id in unread],
        public="public_leaderboard.html" if roster is not None else "")
    return dict(reversed(pages.items()))
