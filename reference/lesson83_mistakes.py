"""Catalogue of typical Lesson 83 mistakes, each a wrong redefinition applied on top of the reference."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REFERENCE_SOURCE = Path(__file__).with_name("lesson83.py")


@dataclass(frozen=True)
class Mistake:
    """A named wrong implementation: `code` redefines one or more reference names."""

    id: str
    question: str
    description: str
    code: str


def reference_namespace(mistake: Mistake | None = None) -> dict[str, Any]:
    """Namespace of the reference solution as a notebook would hold it, optionally with one mistake applied."""
    ns: dict[str, Any] = {"__name__": "lesson83_reference"}
    exec(compile(REFERENCE_SOURCE.read_text(), str(REFERENCE_SOURCE), "exec"), ns)  # noqa: S102
    if mistake is not None:
        exec(compile(mistake.code, f"<mistake {mistake.id}>", "exec"), ns)  # noqa: S102
    return ns


def _edit(base: str, *edits: tuple[str, str]) -> str:
    """`base` with each (old, new) replacement made in turn; each old text must occur exactly once."""
    for old, new in edits:
        if base.count(old) != 1:
            raise ValueError(f"{old!r} occurs {base.count(old)} times, not once, in:\n{base}")
        base = base.replace(old, new)
    return base


_LM_METHODS = {  # method -> (its signature, what runs before the override, the fallback after it)
    "attend": ("attend(self, q, k, v)", "", "return super().attend(q, k, v)"),
    "add_positions": ("add_positions(self, H)", "", "return super().add_positions(H)"),
    "__init__": ("__init__(self, *args, **kwargs)", "super().__init__(*args, **kwargs)", ""),
}


def _lm_subclass(method: str, pos: str, body: str) -> str:
    """Source of a TinyCharLM subclass whose `method` runs `body` under the scheme `pos` and the reference's
    own method otherwise (`__init__` runs the reference's first, then `body`)."""
    signature, before, after = _LM_METHODS[method]
    lines = ["", "class TinyCharLM(TinyCharLM):", f"    def {signature}:", *([f"        {before}"] if before else []),
             f'        if self.pos == "{pos}":', textwrap.indent(textwrap.dedent(body).strip("\n"), " " * 12),
             *([f"        {after}"] if after else [])]
    return "\n".join(lines) + "\n"


# Correct definitions as the mistakes below write them; most mistakes are one of these with one edit, so the
# edit is the mistake.
_SELF_ATTENTION = """
def self_attention(X, W_q, W_k, W_v, causal=False):
    Q, K, V = X @ W_q, X @ W_k, X @ W_v
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
    if causal:
        T = X.shape[-2]
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(scores, dim=-1) @ V
"""
_SINUSOIDAL_PE = """
def sinusoidal_pe(max_len, d):
    if d % 2:
        raise ValueError("d must be even")
    pos = np.arange(max_len, dtype=np.float64)[:, None]
    w = 10000.0 ** (np.arange(0, d, 2) / d)
    pe = np.zeros((max_len, d))
    pe[:, 0::2], pe[:, 1::2] = np.sin(pos / w), np.cos(pos / w)
    return pe
"""
_SINUSOIDAL_MODULE = """
class SinusoidalPE(nn.Module):
    def __init__(self, d_model, max_len=512):
        super().__init__()
        self.max_len = max_len
        self.register_buffer("pe", torch.tensor(sinusoidal_pe(max_len, d_model), dtype=torch.float32))

    def forward(self, x):
        if x.shape[1] > self.max_len:
            raise ValueError(f"sequence length {x.shape[1]} is longer than max_len={self.max_len}")
        return x + self.pe[: x.shape[1]]
"""
_ROPE_ATTENTION = """
def rope_attention(q, k, v, causal=True):
    T, d = q.shape[-2], q.shape[-1]
    cos, sin = rope_cache(T, d)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d)
    if causal:
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v
"""
_ALIBI_ATTENTION = """
def alibi_attention(q, k, v):
    H, T, d = q.shape[-3], q.shape[-2], q.shape[-1]
    scores = q @ k.transpose(-2, -1) / math.sqrt(d) + alibi_bias(H, T).to(q.dtype)
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v
"""

MISTAKES: tuple[Mistake, ...] = (
    Mistake("attention_no_scale", "q1_equivariance",
            "the scores are not divided by sqrt(d_k); scale Q K^T by 1/sqrt(d_k) before the softmax.",
            _edit(_SELF_ATTENTION, (" / math.sqrt(Q.shape[-1])", ""))),
    Mistake("attention_softmax_wrong_axis", "q1_equivariance",
            "the softmax runs over the queries (dim=0) instead of over the keys of each row (dim=-1).",
            _edit(_SELF_ATTENTION, ("dim=-1", "dim=-2"))),
    Mistake("attention_mask_ignored", "q1_equivariance",
            "causal=True is ignored: mask the future keys (j > i) with -inf before the softmax.", """
def self_attention(X, W_q, W_k, W_v, causal=False):
    Q, K, V = X @ W_q, X @ W_k, X @ W_v
    return torch.softmax(Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1]), dim=-1) @ V
"""),
    Mistake("pe_sin_cos_swapped", "q2_sinusoidal_pe",
            "sin and cos are swapped: even columns 2i take sin, odd columns 2i+1 take cos.",
            _edit(_SINUSOIDAL_PE, ("np.sin(pos / w), np.cos(pos / w)", "np.cos(pos / w), np.sin(pos / w)"))),
    Mistake("pe_exponent_i_over_d", "q2_sinusoidal_pe",
            "the exponent uses i/d instead of 2i/d (i is the pair index): w_i = 10000^(2i/d).",
            _edit(_SINUSOIDAL_PE, ("np.arange(0, d, 2)", "np.arange(d // 2)"))),
    Mistake("pe_positions_from_one", "q2_sinusoidal_pe",
            "positions are counted from 1: the first row is position 0, so PE[0] = [0, 1, 0, 1, ...].",
            _edit(_SINUSOIDAL_PE, ("np.arange(max_len,", "np.arange(1, max_len + 1,"))),
    Mistake("pe_multiply_not_divide", "q2_sinusoidal_pe",
            "the position is multiplied by 10000^(2i/d) instead of divided by it.",
            _edit(_SINUSOIDAL_PE, ("np.sin(pos / w), np.cos(pos / w)", "np.sin(pos * w), np.cos(pos * w)"))),
    Mistake("pe_as_parameter", "q3_sinusoidal_module",
            "the table is an nn.Parameter, so the optimiser trains it; use self.register_buffer('pe', table).",
            _edit(_SINUSOIDAL_MODULE, ('self.register_buffer("pe", torch.tensor(',
                                        "self.pe = nn.Parameter(torch.tensor("))),
    Mistake("pe_plain_attribute", "q3_sinusoidal_module",
            "the table is a plain attribute: state_dict() loses it and .to() leaves it behind; "
            "use self.register_buffer('pe', table).",
            _edit(_SINUSOIDAL_MODULE, ('self.register_buffer("pe", torch.tensor(', "self.pe = torch.tensor("),
                  ("dtype=torch.float32))", "dtype=torch.float32)"))),
    Mistake("learned_transposed", "q4_learned_pe",
            "the table is built as nn.Embedding(d_model, max_len): one row per position means "
            "nn.Embedding(max_len, d_model).", """
class LearnedPE(nn.Module):
    def __init__(self, max_len, d_model):
        super().__init__()
        self.max_len = max_len
        self.table = nn.Embedding(d_model, max_len)

    def forward(self, x):
        T = x.shape[1]
        if T > self.max_len:
            raise ValueError(f"sequence length {T} is longer than max_len={self.max_len}")
        return x + self.table.weight.T[:T]
"""),
    Mistake("learned_no_length_check", "q4_learned_pe",
            "there is no length check, so T > max_len fails with an opaque IndexError; raise a ValueError "
            "that names T and max_len.", """
class LearnedPE(nn.Module):
    def __init__(self, max_len, d_model):
        super().__init__()
        self.table = nn.Embedding(max_len, d_model)

    def forward(self, x):
        return x + self.table(torch.arange(x.shape[1]))
"""),
    Mistake("rope_interleaved", "q5_rope",
            "RoPE pairs neighbouring features (2i, 2i+1) (the interleaved convention); this lesson uses the "
            "half-split convention: x1 = x[..., :d/2], x2 = x[..., d/2:].", """
def apply_rope(x, cos, sin):
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out
"""),
    Mistake("rope_negative_angle", "q5_rope",
            "RoPE rotates by -theta (the signs of the sin terms are swapped): "
            "result = cat(x1 cos - x2 sin, x1 sin + x2 cos).", """
def apply_rope(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos + x2 * sin, -x1 * sin + x2 * cos], dim=-1)
"""),
    Mistake("rope_ignores_base", "q5_rope",
            "rope_cache ignores its base argument and always uses 10000.", """
def rope_cache(seq_len, d, base=10000.0):
    if d % 2:
        raise ValueError("d must be even")
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float64), theta)
    return torch.cos(angles).float(), torch.sin(angles).float()
"""),
    Mistake("rope_rotates_v", "q6_rope_attention",
            "V is rotated too: RoPE goes on q and k only; v carries content and must stay as it is.",
            _edit(_ROPE_ATTENTION, ("q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)",
                                    "q, k, v = apply_rope(q, cos, sin), apply_rope(k, cos, sin), "
                                    "apply_rope(v, cos, sin)"))),
    Mistake("rope_model_width", "q6_rope_attention",
            "the RoPE frequencies use the model width (heads x head width) instead of the per-head width d.",
            _edit(_ROPE_ATTENTION, ("""
    cos, sin = rope_cache(T, d)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
""", """
    width = d * (q.shape[-3] if q.dim() >= 4 else 1)
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / width)
    angles = torch.outer(torch.arange(T, dtype=torch.float64), theta)
    q = apply_rope(q, torch.cos(angles).float(), torch.sin(angles).float())
    k = apply_rope(k, torch.cos(angles).float(), torch.sin(angles).float())
"""))),
    Mistake("rope_attention_no_scale", "q6_rope_attention",
            "the scores are not divided by sqrt(d) before the softmax.",
            _edit(_ROPE_ATTENTION, (" / math.sqrt(d)", ""))),
    Mistake("alibi_sign_flipped", "q7_alibi",
            "the ALiBi bias has the wrong sign: bias[h, i, j] = slope_h * (j - i) is negative for past keys.",
            """
def alibi_bias(num_heads, seq_len):
    pos = torch.arange(seq_len, dtype=torch.float32)
    return alibi_slopes(num_heads)[:, None, None] * (pos[:, None] - pos[None, :])
"""),
    Mistake("alibi_slopes_from_zero", "q7_alibi",
            "the slopes start at h = 0 (the first slope is 1); they run over h = 1..H: 2^(-8h/H).", """
def alibi_slopes(num_heads):
    h = torch.arange(0, num_heads, dtype=torch.float64)
    return (2.0 ** (-8.0 * h / num_heads)).float()
"""),
    Mistake("alibi_after_softmax", "q7_alibi",
            "the bias is added after the softmax; it belongs to the scaled scores, before the mask and softmax.",
            """
def alibi_attention(q, k, v):
    H, T, d = q.shape[-3], q.shape[-2], q.shape[-1]
    scores = q @ k.transpose(-2, -1) / math.sqrt(d)
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    weights = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
    weights = (weights + alibi_bias(H, T).to(weights.dtype)).masked_fill(future, 0.0)
    return weights @ v
"""),
    Mistake("alibi_no_causal_mask", "q7_alibi",
            "there is no causal mask: the bias alone does not hide future keys (it even favours them).",
            _edit(_ALIBI_ATTENTION, ('    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), '
                                     'float("-inf"))\n', ""))),
    Mistake("alibi_no_scale", "q7_alibi",
            "the scores are not divided by sqrt(d) before the bias is added.",
            _edit(_ALIBI_ATTENTION, (" / math.sqrt(d) +", " +"))),
    Mistake("alibi_bias_scaled", "q7_alibi",
            "the ALiBi bias is divided by sqrt(d) together with the scores; only q k^T is scaled: "
            "scores = q k^T / sqrt(d) + alibi_bias(H, T).",
            _edit(_ALIBI_ATTENTION, ("q @ k.transpose(-2, -1) / math.sqrt(d) + alibi_bias(H, T).to(q.dtype)",
                                     "(q @ k.transpose(-2, -1) + alibi_bias(H, T).to(q.dtype)) / math.sqrt(d)"))),
    Mistake("alibi_paper_slopes", "q7_alibi",
            "the slopes follow the ALiBi paper's get_slopes, which for a head count that is not a power of two "
            "takes the slopes of the next lower power of two and interleaves some of the next higher; this "
            "lesson defines slope_h = 2^(-8h/H), h = 1..H, for every H.", """
def alibi_slopes(num_heads):
    def power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start ** i for i in range(n)]
    if math.log2(num_heads).is_integer():
        return torch.tensor(power_of_2(num_heads))
    closest = 2 ** math.floor(math.log2(num_heads))
    extra = alibi_slopes(2 * closest).tolist()[0::2][: num_heads - closest]
    return torch.tensor(power_of_2(closest) + extra)
"""),
    Mistake("lm_rotates_v", "m1_tinycharlm",
            "RoPE is applied to v as well; rotate q and k only and pass v through untouched.",
            _lm_subclass("attend", "rope", """
T = q.shape[-2]
cos, sin = rope_cache(T, self.head_dim)
q, k, v = apply_rope(q, cos, sin), apply_rope(k, cos, sin), apply_rope(v, cos, sin)
return F.scaled_dot_product_attention(q, k, v, is_causal=True)
""")),
    Mistake("lm_not_causal", "m1_tinycharlm",
            "attention is not causal: without is_causal=True (or a -inf mask) every position reads the future.",
            """
class TinyCharLM(TinyCharLM):
    def attend(self, q, k, v):
        if self.pos == "rope":
            cos, sin = rope_cache(q.shape[-2], self.head_dim)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.pos == "alibi":
            return super().attend(q, k, v)
        return F.scaled_dot_product_attention(q, k, v)
"""),
    Mistake("lm_alibi_no_causal", "m1_tinycharlm",
            "the ALiBi mask holds the bias only: a float attn_mask replaces the causal mask, so it needs -inf "
            "above the diagonal.",
            _lm_subclass("attend", "alibi", """
bias = alibi_bias(self.num_heads, q.shape[-2]).to(q.dtype)
return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
""")),
    Mistake("lm_alibi_unscaled", "m1_tinycharlm",
            "the ALiBi scores are not divided by sqrt(head_dim) before the bias is added.",
            _lm_subclass("attend", "alibi", """
T = q.shape[-2]
scores = q @ k.transpose(-2, -1) + alibi_bias(self.num_heads, T).to(q.dtype)
scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
return scores.softmax(-1) @ v
""")),
    Mistake("lm_rope_model_width", "m1_tinycharlm",
            "inside the model, the RoPE frequencies use the model width num_hiddens instead of the per-head width "
            "head_dim: build the tables with rope_cache(T, self.head_dim).",
            _lm_subclass("attend", "rope", """
T, d = q.shape[-2], self.head_dim
theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / (d * self.num_heads))
angles = torch.outer(torch.arange(T, dtype=torch.float64), theta).to(q.device)
cos, sin = torch.cos(angles).to(q.dtype), torch.sin(angles).to(q.dtype)
q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
return F.scaled_dot_product_attention(q, k, v, is_causal=True)
""")),
    Mistake("lm_alibi_bias_scaled", "m1_tinycharlm",
            "inside the model, the ALiBi bias is divided by sqrt(head_dim) with the scores; only q k^T is scaled, "
            "the bias is added as it is.",
            _lm_subclass("attend", "alibi", """
T = q.shape[-2]
future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
bias = alibi_bias(self.num_heads, T).to(q.device) / math.sqrt(self.head_dim)
mask = bias.masked_fill(future, float("-inf")).to(q.dtype)[None]
return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
""")),
    Mistake("lm_pe_parameter", "m1_tinycharlm",
            "the sinusoidal table pe is an nn.Parameter, so it is trained; register it as a buffer.",
            _lm_subclass("__init__", "sinusoidal", """
table = self.pe
del self.pe
self.pe = nn.Parameter(table.clone())
""")),
    Mistake("lm_tables_in_state_dict", "m1_tinycharlm",
            "the RoPE tables are persistent buffers, so they enter the state dict and the checkpoint no longer "
            "loads into the grader's model; register them with persistent=False.",
            _lm_subclass("__init__", "rope", """
cos, sin = rope_cache(self.max_len, self.head_dim)
self.register_buffer("rope_cos", cos)
self.register_buffer("rope_sin", sin)
""")),
    Mistake("lm_untied_head", "m1_tinycharlm",
            "the output head is a separate nn.Linear; it must reuse token_emb.weight (a tied head).", """
class TinyCharLM(TinyCharLM):
    def __init__(self, vocab_size, num_hiddens=128, *args, **kwargs):
        super().__init__(vocab_size, num_hiddens, *args, **kwargs)
        self.head = nn.Linear(num_hiddens, vocab_size, bias=False)
        self.head.weight.data.copy_(self.token_emb.weight.data)

    def forward(self, X):
        return self.head(self.hidden(X))
"""),
    Mistake("lm_learned_last_rows", "m1_tinycharlm",
            "the learned table is read from its last T rows; position t uses row t: pos_emb.weight[:T].",
            _lm_subclass("add_positions", "learned", """
return H + self.pos_emb.weight[-H.shape[1]:]
""")),
    Mistake("lm_sinusoidal_scaled_embedding", "m1_tinycharlm",
            "the token embeddings are multiplied by sqrt(d) before the sinusoidal table is added; this "
            "protocol adds the table to the embeddings as they are.",
            _lm_subclass("add_positions", "sinusoidal", """
return H * math.sqrt(H.shape[-1]) + self.pe[: H.shape[1]]
""")),
    Mistake("lm_tables_on_cpu", "m1_tinycharlm",
            "the RoPE tables are built on the CPU inside forward (rope_cache in attend, never moved to q's "
            "device): right on a CPU, a crash at the first GPU step. Register them as buffers in __init__ "
            "(persistent=False), or create them on q.device.",
            _lm_subclass("attend", "rope", """
cos, sin = rope_cache(q.shape[-2], self.head_dim)
q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
return F.scaled_dot_product_attention(q, k, v, is_causal=True)
""")),
)
