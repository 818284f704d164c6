"""Reference TinyCharLM: an attention-only character language model with five positional schemes."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from reference.lesson83 import alibi_bias, apply_rope, rope_cache, sinusoidal_pe

SCHEMES = ("learned", "sinusoidal", "rope", "alibi", "none")


def alibi_mask(num_heads: int, seq_len: int) -> torch.Tensor:
    """Float attention mask of shape (H, T, T): the ALiBi bias on and below the diagonal, -inf above it."""
    future = torch.ones(seq_len, seq_len, dtype=torch.bool).triu(1)
    return alibi_bias(num_heads, seq_len).masked_fill(future, float("-inf"))


class TinyCharLM(nn.Module):
    """Token embedding, residual causal self-attention blocks (no FFN, no norm), head tied to the embedding.

    The state-dict names are fixed; every milestone checkpoint must load into this class:

    - ``token_emb.weight`` (vocab_size, num_hiddens), also the output head;
    - ``pos_emb.weight`` (max_len, num_hiddens), only for pos="learned";
    - ``pe`` (max_len, num_hiddens), only for pos="sinusoidal": a buffer, not a parameter;
    - ``blks.{i}.qkv.weight`` (3 * num_hiddens, num_hiddens) and ``blks.{i}.proj.weight``
      (num_hiddens, num_hiddens), plus ``.bias`` entries when bias=True.

    The RoPE tables (``rope_cos``, ``rope_sin``) and the ALiBi mask (``alibi``) are computed once for
    max_len positions and registered as non-persistent buffers, so rope, alibi and none have exactly the
    state dict of none. Longer inputs work for those three schemes; their tables are then built per call.
    """

    def __init__(self, vocab_size: int, num_hiddens: int = 128, num_heads: int = 4, num_blks: int = 2,
                 pos: str = "rope", max_len: int = 512, bias: bool = False):
        super().__init__()
        if pos not in SCHEMES:
            raise ValueError(f"pos must be one of {SCHEMES}, got {pos!r}")
        if num_hiddens % num_heads:
            raise ValueError(f"num_hiddens={num_hiddens} is not divisible by num_heads={num_heads}")
        self.pos, self.num_heads, self.max_len = pos, num_heads, max_len
        self.head_dim = num_hiddens // num_heads
        self.token_emb = nn.Embedding(vocab_size, num_hiddens)
        nn.init.normal_(self.token_emb.weight, std=0.02)
        if pos == "learned":
            self.pos_emb = nn.Embedding(max_len, num_hiddens)
            nn.init.normal_(self.pos_emb.weight, std=0.02)
        elif pos == "sinusoidal":
            self.register_buffer("pe", torch.tensor(sinusoidal_pe(max_len, num_hiddens), dtype=torch.float32))
        elif pos == "rope":
            cos, sin = rope_cache(max_len, self.head_dim)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        elif pos == "alibi":
            self.register_buffer("alibi", alibi_mask(num_heads, max_len), persistent=False)
        self.blks = nn.ModuleList(
            nn.ModuleDict({"qkv": nn.Linear(num_hiddens, 3 * num_hiddens, bias=bias),
                           "proj": nn.Linear(num_hiddens, num_hiddens, bias=bias)})
            for _ in range(num_blks))

    def _embed(self, X: torch.Tensor) -> torch.Tensor:
        T = X.shape[1]
        if self.pos in ("learned", "sinusoidal") and T > self.max_len:
            raise ValueError(f"{self.pos} positions exist only up to max_len={self.max_len}, got length {T}")
        H = self.token_emb(X)
        if self.pos == "learned":
            H = H + self.pos_emb.weight[:T]
        elif self.pos == "sinusoidal":
            H = H + self.pe[:T]
        return H

    def _heads(self, blk: nn.ModuleDict, H: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v of shape (B, heads, T, head_dim), with RoPE applied to q and k (never to v)."""
        B, T, _ = H.shape
        q, k, v = (u.reshape(B, T, self.num_heads, self.head_dim).transpose(1, 2)
                   for u in blk["qkv"](H).chunk(3, dim=-1))
        if self.pos == "rope":
            if T <= self.max_len:
                cos, sin = self.rope_cos[:T], self.rope_sin[:T]
            else:
                cos, sin = (t.to(H.device) for t in rope_cache(T, self.head_dim))
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return q, k, v

    def _alibi(self, T: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        mask = self.alibi[:, :T, :T] if T <= self.max_len else alibi_mask(self.num_heads, T).to(device)
        return mask.to(dtype)

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        """Logits of shape (B, T, vocab_size) for token ids X of shape (B, T)."""
        B, T = X.shape
        H = self._embed(X)
        for blk in self.blks:
            q, k, v = self._heads(blk, H)
            if self.pos == "alibi":
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=self._alibi(T, q.dtype, q.device))
            else:
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            H = H + blk["proj"](out.transpose(1, 2).reshape(B, T, -1))
        return F.linear(H, self.token_emb.weight)  # tied output head

    def attention_weights(self, X: torch.Tensor) -> list[torch.Tensor]:
        """Per-block attention maps, each (B, heads, T, T), computed with an explicit softmax."""
        B, T = X.shape
        H, maps = self._embed(X), []
        for blk in self.blks:
            q, k, v = self._heads(blk, H)
            scores = q @ k.transpose(-2, -1) / self.head_dim ** 0.5
            if self.pos == "alibi":
                scores = scores + self._alibi(T, scores.dtype, scores.device)
            else:
                future = torch.ones(T, T, dtype=torch.bool, device=X.device).triu(1)
                scores = scores.masked_fill(future, float("-inf"))
            weights = scores.softmax(dim=-1)
            maps.append(weights)
            H = H + blk["proj"]((weights @ v).transpose(1, 2).reshape(B, T, -1))
        return maps
