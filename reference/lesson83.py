"""Reference solutions for Lesson 83; the builder turns the marked bodies into student stubs."""

from __future__ import annotations

import math

import numpy as np
import torch
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
    cos, sin = rope_cache(T, d)
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
    scores = scores + alibi_bias(H, T).to(scores.dtype)
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    scores = scores.masked_fill(future, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v
    # END SOLUTION
