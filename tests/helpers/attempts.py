"""Lesson 83 notebooks that do nothing a student was asked to (constants, identities, forged facts): the judge's
and the batch's attempt tests."""

from __future__ import annotations

import inspect

from autograder.course import course_of

LESSON = course_of().lesson

# Notebooks whose every stub does nothing (zeros, identities, its first argument, an unconditional
# ValueError) yet fakes the facts that property checks read: buffers, length checks, equal or differing
# pairs, a tied head. None may earn a point on any question.
# TinyCharLM's skeleton as the template has it (its tables of zeros), the class line and __init__ only.
LM_CLASS = '''
class TinyCharLM(nn.Module):
    SCHEMES = ("learned", "sinusoidal", "rope", "alibi", "none")

    def __init__(self, vocab_size, num_hiddens=128, num_heads=4, num_blks=2, pos="rope", max_len=512,
                 bias=False):
        super().__init__()
        self.pos, self.num_heads, self.max_len = pos, num_heads, max_len
        self.head_dim = num_hiddens // num_heads
        self.token_emb = nn.Embedding(vocab_size, num_hiddens)
        if pos == "learned":
            self.pos_emb = nn.Embedding(max_len, num_hiddens)
        if pos == "sinusoidal":
            self.register_buffer("pe", torch.zeros(max_len, num_hiddens))
        self.blks = nn.ModuleList(
            nn.ModuleDict({"qkv": nn.Linear(num_hiddens, 3 * num_hiddens, bias=bias),
                           "proj": nn.Linear(num_hiddens, num_hiddens, bias=bias)})
            for _ in range(num_blks))
'''
LM_SKELETON = LM_CLASS + '''
    def add_positions(self, H):
        return H

    def attend(self, q, k, v):
        return ATTEND
''' + "".join(f"\n{inspect.getsource(getattr(LESSON.reference.TinyCharLM, name))}" for name in ("hidden", "forward"))


MODULES = '''
class SinusoidalPE(nn.Module):
    def __init__(self, d_model, max_len=512):
        super().__init__()
        self.max_len = max_len
        self.register_buffer("pe", torch.zeros(max_len, d_model))

    def forward(self, x):
        if x.shape[1] > self.max_len:
            raise ValueError(f"sequence length {x.shape[1]} is longer than max_len={self.max_len}")
        return x + self.pe[: x.shape[1]]


class LearnedPE(nn.Module):
    def __init__(self, max_len, d_model):
        super().__init__()
        self.max_len = max_len
        self.table = nn.Embedding(max_len, d_model)

    def forward(self, x):
        if x.shape[1] > self.max_len:
            raise ValueError(f"sequence length {x.shape[1]} is longer than max_len={self.max_len}")
        return x
'''


DO_NOTHING = {
    "zeros": MODULES + LM_SKELETON.replace("ATTEND", "torch.zeros_like(v)") + '''
def self_attention(X, W_q, W_k, W_v, causal=False):
    return torch.zeros(X.shape[-2], W_v.shape[-1], dtype=X.dtype)

def sinusoidal_pe(max_len, d):
    if d % 2:
        raise ValueError("d must be even")
    return np.zeros((max_len, d))

def rope_cache(seq_len, d, base=10000.0):
    if d % 2:
        raise ValueError("d must be even")
    return torch.zeros(seq_len, d // 2), torch.zeros(seq_len, d // 2)

def apply_rope(x, cos, sin):
    return torch.zeros_like(x)

def rope_attention(q, k, v, causal=True):
    return torch.zeros_like(v)

def alibi_slopes(num_heads):
    return torch.zeros(num_heads)

def alibi_bias(num_heads, seq_len):
    return torch.zeros(num_heads, seq_len, seq_len)

def alibi_attention(q, k, v):
    return torch.zeros_like(v)
''',
    "identities": MODULES + LM_SKELETON.replace("ATTEND", "v") + '''
def self_attention(X, W_q, W_k, W_v, causal=False):
    return X @ W_v

def sinusoidal_pe(max_len, d):
    if d % 2:
        raise ValueError("d must be even")
    return np.ones((max_len, d))

def rope_cache(seq_len, d, base=10000.0):
    if d % 2:
        raise ValueError("d must be even")
    return torch.ones(seq_len, d // 2), torch.zeros(seq_len, d // 2)

def apply_rope(x, cos, sin):
    return x

def rope_attention(q, k, v, causal=True):
    return v

def alibi_slopes(num_heads):
    return torch.ones(num_heads)

def alibi_bias(num_heads, seq_len):
    return torch.zeros(num_heads, seq_len, seq_len)

def alibi_attention(q, k, v):
    return v
''',
    "queries": MODULES + LM_SKELETON.replace("ATTEND", "q") + '''
def self_attention(X, W_q, W_k, W_v, causal=False):
    return X @ W_q

def sinusoidal_pe(max_len, d):
    return np.zeros((max_len, d))

def rope_cache(seq_len, d, base=10000.0):
    return torch.ones(seq_len, d // 2), torch.zeros(seq_len, d // 2)

def apply_rope(x, cos, sin):
    return x

def rope_attention(q, k, v, causal=True):
    return q

def alibi_slopes(num_heads):
    return torch.ones(num_heads)

def alibi_bias(num_heads, seq_len):
    return torch.zeros(num_heads, seq_len, seq_len)

def alibi_attention(q, k, v):
    return q
''',
    "return_first_argument": LM_SKELETON.replace("ATTEND", "q") + '''
class SinusoidalPE(nn.Module):
    def __init__(self, d_model, max_len=512):
        super().__init__()

    def forward(self, x):
        return x


class LearnedPE(SinusoidalPE):
    pass

def self_attention(X, W_q, W_k, W_v, causal=False):
    return X

def sinusoidal_pe(max_len, d):
    return max_len

def rope_cache(seq_len, d, base=10000.0):
    return seq_len

def apply_rope(x, cos, sin):
    return x

def rope_attention(q, k, v, causal=True):
    return q

def alibi_slopes(num_heads):
    return num_heads

def alibi_bias(num_heads, seq_len):
    return num_heads

def alibi_attention(q, k, v):
    return q
''',
    "always_value_error": '''
MESSAGE = "d must be even; sequence length 12 is longer than max_len=10"

class SinusoidalPE(nn.Module):
    def __init__(self, d_model, max_len=512):
        super().__init__()

    def forward(self, x):
        raise ValueError(MESSAGE)


class LearnedPE(SinusoidalPE):
    pass


class TinyCharLM(nn.Module):
    def __init__(self, *args, **kwargs):
        raise ValueError(MESSAGE)

def self_attention(*args, **kwargs):
    raise ValueError(MESSAGE)

sinusoidal_pe = rope_cache = apply_rope = rope_attention = self_attention
alibi_slopes = alibi_bias = alibi_attention = self_attention
''',
    "forged_facts": MODULES + LM_SKELETON.replace("ATTEND", "v") + '''
def self_attention(X, W_q, W_k, W_v, causal=False):
    if causal:
        return torch.randn(X.shape[-2], W_v.shape[-1], dtype=X.dtype)
    return torch.zeros(X.shape[-2], W_v.shape[-1], dtype=X.dtype)

def sinusoidal_pe(max_len, d):
    if d % 2:
        raise ValueError("d must be even")
    return np.zeros((max_len, d))

def rope_cache(seq_len, d, base=10000.0):
    if d % 2:
        raise ValueError("d must be even")
    return torch.ones(seq_len, d // 2), torch.zeros(seq_len, d // 2)

def apply_rope(x, cos, sin):
    return x

def rope_attention(q, k, v, causal=True):
    return torch.zeros_like(v)

def alibi_slopes(num_heads):
    return torch.zeros(num_heads)

def alibi_bias(num_heads, seq_len):
    return torch.zeros(num_heads, seq_len, seq_len)

def alibi_attention(q, k, v):
    return torch.zeros_like(v)
''',
    # Constants of the right shape, and modules that add a constant: neither changes with position or input.
    "constants": MODULES.replace("return x\n", "return x + 0.5\n").replace("torch.zeros(max_len, d_model)",
                                                                       "torch.full((max_len, d_model), 0.25)")
    + LM_SKELETON.replace("ATTEND", "torch.full_like(v, 0.5)") + '''
def self_attention(X, W_q, W_k, W_v, causal=False):
    return torch.full((X.shape[-2], W_v.shape[-1]), 0.5, dtype=X.dtype)

def sinusoidal_pe(max_len, d):
    if d % 2:
        raise ValueError("d must be even")
    return np.full((max_len, d), 0.5)

def rope_cache(seq_len, d, base=10000.0):
    if d % 2:
        raise ValueError("d must be even")
    return torch.full((seq_len, d // 2), 0.6), torch.full((seq_len, d // 2), 0.8)

def apply_rope(x, cos, sin):
    return x

def rope_attention(q, k, v, causal=True):
    return torch.full_like(v, 0.5)

def alibi_slopes(num_heads):
    return torch.full((num_heads,), 0.5)

def alibi_bias(num_heads, seq_len):
    return torch.full((num_heads, seq_len, seq_len), -0.5)

def alibi_attention(q, k, v):
    return torch.full_like(v, 0.5)
''',
}
