"""Similarity report benchmark: a class of independently written honest notebooks with planted disguised copies.

The honest students are tests/helpers/classmates.py's: each writes the positional-encoding lesson's functions in one
of several implementations (the sinusoidal table by loops, broadcasting, exp-log, np.power; the rotation by halves,
rotate_half, complex numbers, interleaved pairs; ...) with habits of their own. Each planted copy takes another
student's notebook and disguises it by renaming, reordering cells and functions, rewriting comments, inlining a
helper, adding dead code or swapping `@` and matmul, alone or two together (every disguise and pair in turn).
Checkpoints: honest students' weights are independent (their sketches unrelated, their held-out losses per segment
the text's own difficulty plus errors of their own, about 0.1 nats: tests/lesson83/test_checkpoint_copies.py
measures 0.6 and more between real ones); one student submits a copy of another's checkpoint, one a copy trained a
little further (1% away in weights, its losses 0.04 away: one Adam step), one a copy under other weights (units
permuted, heads reordered: its sketch unrelated, its losses the original's up to float rounding). The template's
code cells are left out, as the report does.

    python benchmarks/similarity.py                # 300 students, 42 of them planted copies
    python benchmarks/similarity.py --students 60 --copies 21 --smoke

Prints recall (planted copies listed), the honest pairs listed (false pairs) and the time. Exit status 1 when fewer
than 90% of the copies are listed, an honest pair is listed or (without --smoke) the time is over the goal of 10 s.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from autograder.report.similarity import find_similar, written_cells  # noqa: E402
from helpers.classmates import DISGUISES, INLINE, TEMPLATE, disguise, honest, with_helpers  # noqa: E402

GOAL_S = 10.0
RECALL = 0.9


Vectors = dict[str, dict[str, list[float]]]


def losses(rng: random.Random, n: int = 128) -> list[float]:
    """One independently trained model's held-out losses per segment (stored to 1e-4, as the reader does)."""
    return [round(1.8 + 0.4 * math.sin(k) + rng.gauss(0, 0.1), 4) for k in range(n)]


def make_class(n: int, copies: int, seed: int) -> tuple[dict[str, list[str]], dict[str, str], Vectors, Vectors,
                                                         set[tuple[str, str]]]:
    """Students' cells, the planted code copies (copy -> student copied), checkpoint sketches and held-out losses,
    and the planted checkpoint copies (pairs)."""
    rng = random.Random(seed)
    cells = {f"s{i:03d}": honest(seed * 100_000 + i) for i in range(n - copies)}
    ids = sorted(cells)
    helpers = [s for s in ids if with_helpers(seed * 100_000 + int(s[1:]))]
    sources = rng.sample(ids, min(copies, len(ids)))  # distinct where the class allows
    planted = {}
    for i in range(copies):
        kinds = DISGUISES[i % len(DISGUISES)]
        source = rng.choice(helpers) if INLINE in kinds else sources[i % len(sources)]
        sid = f"c{i:03d}"
        cells[sid] = disguise(cells[source], kinds, random.Random(seed * 1000 + i))
        planted[sid] = source
    sketches = {sid: {p: [rng.gauss(0, 1) for _ in range(256)] for p in ("p1", "p2")} for sid in sorted(cells)}
    loss = {sid: {p: losses(rng) for p in ("p1", "p2")} for sid in sorted(cells)}
    a, b, c, d, e, f = ids[3], ids[7], ids[11], ids[13], ids[17], ids[19]
    sketches[b], loss[b] = ({p: list(v) for p, v in x[a].items()} for x in (sketches, loss))  # a copied checkpoint
    sketches[d] = {p: [x + rng.gauss(0, 0.01) for x in v] for p, v in sketches[c].items()}  # trained a little more
    loss[d] = {p: [round(x + rng.gauss(0, 0.04), 4) for x in v] for p, v in loss[c].items()}
    loss[f] = {p: [round(x + rng.gauss(0, 2e-6), 4) for x in v] for p, v in loss[e].items()}  # under other weights
    return cells, planted, sketches, loss, {(a, b), (c, d), (e, f)}


def cpu_seconds() -> float:
    """CPU seconds of this process and its finished children (the report fingerprints in a child)."""
    import resource

    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + kids.ru_utime + kids.ru_stime


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--students", type=int, default=300)
    ap.add_argument("--copies", type=int, default=2 * len(DISGUISES))
    ap.add_argument("--seed", type=int, default=83)
    ap.add_argument("--smoke", action="store_true", help="a small class; the time is not judged")
    args = ap.parse_args(argv)
    cells, planted, sketches, loss, planted_weights = make_class(args.students, args.copies, args.seed)

    start, cpu = time.perf_counter(), cpu_seconds()
    codes = {sid: written_cells(list(enumerate(c)), TEMPLATE) for sid, c in cells.items()}
    found = find_similar(codes, TEMPLATE, sketches, losses=loss)
    seconds, cpu_s = time.perf_counter() - start, cpu_seconds() - cpu
    listed = {(p.first, p.second) for p in found.code}
    weights = {(p.first, p.second) for p in found.weights}
    by_outputs = {(p.first, p.second) for p in found.weights if p.gaps and not p.distances}
    group = {sid: planted.get(sid, sid) for sid in cells}  # a copy and its source (and other copies of it)
    hits = {c for c, s in planted.items() if (min(c, s), max(c, s)) in listed}
    false = {(x, y) for x, y in listed if group[x] != group[y]}
    print(f"students: {args.students} ({len(planted)} planted code copies, {len(DISGUISES)} disguises and pairs of "
          f"them in turn; {len(planted_weights)} checkpoint copies); cores: {len(os.sched_getaffinity(0))}")
    print(f"time: {seconds:.1f} s wall, {cpu_s:.1f} CPU-s (goal: {GOAL_S:g} s)")
    print(f"recall: {len(hits)}/{len(planted)} copies listed ({len(hits) / max(1, len(planted)):.0%}); "
          f"false pairs: {len(false)}; code pairs listed: {len(listed)}; fingerprints left out as common: "
          f"{found.common}; not compared: {len(found.skipped)}{'; ' + found.problem if found.problem else ''}")
    scores = [p.score for p in found.code if (p.first, p.second) not in false]
    print(f"lowest score of a listed copy: {min(scores, default=0):.2f}")
    print(f"checkpoint pairs listed: {len(weights)}; copies found: {len(planted_weights & weights)}/"
          f"{len(planted_weights)} ({len(planted_weights & by_outputs)} by what they compute alone); honest pairs "
          f"listed: {len(weights - planted_weights)}")
    for copy in sorted(set(planted) - hits):
        print(f"MISSED copy: {copy} of {planted[copy]} ({'+'.join(DISGUISES[int(copy[1:]) % len(DISGUISES)])})")
    for pair in sorted(false):
        print(f"HONEST pair listed: {pair}")
    bad = bool(len(hits) < RECALL * len(planted) or false or planted_weights - weights or weights - planted_weights
               or found.problem)
    return 1 if bad or (not args.smoke and seconds > GOAL_S) else 0


if __name__ == "__main__":
    sys.exit(main())
