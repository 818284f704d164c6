"""Correct alternative implementations, written differently from the reference, that must keep full marks."""

CORRECT_VARIANTS: dict[str, str] = {
    "loops_and_math": '''
def sinusoidal_pe(max_len, d):
    if d % 2 != 0:
        raise ValueError("d must be even")
    pe = np.zeros((max_len, d))
    for pos in range(max_len):
        for i in range(d // 2):
            w = 10000 ** (2 * i / d)
            pe[pos, 2 * i] = math.sin(pos / w)
            pe[pos, 2 * i + 1] = math.cos(pos / w)
    return pe
''',
    "exp_log_float32_module": '''
class SinusoidalPE(nn.Module):
    def __init__(self, d_model, max_len=512):
        super().__init__()
        self.max_len = max_len
        pe = torch.zeros(max_len, d_model)
        pos = torch.arange(max_len).float().unsqueeze(1)
        div = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
        pe[:, 0::2] = torch.sin(pos * div)
        pe[:, 1::2] = torch.cos(pos * div)
        self.register_buffer("pe", pe)

    def forward(self, x):
        if x.size(1) > self.max_len:
            raise ValueError(f"got {x.size(1)} positions but max_len is {self.max_len}")
        return x + self.pe[: x.size(1)].unsqueeze(0)
''',
    "batch_axis_buffer_module": '''
class SinusoidalPE(nn.Module):
    def __init__(self, d_model, max_len=512):
        super().__init__()
        self.max_len = max_len
        pe = torch.tensor(sinusoidal_pe(max_len, d_model), dtype=torch.float32)
        self.register_buffer("pe", pe.unsqueeze(0))  # (1, max_len, d_model)

    def forward(self, x):
        if x.size(1) > self.max_len:
            raise ValueError(f"length {x.size(1)} is longer than max_len={self.max_len}")
        return x + self.pe[:, : x.size(1)]
''',
    "seq_first_buffer_module": '''
class SinusoidalPE(nn.Module):
    def __init__(self, d_model, max_len=512):
        super().__init__()
        position = torch.arange(max_len).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(max_len, 1, d_model)
        pe[:, 0, 0::2] = torch.sin(position * div_term)
        pe[:, 0, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe)  # (max_len, 1, d_model), as in the PyTorch tutorial

    def forward(self, x):
        if x.size(1) > self.pe.size(0):
            raise ValueError(f"sequence of {x.size(1)} > max_len {self.pe.size(0)}")
        return x + self.pe[: x.size(1)].transpose(0, 1)
''',
    "einsum_attention": '''
def self_attention(X, W_q, W_k, W_v, causal=False):
    q, k, v = X @ W_q, X @ W_k, X @ W_v
    s = torch.einsum("id,jd->ij", q, k) / q.shape[-1] ** 0.5
    if causal:
        s = s + torch.triu(torch.full_like(s, float("-inf")), diagonal=1)
    return torch.einsum("ij,jd->id", s.softmax(-1), v)
''',
    "rope_numpy_inside": '''
def rope_cache(seq_len, d, base=10000.0):
    if d % 2:
        raise ValueError("d must be even")
    ang = np.outer(np.arange(seq_len), base ** (-np.arange(0, d, 2) / d))
    return torch.from_numpy(np.cos(ang)).float(), torch.from_numpy(np.sin(ang)).float()

def apply_rope(x, cos, sin):
    h = x.shape[-1] // 2
    rot = torch.cat([-x[..., h:], x[..., :h]], dim=-1)
    return x * torch.cat([cos, cos], -1) + rot * torch.cat([sin, sin], -1)
''',
    "alibi_loops": '''
def alibi_slopes(num_heads):
    return torch.tensor([2 ** (-8 * h / num_heads) for h in range(1, num_heads + 1)])

def alibi_bias(num_heads, seq_len):
    j = torch.arange(seq_len)
    return alibi_slopes(num_heads).view(-1, 1, 1) * (j.view(1, -1) - j.view(-1, 1))
''',
    "learned_parameter_lookup": '''
class LearnedPE(nn.Module):
    def __init__(self, max_len, d_model):
        super().__init__()
        self.max_len, self.pos = max_len, nn.Embedding(max_len, d_model)

    def forward(self, x):
        if x.shape[1] > self.max_len:
            raise ValueError(f"length {x.shape[1]} exceeds max_len {self.max_len}")
        return x + self.pos.weight[: x.shape[1]]
''',
    "float64_module_table": '''
class SinusoidalPE(nn.Module):
    def __init__(self, d_model, max_len=512):
        super().__init__()
        self.register_buffer("pe", torch.from_numpy(sinusoidal_pe(max_len, d_model)))

    def forward(self, x):
        if x.shape[1] > self.pe.shape[0]:
            raise ValueError(f"T={x.shape[1]} > max_len={self.pe.shape[0]}")
        return x + self.pe[: x.shape[1]].to(x.dtype)
''',
    "torch_inside_sinusoidal": '''
def sinusoidal_pe(max_len, d):
    if d % 2 == 1:
        raise ValueError(f"d must be even, got {d}")
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]
    inv = torch.exp(-math.log(10000.0) * torch.arange(0, d, 2, dtype=torch.float64) / d)
    pe = torch.stack([torch.sin(pos * inv), torch.cos(pos * inv)], dim=-1).reshape(max_len, d)
    return pe.numpy()
''',
    "rope_inverse_frequency_explicit_base": '''
def rope_cache(seq_len, d, base=10000.0):
    if d % 2:
        raise ValueError("RoPE needs an even d")
    inv_freq = 1.0 / (base ** (torch.arange(0, d, 2).double() / d))
    t = torch.arange(seq_len).double()
    freqs = t[:, None] * inv_freq[None, :]
    return freqs.cos().float(), freqs.sin().float()

def rope_attention(q, k, v, causal=True):
    cos, sin = (t.to(q.device) for t in rope_cache(q.shape[-2], q.shape[-1], base=10000.0))
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
''',
    "alibi_einsum_float64": '''
def alibi_attention(q, k, v):
    H, T, d = q.shape[-3:]
    s = torch.einsum("...id,...jd->...ij", q.double(), k.double()) / math.sqrt(d)
    s = s + alibi_bias(H, T).to(q.device).double()
    s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool, device=q.device), 1), float("-inf"))
    return (s.softmax(-1) @ v.double()).to(q.dtype)
''',
    "lm_explicit_softmax": '''
class TinyCharLM(TinyCharLM):
    def attend(self, q, k, v):
        T, d = q.shape[-2], q.shape[-1]
        if self.pos == "rope":
            cos, sin = (t.to(q.device) for t in rope_cache(T, d))
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        scores = q @ k.transpose(-2, -1) / math.sqrt(d)
        if self.pos == "alibi":
            scores = scores + alibi_bias(self.num_heads, T).to(q.device)
        future = torch.triu(torch.ones(T, T, dtype=torch.bool, device=q.device), diagonal=1)
        return torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1) @ v
''',
    "lm_lookup_positions_and_additive_mask": '''
class TinyCharLM(TinyCharLM):
    def add_positions(self, H):
        T = H.shape[1]
        if self.pos == "learned":
            return H + self.pos_emb(torch.arange(T, device=H.device))
        if self.pos == "sinusoidal":
            return H + self.pe[:T].unsqueeze(0)
        return H

    def attend(self, q, k, v):
        if self.pos != "alibi":
            return super().attend(q, k, v)
        T = q.shape[-2]
        causal = torch.zeros(T, T, device=q.device).masked_fill(
            torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
        bias = alibi_bias(self.num_heads, T).to(q.device)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias + causal)
''',
}
