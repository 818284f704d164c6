"""Reference solutions for Lesson 83; the builder turns the marked bodies into student stubs."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


def self_attention(X, W_q, W_k, W_v, causal=False):
    """One head of scaled dot-product self-attention with no positional information.

    X: (T, d_in); W_q, W_k: (d_in, d_k); W_v: (d_in, d_v). Returns (T, d_v).
    With causal=True, token t may only attend to tokens 0..t.
    """
    # BEGIN SOLUTION
    Q, K, V = X @ W_q, X @ W_k, X @ W_v
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
    if causal:
        T = X.shape[-2]
        future = torch.ones(T, T, dtype=torch.bool, device=X.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    return torch.softmax(scores, dim=-1) @ V
    # END SOLUTION


def sinusoidal_pe(max_len, d):
    """Sinusoidal table as a float64 numpy array of shape (max_len, d).

    PE[pos, 2i] = sin(pos / 10000**(2i/d)) and PE[pos, 2i+1] = cos(pos / 10000**(2i/d)).
    Raises ValueError when d is odd.
    """
    # BEGIN SOLUTION
    if d % 2:
        raise ValueError(f"d must be even: sin and cos fill the columns in pairs, got d={d}")
    pos = np.arange(max_len, dtype=np.float64)[:, None]
    w = 10000.0 ** (np.arange(0, d, 2, dtype=np.float64) / d)
    pe = np.zeros((max_len, d), dtype=np.float64)
    pe[:, 0::2] = np.sin(pos / w)
    pe[:, 1::2] = np.cos(pos / w)
    return pe
    # END SOLUTION


class SinusoidalPE(nn.Module):
    """Adds the fixed sinusoidal table to x of shape (B, T, d_model); the table is a buffer named pe."""

    def __init__(self, d_model, max_len=512):
        super().__init__()
        # BEGIN SOLUTION
        self.max_len = max_len
        table = torch.tensor(sinusoidal_pe(max_len, d_model), dtype=torch.float32)
        self.register_buffer("pe", table)
        # END SOLUTION

    def forward(self, x):
        # BEGIN SOLUTION
        T = x.shape[1]
        if T > self.max_len:
            raise ValueError(f"sequence length {T} is longer than max_len={self.max_len}")
        return x + self.pe[:T]
        # END SOLUTION


class LearnedPE(nn.Module):
    """Adds a learned position vector (one nn.Embedding row per position) to x of shape (B, T, d_model)."""

    def __init__(self, max_len, d_model):
        super().__init__()
        # BEGIN SOLUTION
        self.max_len = max_len
        self.table = nn.Embedding(max_len, d_model)
        nn.init.normal_(self.table.weight, std=0.02)
        # END SOLUTION

    def forward(self, x):
        # BEGIN SOLUTION
        T = x.shape[1]
        if T > self.max_len:
            raise ValueError(f"sequence length {T} is longer than max_len={self.max_len}")
        return x + self.table(torch.arange(T, device=x.device))
        # END SOLUTION


def rope_cache(seq_len, d, base=10000.0):
    """Return (cos, sin), each of shape (seq_len, d // 2), for angles pos * base**(-2i/d)."""
    # BEGIN SOLUTION
    if d % 2:
        raise ValueError(f"d must be even: RoPE rotates the features in pairs, got d={d}")
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float64), theta)
    return torch.cos(angles).float(), torch.sin(angles).float()
    # END SOLUTION


def apply_rope(x, cos, sin):
    """Rotate x of shape (..., seq_len, d) in the half-split convention.

    x1 = x[..., :d/2], x2 = x[..., d/2:]; result = concat(x1*cos - x2*sin, x1*sin + x2*cos).
    """
    # BEGIN SOLUTION
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    # END SOLUTION


def rope_attention(q, k, v, causal=True):
    """Attention for q, k, v of shape (..., T, d) with RoPE on q and k only (never on v)."""
    # BEGIN SOLUTION
    T, d = q.shape[-2], q.shape[-1]
    cos, sin = (t.to(q.device) for t in rope_cache(T, d))  # made on the CPU: move them to q's device
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d)
    if causal:
        future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v
    # END SOLUTION


def alibi_slopes(num_heads):
    """Head slopes 2**(-8h/H) for h = 1..H, as a float tensor of shape (H,)."""
    # BEGIN SOLUTION
    h = torch.arange(1, num_heads + 1, dtype=torch.float64)
    return (2.0 ** (-8.0 * h / num_heads)).float()
    # END SOLUTION


def alibi_bias(num_heads, seq_len):
    """Bias of shape (H, T, T) with bias[h, i, j] = slope_h * (j - i): keys in the past are penalised."""
    # BEGIN SOLUTION
    pos = torch.arange(seq_len, dtype=torch.float32)
    distance = pos[None, :] - pos[:, None]
    return alibi_slopes(num_heads)[:, None, None] * distance
    # END SOLUTION


def alibi_attention(q, k, v):
    """Causal attention for q, k, v of shape (..., H, T, d) with the ALiBi bias added to the scaled scores."""
    # BEGIN SOLUTION
    H, T, d = q.shape[-3], q.shape[-2], q.shape[-1]
    scores = q @ k.transpose(-2, -1) / math.sqrt(d)
    scores = scores + alibi_bias(H, T).to(device=scores.device, dtype=scores.dtype)
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    scores = scores.masked_fill(future, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v
    # END SOLUTION


class TinyCharLM(nn.Module):
    """Attention-only character language model for Milestone M1.

    A token embedding, num_blks residual causal self-attention blocks (one qkv and one output projection
    each; no feed-forward layer, no normalisation) and an output head tied to the embedding.
    pos picks the positional scheme: "learned", "sinusoidal", "rope", "alibi" or "none".

    Keep the names token_emb, pos_emb, pe and blks: the grader loads your trained weights into its own
    copy of this class by name. Tables for "rope" and "alibi" must not enter the state dict.
    """

    SCHEMES = ("learned", "sinusoidal", "rope", "alibi", "none")
    INIT_STD = 0.02  # standard deviation of the normal init of the token and learned position tables

    def __init__(self, vocab_size, num_hiddens=128, num_heads=4, num_blks=2, pos="rope", max_len=512,
                 bias=False):
        super().__init__()
        if pos not in self.SCHEMES:
            raise ValueError(f"pos must be one of {self.SCHEMES}, got {pos!r}")
        if num_hiddens % num_heads:
            raise ValueError(f"num_hiddens={num_hiddens} is not divisible by num_heads={num_heads}")
        self.pos, self.num_heads, self.max_len = pos, num_heads, max_len
        self.head_dim = num_hiddens // num_heads
        self.token_emb = nn.Embedding(vocab_size, num_hiddens)
        nn.init.normal_(self.token_emb.weight, std=self.INIT_STD)
        # Positional state: learned -> self.pos_emb, an nn.Embedding(max_len, num_hiddens) with normal
        # init (std INIT_STD); sinusoidal -> the float32 table of sinusoidal_pe as a buffer named pe;
        # rope and alibi -> optional precomputed tables, registered with persistent=False.
        # BEGIN SOLUTION
        if pos == "learned":
            self.pos_emb = nn.Embedding(max_len, num_hiddens)
            nn.init.normal_(self.pos_emb.weight, std=self.INIT_STD)
        elif pos == "sinusoidal":
            self.register_buffer("pe", torch.tensor(sinusoidal_pe(max_len, num_hiddens), dtype=torch.float32))
        elif pos == "rope":
            cos, sin = rope_cache(max_len, self.head_dim)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        elif pos == "alibi":
            future = torch.ones(max_len, max_len, dtype=torch.bool).triu(1)
            mask = alibi_bias(num_heads, max_len).masked_fill(future, float("-inf"))
            self.register_buffer("alibi_mask", mask, persistent=False)
        # END SOLUTION
        self.blks = nn.ModuleList(
            nn.ModuleDict({"qkv": nn.Linear(num_hiddens, 3 * num_hiddens, bias=bias),
                           "proj": nn.Linear(num_hiddens, num_hiddens, bias=bias)})
            for _ in range(num_blks))

    def add_positions(self, H):
        """H of shape (B, T, num_hiddens) plus the position vectors of learned or sinusoidal, else H."""
        # BEGIN SOLUTION
        T = H.shape[1]
        if self.pos in ("learned", "sinusoidal") and T > self.max_len:
            raise ValueError(f"{self.pos} positions exist only up to max_len={self.max_len}, got length {T}")
        if self.pos == "learned":
            return H + self.pos_emb.weight[:T]
        if self.pos == "sinusoidal":
            return H + self.pe[:T]
        return H
        # END SOLUTION

    def attend(self, q, k, v):
        """Causal attention for q, k, v of shape (B, num_heads, T, head_dim) under this model's scheme:
        RoPE on q and k (never v) for "rope", the ALiBi bias on the scaled scores for "alibi", and the
        causal mask alone otherwise. Returns (B, num_heads, T, head_dim)."""
        # BEGIN SOLUTION
        T = q.shape[-2]
        if self.pos == "rope":
            if T <= self.max_len:
                cos, sin = self.rope_cos[:T], self.rope_sin[:T]
            else:
                cos, sin = (t.to(q.device) for t in rope_cache(T, self.head_dim))
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.pos != "alibi":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if T <= self.max_len:
            mask = self.alibi_mask[:, :T, :T]
        else:
            future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
            mask = alibi_bias(self.num_heads, T).to(q.device).masked_fill(future, float("-inf"))
        # A 4-D mask (1, heads, T, T) lets the fused kernel run on a CPU too (a 3-D one falls back to math).
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype)[None])
        # END SOLUTION

    def hidden(self, X):
        """The last block's output, (B, T, num_hiddens), for token ids X of shape (B, T)."""
        B, T = X.shape
        H = self.add_positions(self.token_emb(X))
        for blk in self.blks:
            q, k, v = (u.reshape(B, T, self.num_heads, self.head_dim).transpose(1, 2)
                       for u in blk["qkv"](H).chunk(3, dim=-1))
            H = H + blk["proj"](self.attend(q, k, v).transpose(1, 2).reshape(B, T, -1))
        return H

    def forward(self, X):
        """Logits of shape (B, T, vocab_size) for token ids X of shape (B, T)."""
        return F.linear(self.hidden(X), self.token_emb.weight)  # the head shares the embedding's weights
