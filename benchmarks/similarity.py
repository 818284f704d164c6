"""Similarity report benchmark: a synthetic class of independently written honest solutions with planted copies.

Each honest student writes eight small functions of a made-up homework (tensor helpers), each in one of several
styles with optional steps of their own (checks, intermediate names, docstrings, comments) and their own names;
about a third of the class writes the canonical solution of a function, which the report leaves out as shared by
much of the class. Planted copies take another student's code and rename every variable, reorder the functions
and rewrite the comments (some also add a helper of their own). Checkpoint sketches: honest students' weights are
independent; one student submits a copy of another's checkpoint, one a copy trained a little further (1% away).
The template's code (given helpers and stubs) is boilerplate.

    python benchmarks/similarity.py                # 300 students, 12 planted code copies
    python benchmarks/similarity.py --students 40 --smoke

Prints the figures: time, pairs listed, copies found, honest pairs listed. Exit status 1 when a copy is missed,
an honest pair is listed or (without --smoke) the time is over the goal of 60 s.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autograder.report.similarity import find_similar  # noqa: E402

GOAL_S = 60.0
TEMPLATE = '''import torch

def check_shape(x, n):
    """Given: raise when x has not n dimensions."""
    if x.dim() != n:
        raise ValueError(f"expected {n} dimensions, got {x.dim()}")

# TASK: fill in each function below.
'''
STUB = "def {name}({args}):\n    # YOUR CODE HERE\n    raise NotImplementedError\n"
NAMES = ["x", "t", "inp", "data", "arr", "a", "b", "m", "vals", "tensor", "z", "w", "q", "k", "v", "h", "p", "s",
         "out", "res", "result", "y", "acc", "tmp", "buf", "row", "col", "idx", "n", "d", "size", "total", "c"]

# Each task: its signature and styles; a style is lines with {v0}.. placeholders (the student's names); "?" marks an
# optional line (each student keeps it or not). The first style is the canonical one (many students write it).
TASKS = {
    "center": ("x", [
        ["{r} = x - x.mean(dim=0, keepdim=True)", "return {r}"],
        ["?check_shape(x, 2)", "{m} = x.mean(0)", "?{m} = {m}.unsqueeze(0)", "{r} = x - {m}", "return {r}"],
        ["{r} = x.clone()", "for {i} in range(x.shape[1]):", "    {r}[:, {i}] -= x[:, {i}].mean()", "return {r}"],
        ["{n} = x.shape[0]", "{s} = x.sum(dim=0) / {n}", "?{s} = {s}.reshape(1, -1)", "return x - {s}"]]),
    "normalize": ("x, eps=1e-5", [
        ["return (x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True) + eps)"],
        ["{m} = x.mean(dim=-1, keepdim=True)", "{s} = ((x - {m}) ** 2).mean(dim=-1, keepdim=True).sqrt()",
         "?{s} = {s}.clamp_min(0)", "return (x - {m}) / ({s} + eps)"],
        ["{r} = torch.empty_like(x)", "for {i}, {row} in enumerate(x):",
         "    {r}[{i}] = ({row} - {row}.mean()) / ({row}.std() + eps)", "return {r}"]]),
    "softmax_rows": ("x", [
        ["return torch.softmax(x, dim=-1)"],
        ["{e} = torch.exp(x - x.max(dim=-1, keepdim=True).values)", "?{e} = {e}.float()",
         "return {e} / {e}.sum(dim=-1, keepdim=True)"],
        ["{m} = x.amax(-1, keepdim=True)", "{e} = (x - {m}).exp()", "{s} = {e}.sum(-1, keepdim=True)",
         "?assert ({s} > 0).all()", "return {e} / {s}"]]),
    "pairwise": ("a, b", [
        ["return torch.cdist(a, b)"],
        ["{d} = a[:, None, :] - b[None, :, :]", "?{d} = {d}.double()", "return ({d} ** 2).sum(-1).sqrt()"],
        ["{aa} = (a * a).sum(1, keepdim=True)", "{bb} = (b * b).sum(1)", "{ab} = a @ b.T",
         "return ({aa} + {bb} - 2 * {ab}).clamp_min(0).sqrt()"],
        ["{r} = torch.zeros(len(a), len(b))", "for {i} in range(len(a)):", "    for {j} in range(len(b)):",
         "        {r}[{i}, {j}] = torch.norm(a[{i}] - b[{j}])", "return {r}"]]),
    "causal_mask": ("n", [
        ["return torch.tril(torch.ones(n, n, dtype=torch.bool))"],
        ["{i} = torch.arange(n)", "?{i} = {i}.long()", "return {i}[:, None] >= {i}[None, :]"],
        ["{m} = torch.ones(n, n)", "{m} = torch.triu({m}, diagonal=1)", "return {m} == 0"],
        ["{m} = torch.zeros(n, n, dtype=torch.bool)", "for {i} in range(n):", "    {m}[{i}, :{i} + 1] = True",
         "return {m}"]]),
    "topk_mean": ("x, k", [
        ["return x.topk(k, dim=-1).values.mean(-1)"],
        ["{s} = x.sort(dim=-1, descending=True).values", "?{s} = {s}.contiguous()", "return {s}[..., :k].mean(-1)"],
        ["{r} = []", "for {row} in x:", "    {vals} = sorted({row}.tolist(), reverse=True)[:k]",
         "    {r}.append(sum({vals}) / k)", "return torch.tensor({r})"]]),
    "one_hot": ("idx, n", [
        ["return torch.nn.functional.one_hot(idx, n).float()"],
        ["{r} = torch.zeros(len(idx), n)", "{r}[torch.arange(len(idx)), idx] = 1.0", "return {r}"],
        ["{r} = torch.eye(n)[idx]", "?{r} = {r}.to(torch.float32)", "return {r}"],
        ["{r} = torch.zeros(idx.shape[0], n)", "for {i}, {j} in enumerate(idx.tolist()):", "    {r}[{i}, {j}] = 1",
         "return {r}"]]),
    "running_sum": ("x", [
        ["return torch.cumsum(x, dim=0)"],
        ["{r} = torch.zeros_like(x)", "{acc} = 0", "for {i} in range(len(x)):", "    {acc} = {acc} + x[{i}]",
         "    {r}[{i}] = {acc}", "return {r}"],
        ["{r} = [x[0]]", "for {v} in x[1:]:", "    {r}.append({r}[-1] + {v})", "return torch.stack({r})"]]),
}
EXTRAS = ["?{t} = None  # not used", "?assert {x_arg} is not None", '?"""{doc}"""']
DOCS = ["Computes it.", "My version.", "Vectorised.", "Uses a loop, slower but clear.", "See lecture 3.",
        "TODO: tidy", "Returns a tensor.", "Works for 2-D input."]
COMMENTS = ["# first the shape", "# then the result", "# careful with dims", "# as in class", "# broadcasting",
            "# simple loop", "# check this", "# done"]
PLACEHOLDERS = ["r", "m", "i", "j", "s", "n", "e", "d", "aa", "bb", "ab", "row", "vals", "acc", "v", "t"]


# Habits: each student has some of these in every function they write (a personal style, as real students have).
HABITS = [(r"dim=(-?\d)", r"\1"), (r"\.values\b", "[0]"), (r" \*\* 2", ".pow(2)"), (r"range\(len\((\w+)\)\)",
          r"range(\1.shape[0])"), (r"keepdim=True", "keepdim=1 > 0"), (r"\.sum\(", ".sum(dim="),
          (r"torch\.zeros\(([^)]*)\)", r"torch.zeros(\1, dtype=torch.float32)"),
          (r"return (.+)", r"out = \1\n    return out"),
          (r"\.mean\(", ".float().mean("), (r"\[:, ", "[..., ")]


def write_function(rng: random.Random, name: str, *, canonical: float, habits: list[tuple[str, str]] = ()) -> str:
    """One student's version of a task: a style (the canonical one with probability `canonical`), their optional
    lines, names, a docstring or comments of their own."""
    args, styles = TASKS[name]
    style = styles[0] if rng.random() < canonical else rng.choice(styles[1:])
    names = dict(zip(PLACEHOLDERS, rng.sample(NAMES, len(PLACEHOLDERS))))
    names |= {"doc": rng.choice(DOCS), "x_arg": args.split(",")[0]}
    body = []
    for line in [*([EXTRAS[2]] if rng.random() < 0.5 else []), *style, *EXTRAS[:2]]:
        if line.startswith("?") or line.lstrip().startswith("?"):
            if rng.random() < 0.5:
                continue
            line = line.replace("?", "", 1)
        if rng.random() < 0.2:
            body.append("    " + " " * (len(line) - len(line.lstrip())) + rng.choice(COMMENTS))
        body.append("    " + line.format(**names))
    ret = [i for i, b in enumerate(body) if b.strip().startswith("return")]
    body = body[:ret[0] + 1] if ret and not body[-1].strip().startswith("return") else body
    code = "\n".join(body)
    for pattern, repl in habits:
        code = re.sub(pattern, repl, code)
    hint = rng.random() < 0.3
    head = f"def {name}({args}) -> torch.Tensor:" if hint else f"def {name}({args}):"
    return head + "\n" + code + "\n"


def honest(rng: random.Random) -> list[str]:
    """An honest student's cells: the template's given cell, then their functions in their own order."""
    names = list(TASKS)
    rng.shuffle(names)
    habits = [h for h in HABITS if rng.random() < 0.4]
    return [TEMPLATE, *(write_function(rng, n, canonical=0.3, habits=habits) for n in names)]


def disguise(rng: random.Random, cells: list[str]) -> list[str]:
    """A planted copy: every local name renamed, the functions reordered, the comments and docstrings rewritten,
    sometimes a helper of the copier's own added."""
    funcs = cells[1:]
    rng.shuffle(funcs)
    out = []
    for code in funcs:
        code = re.sub(r"#.*", lambda _: rng.choice(COMMENTS + ["# mine"]), code)
        code = re.sub(r'"""[^"]*"""', f'"""{rng.choice(DOCS)} (rewritten)"""', code)
        for old in sorted(set(re.findall(r"\b(?:" + "|".join(NAMES) + r")\b", code)), key=len, reverse=True):
            if old not in ("x", "a", "b", "n", "k", "idx"):  # arguments keep their names (the signature is given)
                code = re.sub(rf"\b{old}\b", f"{old}_{rng.randint(1, 9)}", code)
        out.append(code)
    if rng.random() < 0.5:
        out.append("def my_helper(z):\n    return z * 2\n")
    return [cells[0], *out]


def make_class(n: int, copies: int, seed: int) -> tuple[dict[str, list[str]], set[tuple[str, str]],
                                                         dict[str, dict[str, list[float]]], set[tuple[str, str]]]:
    """Students' cells, the planted code copies (pairs), checkpoint sketches and the planted checkpoint copies."""
    rng = random.Random(seed)
    cells = {f"s{i:03d}": honest(rng) for i in range(n - copies)}
    planted = set()
    sources = rng.sample(sorted(cells), copies)  # distinct: two copies of one student would be a copy pair too
    for i, source in enumerate(sources):
        sid = f"c{i:03d}"
        cells[sid] = disguise(rng, cells[source])
        planted.add((min(source, sid), max(source, sid)))
    sketches = {sid: {p: [rng.gauss(0, 1) for _ in range(256)] for p in ("p1", "p2")} for sid in sorted(cells)}
    ids = sorted(cells)
    a, b, c, d = ids[3], ids[7], ids[11], ids[13]
    sketches[b] = {p: list(v) for p, v in sketches[a].items()}  # a copied checkpoint
    sketches[d] = {p: [x + rng.gauss(0, 0.01) for x in v] for p, v in sketches[c].items()}  # trained a little more
    return cells, planted, sketches, {(a, b), (c, d)}


def cpu_seconds() -> float:
    """CPU seconds of this process and its finished children (the report fingerprints in a child)."""
    import resource

    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + kids.ru_utime + kids.ru_stime


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--students", type=int, default=300)
    ap.add_argument("--copies", type=int, default=12)
    ap.add_argument("--seed", type=int, default=83)
    ap.add_argument("--smoke", action="store_true", help="a small class; the time is not judged")
    args = ap.parse_args(argv)
    cells, planted, sketches, planted_weights = make_class(args.students, args.copies, args.seed)
    from autograder.report.similarity import written_code

    start, cpu = time.perf_counter(), cpu_seconds()
    codes = {sid: written_code(list(enumerate(c)), [TEMPLATE]) for sid, c in cells.items()}
    found = find_similar(codes, TEMPLATE + "\n".join(STUB.format(name=n, args=a) for n, (a, _) in TASKS.items()),
                         sketches)
    seconds, cpu_s = time.perf_counter() - start, cpu_seconds() - cpu
    listed = {(p.first, p.second) for p in found.code}
    weights = {(p.first, p.second) for p in found.weights}
    missed, false = planted - listed, listed - planted
    print(f"students: {args.students} (planted code copies: {len(planted)}, checkpoint copies: "
          f"{len(planted_weights)}); cores: {len(os.sched_getaffinity(0))}")
    print(f"time: {seconds:.1f} s wall, {cpu_s:.1f} CPU-s (goal: {GOAL_S:g} s)")
    print(f"code pairs listed: {len(listed)}; copies found: {len(planted & listed)}/{len(planted)}; "
          f"honest pairs listed: {len(false)}; fingerprints left out as common: {found.common}")
    scores = sorted((p.score for p in found.code), reverse=True)
    print(f"lowest score of a listed pair: {min(scores, default=0):.2f}")
    print(f"checkpoint pairs listed: {len(weights)}; copies found: {len(planted_weights & weights)}/"
          f"{len(planted_weights)}; honest pairs listed: {len(weights - planted_weights)}")
    bad = bool(missed or false or planted_weights - weights or weights - planted_weights)
    for pair in sorted(missed):
        print(f"MISSED copy: {pair}")
    for pair in sorted(false):
        print(f"HONEST pair listed: {pair}")
    return 1 if bad or (not args.smoke and seconds > GOAL_S) else 0


if __name__ == "__main__":
    sys.exit(main())
