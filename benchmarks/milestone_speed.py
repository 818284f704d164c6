"""Training steps per second: the milestone trainer against a straightforward TinyCharLM, side by side."""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from autograder import lesson83_milestone as milestone
from reference.lesson83 import TinyCharLM, alibi_bias, apply_rope, rope_cache, sinusoidal_pe


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
                          device: torch.device) -> None:
    """The textbook loop: float32, a fresh batch gathered on the host, the loss read back every step."""
    tokens = milestone.corpus_tokens()
    torch.manual_seed(0)
    model = StraightforwardLM(pos=pos, **milestone.ARCH).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    starts = milestone.batch_starts(steps=steps, batch_size=batch_size, seed=0)
    losses = []
    for step in range(steps):
        X, Y = milestone.windows(tokens, starts[step], context)
        X, Y = X.to(device), Y.to(device)
        logits = model(X)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), Y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())


def steps_per_second(fn, *, steps: int, device: torch.device) -> float:
    """Steps per second of one call fn(steps=steps)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn(steps=steps)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return steps / (time.perf_counter() - start)


def same_logits(pos: str) -> float:
    """Largest logit difference between the two implementations on the same weights and input."""
    torch.manual_seed(0)
    fast = TinyCharLM(pos=pos, **milestone.ARCH).eval()
    slow = StraightforwardLM(pos=pos, **milestone.ARCH).eval()
    slow.load_state_dict(fast.state_dict())
    X = torch.randint(0, milestone.ARCH["vocab_size"], (2, 128))
    with torch.no_grad():
        return (fast(X) - slow(X)).abs().max().item()


def main(argv: Sequence[str] | None = None) -> None:
    """Print steps/s of both implementations and their ratio, per device and scheme."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default 10 CPU, 300 CUDA)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps before each scheme")
    parser.add_argument("--repeats", type=int, default=3, help="alternating timed runs; the best counts")
    parser.add_argument("--schemes", nargs="+", default=list(milestone.SCHEMES), choices=milestone.SCHEMES)
    parser.add_argument("--threads", type=int, default=2, help="CPU threads (torch.set_num_threads)")
    parser.add_argument("--compile", action="store_true", help="also time the trainer with torch.compile")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    shapes = {k: milestone.PRESETS["full"][k] for k in ("batch_size", "context")}
    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    print(f"batch {shapes['batch_size']}, context {shapes['context']}, torch {torch.__version__}, "
          f"{args.threads} CPU threads" + (f", {torch.cuda.get_device_name()}" if len(devices) > 1 else ""))
    for pos in args.schemes:
        assert same_logits(pos) < 1e-4, f"{pos}: the two implementations disagree"
    names = ["trainer", "simple"] + (["compiled"] if args.compile else [])
    print(f"{'device':<6} {'scheme':<10} " + " ".join(f"{n:>9}" for n in names) + "   steps/s; ratios to simple")
    for device in devices:
        steps = args.steps or (300 if device.type == "cuda" else 10)
        ratios: dict[str, list[float]] = {n: [] for n in names if n != "simple"}
        for pos in args.schemes:
            impls = {
                "trainer": partial(milestone.train, TinyCharLM, pos, device=device, progress=False, **shapes),
                "simple": partial(straightforward_train, pos, device=device, **shapes),
                "compiled": partial(milestone.train, TinyCharLM, pos, device=device, progress=False,
                                    compile=True, **shapes),
            }
            for n in names:
                impls[n](steps=args.warmup)  # warm-up (and compilation)
            runs = [[steps_per_second(impls[n], steps=steps, device=device) for n in names]
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
