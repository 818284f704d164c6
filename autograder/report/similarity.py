"""Similarity evidence for TAs (never a score): pairs of students one of whose code is found, for at least
CODE_THRESHOLD of its fingerprints, in the other's (winnowed hashes of normalised tokens, fingerprints.py: names,
comments, docstrings and string contents do not count; the template's code and the code most of the class shares are
left out of every student alike), and pairs whose checkpoints are the same: weights identical or nearly so (the
sketches the lesson's checkpoint reader took), or computing the same losses on held-out text whatever the weights'
parametrisation (units permuted, heads reordered: the reader's per-segment losses); no weights are loaded here. A
TA's decision on a pair is read from a small file kept beside the grades."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from markupsafe import Markup, escape

from autograder.grading.gradebook import Gradebook
from autograder.report.fingerprints import Unit, aliases, defined_names, fingerprint
from autograder.report.text import clip_text

# Documented in docs/similarity.md, with the benchmark that measured them (benchmarks/similarity.py).
CODE_THRESHOLD = 0.8  # a pair is listed when at least this share of one student's fingerprints is in the other's
OTHER_SHARE = 0.5  # ... and at least this share of the other's is in the first's (code added to a copy is tolerated)
MIN_SHARED = 30  # ... and at least this many fingerprints are shared (a student who wrote little is not listed)
COMMON_SHARE = 0.2  # a fingerprint in at least this share of the class (and 3 students) is everyone's code
COMMON_UNIT = 0.5  # a unit (function, method) whose fingerprints are at least this share common is left out whole
MARK_SHARE = 0.5  # a unit is marked on the page when at least this share of its fingerprints is in the other's
CODE_CHARS = 20_000  # a cell is shown up to this many characters
WEIGHTS_THRESHOLD = 0.05  # checkpoint parts whose sketches lie closer than this (relative) are "nearly identical"
# Checkpoint parts whose held-out losses (per segment, stored to 1e-4) all lie within this of each other (nats) compute
# the same function: float32 rounding moves them by about 1e-6 (units permuted, heads reordered), independently
# trained models differ by 0.15 or more somewhere, untrained ones of two seeds by 0.002 (docs/similarity.md).
LOSS_TOLERANCE = 1e-3


@dataclass
class CodePair:
    """Two students: a share `a` of the first's fingerprints is in the second's code, `b` of the second's in the
    first's; `shared` fingerprints in common."""

    first: str
    second: str
    a: float
    b: float
    shared: int
    left: Markup = Markup("")  # each student's code, the matching units marked
    right: Markup = Markup("")

    @property
    def score(self) -> float:
        return max(self.a, self.b)


@dataclass
class WeightPair:
    """Two students whose checkpoint parts are the same: distances, part -> relative distance of the weights'
    sketches (the parts within WEIGHTS_THRESHOLD); gaps, part -> the largest difference of their held-out losses
    (the parts within LOSS_TOLERANCE: the same function, whatever the weights)."""

    first: str
    second: str
    distances: dict[str, float]
    gaps: dict[str, float] = field(default_factory=dict)

    @property
    def score(self) -> float:
        """The closest part's weight distance (inf when only what they compute is the same)."""
        return min(self.distances.values(), default=math.inf)

    @property
    def parts(self) -> list[str]:
        """The parts found the same either way, the weights' first."""
        return list(dict.fromkeys([*self.distances, *self.gaps]))


@dataclass
class Similarity:
    """The pairs listed, best evidence first, and what was compared."""

    code: list[CodePair] = field(default_factory=list)
    weights: list[WeightPair] = field(default_factory=list)
    students: int = 0
    with_code: int = 0
    with_sketch: int = 0
    common: int = 0  # fingerprints left out as shared by most of the class
    skipped: dict[str, str] = field(default_factory=dict)  # id -> why their code could not be compared
    problem: str = ""  # why no code was compared at all ("" when it was)


class CodeFindings(NamedTuple):
    """What code_pairs found: the pairs, how many fingerprints were left out as common, and the students whose
    code could not be fingerprinted (id -> why)."""

    pairs: list[CodePair]
    common: int
    skipped: dict[str, str]


def written_cells(cells: Sequence[tuple[int, str]], template: Sequence[str]) -> list[str]:
    """The code cells a student wrote: their code cells, those identical to a cell of the template left out."""
    given = {t.strip() for t in template}
    return [src for _, src in cells if src.strip() and src.strip() not in given]


def _as_cells(code: Sequence[str] | str) -> list[str]:
    return [code] if isinstance(code, str) else [c for c in code if isinstance(c, str)]


def _marked(cells: list[str], units: list[Unit], other: set[int]) -> Markup:
    """A student's cells as HTML, the units that share at least MARK_SHARE of their fingerprints with `other`
    marked."""
    marks: dict[int, set[int]] = {}
    for u in units:
        if u.hashes and len(u.hashes & other) >= MARK_SHARE * len(u.hashes):
            marks.setdefault(u.cell, set()).update(range(u.first, u.last + 1))
    out = []
    for n, cell in enumerate(cells):
        lines = clip_text(cell, CODE_CHARS).split("\n")
        out.append(Markup("\n").join(Markup("<mark>{}</mark>").format(line) if i in marks.get(n, ()) else escape(line)
                                      for i, line in enumerate(lines, start=1)))
    return Markup("\n\n").join(out)


def code_pairs(codes: Mapping[str, Sequence[str] | str], template: Sequence[str] | str, *,
               threshold: float = CODE_THRESHOLD, min_shared: int = MIN_SHARED, common_share: float = COMMON_SHARE,
               other: float = OTHER_SHARE, highlight: bool = True) -> CodeFindings:
    """The pairs of students (id -> the code cells they wrote) one of whose fingerprints are found, for at least
    `threshold` of them, in the other's, most similar first. A student whose code cannot be fingerprinted is left
    out and named (never the whole class)."""
    given = _as_cells(template)
    keep = defined_names(given)
    boilerplate = {h for u in fingerprint(given, keep=keep) for h in u.hashes}
    units: dict[str, list[Unit]] = {}
    skipped: dict[str, str] = {}
    cells = {sid: _as_cells(code) for sid, code in codes.items()}
    for sid, mine in cells.items():
        if not any(c.strip() for c in mine):
            continue
        try:
            found = fingerprint(mine, names=aliases([*given, *mine]), keep=keep)  # the template's imports too
        except Exception as exc:  # noqa: BLE001 - one notebook never stops the comparison of the class
            skipped[sid] = f"its code could not be read ({type(exc).__name__}: {str(exc)[:200]})"
            continue
        for u in found:
            u.hashes -= boilerplate
        units[sid] = [u for u in found if u.hashes]
    seen = Counter(h for found in units.values() for h in set().union(*(u.hashes for u in found)))
    cut = max(3, math.ceil(common_share * len(units)))
    common = {h for h, n in seen.items() if n >= cut}
    sets: dict[str, set[int]] = {}
    for sid, found in units.items():  # the class's code is left out of every student alike: a unit mostly common
        kept = [u for u in found if len(u.hashes & common) < COMMON_UNIT * len(u.hashes)]  # goes whole
        for u in kept:
            u.hashes -= common
        units[sid] = [u for u in kept if u.hashes]
        sets[sid] = set().union(*(u.hashes for u in units[sid]))
    index: dict[int, list[str]] = {}
    for sid in sorted(sets):
        for h in sets[sid]:
            index.setdefault(h, []).append(sid)
    shared: Counter[tuple[str, str]] = Counter()
    for ids in index.values():
        if len(ids) > 1:
            shared.update((x, y) for i, x in enumerate(ids) for y in ids[i + 1:])
    pairs = []
    for (x, y), n in shared.items():
        sx, sy = sets[x], sets[y]
        if n < min_shared or n < threshold * min(len(sx), len(sy)) or n < other * max(len(sx), len(sy)):
            continue
        pair = CodePair(x, y, round(n / len(sx), 3), round(n / len(sy), 3), n)
        if highlight:
            pair.left, pair.right = _marked(cells[x], units[x], sy), _marked(cells[y], units[y], sx)
        pairs.append(pair)
    pairs.sort(key=lambda p: (-p.score, p.first, p.second))
    return CodeFindings(pairs, len(common), skipped)


def weight_pairs(sketches: dict[str, dict[str, list[float]]], *,
                 threshold: float = WEIGHTS_THRESHOLD) -> list[WeightPair]:
    """The pairs of students (id -> part -> sketch of its weights) with a part whose sketches lie within
    `threshold` of each other, relative to the larger norm (0: identical weights), closest first."""
    found: dict[tuple[str, str], dict[str, float]] = {}
    parts = sorted({p for row in sketches.values() for p in row})
    for part in parts:
        ids = sorted(sid for sid, row in sketches.items() if len(row.get(part) or []) > 0)
        if len(ids) < 2:
            continue
        size = max(len(sketches[sid][part]) for sid in ids)
        ids = [sid for sid in ids if len(sketches[sid][part]) == size]
        m = np.array([sketches[sid][part] for sid in ids], dtype=np.float64)
        norms = np.linalg.norm(m, axis=1)
        sq = norms[:, None] ** 2 + norms[None, :] ** 2 - 2 * m @ m.T
        dist = np.sqrt(np.clip(sq, 0, None)) / np.maximum(np.maximum(norms[:, None], norms[None, :]), 1e-12)
        for i, j in zip(*np.nonzero(np.triu(dist <= threshold, 1))):
            d = float(np.linalg.norm(m[i] - m[j]) / max(norms[i], norms[j], 1e-12))  # exact for the listed pairs
            if d <= threshold:
                found.setdefault((ids[i], ids[j]), {})[part] = round(d, 5)
    pairs = [WeightPair(x, y, {p: d[p] for p in parts if p in d}) for (x, y), d in found.items()]
    pairs.sort(key=lambda p: (p.score, p.first, p.second))
    return pairs


def output_pairs(losses: dict[str, dict[str, list[float]]], *,
                 tolerance: float = LOSS_TOLERANCE) -> dict[tuple[str, str], dict[str, float]]:
    """The pairs of students (id -> part -> held-out losses per segment) with a part whose losses all lie within
    `tolerance` of each other: (first, second) -> part -> the largest difference. Pairs are looked for among
    neighbours in the order of the losses' means (two vectors within `tolerance` everywhere have means that close),
    so a class costs a sort and the few close neighbours, not every pair."""
    found: dict[tuple[str, str], dict[str, float]] = {}
    for part in sorted({p for row in losses.values() for p in row}):
        ids = sorted(sid for sid, row in losses.items() if len(row.get(part) or []) > 0)
        size = max((len(losses[sid][part]) for sid in ids), default=0)
        ids = [sid for sid in ids if len(losses[sid][part]) == size]
        if len(ids) < 2:
            continue
        m = np.array([losses[sid][part] for sid in ids], dtype=np.float64)
        means = m.mean(1)
        order = np.argsort(means, kind="stable")
        for a, i in enumerate(order):
            for j in order[a + 1:]:
                if means[j] - means[i] > tolerance:
                    break
                gap = float(np.abs(m[i] - m[j]).max())
                if gap <= tolerance:
                    x, y = sorted((ids[i], ids[j]))
                    found.setdefault((x, y), {})[part] = round(gap, 5)
    return found


def checkpoint_pairs(sketches: dict[str, dict[str, list[float]]], losses: dict[str, dict[str, list[float]]], *,
                     threshold: float = WEIGHTS_THRESHOLD, tolerance: float = LOSS_TOLERANCE) -> list[WeightPair]:
    """The pairs of students whose checkpoints are the same by their weights (weight_pairs) or by what they compute
    (output_pairs), each with both kinds of evidence; identical weights first, then the closest, then those found
    by their outputs alone (most alike first)."""
    pairs = {(p.first, p.second): p for p in weight_pairs(sketches, threshold=threshold)}
    for key, gaps in output_pairs(losses, tolerance=tolerance).items():
        pairs.setdefault(key, WeightPair(*key, {})).gaps = {p: gaps[p] for p in sorted(gaps)}
    return sorted(pairs.values(), key=lambda p: (p.score, min(p.gaps.values(), default=math.inf), p.first,
                                                 p.second))


def _vectors_of(record: dict[str, Any], parts: dict[str, str], key: str) -> dict[str, list[float]]:
    out = {}
    for case in record.get("cases") or []:
        got = case.get("received") if isinstance(case, dict) else None
        values = got.get(key) if isinstance(got, dict) else None
        part = parts.get(case.get("id")) if isinstance(case, dict) else None
        if part and isinstance(values, list) and values and all(
                isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in values):
            out[part] = [float(v) for v in values]
    return out


def sketches_of(record: dict[str, Any], parts: dict[str, str]) -> dict[str, list[float]]:
    """A stored result's weight sketches per checkpoint part (case id -> part in `parts`); {} when none."""
    return _vectors_of(record, parts, "sketch")


def losses_of(record: dict[str, Any], parts: dict[str, str]) -> dict[str, list[float]]:
    """A stored result's held-out losses per segment per checkpoint part (the reader's `heldout_losses`); {} when
    none (a result stored before they were taken)."""
    return _vectors_of(record, parts, "heldout_losses")


def pair_decisions(book: Gradebook) -> tuple[dict[tuple[str, str], dict[str, str]], str]:
    """The TAs' similarity decisions of a grades folder (sorted pair of ids -> {"decision", "note"}) and a problem
    ("" when none): the file (YAML) is `decisions:` with a list of {pair: [id, id], decision: text, note: text};
    a missing file has none."""
    data, problem = book.similarity_decisions()
    path = book.similarity_decisions_path
    if problem or data is None:
        return {}, problem
    out = {}
    rows = data.get("decisions") if isinstance(data, dict) else None
    if not isinstance(rows, list):
        return {}, f"{path}: expected `decisions:` and a list of pairs; its decisions are not shown"
    for n, row in enumerate(rows):
        pair = row.get("pair") if isinstance(row, dict) else None
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(p, str) for p in pair)):
            return {}, f"{path}: decision {n + 1} has no \"pair\" of two ids; its decisions are not shown"
        key = (min(pair), max(pair))
        out[key] = {"decision": str(row.get("decision") or ""), "note": str(row.get("note") or "")}
    return out, ""


def find_similar(codes: Mapping[str, Sequence[str] | str], template: Sequence[str] | str,
                 sketches: dict[str, dict[str, list[float]]], *, highlight: bool = True,
                 losses: dict[str, dict[str, list[float]]] | None = None) -> Similarity:
    """Both kinds of pairs for a class (codes: id -> the code cells written; sketches: id -> part -> sketch;
    losses: id -> part -> held-out losses per segment).

    The code is fingerprinted and compared in a child interpreter: a notebook that exhausts it (memory, the C
    stack) costs the code pairs, said on the page, never the report; the checkpoint pairs are found here. The
    fingerprints are keyed hashes (blake2b), the same in every process: every run lists the same pairs."""
    cells = {sid: _as_cells(code) for sid, code in codes.items()}
    payload = json.dumps({"codes": cells, "template": _as_cells(template), "highlight": highlight})
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "autograder.report.similarity"], input=payload, env=env,
                          capture_output=True, text=True, check=False, errors="surrogateescape")
    losses = losses or {}
    found = Similarity(weights=checkpoint_pairs(sketches, losses),
                       students=len(set(codes) | set(sketches) | set(losses)),
                       with_code=sum(any(c.strip() for c in v) for v in cells.values()),
                       with_sketch=len(set(sketches) | set(losses)))
    try:  # a child that died (memory, the C stack) costs the code pairs, said on the page, never the report
        if done.returncode != 0:
            raise RuntimeError(f"exit status {done.returncode}: {done.stderr.strip()[-300:]}")
        data = json.loads(done.stdout)
        found.code = [CodePair(**{**p, "left": Markup(p["left"]), "right": Markup(p["right"])})
                      for p in data["pairs"]]
        found.common, found.skipped = int(data["common"]), {str(k): str(v) for k, v in data["skipped"].items()}
    except (RuntimeError, ValueError, KeyError, TypeError, AttributeError) as exc:
        found.problem = f"the code could not be compared ({str(exc)[:400]}); the checkpoint pairs are listed"
    return found


def main() -> int:
    """The child of find_similar: a class's code cells as JSON on stdin, the code pairs as JSON on stdout."""
    given = json.loads(sys.stdin.read())
    found = code_pairs(given["codes"], given["template"], highlight=given["highlight"])
    out = [{**asdict(p), "left": str(p.left), "right": str(p.right)} for p in found.pairs]
    sys.stdout.write(json.dumps({"pairs": out, "common": found.common, "skipped": found.skipped}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
