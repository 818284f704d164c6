"""Training steps per second: the milestone trainer against a straightforward TinyCharLM, side by side."""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable, Sequence
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from autograder.lesson import ENGINE_ROOT, lesson_named_in
from reference.lesson83 import TinyCharLM, alibi_bias, apply_rope, rope_cache, sinusoidal_pe

milestone = lesson_named_in(ENGINE_ROOT / "grading_config.yaml").trainer  # lesson83_milestone


class StraightforwardLM(nn.Module):
    """TinyCharLM as the textbook writes it: explicit softmax attention, positions recomputed on every call.

    It has the same state-dict names as reference.lesson83.TinyCharLM, so both load the same weights.
    """

    def __init__(self, vocab_size: int, num_hiddens: int = 128, num_heads: int = 4, num_blks: int = 2,
                 pos: str = "rope", max_len: int = 512, bias: bool = False):
        super().__init__()
        self.pos, self.num_heads = pos, num_heads
        self.token_emb = nn.Embedding(vocab_size, num_hiddens)
        nn.init.normal_(self.token_emb.weight, std=0.02)
        if pos == "learned":
            self.pos_emb = nn.Embedding(max_len, num_hiddens)
            nn.init.normal_(self.pos_emb.weight, std=0.02)
        if pos == "sinusoidal":
            self.register_buffer("pe", torch.tensor(sinusoidal_pe(max_len, num_hiddens), dtype=torch.float32))
        self.blks = nn.ModuleList(
            nn.ModuleDict({"qkv": nn.Linear(num_hiddens, 3 * num_hiddens, bias=bias),
                           "proj": nn.Linear(num_hiddens, num_hiddens, bias=bias)})
            for _ in range(num_blks))

    def _attend(self, blk: nn.ModuleDict, H: torch.Tensor) -> torch.Tensor:
        B, T, D = H.shape
        q, k, v = (u.reshape(B, T, self.num_heads, -1).transpose(1, 2) for u in blk["qkv"](H).chunk(3, -1))
        if self.pos == "rope":
            cos, sin = (t.to(H.device) for t in rope_cache(T, q.shape[-1]))
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if self.pos == "alibi":
            scores = scores + alibi_bias(self.num_heads, T).to(H.device)
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool, device=H.device), 1)
        weights = F.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
        return blk["proj"]((weights @ v).transpose(1, 2).reshape(B, T, D))

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        H = self.token_emb(X)
        if self.pos == "learned":
            H = H + self.pos_emb(torch.arange(X.shape[1], device=X.device))
        if self.pos == "sinusoidal":
            H = H + self.pe[: X.shape[1]]
        for blk in self.blks:
            H = H + self._attend(blk, H)
        return F.linear(H, self.token_emb.weight)


def straightforward_train(pos: str, *, steps: int, batch_size: int, context: int,
                          device: torch.device) -> float:
    """The textbook loop: float32, a fresh batch gathered on the host, the loss read back every step.

    Returns the seconds of the steps alone (corpus loading and model creation are not timed)."""
    tokens = milestone.corpus_tokens()
    torch.manual_seed(0)
    model = StraightforwardLM(pos=pos, **milestone.ARCH).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    starts = milestone.batch_starts(steps=steps, batch_size=batch_size, seed=0)
    losses = []
    _sync(device)
    began = time.perf_counter()
    for step in range(steps):
        X, Y = milestone.windows(tokens, starts[step], context)
        X, Y = X.to(device), Y.to(device)
        logits = model(X)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), Y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return time.perf_counter() - began


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def trainer_seconds(pos: str, *, steps: int, batch_size: int, context: int, device: torch.device,
                    graph: bool = False, compile: bool = False) -> float:
    """Seconds of the milestone trainer's steps alone (train reports them; set-up is not timed)."""
    info: dict = {}
    milestone.train(TinyCharLM, pos, steps=steps, batch_size=batch_size, context=context, device=device,
                    progress=False, graph=graph, compile=compile, info=info)
    _sync(device)
    return info["seconds"]


def implementations(device: torch.device, *, compile: bool) -> dict[str, Callable[..., float]]:
    """Name -> function(pos, steps=, batch_size=, context=, device=) returning the seconds of its steps."""
    impls: dict[str, Callable[..., float]] = {"trainer": trainer_seconds}
    if device.type == "cuda":
        impls["graphed"] = partial(trainer_seconds, graph=True)
    impls["simple"] = straightforward_train
    if compile:
        impls["compiled"] = partial(trainer_seconds, compile=True)
    return impls


def same_logits(pos: str, other: type[nn.Module] | None = None) -> float:
    """Largest logit difference between the reference TinyCharLM and `other` (default: StraightforwardLM) on the
    same weights and input."""
    torch.manual_seed(0)
    fast = TinyCharLM(pos=pos, **milestone.ARCH).eval()
    slow = (other or StraightforwardLM)(pos=pos, **milestone.ARCH).eval()
    slow.load_state_dict(fast.state_dict())
    X = torch.randint(0, milestone.ARCH["vocab_size"], (2, 128))
    with torch.no_grad():
        return (fast(X) - slow(X)).abs().max().item()


def main(argv: Sequence[str] | None = None) -> None:
    """Print steps/s of each implementation and the ratios to the straightforward one, per device and scheme.

    CUDA rows come first. Each timed run covers --steps steps (1000 by default) and excludes set-up. With
    --compile, dynamo's caches are reset before every device and scheme, so no compiled row silently runs
    eagerly because an earlier row used up the recompile limit.
    """
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=1000, help="timed steps per run (use a few for a smoke run)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps before each scheme")
    parser.add_argument("--repeats", type=int, default=1, help="alternating timed runs; the best counts")
    parser.add_argument("--schemes", nargs="+", default=list(milestone.SCHEMES), choices=milestone.SCHEMES)
    parser.add_argument("--devices", nargs="+", default=None, choices=("cuda", "cpu"),
                        help="default: cuda (when present), then cpu")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads (torch.set_num_threads)")
    parser.add_argument("--compile", action="store_true", help="also time the trainer with torch.compile")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    shapes = {k: milestone.PRESETS["full"][k] for k in ("batch_size", "context")}
    wanted = args.devices or (["cuda"] if torch.cuda.is_available() else []) + ["cpu"]
    devices = [torch.device(d) for d in ("cuda", "cpu") if d in wanted]
    print(f"batch {shapes['batch_size']}, context {shapes['context']}, {args.steps} timed steps, torch "
          f"{torch.__version__}, {args.threads} CPU threads"
          + (f", {torch.cuda.get_device_name()}" if torch.device("cuda") in devices else ""))
    for pos in args.schemes:
        assert same_logits(pos) < 1e-4, f"{pos}: the two implementations disagree"
    for device in devices:
        impls = implementations(device, compile=args.compile)
        names = list(impls)
        ratios: dict[str, list[float]] = {n: [] for n in names if n != "simple"}
        print(f"{'device':<6} {'scheme':<10} " + " ".join(f"{n:>9}" for n in names) + "   steps/s; ratios to simple")
        for pos in args.schemes:
            if args.compile:
                torch._dynamo.reset()  # a fresh recompile budget for every device and scheme
            for n in names:
                impls[n](pos, steps=args.warmup, device=device, **shapes)  # warm-up (and compilation)
            runs = [[args.steps / impls[n](pos, steps=args.steps, device=device, **shapes) for n in names]
                    for _ in range(args.repeats)]
            best = dict(zip(names, map(max, zip(*runs))))
            for n in ratios:
                ratios[n].append(best[n] / best["simple"])
            print(f"{device.type:<6} {pos:<10} " + " ".join(f"{best[n]:9.2f}" for n in names) + "   "
                  + "  ".join(f"{n} {best[n] / best['simple']:.2f}x" for n in ratios), flush=True)
        print(f"{device.type:<6} geometric mean of the ratios: "
              + "  ".join(f"{n} {math.exp(sum(map(math.log, r)) / len(r)):.2f}x" for n, r in ratios.items()))


if __name__ == "__main__":
    main()
