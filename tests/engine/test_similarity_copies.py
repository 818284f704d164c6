"""Disguised copies on the similarity report (issue 41 item 1, autograder/report/similarity.py and fingerprints.py):
a class of honest notebooks written in different students' styles (tests/helpers/classmates.py) with planted copies
disguised by renaming, reordering cells and functions, rewritten comments, an inlined helper, dead code and `@` <->
matmul, alone and two together: at least 90% are listed and no honest pair is. Class-common code is left out of both
sides alike; a magic or a syntax error in one cell leaves the other cells normalised."""

from __future__ import annotations

import random

import pytest

from autograder.report.fingerprints import fingerprint, strip_magics, unit_tokens
from autograder.report.similarity import code_pairs, written_cells
from helpers.classmates import DISGUISES, INLINE, TEMPLATE, disguise, honest, with_helpers

HONEST = 36  # honest students per class


def planted_class(seed: int) -> tuple[dict[str, list[str]], dict[str, str]]:
    """HONEST honest notebooks and one copy per disguise (each of a different student where it can be; an inlined
    helper needs a student who wrote one): id -> the cells they wrote (the template's own cells left out, as the
    report does: the imports are then the template's), and copy id -> the student copied."""
    codes = {f"s{i:02d}": honest(seed * 1000 + i) for i in range(HONEST)}
    ids = sorted(codes)
    helpers = [s for s in ids if with_helpers(seed * 1000 + int(s[1:]))]
    planted = {}
    for n, kinds in enumerate(DISGUISES):
        pool = helpers if INLINE in kinds else ids
        source = pool[(n * 5 + seed) % len(pool)]
        copy = f"copy{n:02d}-{'+'.join(kinds)}"
        codes[copy] = disguise(codes[source], kinds, random.Random(seed * 100 + n))
        planted[copy] = source
    return {sid: written_cells(list(enumerate(cells)), TEMPLATE) for sid, cells in codes.items()}, planted


SINUSOIDAL = {"loops": "for pos in range(", "broadcasting and pow": "denom = ", "exp-log": "div_term = np.exp(",
              "np.power": "np.power(10000", "row by row": "rows.append(row)"}
ROTATION = {"halves": "x1, x2 = x[..., :half]", "rotate_half": "rotated = torch.c",
            "complex numbers": "torch.complex(", "interleaved pairs": "pairs = torch.stack("}


def test_the_honest_class_is_written_in_different_styles() -> None:
    """The honest notebooks are genuinely different: no two alike, each function written in several ways across
    the class (the sinusoidal table by loops, broadcasting with pow, exp-log, np.power, row by row; the rotation by
    halves, rotate_half, complex numbers, interleaved pairs)."""
    cells = ["\n".join(honest(i)) for i in range(HONEST)]
    assert len(set(cells)) == HONEST
    for styles in (SINUSOIDAL, ROTATION):
        assert {name for name, mark in styles.items() if any(mark in c for c in cells)} == set(styles)


@pytest.mark.parametrize("seed", [0, 1])
def test_disguised_copies_are_listed_and_honest_pairs_are_not(seed: int) -> None:
    codes, planted = planted_class(seed)
    found = code_pairs(codes, TEMPLATE, highlight=False)
    listed = {(p.first, p.second) for p in found.pairs}
    hits = [c for c, s in planted.items() if (min(c, s), max(c, s)) in listed]
    assert len(hits) >= 0.9 * len(planted), sorted(set(planted) - set(hits))
    copies_of = {}
    for copy, source in planted.items():
        copies_of.setdefault(source, {source}).add(copy)
    false = [(x, y) for x, y in listed if not any({x, y} <= group for group in copies_of.values())]
    assert false == [] and found.skipped == {}


def test_a_copy_is_marked_on_the_page() -> None:
    codes, planted = planted_class(0)
    copy = next(c for c in planted if c.endswith("-rename+reorder"))
    found = code_pairs({s: cells for s, cells in codes.items() if s == copy or not s.startswith("copy")}, TEMPLATE)
    pair = next(p for p in found.pairs if {p.first, p.second} == {copy, planted[copy]})
    assert pair.left.count("<mark>") > 10 and pair.right.count("<mark>") > 10 and "&lt;" not in pair.left


def test_class_common_code_is_left_out_of_both_sides_alike() -> None:
    """Most of the class writes one function the same way; the copier edits their copy of it (an assert, a renamed
    local). Its fingerprints are no longer the class's, but the function is still mostly class-common: it is left out
    of the copier's code as it is of the original's, and does not dilute the copier's share (the issue's finding)."""
    common = ('def sinusoidal_pe(max_len, d):\n    pos = np.arange(max_len)[:, None]\n'
              '    w = 10000.0 ** (np.arange(0, d, 2) / d)\n    pe = np.zeros((max_len, d))\n'
              '    pe[:, 0::2] = np.sin(pos / w)\n    pe[:, 1::2] = np.cos(pos / w)\n    return pe\n')
    edited = common.replace("    pos = ", "    assert d % 2 == 0\n    pos = ").replace("pe", "table")
    codes = {f"s{i:02d}": [common, honest(500 + i)[1]] for i in range(10)}  # ten write the common function
    original = codes["s00"] = [common, honest(77)[-1]]
    codes["copier"] = [edited, original[1]]
    found = code_pairs(codes, TEMPLATE, highlight=False)
    pair = next(p for p in found.pairs if {p.first, p.second} == {"copier", "s00"})
    assert min(pair.a, pair.b) >= 0.95


def test_a_magic_or_a_syntax_error_leaves_the_other_cells_normalised() -> None:
    cells = honest(3)
    names = {"np": "numpy"}
    clean = [unit_tokens(c, names) for c in cells]
    broken = cells[:2] + ["%timeit sinusoidal_pe(64, 16)\n" + cells[2], cells[3] + "\n\ndef oops(:\n    pass\n",
                          *cells[4:]]
    dirty = [unit_tokens(c, names) for c in broken]
    assert [t for _, _, t in dirty[2]] == [t for _, _, t in clean[2]]  # the magic blanked: the cell reads as before
    assert dirty[4:] == clean[4:] and dirty[:2] == clean[:2]  # the cell that does not parse touches no other
    assert any("V" in toks for _, _, toks in dirty[3])  # and is itself still read, token by token
    assert strip_magics("x = !ls\n%%time\ny = 1\n") == "x = None\n\ny = 1\n"
    copy = disguise(cells, ("rename", "reorder"), random.Random(1))
    copy = ["%load_ext autoreload\n%autoreload 2\n" + copy[0], *copy[1:], "def unfinished(:\n"]
    others = {f"s{i:02d}": honest(900 + i) for i in range(12)}
    found = code_pairs({"orig": cells, "copy": copy, **others}, TEMPLATE, highlight=False)
    assert [(p.first, p.second) for p in found.pairs] == [("copy", "orig")]


@pytest.mark.parametrize(("one", "other"), [
    ("def f(a, b):\n    return torch.matmul(a, b.T)\n", "def f(a, b):\n    return a @ b.T\n"),
    ("def f(a, b):\n    return a.matmul(b).sum(-1)\n", "def f(a, b):\n    return (a @ b).sum(-1)\n"),
    ("def _m(n, dev):\n    return torch.ones(n, n, device=dev).triu(1)\n\n"
     "def f(q, k):\n    s = q @ k.T\n    m = _m(q.shape[0], q.device)\n    return s.masked_fill(m.bool(), 0)\n",
     "def f(q, k):\n    s = q @ k.T\n    m = torch.ones(q.shape[0], q.shape[0], device=q.device).triu(1)\n"
     "    return s.masked_fill(m.bool(), 0)\n"),
    ('def f(x: torch.Tensor) -> torch.Tensor:\n    """Doc."""\n    unused = x * 2  # not read\n'
     "    y = x.sum(dim=-1)\n    if False:\n        print(y)\n    return y / x.shape[-1]\n    print('never')\n",
     "def f(x):\n    # mine\n    y = x.sum(dim=-1)\n    return y / x.shape[-1]\n"),
])
def test_forms_that_compute_the_same_read_alike(one: str, other: str) -> None:
    def prints(code: str) -> set[int]:
        return {h for u in fingerprint([code], names={"torch": "torch"}) for h in u.hashes}

    assert prints(one) == prints(other) and prints(one)
