"""Similarity evidence for TAs (never a score): pairs of students whose code shares more than CODE_THRESHOLD of
its fingerprints (copydetect's winnowing over normalised tokens: names, comments and string contents do not
count; the template's code is boilerplate and fingerprints most of the class shares are left out), and pairs whose
checkpoint weights are identical or nearly so (the sketches the lesson's checkpoint reader took; no weights are
loaded here). A TA's decision on a pair is read from a small JSON file kept beside the grades."""

from __future__ import annotations

import ast
import io
import json
import math
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from copydetect import CodeFingerprint, compare_files
from copydetect.utils import get_token_coverage, highlight_overlap
from markupsafe import Markup

from autograder.grading.gradebook import Gradebook

# Documented in docs/similarity.md, with the benchmark that measured them (benchmarks/similarity.py).
NOISE = 25  # k: fingerprints are 25 filtered characters long (copydetect's default noise threshold)
GUARANTEE = 30  # every shared run this long is found (copydetect's default guarantee threshold)
CODE_THRESHOLD = 0.85  # a pair is listed when each student's code shares at least this share with the other's
MIN_SHARED = 120  # ... and at least this many filtered characters (a student who wrote little is not listed)
COMMON_SHARE = 0.2  # a fingerprint in at least this share of the class (and 3 students) is everyone's code
WEIGHTS_THRESHOLD = 0.05  # checkpoint parts whose sketches lie closer than this (relative) are "nearly identical"


@dataclass
class CodePair:
    """Two students whose code shares a share `a` of the first's and `b` of the second's fingerprinted code."""

    first: str
    second: str
    a: float
    b: float
    shared: int
    left: Markup = Markup("")  # each student's code, the matching parts marked
    right: Markup = Markup("")

    @property
    def score(self) -> float:
        return min(self.a, self.b)


@dataclass
class WeightPair:
    """Two students whose checkpoint parts are identical or nearly so: part -> relative distance of the sketches."""

    first: str
    second: str
    distances: dict[str, float]

    @property
    def score(self) -> float:
        return min(self.distances.values())


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


def written_code(cells: Sequence[tuple[int, str]], template: Sequence[str]) -> str:
    """The code a student wrote: their code cells, those identical to a cell of the template left out."""
    given = {t.strip() for t in template}
    return "\n\n".join(src for _, src in cells if src.strip() and src.strip() not in given)


def in_name_order(code: str) -> str:
    """The code with its top-level statements regrouped: the others first, in their order, then the functions and
    classes sorted by name (a reordering of functions changes nothing; code that does not parse stays as it is)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # the last two: a tree too deep to build
        return code
    lines = code.splitlines(keepends=True)

    def text(node: ast.stmt) -> str:
        first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
        return "".join(lines[first - 1:node.end_lineno or node.lineno])

    defs = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    rest = [text(n) for n in tree.body if not isinstance(n, defs)]
    named = sorted(((n.name, i, text(n)) for i, n in enumerate(tree.body) if isinstance(n, defs)))
    return "\n".join([*rest, *(t for _, _, t in named)])


def _fingerprint(code: str, boilerplate: np.ndarray) -> CodeFingerprint:
    win = GUARANTEE - NOISE + 1
    return CodeFingerprint("code.py", NOISE, win, boilerplate=boilerplate, language="python", fp=io.StringIO(code))


def _drop(fp: CodeFingerprint, common: set[int]) -> None:
    """Leave the class-common fingerprints out of one student's (as copydetect leaves boilerplate out)."""
    if common & fp.hashes:
        fp.hashes = fp.hashes - common
        fp.hash_idx = {h: i for h, i in fp.hash_idx.items() if h not in common}
        fp.token_coverage = get_token_coverage(fp.hash_idx, fp.k, len(fp.filtered_code))


def fingerprints(codes: dict[str, str], boilerplate: np.ndarray) -> tuple[dict[str, CodeFingerprint], dict[str, str]]:
    """Each student's fingerprints (id -> the code they wrote), and the students whose code could not be
    fingerprinted (id -> why): one notebook never stops the comparison of the rest of the class."""
    fps, skipped = {}, {}
    for sid, code in codes.items():
        if not code.strip():
            continue
        try:
            fps[sid] = _fingerprint(in_name_order(code), boilerplate)
        except Exception as exc:  # noqa: BLE001 - RecursionError, MemoryError, whatever one notebook raises
            skipped[sid] = f"its code could not be fingerprinted ({type(exc).__name__}: {str(exc)[:200]})"
    return fps, skipped


def code_pairs(codes: dict[str, str], template: str, *, threshold: float = CODE_THRESHOLD,
               min_shared: int = MIN_SHARED, common_share: float = COMMON_SHARE,
               highlight: bool = True, skipped: dict[str, str] | None = None) -> tuple[list[CodePair], int]:
    """The pairs of students (id -> the code they wrote) whose code shares at least `threshold` of each one's
    fingerprints, most similar first, and how many fingerprints were left out as common. Fingerprints use
    Python's salted hash(), so they are made and compared in this one process and never stored. `skipped`, when
    given, receives the students whose code could not be fingerprinted (id -> why); the rest are compared."""
    boilerplate = np.array(sorted(_fingerprint(template, np.array([])).hashes), dtype=np.int64) if template else \
        np.array([], dtype=np.int64)
    fps, left_out = fingerprints(codes, boilerplate)
    if skipped is not None:
        skipped.update(left_out)
    seen = Counter(h for fp in fps.values() for h in fp.hashes)
    cut = max(3, math.ceil(common_share * len(fps)))
    common = {h for h, n in seen.items() if n >= cut}
    index: dict[int, list[str]] = {}
    for sid, fp in fps.items():
        _drop(fp, common)
        for h in fp.hashes:
            index.setdefault(h, []).append(sid)
    shared: Counter[tuple[str, str]] = Counter()
    for ids in index.values():
        if len(ids) > 1:
            ids = sorted(ids)
            shared.update((x, y) for i, x in enumerate(ids) for y in ids[i + 1:])
    pairs = []
    for (x, y), n in shared.items():
        fx, fy = fps[x], fps[y]
        if n < threshold / 2 * min(len(fx.hashes), len(fy.hashes)):
            continue  # far too few shared fingerprints to reach the threshold: not compared in full
        overlap, (a, b), (sx, sy) = compare_files(fx, fy)
        if min(a, b) < threshold or overlap < min_shared:
            continue
        pair = CodePair(x, y, round(float(a), 3), round(float(b), 3), int(overlap))
        if highlight:
            try:
                pair.left = Markup(highlight_overlap(fx.raw_code, sx, "<mark>", "</mark>", escape_html=True)[0])
                pair.right = Markup(highlight_overlap(fy.raw_code, sy, "<mark>", "</mark>", escape_html=True)[0])
            except Exception:  # noqa: BLE001 - the pair is listed all the same, its code unmarked
                pair.left, pair.right = Markup(""), Markup("")
        pairs.append(pair)
    pairs.sort(key=lambda p: (-p.score, p.first, p.second))
    return pairs, len(common)


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


def sketches_of(record: dict[str, Any], parts: dict[str, str]) -> dict[str, list[float]]:
    """A stored result's weight sketches per checkpoint part (case id -> part in `parts`); {} when none."""
    out = {}
    for case in record.get("cases") or []:
        got = case.get("received") if isinstance(case, dict) else None
        sketch = got.get("sketch") if isinstance(got, dict) else None
        part = parts.get(case.get("id")) if isinstance(case, dict) else None
        if part and isinstance(sketch, list) and sketch and all(
                isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in sketch):
            out[part] = [float(v) for v in sketch]
    return out


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


HASH_SEED = "0"  # the child that makes and compares the fingerprints runs with PYTHONHASHSEED fixed to this


def find_similar(codes: dict[str, str], template: str, sketches: dict[str, dict[str, list[float]]], *,
                 highlight: bool = True) -> Similarity:
    """Both kinds of pairs for a class (codes: id -> code written; sketches: id -> part -> sketch).

    copydetect's fingerprints are Python's salted hash() of each k-gram, and winnowing keeps the smallest hash of
    each window, so which fingerprints a file has depends on the salt. They are therefore made and compared in a
    child interpreter with the hash seed fixed (HASH_SEED): every run of the report lists the same pairs with the
    same scores, whatever this process's salt."""
    payload = json.dumps({"codes": codes, "template": template, "highlight": highlight})
    env = {**os.environ, "PYTHONHASHSEED": HASH_SEED,
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "autograder.report.similarity"], input=payload, env=env,
                          capture_output=True, text=True, check=False, errors="surrogateescape")
    found = Similarity(weights=weight_pairs(sketches), students=len(set(codes) | set(sketches)),
                       with_code=sum(bool(c.strip()) for c in codes.values()), with_sketch=len(sketches))
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
    """The child of find_similar: a class's codes as JSON on stdin, the code pairs as JSON on stdout."""
    if os.environ.get("PYTHONHASHSEED") != HASH_SEED:
        print(f"run with PYTHONHASHSEED={HASH_SEED} (find_similar does)", file=sys.stderr)
        return 2
    given = json.loads(sys.stdin.read())
    skipped: dict[str, str] = {}
    pairs, common = code_pairs(given["codes"], given["template"], highlight=given["highlight"], skipped=skipped)
    out = [{**asdict(p), "left": str(p.left), "right": str(p.right)} for p in pairs]
    sys.stdout.write(json.dumps({"pairs": out, "common": common, "skipped": skipped}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
