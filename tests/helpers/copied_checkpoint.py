"""A checkpoint copied under other weights: the same function, reparametrised the ways a copier can without changing
a single output (tests/engine/test_leaderboard.py's pairs, tests/lesson83/test_checkpoint_copies.py).

`reparametrised(state, heads=H, seed=s)` takes an attention-only language model's state dict (a token embedding
tied to the output head, optional learned or fixed position tables added to the residual stream, blocks of one
`qkv` and one `proj` linear map, no normalisation) and returns another state dict computing the same: the residual
stream's units permuted (embeddings, position tables, every map's input or output side), the heads reordered (when
`reorder_heads`: not for a model whose heads differ by design, such as ALiBi's slopes), each head's value space
rotated (undone in `proj`), and queries scaled up as keys are scaled down."""

from __future__ import annotations

import torch

RESIDUAL = ("token_emb.weight", "pos_emb.weight", "pe")  # tables whose last axis is the residual stream


def reparametrised(state: dict[str, torch.Tensor], *, heads: int, seed: int, reorder_heads: bool = True,
                   scale: float = 1.7) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = {k: v.detach().clone() for k, v in state.items()}
    width = out["token_emb.weight"].shape[1]
    size = width // heads
    units = torch.randperm(width, generator=gen)
    for key in RESIDUAL:
        if key in out:
            out[key] = out[key][..., units]
    for key in [k for k in out if k.endswith("qkv.weight")]:
        proj = key.replace("qkv", "proj")
        q, k, v = (w.reshape(heads, size, width) for w in out[key][:, units].chunk(3, 0))
        order = torch.randperm(heads, generator=gen) if reorder_heads else torch.arange(heads)
        turn = [torch.linalg.qr(torch.randn(size, size, generator=gen, dtype=torch.float64))[0].float()
                for _ in range(heads)]
        v = torch.stack([turn[h].T @ v[order[h]] for h in range(heads)])
        out[key] = torch.cat([(q[order] * scale).reshape(width, width), (k[order] / scale).reshape(width, width),
                              v.reshape(width, width)])
        columns = out[proj].reshape(width, heads, size)
        out[proj] = torch.stack([columns[:, order[h]] @ turn[h] for h in range(heads)], 1).reshape(width, width)
        out[proj] = out[proj][units]
    return out
