"""The device trace's shortcut for scaled_dot_product_attention on `meta` (lesson83_checks._attention_on_meta):
every call gives what torch's own `meta` kernel gives (shape, strides, dtype, whether it needs grad, or the same
kind of error), over shapes, strides, masks, causal flags, grad modes and dtypes, and the probes' usual call takes
the shortcut."""

from __future__ import annotations

import itertools
from typing import Any

import torch
import torch.nn.functional as F

from autograder.lesson import default_lesson

checks = default_lesson().checks
B, H, T, D = 2, 4, 6, 8
DTYPES = {"bool": torch.bool, "float": torch.float32, "double": torch.float64}


def _tensor(shape: tuple[int, ...], *, transposed: bool = False, dtype: torch.dtype = torch.float32,
            grad: bool = False) -> torch.Tensor:
    """An empty `meta` tensor; transposed: a (B, H, T, D) view of a (B, T, H, D) tensor, as heads are split."""
    if transposed and len(shape) == 4:
        t = torch.empty(shape[0], shape[2], shape[1], shape[3], device="meta", dtype=dtype).transpose(1, 2)
    else:
        t = torch.empty(*shape, device="meta", dtype=dtype)
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
            got = _outcome(lambda: checks._meta_memo(F.scaled_dot_product_attention, args, kwargs, {}))  # noqa: B023
        if got != want:
            differ.append(f"{qshape} S={S} transposed={transposed} {dtype} mask={mask} causal={causal} "
                          f"grad={grad_mode},{q_grad},{m_grad} Ev={Ev}: torch {want}, shortcut {got}")
    assert differ == [], "\n".join(differ[:10])


def test_the_probes_usual_calls_take_the_shortcut() -> None:
    q = _tensor((B, H, T, D), transposed=True, grad=True)
    for kwargs in ({"is_causal": True}, {"attn_mask": _tensor((1, H, T, T))}, {"attn_mask": _tensor((T, T))}):
        out = checks._attention_on_meta((q, q, q), kwargs)
        assert out is not None and (tuple(out.shape), out.requires_grad) == ((B, H, T, D), True), kwargs
    big = _tensor((B, H, 4096, D))  # large inputs: torch's own kernel, never CPU zeros of that size
    assert checks._attention_on_meta((big, big, big), {}) is None
    assert checks._attention_on_meta((q, q, q), {"attn_mask": _tensor((T, T)), "is_causal": True}) is None
