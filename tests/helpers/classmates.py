"""A class of honest notebooks for the similarity report, and copies of them in disguise.

`honest(seed)` writes one student's code cells for the positional-encoding lesson's functions (attention, the
sinusoidal table and module, the learned table, the rotary cache, rotation and attention, the linear-bias slopes,
bias and attention): each function in one of several genuinely different implementations (the sinusoidal table by
loops, broadcasting, exp-log or pow; the rotation by halves, rotate_half, complex numbers or interleaved pairs;
...), written with the student's own habits (how they build a column, a square root, a transpose, a softmax, a
causal mask, an even-`d` check, `@` or `torch.matmul`, intermediate names or one expression, helpers of their own,
comments). `disguise(cells, kinds, rng)` copies a notebook the ways a copier does: RENAME, REORDER, COMMENTS,
INLINE (a one-line helper's body written at its calls), DEAD (unused code added) and MATMUL (`@` <-> matmul).
TEMPLATE is the template's code cells (stubs with their docstrings), which the report leaves out."""

from __future__ import annotations

import ast
import io
import itertools
import keyword
import random
import re
import tokenize
from dataclasses import dataclass

IMPORTS = "import math\n\nimport numpy as np\nimport torch\nfrom torch import nn"
RENAME, REORDER, COMMENTS, INLINE, DEAD, MATMUL = "rename", "reorder", "comments", "inline", "dead", "matmul"
KINDS = (RENAME, REORDER, COMMENTS, INLINE, DEAD, MATMUL)
# Every disguise alone and every two together.
DISGUISES: list[tuple[str, ...]] = [(k,) for k in KINDS] + list(itertools.combinations(KINDS, 2))

DOCS = {
    "self_attention": ("self_attention(X, W_q, W_k, W_v, causal=False)",
                       "One head of scaled dot-product self-attention with no positional information."),
    "sinusoidal_pe": ("sinusoidal_pe(max_len, d)", "Sinusoidal table as a float64 numpy array of shape (max_len, d)."),
    "rope_cache": ("rope_cache(seq_len, d, base=10000.0)",
                   "Return (cos, sin), each of shape (seq_len, d // 2), for angles pos * base**(-2i/d)."),
    "apply_rope": ("apply_rope(x, cos, sin)", "Rotate x of shape (..., seq_len, d) in the half-split convention."),
    "rope_attention": ("rope_attention(q, k, v, causal=True)",
                       "Attention for q, k, v of shape (..., T, d) with RoPE on q and k only (never on v)."),
    "alibi_slopes": ("alibi_slopes(num_heads)",
                     "Head slopes 2**(-8h/H) for h = 1..H, as a float tensor of shape (H,)."),
    "alibi_bias": ("alibi_bias(num_heads, seq_len)", "Bias of shape (H, T, T) with bias[h, i, j] = slope_h * (j - i)."),
    "alibi_attention": ("alibi_attention(q, k, v)", "Causal attention with the ALiBi bias added to the scaled scores."),
}
SIN_DOC = "Adds the fixed sinusoidal table to x of shape (B, T, d_model); the table is a buffer named pe."
LEARNED_DOC = "Adds a learned position vector (one nn.Embedding row per position) to x of shape (B, T, d_model)."


def _stub(name: str) -> str:
    sig, doc = DOCS[name]
    return f'def {sig}:\n    """{doc}"""\n    ...\n'


def _class_stub(name: str, doc: str, init: str) -> str:
    return (f'class {name}(nn.Module):\n    """{doc}"""\n\n    def __init__(self, {init}):\n'
            f'        super().__init__()\n        ...\n\n    def forward(self, x):\n        ...\n')


TEMPLATE = [IMPORTS, _stub("self_attention"), _stub("sinusoidal_pe"),
            _class_stub("SinusoidalPE", SIN_DOC, "d_model, max_len=512"),
            _class_stub("LearnedPE", LEARNED_DOC, "max_len, d_model"),
            _stub("rope_cache") + "\n\n" + _stub("apply_rope"), _stub("rope_attention"),
            _stub("alibi_slopes") + "\n\n" + _stub("alibi_bias") + "\n\n" + _stub("alibi_attention")]

COMMENT_WORDS = ["shape check", "as in the lecture", "scale the scores", "positions as a column", "see the formula",
                 "TODO tidy", "careful with the dims", "this took a while", "mask the future", "broadcast here",
                 "pairs of columns", "works for batches too", "from the handout", "double-check", "float64 first"]


@dataclass
class Habits:
    """How one student writes: the same choices in every function they write."""

    rng: random.Random
    col: str  # a vector as a column: {v} is the vector
    row: str
    sqrt: str  # the square root of {d}
    tr: str  # the last two axes of {k} swapped
    softmax: str  # softmax of {s} over the last axis
    mask: str  # the (T, T) boolean mask of future positions, {T} and {dev}
    fill: str  # {s} with {m}'s positions set to -inf
    odd: str  # the even-d check: a condition on {d}
    mm: str  # "@" or "matmul"
    named: bool  # intermediate names rather than one expression
    helpers: bool  # one-line helpers of their own
    comments: float  # the share of lines with a comment
    f64: str  # a float64 dtype argument, or ""
    even: str  # the even column indices 0, 2, ..., d-2 of {d}
    err: str  # how the even-d check raises

    def c(self, line: str) -> str:
        """`line`, with a comment of the student's at its end now and then."""
        if self.rng.random() < self.comments and not line.rstrip().endswith(":"):
            return f"{line}  # {self.rng.choice(COMMENT_WORDS)}"
        return line

    def matmul(self, a: str, b: str) -> str:
        return f"{a} @ {b}" if self.mm == "@" else f"torch.matmul({a}, {b})"


def habits(rng: random.Random) -> Habits:
    pick = rng.choice
    return Habits(
        rng=rng,
        col=pick(["{v}[:, None]", "{v}.unsqueeze(1)", "{v}.unsqueeze(-1)", "{v}.view(-1, 1)", "{v}.reshape(-1, 1)"]),
        row=pick(["{v}[None, :]", "{v}.unsqueeze(0)", "{v}.view(1, -1)", "{v}[None]"]),
        sqrt=pick(["math.sqrt({d})", "{d} ** 0.5", "np.sqrt({d})", "float({d}) ** 0.5"]),
        tr=pick(["{k}.transpose(-2, -1)", "{k}.transpose(-1, -2)", "{k}.mT", "{k}.swapaxes(-1, -2)"]),
        softmax=pick(["torch.softmax({s}, dim=-1)", "{s}.softmax(dim=-1)", "{s}.softmax(-1)",
                      "torch.nn.functional.softmax({s}, dim=-1)",
                      "torch.exp({s}) / torch.exp({s}).sum(-1, keepdim=True)"]),
        mask=pick(["torch.ones({T}, {T}, dtype=torch.bool, device={dev}).triu(1)",
                   "torch.triu(torch.ones({T}, {T}, device={dev}), diagonal=1).bool()",
                   "~torch.tril(torch.ones({T}, {T}, dtype=torch.bool, device={dev}))",
                   "torch.arange({T}, device={dev})[None, :] > torch.arange({T}, device={dev})[:, None]"]),
        fill=pick(["{s}.masked_fill({m}, float('-inf'))", "torch.where({m}, float('-inf'), {s})",
                   "{s}.masked_fill({m}, -float('inf'))", "{s} + torch.zeros_like({s}).masked_fill({m}, -math.inf)"]),
        odd=pick(["{d} % 2", "{d} % 2 != 0", "{d} % 2 == 1", "{d} & 1", "not {d} % 2 == 0"]),
        mm=pick(["@", "@", "matmul"]),
        named=rng.random() < 0.5,
        helpers=rng.random() < 0.4,
        comments=pick([0.0, 0.1, 0.25, 0.4]),
        f64=pick(["", ", dtype=np.float64", ", dtype=float"]),
        even=pick(["np.arange(0, {d}, 2)", "2 * np.arange({d} // 2)", "np.arange({d} // 2) * 2"]),
        err=pick(['raise ValueError("d must be even")', 'raise ValueError(f"odd d={d}")',
                  'raise ValueError("sin/cos need an even dimension")', "raise ValueError(d)"]),
    )


# Equivalent ways of writing one thing: each student has some of these habits, in every function they write.
REWRITES = [
    (r"float\('-inf'\)", "-math.inf"), (r"float\('-inf'\)", "-torch.inf"), (r"dim=(-?\d)\)", r"\1)"),
    (r"\.shape\[(-?\d)\]", r".size(\1)"), (r"torch\.cat\(", "torch.concat("), (r"\b0::2\]", "::2]"),
    (r"np\.zeros\(\((\w+), (\w+)\)", r"np.zeros([\1, \2]"), (r"\.float\(\)", ".to(torch.float32)"),
    (r"\btorch\.(sin|cos|exp)\((\w+)\)", r"\2.\1()"), (r"\bmath\.log\(", "np.log("),
    (r"\b10000\.0\b", "10000"), (r"\b10000\b(?!\.)", "1e4"), (r"\bX\.shape\[0\]", "len(X)"),
    (r"^(\s*)return (?!.*,)(.+)$", r"\1result = \2\n\1return result"),
    (r"(\w+) \* (cos|sin)\b", r"\2 * \1"), (r"\bfor (\w+) in range\((\w+)\):", r"for \1 in range(0, \2):"),
    (r"^(\s*)(\w+) = (.+)\.masked_fill\((\w+), ", r"\1\2 = \3.masked_fill(\4.bool(), "),
    (r"\bq\.device\b", "k.device"),
    (r"\.unsqueeze\(0\)", "[None]"), (r"\bnp\.arange\((\w+)\)", r"np.arange(0, \1)"),
    (r"\bassert (.+), '.*'$", r"assert \1"), (r"\.reshape\(", ".view("),
]


def rewrites(rng: random.Random) -> list[tuple[str, str]]:
    """One student's writing habits: about a third of REWRITES."""
    return [r for r in REWRITES if rng.random() < 0.35]


def _f(template: str, **kw: str) -> str:
    return template.format(**kw)


def _check(h: Habits, d: str = "d") -> list[str]:
    return [f"if {_f(h.odd, d=d)}:", "    " + h.err]


# --- one function each: several implementations, written with the student's habits ---------------------------------

def attention(h: Habits, rng: random.Random, *, q: str, k: str, v: str, d: str, T: str, causal: str | None,
              bias: str | None = None) -> list[str]:
    """The lines of scaled dot-product attention (scores, optional bias and causal mask, softmax, weighted sum)."""
    style = rng.randrange(3)
    scale = _f(h.sqrt, d=d)
    kt = _f(h.tr, k=k)
    lines = []
    if style == 0:
        lines.append(f"scores = {h.matmul(q, kt)} / {scale}")
    elif style == 1:
        lines.append(f"scores = {h.matmul(q + ' / ' + scale, kt)}")
    else:
        lines.append(f"scores = torch.einsum('...id,...jd->...ij', {q}, {k}) * ({scale}) ** -1")
    if bias:
        lines.append(f"scores = scores + {bias}")
    mask_lines = [f"mask = {_f(h.mask, T=T, dev=q + '.device')}", f"scores = {_f(h.fill, s='scores', m='mask')}"]
    if causal == "always":
        lines += mask_lines
    elif causal:
        lines += [f"if {causal}:", *("    " + m for m in mask_lines)]
    if h.named:
        lines.append(f"weights = {_f(h.softmax, s='scores')}")
        lines.append(f"return {h.matmul('weights', v)}")
    else:
        lines.append(f"return {h.matmul(_f(h.softmax, s='scores'), v)}")
    return lines


def self_attention(h: Habits, rng: random.Random) -> list[str]:
    if rng.random() < 0.5:
        head = [f"Q = {h.matmul('X', 'W_q')}", f"K = {h.matmul('X', 'W_k')}", f"V = {h.matmul('X', 'W_v')}"]
    else:
        head = [f"Q, K, V = {h.matmul('X', 'W_q')}, {h.matmul('X', 'W_k')}, {h.matmul('X', 'W_v')}"]
    if rng.random() < 0.4:
        head.append("T, d_k = Q.shape")
        return head + attention(h, rng, q="Q", k="K", v="V", d="d_k", T="T", causal="causal")
    return head + ["n = X.shape[0]"] + attention(h, rng, q="Q", k="K", v="V", d="Q.shape[-1]", T="n",
                                                    causal="causal")


def sinusoidal_pe(h: Habits, rng: random.Random) -> list[str]:
    lines = _check(h) if rng.random() < 0.9 else ["assert d % 2 == 0, 'd must be even'"]
    style = rng.randrange(5)
    if style == 0:  # loops and math
        lines += [f"pe = np.zeros((max_len, d){h.f64})", "for pos in range(max_len):",
                  "    for i in range(0, d, 2):", "        angle = pos / (10000 ** (i / d))",
                  "        pe[pos, i] = math.sin(angle)", "        pe[pos, i + 1] = math.cos(angle)", "return pe"]
    elif style == 1:  # broadcasting with pow
        pos = _f(h.col, v=f"np.arange(max_len{h.f64})")
        lines += [f"pos = {pos}", f"denom = 10000.0 ** ({_f(h.even, d='d')} / d)",
                  f"pe = np.zeros((max_len, d){h.f64})", "pe[:, 0::2] = np.sin(pos / denom)",
                  "pe[:, 1::2] = np.cos(pos / denom)", "return pe"]
    elif style == 2:  # exp-log
        lines += [f"position = np.arange(max_len){'.astype(np.float64)' if rng.random() < 0.5 else ''}",
                  f"div_term = np.exp({_f(h.even, d='d')} * (-math.log(10000.0) / d))",
                  "angles = np.outer(position, div_term)", "table = np.empty((max_len, d))",
                  "table[:, ::2] = np.sin(angles)", "table[:, 1::2] = np.cos(angles)", "return table"]
    elif style == 3:  # stacked then interleaved by reshape
        lines += ["i = np.arange(d // 2)", "freqs = 1.0 / np.power(10000, 2 * i / d)",
                  f"ang = {_f(h.col, v='np.arange(max_len)')} * {_f(h.row, v='freqs')}",
                  "return np.stack([np.sin(ang), np.cos(ang)], axis=-1).reshape(max_len, d)"]
    else:  # one row at a time
        lines += ["rows = []", "for p in range(max_len):", "    row = []", "    for j in range(d // 2):",
                  "        w = p * 10000 ** (-2 * j / d)", "        row += [math.sin(w), math.cos(w)]",
                  "    rows.append(row)", "return np.array(rows, dtype=np.float64)"]
    return lines


def sinusoidal_module(h: Habits, rng: random.Random) -> tuple[list[str], list[str]]:
    style = rng.randrange(3)
    if style == 0:
        init = ["self.max_len = max_len",
                "self.register_buffer('pe', torch.tensor(sinusoidal_pe(max_len, d_model), dtype=torch.float32))"]
    elif style == 1:
        init = ["self.max_len = max_len", "table = torch.from_numpy(sinusoidal_pe(max_len, d_model)).float()",
                "self.register_buffer(\"pe\", table)"]
    else:
        init = ["self.max_len = max_len", "pe = torch.zeros(max_len, d_model)",
                f"pos = {_f(h.col, v='torch.arange(max_len, dtype=torch.float32)')}",
                "div = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))",
                "pe[:, 0::2] = torch.sin(pos * div)", "pe[:, 1::2] = torch.cos(pos * div)",
                "self.register_buffer('pe', pe)"]
    n = rng.choice(["x.shape[1]", "x.size(1)", "x.shape[-2]"])
    if rng.random() < 0.5:
        fwd = [f"T = {n}", "if T > self.max_len:", "    raise ValueError('sequence too long')",
               "return x + self.pe[:T]"]
    else:
        fwd = [f"if {n} > self.max_len:", "    raise ValueError(f'length {" + n + "} > max_len')",
               f"return x + self.pe[:{n}].unsqueeze(0)"]
    return init, fwd


def learned_module(h: Habits, rng: random.Random) -> tuple[list[str], list[str]]:
    name = rng.choice(["table", "emb", "pos_table", "position_embeddings"])
    init = ["self.max_len = max_len", f"self.{name} = nn.Embedding(max_len, d_model)"]
    init.append(rng.choice([f"nn.init.normal_(self.{name}.weight, std=0.02)",
                            f"nn.init.normal_(self.{name}.weight, mean=0.0, std=0.02)",
                            f"torch.nn.init.normal_(self.{name}.weight, 0, 0.02)"]))
    style = rng.randrange(3)
    T = rng.choice(["x.shape[1]", "x.size(1)"])
    check = [f"if {T} > self.max_len:", "    raise ValueError('too long for the table')"]
    if style == 0:
        fwd = [*check, f"idx = torch.arange({T}, device=x.device)", f"return x + self.{name}(idx)"]
    elif style == 1:
        fwd = [*check, f"return x + self.{name}.weight[:{T}]"]
    else:
        fwd = ["B, T, _ = x.shape", "if T > self.max_len:", "    raise ValueError('T too large')",
               "positions = torch.arange(T, device=x.device).unsqueeze(0).expand(B, T)",
               f"return x + self.{name}(positions)"]
    return init, fwd


def rope_cache(h: Habits, rng: random.Random) -> list[str]:
    lines = _check(h)
    style = rng.randrange(4)
    if style == 0:
        lines += ["theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)",
                  "angles = torch.outer(torch.arange(seq_len, dtype=torch.float64), theta)",
                  "return torch.cos(angles).float(), torch.sin(angles).float()"]
    elif style == 1:
        lines += ["inv_freq = 1.0 / (base ** (torch.arange(0, d, 2).float() / d))",
                  "t = torch.arange(seq_len).float()",
                  f"freqs = {_f(h.col, v='t')} * {_f(h.row, v='inv_freq')}", "return freqs.cos(), freqs.sin()"]
    elif style == 2:
        lines += ["cos = torch.empty(seq_len, d // 2)", "sin = torch.empty(seq_len, d // 2)",
                  "for p in range(seq_len):", "    for i in range(d // 2):",
                  "        a = p * base ** (-2 * i / d)", "        cos[p, i] = math.cos(a)",
                  "        sin[p, i] = math.sin(a)",
                  "return cos, sin"]
    else:
        lines += ["exps = torch.arange(d // 2, dtype=torch.float64) * 2 / d",
                  "ang = torch.arange(seq_len, dtype=torch.float64)[:, None] * torch.exp(-exps * math.log(base))",
                  "return ang.cos().to(torch.float32), ang.sin().to(torch.float32)"]
    return lines


def apply_rope(h: Habits, rng: random.Random) -> list[str]:
    style = rng.randrange(4)
    if style == 0:  # halves
        return ["half = x.shape[-1] // 2", "x1, x2 = x[..., :half], x[..., half:]",
                "return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)"]
    if style == 1:  # rotate_half
        return ["h = x.shape[-1] // 2", "rotated = torch.cat((-x[..., h:], x[..., :h]), dim=-1)",
                "c = torch.cat((cos, cos), dim=-1)", "s = torch.cat((sin, sin), dim=-1)", "return x * c + rotated * s"]
    if style == 2:  # complex numbers
        return ["d = x.shape[-1]", "z = torch.complex(x[..., : d // 2].double(), x[..., d // 2 :].double())",
                "rot = torch.complex(cos.double(), sin.double())", "out = z * rot",
                "return torch.cat([out.real, out.imag], dim=-1).to(x.dtype)"]
    # interleaved view of the halves, rotated pair by pair
    return ["d = x.shape[-1]", "pairs = torch.stack([x[..., : d // 2], x[..., d // 2 :]], dim=-1)",
            "a, b = pairs.unbind(-1)", "first = a * cos - b * sin", "second = a * sin + b * cos",
            "return torch.cat([first, second], -1)"]


def rope_attention(h: Habits, rng: random.Random) -> list[str]:
    lines = [rng.choice(["T, d = q.shape[-2], q.shape[-1]", "*_, T, d = q.shape", "T = q.shape[-2]\nd = q.shape[-1]"])]
    lines = [x for line in lines for x in line.split("\n")]
    if rng.random() < 0.5:
        lines += ["cos, sin = rope_cache(T, d)", "cos, sin = cos.to(q.device), sin.to(q.device)"]
    else:
        lines += ["cos, sin = (t.to(q.device) for t in rope_cache(T, d))"]
    lines += ["q = apply_rope(q, cos, sin)", "k = apply_rope(k, cos, sin)"] if rng.random() < 0.5 else \
        ["q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)"]
    return lines + attention(h, rng, q="q", k="k", v="v", d="d", T="T", causal="causal")


def alibi_slopes(h: Habits, rng: random.Random) -> list[str]:
    style = rng.randrange(3)
    if style == 0:
        return ["h = torch.arange(1, num_heads + 1, dtype=torch.float64)",
                "return (2.0 ** (-8.0 * h / num_heads)).float()"]
    if style == 1:
        return ["return torch.tensor([2 ** (-8 * i / num_heads) for i in range(1, num_heads + 1)])"]
    return ["start = 2 ** (-8 / num_heads)", "return torch.tensor([start ** (i + 1) for i in range(num_heads)],"
            " dtype=torch.float32)"]


def alibi_bias(h: Habits, rng: random.Random) -> list[str]:
    style = rng.randrange(3)
    if style == 0:
        return ["pos = torch.arange(seq_len, dtype=torch.float32)", "distance = pos[None, :] - pos[:, None]",
                "return alibi_slopes(num_heads)[:, None, None] * distance"]
    if style == 1:
        return ["j = torch.arange(seq_len)", f"rel = ({_f(h.row, v='j')} - {_f(h.col, v='j')}).float()",
                "return alibi_slopes(num_heads).view(-1, 1, 1) * rel"]
    return ["slopes = alibi_slopes(num_heads)", "bias = torch.zeros(num_heads, seq_len, seq_len)",
            "for i in range(seq_len):", "    for j in range(seq_len):", "        bias[:, i, j] = slopes * (j - i)",
            "return bias"]


def alibi_attention(h: Habits, rng: random.Random) -> list[str]:
    lines = [rng.choice(["H, T, d = q.shape[-3], q.shape[-2], q.shape[-1]", "H, T, d = q.shape[-3:]"])]
    bias = "alibi_bias(H, T).to(q.device)" if rng.random() < 0.5 else \
        "alibi_bias(H, T).to(device=q.device, dtype=q.dtype)"
    return lines + attention(h, rng, q="q", k="k", v="v", d="d", T="T", causal="always", bias=bias)


# --- helpers a student may write, and the notebook -------------------------------------------------------------------

def _helper_calls(h: Habits, body: list[str]) -> tuple[list[str], list[str]]:
    """The student's one-line helpers (each returns one expression) and `body` calling them where it can."""
    found = []
    for n, line in enumerate(body):
        m = re.match(r"(\s*)mask = (.+)$", line)
        if m and "_future_mask" not in line:
            expr = m.group(2).replace("T", "n").replace("q.device", "device").replace("Q.device", "device")
            expr = expr.replace("torch.arange(n", "torch.arange(n")
            dev = "q.device" if "q.device" in line else "Q.device"
            T = "T" if "(T" in line or "T," in line else "n"
            found.append(f"def _future_mask(n, device):\n    return {expr}\n")
            body[n] = f"{m.group(1)}mask = _future_mask({T}, {dev})"
    return found[:1], body


NUMERIC = {"max_len", "d", "seq_len", "num_heads", "d_model"}
_ASSIGN = re.compile(r"^(\w+) = (.+)$")


def tweak(body: list[str], rng: random.Random, params: list[str]) -> list[str]:
    """Small choices a student makes anew in each function: a check of an argument first, the operands of a product
    swapped, the result named before it is returned, two independent lines in the other order, `.shape[i]` as
    `.size(i)`, a pair assigned on two lines."""
    body = list(body)
    if params and rng.random() < 0.3:
        p = rng.choice(params)
        body.insert(0, f"assert {p} > 0" if p in NUMERIC else rng.choice([f"assert {p} is not None",
                                                                         f"assert {p}.dim() >= 1"]))
    if rng.random() < 0.3:
        for n, line in enumerate(body):
            if "**" not in line and (m := re.search(r"\b([A-Za-z_]\w*) \* ([A-Za-z_]\w*)\b(?!\s*[\(\[.])", line)):
                body[n] = line[:m.start()] + f"{m.group(2)} * {m.group(1)}" + line[m.end():]
                break
    if rng.random() < 0.3 and body[-1].startswith("return ") and "," not in body[-1] and "result" not in body[-1]:
        body[-1:] = [f"out = {body[-1][7:]}", "return out"]
    if rng.random() < 0.3:
        for n in range(len(body) - 1):
            a, b = _ASSIGN.match(body[n]), _ASSIGN.match(body[n + 1])
            if a and b and not re.search(rf"\b{a.group(1)}\b", body[n + 1]) and not re.search(
                    rf"\b{b.group(1)}\b", body[n]):
                body[n], body[n + 1] = body[n + 1], body[n]
                break
    if rng.random() < 0.3:
        body = [re.sub(r"\.shape\[(-?\d)\]", r".size(\1)", line) for line in body]
    if rng.random() < 0.3:
        for n, line in enumerate(body):
            if m := re.match(r"^(\w+), (\w+) = ([^,()\[\]]+|\w+\([^()]*\)), ([^,()\[\]]+|\w+\([^()]*\))$", line):
                body[n:n + 1] = [f"{m.group(1)} = {m.group(3)}", f"{m.group(2)} = {m.group(4)}"]
                break
    return body


def _function(sig: str, doc: str, body: list[str], h: Habits, indent: str = "") -> str:
    lines = [f"{indent}def {sig}:", f'{indent}    """{doc}"""']
    lines += [f"{indent}    {h.c(b)}" for b in body]
    return "\n".join(lines) + "\n"


def honest(seed: int) -> list[str]:
    """One student's code cells: the template's cells with the bodies filled in their own way, in its order."""
    rng = random.Random(seed)
    h = habits(rng)
    cells = [IMPORTS + ("\nimport torch.nn.functional as F" if "F." in h.softmax else "")]
    helpers: list[str] = []

    def fn(name: str, body: list[str]) -> str:
        nonlocal helpers
        if h.helpers:
            extra, body = _helper_calls(h, body)
            helpers += [e for e in extra if e not in helpers]
        sig, doc = DOCS[name]
        params = [a.split("=")[0].strip() for a in sig[sig.index("(") + 1:-1].split(",")]
        return _function(sig, doc, tweak(body, rng, params), h)

    attn = fn("self_attention", self_attention(h, rng))
    sin = fn("sinusoidal_pe", sinusoidal_pe(h, rng))
    init, fwd = sinusoidal_module(h, rng)
    init, fwd = tweak(init, rng, ["d_model", "max_len"]), tweak(fwd, rng, ["x"])
    sin_mod = (f'class SinusoidalPE(nn.Module):\n    """{SIN_DOC}"""\n\n    def __init__(self, d_model, max_len=512):\n'
               "        super().__init__()\n" + "".join(f"        {h.c(x)}\n" for x in init) + "\n"
               "    def forward(self, x):\n" + "".join(f"        {h.c(x)}\n" for x in fwd))
    init, fwd = learned_module(h, rng)
    init, fwd = tweak(init, rng, ["d_model", "max_len"]), tweak(fwd, rng, ["x"])
    learned = (f'class LearnedPE(nn.Module):\n    """{LEARNED_DOC}"""\n\n    def __init__(self, max_len, d_model):\n'
               "        super().__init__()\n" + "".join(f"        {h.c(x)}\n" for x in init) + "\n"
               "    def forward(self, x):\n" + "".join(f"        {h.c(x)}\n" for x in fwd))
    rope = fn("rope_cache", rope_cache(h, rng)) + "\n\n" + fn("apply_rope", apply_rope(h, rng))
    rope_att = fn("rope_attention", rope_attention(h, rng))
    alibi = "\n\n".join([fn("alibi_slopes", alibi_slopes(h, rng)), fn("alibi_bias", alibi_bias(h, rng)),
                         fn("alibi_attention", alibi_attention(h, rng))])
    if helpers:
        cells.append("\n\n".join(helpers))
    cells += [attn, sin, sin_mod, learned, rope, rope_att, alibi]
    mine = rewrites(rng)
    out = [cells[0]]
    for cell in cells[1:]:
        for pattern, repl in mine:
            cell = re.sub(pattern, repl, cell, flags=re.M)
        out.append(cell)
    return out


# --- disguises ---------------------------------------------------------------------------------------------------

def _local_names(source: str) -> set[str]:
    """Names the code binds itself (assignments, loops, comprehensions, helper functions): what a copier renames.
    Parameters, the template's functions and classes, attributes and imports stay."""
    given = set(DOCS) | {"SinusoidalPE", "LearnedPE", "forward", "__init__", "self"}
    out = set()
    for cell in source.split("\0"):
        try:
            tree = ast.parse(cell)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                out.add(node.id)
            elif isinstance(node, ast.FunctionDef):
                out.add(node.name)
    return {n for n in out - given if not keyword.iskeyword(n)}


def _rename(cells: list[str], rng: random.Random) -> list[str]:
    names = _local_names("\0".join(cells))
    new = {n: f"{rng.choice(['my', 'tmp', 'val', 'res', 'out', 'z', 'aux'])}_{n.lower()}_{rng.randint(1, 99)}"
           for n in names}
    out = []
    for cell in cells:
        toks = list(tokenize.generate_tokens(io.StringIO(cell).readline))
        depth, edits = 0, []
        for n, t in enumerate(toks):
            if t.type == tokenize.OP:
                depth += t.string in "([{"
                depth -= t.string in ")]}"
            if t.type != tokenize.NAME or t.string not in new:
                continue
            before = toks[n - 1].string if n else ""
            after = toks[n + 1].string if n + 1 < len(toks) else ""
            if before == "." or (depth and after == "="):
                continue
            edits.append((t.start, t.end, new[t.string]))
        out.append(_apply(cell, edits))
    return out


def _apply(cell: str, edits: list[tuple[tuple[int, int], tuple[int, int], str]]) -> str:
    """`cell` with each (start, end) token span replaced (positions as tokenize and ast give them)."""
    lines = cell.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    for (r0, c0), (r1, c1), text in sorted(edits, reverse=True):
        a, b = offsets[r0 - 1] + c0, offsets[r1 - 1] + c1
        cell = cell[:a] + text + cell[b:]
    return cell


def _chunks(cell: str) -> list[str]:
    """A cell's top-level statements (each with the lines above it) as separate texts."""
    tree = ast.parse(cell)
    lines = cell.splitlines(keepends=True)
    starts = [min([n.lineno, *(d.lineno for d in getattr(n, "decorator_list", []))]) for n in tree.body]
    bounds = [1, *starts[1:], len(lines) + 1]
    return ["".join(lines[a - 1:b - 1]).strip("\n") + "\n" for a, b in zip(bounds, bounds[1:])]


def _reorder(cells: list[str], rng: random.Random) -> list[str]:
    head, rest = cells[0], cells[1:]
    out = []
    for cell in rest:
        parts = _chunks(cell)
        rng.shuffle(parts)
        out.append("\n\n".join(parts))
    rng.shuffle(out)
    return [head, *out]


def _comments(cells: list[str], rng: random.Random) -> list[str]:
    out = []
    for cell in cells:
        toks = list(tokenize.generate_tokens(io.StringIO(cell).readline))
        cell = _apply(cell, [(t.start, t.end, "") for t in toks if t.type == tokenize.COMMENT])
        cell = re.sub(r'"""[^"]*"""', lambda _: f'"""{rng.choice(COMMENT_WORDS).capitalize()}."""', cell)
        lines = []
        for line in cell.split("\n"):
            line = line.rstrip()
            if line.strip() and rng.random() < 0.3 and not line.strip().startswith(("def ", "class ", "@")):
                indent = line[:len(line) - len(line.lstrip())]
                lines.append(f"{indent}# {rng.choice(COMMENT_WORDS)} ({rng.randint(1, 9)})")
            lines.append(line)
        out.append("\n".join(lines))
    return out


class _Substitute(ast.NodeTransformer):
    """A helper's expression with its parameters replaced by the call's arguments."""

    def __init__(self, args: dict[str, ast.expr]) -> None:
        self.args = args

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return self.args.get(node.id, node)


def _inline(cells: list[str], rng: random.Random) -> list[str]:
    """Every one-expression helper written out at its calls, and its definition removed."""
    helpers: dict[str, tuple[list[str], ast.expr]] = {}
    for cell in cells:
        for node in ast.parse(cell).body:
            if (isinstance(node, ast.FunctionDef) and node.name.startswith("_") and len(node.body) == 1
                    and isinstance(node.body[0], ast.Return) and node.body[0].value is not None):
                helpers[node.name] = ([a.arg for a in node.args.args], node.body[0].value)
    if not helpers:
        return cells
    out = []
    for cell in cells:
        tree = ast.parse(cell)
        edits = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in helpers:
                params, expr = helpers[node.func.id]
                body = _Substitute(dict(zip(params, node.args))).visit(ast.parse(ast.unparse(expr), mode="eval").body)
                edits.append(((node.lineno, node.col_offset), (node.end_lineno, node.end_col_offset),
                              ast.unparse(body)))
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name in helpers:
                edits.append(((node.lineno, 0), (node.end_lineno + 1, 0), ""))
        cell = _apply(cell + "\n", edits).strip("\n")
        if cell.strip():
            out.append(cell + "\n")
    return out


DEAD_LINES = ["unused = None", "debug = False", "_shape_seen = []", "counter = 0", "tmp_value = 1.0 * 2"]
DEAD_FUNCTION = ("def _print_debug(t, label='tensor'):\n    print(label, tuple(t.shape), t.dtype)\n"
                 "    for i in range(2):\n        pass\n    return t\n")


def _dead(cells: list[str], rng: random.Random) -> list[str]:
    """Unused lines at the top of some functions (after their docstring), an unused function and a block that never
    runs."""
    out = []
    for cell in cells:
        new: list[str] = []
        head = ""  # the indent of a body that just opened, until its first line
        for line in cell.split("\n"):
            if head and not line.strip().startswith('"""'):
                new.append(f"{head}{rng.choice(DEAD_LINES)}")
                head = ""
            new.append(line)
            if head and line.strip().startswith('"""'):
                new.append(f"{head}{rng.choice(DEAD_LINES)}")
                head = ""
            if line.lstrip().startswith("def ") and line.rstrip().endswith(":") and rng.random() < 0.5:
                head = line[:len(line) - len(line.lstrip())] + "    "
        out.append("\n".join(new))
    out.insert(rng.randrange(1, len(out) + 1), DEAD_FUNCTION + "\n\nif False:\n    print('checking')\n")
    return out


def _matmul_swap(cells: list[str], rng: random.Random) -> list[str]:
    """`a @ b` written `torch.matmul(a, b)` in a cell that has `@`, else `torch.matmul(a, b)` written `(a) @ (b)`."""
    out = []
    for cell in cells:
        to_call = any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.MatMult) for n in ast.walk(ast.parse(cell)))
        while True:
            found = None
            for node in ast.walk(ast.parse(cell)):
                if to_call and isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
                    a, b = ast.get_source_segment(cell, node.left), ast.get_source_segment(cell, node.right)
                    found = f"torch.matmul({a}, {b})"
                elif (not to_call and isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                      and node.func.attr == "matmul" and len(node.args) == 2):
                    a, b = (ast.get_source_segment(cell, x) for x in node.args)
                    found = f"({a}) @ ({b})"
                if found:
                    cell = _apply(cell, [((node.lineno, node.col_offset), (node.end_lineno, node.end_col_offset),
                                          found)])
                    break
            if found is None:
                break
        out.append(cell)
    return out


APPLY = {RENAME: _rename, REORDER: _reorder, COMMENTS: _comments, INLINE: _inline, DEAD: _dead, MATMUL: _matmul_swap}


def disguise(cells: list[str], kinds: tuple[str, ...], rng: random.Random) -> list[str]:
    """A copy of `cells` disguised each of the ways `kinds` names (inlining first, renaming last)."""
    order = [INLINE, MATMUL, DEAD, COMMENTS, REORDER, RENAME]
    for kind in sorted(kinds, key=order.index):
        cells = APPLY[kind](cells, rng)
    return cells


def with_helpers(seed: int) -> bool:
    """Whether student `seed` writes helpers of their own (an INLINE disguise needs one)."""
    return habits(random.Random(seed)).helpers
