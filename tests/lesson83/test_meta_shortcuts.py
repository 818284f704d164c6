"""The device trace's shortcuts on `meta` (the kit's torch_trace.attention_on_meta and shaped_on_cpu): every call of
scaled_dot_product_attention and of the elementwise, triangle, softmax and joining ops gives what torch's own
`meta` kernel gives (shape, strides, dtype, whether it needs grad, or the same kind of error) over shapes, strides,
masks, causal flags, grad modes and dtypes; the probes' usual calls take the shortcut, large ones never do."""

from __future__ import annotations

import itertools
from typing import Any

import torch
import torch.nn.functional as F

from autograder.course import course_of

trace = course_of().lesson.runtime_copies["torch_trace"]  # the kit as Lesson 83 runs it
B, H, T, D = 2, 4, 6, 8
DTYPES = {"bool": torch.bool, "float": torch.float32, "double": torch.float64}


def _tensor(shape: tuple[int, ...], *, transposed: bool = False, dtype: torch.dtype = torch.float32,
            grad: bool = False) -> torch.Tensor:
    """An empty `meta` tensor; transposed: a (B, H, T, D) view of a (B, T, H, D) tensor, as heads are split."""
    if transposed and len(shape) == 4:
        t = torch.empty(shape[0], shape[2], shape[1], shape[3], device="meta", dtype=dtype).transpose(1, 2)
    else:
        t = torch.empty(shape, device="meta", dtype=dtype)
    return t.requires_grad_() if grad else t


def _outcome(call: Any) -> tuple:
    try:
        out = call()
    except Exception as exc:  # noqa: BLE001 - the kind of error is what is compared
        return ("error", type(exc).__name__)
    return (tuple(out.shape), out.stride(), out.dtype, out.requires_grad, out.device.type)


VARIANTS = list(itertools.product(
    [(B, H, T, D), (H, T, D), (B, H, T, D + 1)],  # query shape
    [T, T + 3],  # key/value length
    [False, True],  # transposed query and key
    [torch.float32, torch.float64],
    [None, ("bool", (T, T)), ("float", (1, H, T, T)), ("float", (B, H, T, T)), ("double", (T, T)),
     ("float", (T, T + 1))],  # mask
    [False, True],  # is_causal
    [True, False],  # grad mode
    [(False, False), (True, False), (False, True)],  # query needs grad, mask needs grad
    [D, 5],  # value width
))[::7]  # every 7th of the 3,456 combinations (7 is prime to each factor's size, so every value occurs)


def test_the_shortcut_gives_what_torch_gives_on_meta() -> None:
    differ = []
    for qshape, S, transposed, dtype, mask, causal, grad_mode, (q_grad, m_grad), Ev in VARIANTS:
        q = _tensor(qshape, transposed=transposed, dtype=dtype, grad=q_grad)
        k = _tensor((*qshape[:-2], S, qshape[-1]), transposed=transposed, dtype=dtype)
        v = _tensor((*qshape[:-2], S, Ev), dtype=dtype)
        m = None if mask is None else _tensor(mask[1], dtype=DTYPES[mask[0]], grad=m_grad and mask[0] != "bool")
        args, kwargs = (q, k, v), {"attn_mask": m, "is_causal": causal}
        with torch.set_grad_enabled(grad_mode):
            want = _outcome(lambda: F.scaled_dot_product_attention(*args, **kwargs))  # noqa: B023
            got = _outcome(lambda: trace.meta_memo(F.scaled_dot_product_attention, args, kwargs, {}))  # noqa: B023
        if got != want:
            differ.append(f"{qshape} S={S} transposed={transposed} {dtype} mask={mask} causal={causal} "
                          f"grad={grad_mode},{q_grad},{m_grad} Ev={Ev}: torch {want}, shortcut {got}")
    assert differ == [], "\n".join(differ[:10])


def test_the_probes_usual_calls_take_the_shortcut() -> None:
    q = _tensor((B, H, T, D), transposed=True, grad=True)
    for kwargs in ({"is_causal": True}, {"attn_mask": _tensor((1, H, T, T))}, {"attn_mask": _tensor((T, T))}):
        out = trace.attention_on_meta(F.scaled_dot_product_attention, (q, q, q), kwargs)
        assert out is not None and (tuple(out.shape), out.requires_grad) == ((B, H, T, D), True), kwargs
    big = _tensor((B, H, 4096, D))  # large inputs: torch's own kernel, never CPU zeros of that size
    assert trace.attention_on_meta(F.scaled_dot_product_attention, (big, big, big), {}) is None
    causal_mask = {"attn_mask": _tensor((T, T)), "is_causal": True}
    assert trace.attention_on_meta(F.scaled_dot_product_attention, (q, q, q), causal_mask) is None


def _strided(shape: tuple[int, ...], kind: str, dtype: torch.dtype, grad: bool) -> torch.Tensor:
    """An empty `meta` tensor: contiguous (C), transposed (T), broadcast along its last dimension (E) or every
    other element (S); needing grad where its dtype can."""
    t = _tensor(shape, dtype=dtype)
    if kind == "T" and len(shape) >= 2:
        t = torch.empty(*shape[:-2], shape[-1], shape[-2], device="meta", dtype=dtype).transpose(-1, -2)
    elif kind == "E" and len(shape) >= 2:
        t = torch.empty(*shape[:-1], 1, device="meta", dtype=dtype).expand(*shape)
    elif kind == "S" and len(shape) >= 1:
        t = torch.empty(*shape[:-1], shape[-1] * 2, device="meta", dtype=dtype)[..., ::2]
    return t.requires_grad_() if grad and dtype.is_floating_point and t.is_leaf else t


def _layout(call: Any) -> tuple:
    """shape, strides (but those of dimensions of size 1, which address nothing), dtype and need of grad, or the kind
    of error."""
    try:
        out = call()
    except Exception as exc:  # noqa: BLE001 - the kind of error is what is compared
        return ("error", type(exc).__name__)
    return (tuple(out.shape), tuple(s for s, n in zip(out.stride(), out.shape, strict=True) if n != 1), out.dtype,
            out.requires_grad, out.device.type)


SHAPES = [(2, 4, 6, 6), (4, 6, 6), (6, 6), (6,), (1, 6), (6, 1), (1, 4, 1, 1), (2, 1, 6, 6), (), (4, 1, 6)]
BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "pow": torch.pow,
          "__add__": torch.Tensor.__add__, "__rsub__": torch.Tensor.__rsub__, "__truediv__": torch.Tensor.__truediv__,
          "__rpow__": torch.Tensor.__rpow__}
PAIRS = list(itertools.product(BINARY, SHAPES, "CTES", SHAPES, "CTES",
                               [(torch.float32, torch.float32), (torch.float32, torch.float64),
                                (torch.int64, torch.float32)], [True, False]))[::11]


def test_elementwise_ops_are_shaped_on_the_cpu_as_torch_shapes_them_on_meta() -> None:
    differ = []
    for name, sa, ka, sb, kb, (da, db), grad_mode in PAIRS:
        a, b = _strided(sa, ka, da, True), _strided(sb, kb, db, False)
        func = BINARY[name]
        with torch.set_grad_enabled(grad_mode):
            want = _layout(lambda: func(a, b))  # noqa: B023
            got = _layout(lambda: trace.meta_memo(func, (a, b), {}, {}))  # noqa: B023
            scalar = _layout(lambda: func(a, 2.5)), _layout(lambda: trace.meta_memo(func, (a, 2.5), {}, {}))  # noqa: B023
        if got != want or scalar[0] != scalar[1]:
            differ.append(f"{name} {sa}{ka} {sb}{kb} {da} {db} grad={grad_mode}: torch {want} {scalar[0]}, "
                          f"shortcut {got} {scalar[1]}")
    assert differ == [], "\n".join(differ[:10])


OTHERS: list[tuple[str, Any, Any]] = [
    ("where", torch.where, lambda a, b: (b.to(torch.bool), a, 0.0)),
    ("masked_fill", torch.Tensor.masked_fill, lambda a, b: (a, b.to(torch.bool), float("-inf"))),
    ("neg", torch.neg, lambda a, b: (a,)), ("exp", torch.exp, lambda a, b: (a,)),
    ("sqrt", torch.sqrt, lambda a, b: (a,)), ("__neg__", torch.Tensor.__neg__, lambda a, b: (a,)),
    ("triu", torch.triu, lambda a, b: (a, 1)), ("tril", torch.tril, lambda a, b: (a,)),
    ("softmax", torch.softmax, lambda a, b: (a, -1)), ("log_softmax", torch.log_softmax, lambda a, b: (a, 0)),
    ("cat", torch.cat, lambda a, b: ([a, b], -1)), ("stack", torch.stack, lambda a, b: ([a, b],)),
    ("cat", torch.cat, lambda a, b: ((a, a, b),)),
]


def test_other_ops_are_shaped_on_the_cpu_as_torch_shapes_them_on_meta() -> None:
    differ = []
    for (name, func, make), sa, ka, kb, grad_mode in itertools.product(OTHERS, SHAPES, "CTES", "CTS", [True, False]):
        a, b = _strided(sa, ka, torch.float32, True), _strided(sa, kb, torch.float32, False)
        args = make(a, b)
        with torch.set_grad_enabled(grad_mode):
            want = _layout(lambda: func(*args))  # noqa: B023
            got = _layout(lambda: trace.meta_memo(func, args, {}, {}))  # noqa: B023
        if got != want:
            differ.append(f"{name} {sa}{ka} {kb} grad={grad_mode}: torch {want}, shortcut {got}")
    assert differ == [], "\n".join(differ[:10])


def test_the_usual_ops_take_the_cpu_shortcut_and_large_ones_do_not() -> None:
    a = _strided((2, 4, 6, 6), "T", torch.float32, True)
    for name, func, args in [("mul", torch.mul, (a, a)), ("triu", torch.triu, (a, 1)), ("cat", torch.cat, ([a, a],))]:
        out = trace.shaped_on_cpu(func, name, args, {})
        assert out is not None and out.requires_grad and out.device.type == "meta", name
    big = _tensor((300, 300))
    assert trace.shaped_on_cpu(torch.mul, "mul", (big, big), {}) is None  # never CPU zeros of that size
    tall, wide = _tensor((300, 1)), _tensor((1, 300))  # small inputs, a large broadcast output
    assert trace.shaped_on_cpu(torch.add, "add", (tall, wide), {}) is None
