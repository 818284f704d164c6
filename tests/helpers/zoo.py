"""Two zoos of Lesson 83 submissions, as the code a student writes (run on top of nothing, or of the reference):

- GARBAGE: code that computes nothing the questions ask for (issue #31 finding 3): tanh and cumsum of the inputs, a
  polynomial ramp, `x * 1.5`, a running sum in TinyCharLM, Q3 and Q8 left blank; the same with functions that
  return zeros or their input while a property probe is on the stack; a lookup of the visible answers with zeros
  elsewhere (issue #32 finding 10). Each earns 0 on every question.
- NEAR_MISSES: honest partial work that is not in the catalogue (a wrong base, a full-width RoPE cache, a table
  one row too long): each keeps the points of every property that holds.
- GARBAGE_ON_REFERENCE: one question's functions replaced by finding 3's garbage in an otherwise reference notebook
  (issue #40 finding 2: `cumsum(tanh(q + k) * v)` for RoPE attention, `x * 1.5 + 0.01 * table[:T].cumsum(0)` for
  LearnedPE): that question earns 0 however right the rest is.
"""

from __future__ import annotations

from helpers.attempts import LM_CLASS

_IMPORTS = "import math\nimport numpy as np\nimport torch\nimport torch.nn.functional as F\nfrom torch import nn\n"

# Finding 3's notebook: no attention, no sinusoid, no rotation and no slope anywhere.
NOTHING = _IMPORTS + '''
def self_attention(X, W_q, W_k, W_v, causal=False):
    V = X @ W_v
    if causal:
        return torch.cumsum(V, dim=-2) / torch.arange(1, V.shape[-2] + 1, dtype=V.dtype)[:, None]
    return torch.tanh(V) + V.mean(dim=-2, keepdim=True)

def sinusoidal_pe(max_len, d):
    if d % 2:
        raise ValueError("d must be even")
    pos = np.arange(max_len, dtype=np.float64)[:, None]
    col = np.arange(d, dtype=np.float64)[None, :]
    return np.where(col % 2 == 0, 0.01 * pos * (1 + col), 1 - 0.001 * pos ** 2 / (1 + col))

class LearnedPE(nn.Module):
    def __init__(self, max_len, d_model):
        super().__init__()
        self.max_len = max_len
        self.table = nn.Embedding(max_len, d_model)

    def forward(self, x):
        T = x.shape[1]
        if T > self.max_len:
            raise ValueError(f"sequence length {T} is longer than max_len={self.max_len}")
        return x * 1.5 + 0.01 * self.table.weight[:T].cumsum(0)

def rope_cache(seq_len, d, base=10000.0):
    if d % 2:
        raise ValueError("d must be even")
    pos = torch.arange(seq_len, dtype=torch.float32)[:, None]
    col = torch.arange(d // 2, dtype=torch.float32)[None, :]
    return 1 - 0.01 * pos * (1 + col), 0.01 * pos ** 2 / (1 + col)

def apply_rope(x, cos, sin):
    return x * 1.5 + torch.tanh(x) * sin[..., :1]

def rope_attention(q, k, v, causal=True):
    return torch.cumsum(torch.tanh(q + k) * v, dim=-2)

def alibi_slopes(num_heads):
    return torch.arange(1, num_heads + 1, dtype=torch.float32) ** 2 / 100

def alibi_bias(num_heads, seq_len):
    j = torch.arange(seq_len, dtype=torch.float32)
    return -torch.tanh(alibi_slopes(num_heads)[:, None, None] * (j[None, :, None] + j[None, None, :]))

def alibi_attention(q, k, v):
    return torch.cumsum(v, dim=-2) / torch.arange(1, v.shape[-2] + 1, dtype=v.dtype)[:, None]

''' + LM_CLASS + '''
    def forward(self, X):
        H = self.token_emb(X)
        H = torch.cumsum(H, dim=1) / torch.arange(1, X.shape[1] + 1, dtype=H.dtype)[None, :, None]
        return F.linear(H, self.token_emb.weight)
'''

# The same, plus a look at the call stack: zeros or the input while a property probe runs.
_STACK = '''
import sys
_PROPERTIES = {"permutation_pair", "relative_identity", "rope_norms", "rope_shift", "toeplitz", "lm_causal",
               "lm_prefix", "learned_grad", "module_storage"}

def _probing():
    f = sys._getframe(1)
    while f is not None:
        if f.f_code.co_name in _PROPERTIES:
            return True
        f = f.f_back
    return False

def _quiet(fn, mode):
    def wrapper(*args, **kwargs):
        out = fn(*args, **kwargs)
        if not _probing():
            return out
        if mode == "zeros":
            return tuple(torch.zeros_like(o) for o in out) if isinstance(out, tuple) else out * 0
        return args[0]
    return wrapper

self_attention = _quiet(self_attention, "zeros")
sinusoidal_pe = _quiet(sinusoidal_pe, "zeros")
rope_cache = _quiet(rope_cache, "zeros")
apply_rope = _quiet(apply_rope, "input")
alibi_bias = _quiet(alibi_bias, "zeros")
'''

# The earlier trivial stub: attention that is a running sum of the values when causal (Q1 paid 0.47 for it).
TRIVIAL = _IMPORTS + '''
def self_attention(X, W_q, W_k, W_v, causal=False):
    V = X @ W_v
    return torch.cumsum(V, dim=-2) if causal else V
'''

GARBAGE: dict[str, str] = {"finding3": NOTHING, "finding3_stack": NOTHING + _STACK, "trivial_stub": TRIVIAL,
                           "blank": _IMPORTS}

# Honest partial work that no catalogue row describes: the properties that hold keep their points.
NEAR_MISSES: dict[str, str] = {
    # The RoPE tables at full width (seq_len, d), the rotation right (the form many libraries use).
    "rope_full_width_cache": '''
def rope_cache(seq_len, d, base=10000.0):
    if d % 2:
        raise ValueError("d must be even")
    inv = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.arange(seq_len, dtype=torch.float64)[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos().float(), ang.sin().float()

def apply_rope(x, cos, sin):
    h = x.shape[-1] // 2
    rot = torch.cat([-x[..., h:], x[..., :h]], dim=-1)
    return x * cos + rot * sin

''',
    # A wrong base in the sinusoidal table (1000 instead of 10000).
    "pe_base_1000": '''
def sinusoidal_pe(max_len, d):
    if d % 2:
        raise ValueError("d must be even")
    pos = np.arange(max_len, dtype=np.float64)[:, None]
    w = 1000.0 ** (np.arange(0, d, 2) / d)
    pe = np.zeros((max_len, d))
    pe[:, 0::2], pe[:, 1::2] = np.sin(pos / w), np.cos(pos / w)
    return pe
''',
    # RoPE's default base written wrong (1000): every property of a rotation holds.
    "rope_base_1000": '''
def rope_cache(seq_len, d, base=1000.0):
    if d % 2:
        raise ValueError("d must be even")
    inv = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.arange(seq_len, dtype=torch.float64)[:, None] * inv[None, :]
    return ang.cos().float(), ang.sin().float()
''',
}


# One question's garbage on top of the reference (issue #40 Done-when 2): question -> code that replaces its functions.
GARBAGE_ON_REFERENCE: dict[str, str] = {
    "q1_equivariance": '''
def self_attention(X, W_q, W_k, W_v, causal=False):
    V = X @ W_v
    if causal:
        return torch.cumsum(V, dim=-2) / torch.arange(1, V.shape[-2] + 1, dtype=V.dtype)[:, None]
    return torch.tanh(V) + V.mean(dim=-2, keepdim=True)
''',
    "q4_learned_pe": '''
class LearnedPE(nn.Module):
    def __init__(self, max_len, d_model):
        super().__init__()
        self.max_len = max_len
        self.table = nn.Embedding(max_len, d_model)

    def forward(self, x):
        T = x.shape[1]
        if T > self.max_len:
            raise ValueError(f"sequence length {T} is longer than max_len={self.max_len}")
        return x * 1.5 + 0.01 * self.table.weight[:T].cumsum(0)
''',
    "q6_rope_attention": '''
def rope_attention(q, k, v, causal=True):
    return torch.cumsum(torch.tanh(q + k) * v, dim=-2)
''',
    "q7_alibi": '''
def alibi_slopes(num_heads):
    return torch.arange(1, num_heads + 1, dtype=torch.float32) ** 2 / 100

def alibi_bias(num_heads, seq_len):
    j = torch.arange(seq_len, dtype=torch.float32)
    return -torch.tanh(alibi_slopes(num_heads)[:, None, None] * (j[None, :, None] + j[None, None, :]))

def alibi_attention(q, k, v):
    return torch.cumsum(v, dim=-2) / torch.arange(1, v.shape[-2] + 1, dtype=v.dtype)[:, None]
''',
    "m1_tinycharlm": LM_CLASS + '''
    def forward(self, X):
        H = self.token_emb(X)
        H = torch.cumsum(H, dim=1) / torch.arange(1, X.shape[1] + 1, dtype=H.dtype)[None, :, None]
        return F.linear(H, self.token_emb.weight)
''',
}
