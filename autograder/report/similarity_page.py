"""The report's similarity page (similarity.html): the pairs of autograder/report/similarity.py for a graded batch,
both codes side by side with the matching parts marked, the checkpoint pairs' evidence (weights and what they
compute), and each pair's decision
from the TAs' file (the grades folder's similarity_decisions.yaml, which the report never writes); with a copy of
that file holding every listed pair, for the TAs to fill in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from autograder.authoring.suite import Suite
from autograder.grading.gradebook import SIMILARITY_DECISIONS_FILE, Gradebook
from autograder.report.code import code_cells, submission_cells
from autograder.report.similarity import (
    CODE_THRESHOLD,
    LOSS_TOLERANCE,
    OTHER_SHARE,
    WEIGHTS_THRESHOLD,
    find_similar,
    losses_of,
    pair_decisions,
    sketches_of,
    written_cells,
)


def template_cells(suite: Suite) -> list[str]:
    """The code cells of the students' template notebook ([] when it is not built)."""
    path = suite.lesson.notebook
    if not path.is_file():
        return []
    cells, _ = submission_cells(str(path), path.parent, limits=suite.config.submissions)
    return [src for _, src in code_cells(cells)]


def similarity_pages(suite: Suite, students: list[Any], *, grades: Path, title: str) -> dict[str, str]:
    """similarity.html and the decisions file to fill in (similarity_decisions.yaml), or {} for a class of fewer
    than two students with code or a checkpoint."""
    from autograder.report.render import render_template

    template = template_cells(suite)
    parts = {c.id: c.part for c in suite.checkpoint_cases}
    codes = {s.id: written_cells(s.cells, template) for s in students if s.cells}
    sketches = {s.id: row for s in students if (row := sketches_of(s.record, parts))}
    losses = {s.id: row for s in students if (row := losses_of(s.record, parts))}
    if len(codes) + len(set(sketches) | set(losses)) < 2:
        return {}
    found = find_similar(codes, template, sketches, losses=losses)
    decisions, problem = pair_decisions(Gradebook(grades))
    pages = {s.id: s.page for s in students}
    figures = {s.id: {parts[c["id"]]: c.get("received") or {} for c in s.record.get("cases") or []
                      if isinstance(c, dict) and c.get("id") in parts} for s in students}

    def decided(first: str, second: str) -> dict[str, str]:
        return decisions.get((min(first, second), max(first, second)), {"decision": "", "note": ""})

    listed = [{"pair": [p.first, p.second], "kind": "code", "score": p.score, **decided(p.first, p.second)}
              for p in found.code]
    listed += [{"pair": [p.first, p.second], "kind": "checkpoint",
                **({"distance": p.score} if p.distances else {}),
                **({"loss_gap": min(p.gaps.values())} if p.gaps else {}),
                **decided(p.first, p.second)} for p in found.weights]
    listed += [{"pair": list(k), "kind": "no longer listed", **v} for k, v in decisions.items()
               if not any(sorted(x["pair"]) == list(k) for x in listed)]  # kept: a TA's word is never dropped
    page = render_template("similarity.html.j2", page_title=f"{title}: similarity", found=found, pages=pages,
                   decided=decided, figures=figures, problem=problem, decisions_file=SIMILARITY_DECISIONS_FILE,
                   code_threshold=CODE_THRESHOLD, other_share=OTHER_SHARE, weights_threshold=WEIGHTS_THRESHOLD,
                   loss_tolerance=LOSS_TOLERANCE,
                   grades=str(grades))
    filled = yaml.safe_dump({"decisions": listed}, sort_keys=False, allow_unicode=True, width=1000)
    return {"similarity.html": page, SIMILARITY_DECISIONS_FILE: filled}
