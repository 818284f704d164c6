"""The device trace shipped beside a lesson's checks (torch_trace.py): which op of a forward pass mixes devices.

`device_finding` is a device probe's whole job: `trace_on_cpu` runs the forward pass once on real values on the CPU
under a torch function mode that shows its tensors as cuda tensors and keeps where each tensor made would live on
a GPU, so data-dependent code takes its real path and a tensor that would stay on the CPU is found where it meets
one on the device. `trace_devices` (with `trace_devices_as_gpu`, the milestone trainer's quick check) runs it on
`meta` instead (nothing is computed); `meta_memo` and its shortcuts (`shaped_on_cpu`, `attention_on_meta`) reuse
the output layout of a call seen before. Memos live on objects (LAYOUTS), never in module-level tables: the
grader's guard reads a changed module table as tampering.
"""

from __future__ import annotations

import math
import sys
import types
from collections.abc import Callable
from typing import Any

from torch_kit import module_state, named_modules, tables
from torch_kit import torch as _torch

# Frames of these files are the grader's, never the student's (`student_line`): the kit's, a lesson's checks and
# its milestone trainer.
OWN_FILES = ("torch_kit.py", "torch_trace.py", "generic_checks.py", "_checks.py", "_milestone.py")


# Ops that may take tensors of two devices on a GPU too: they move data, or take CPU indices or values.
MOVES = {"to", "copy_", "cuda", "cpu", "type", "new_tensor", "__getitem__", "__setitem__", "index_put_",
          "index_put", "as_tensor", "tensor"}


class DeviceMismatch(RuntimeError):
    """Raised inside a traced forward pass at an op that mixes devices, with the words a GPU run raises; carries
    the finding as plain data."""

    def __init__(self, finding: dict[str, Any]) -> None:
        super().__init__(f"Expected all tensors to be on the same device, but found at least two devices, "
                         f"{finding.get('device', '')} and cpu! (when checking the arguments of {finding.get('op')})")
        self.finding = finding


def student_line() -> str:
    """Where the student's code made the call being traced: the innermost two frames of student code, read from the
    op outwards and stopping at the probe that called it (never the grader's or the build's own frames, whose line
    numbers would then end up in stored outputs)."""
    ours = OWN_FILES
    mine: list[str] = []
    frame = sys._getframe()  # the frames themselves: a traceback.extract_stack would read every file's source
    while frame is not None:
        name = frame.f_code.co_filename.replace("\\", "/")
        if name.endswith(ours) or "/torch/" in name:
            if mine and name.endswith(ours):
                break  # back in the probe: what called it is not the student's
        else:
            mine.append(f"line {frame.f_lineno} in {frame.f_code.co_name}")
        frame = frame.f_back
    return ", called from ".join(mine[:2])


# Ops whose output on `meta` is a new tensor (never a view or an input) with a layout that follows from the
# metadata of their arguments alone; a trace with a memo runs each distinct call of these once.
FRESH_OPS = frozenset({
    "scaled_dot_product_attention", "linear", "embedding", "matmul", "bmm", "mm", "outer", "softmax", "log_softmax",
    "add", "sub", "mul", "div", "true_divide", "neg", "pow", "exp", "sin", "cos", "sqrt", "rsqrt", "where",
    "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__",
    "__matmul__", "__rmatmul__", "__neg__", "__pow__", "__rpow__", "cat", "stack", "masked_fill", "triu", "tril",
    "ones", "zeros", "full", "arange", "ones_like", "zeros_like", "full_like", "clone", "contiguous"})


def meta_memo(func: Callable[..., Any], args: Any, kwargs: dict[str, Any], layouts: dict[tuple, tuple]) -> Any:
    """An op of FRESH_OPS on `meta` tensors, from the memo `layouts` when the same call was seen.

    On `meta` nothing is computed, so such an op's output (shape, strides, dtype, whether it needs grad) is a
    function of the op, the inputs' layouts and the other arguments alone; torch still takes from tens of
    microseconds (add) to milliseconds (attention) to derive it, every call, and one model's two blocks repeat
    the same calls. The first call with given metadata runs torch's own kernel (and raises as it does); a later
    one returns an empty tensor of the layout that call produced. A call with an argument of any other kind (an
    object of the student's own, say) is always run. The memo is the caller's (a probe's own, LAYOUTS, or
    MEMO.layouts while a local check runs), never a module-level table: the grader's guard reads a changed module
    table as tampering."""
    torch = _torch()
    plain = (type(None), bool, int, float, str, torch.dtype, torch.device, torch.Size, torch.memory_format,
             torch.layout)

    def meta(value: Any) -> Any:
        t = type(value)
        if t in (torch.Tensor, torch.nn.Parameter):
            return ("T", t.__name__, tuple(value.shape), value.stride(), value.storage_offset(), str(value.dtype),
                    value.device.type, value.requires_grad, value.layout == torch.strided)
        if t in (list, tuple):
            return (t.__name__, *(meta(v) for v in value))
        if t in plain:
            return ("V", t.__name__, repr(value))
        raise TypeError(t.__name__)

    try:
        key = (func, meta(args), tuple(sorted((k, meta(v)) for k, v in kwargs.items())), torch.is_grad_enabled(),
               torch.is_inference_mode_enabled())
    except TypeError:
        return func(*args, **kwargs)
    layout = layouts.get(key)
    if layout is None:
        name = getattr(func, "__name__", "")
        out = (attention_on_meta(func, args, kwargs) if name == SDPA else
               shaped_on_cpu(func, name, args, kwargs) if name in CPU_SHAPED else None)
        if out is None:
            out = func(*args, **kwargs)
        given = [v for a in (*args, *kwargs.values()) for v in (a if type(a) in (list, tuple) else (a,))]
        if (type(out) is torch.Tensor and out.device.type == "meta" and out.layout == torch.strided
                and not out._is_view() and all(out is not v for v in given) and out.storage_offset() == 0
                and fresh_meta(tuple(out.shape), out.stride(), out.dtype, out.requires_grad).stride() == out.stride()):
            layouts[key] = (tuple(out.shape), out.stride(), out.dtype, out.requires_grad)
        return out
    return fresh_meta(*layout)


ELEMENTWISE = frozenset({
    "add", "sub", "mul", "div", "true_divide", "pow", "where", "masked_fill", "neg", "exp", "sin", "cos", "sqrt",
    "rsqrt", "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__",
    "__pow__", "__neg__"})  # not __rpow__: number ** tensor on the CPU is contiguous, on `meta` it keeps the order
CPU_SHAPED = ELEMENTWISE | {"triu", "tril", "softmax", "log_softmax", "cat", "stack"}
SMALL = 1 << 16  # elements: inputs and outputs up to this size are shaped on the CPU (256 KB of float32)


def shaped_on_cpu(func: Callable[..., Any], name: str, args: Any, kwargs: dict[str, Any], *,
                   contiguous: bool = False) -> Any:
    """The output on `meta` of an op of CPU_SHAPED whose tensors are all small and on `meta`, taken from the same
    call on CPU zeros of the same layouts, or None to run torch's own `meta` kernel. Those kernels are Python
    reference ops (a hundred microseconds to a millisecond a call); the CPU's take microseconds, and both derive
    the output's shape, dtype and strides by the same rules (the tests' test_meta_shortcuts.py compares them on
    thousands of calls; only the strides of dimensions of size 1, which address nothing, may differ). A call the
    CPU refuses runs torch's own kernel, so it fails as it does on `meta`. `contiguous`: the output's strides are
    those of a contiguous tensor, as `meta` gives them where the CPU's kernel may choose others (attention)."""
    torch = _torch()
    tensors: list[Any] = []

    def find(value: Any) -> None:
        t = type(value)
        if t in (torch.Tensor, torch.nn.Parameter):
            if value.device.type != "meta" or value.layout != torch.strided:
                raise TypeError(t.__name__)
            tensors.append(value)
        elif t in (list, tuple):
            for v in value:
                find(v)

    def on_cpu(value: Any) -> Any:
        t = type(value)
        if t in (torch.Tensor, torch.nn.Parameter):
            span = 1 + sum((n - 1) * s for n, s in zip(value.shape, value.stride(), strict=True)) \
                if value.numel() else 1
            return torch.zeros(span, dtype=value.dtype).as_strided(value.shape, value.stride())
        if t in (list, tuple):
            return t(on_cpu(v) for v in value)
        return value

    try:
        find((args, tuple(kwargs.values())))
        shapes = [tuple(t.shape) for t in tensors]
        if not tensors or sum(map(math.prod, shapes)) > SMALL or (
                name in ELEMENTWISE and math.prod(torch.broadcast_shapes(*shapes)) > SMALL):
            return None
        cpu_args, cpu_kwargs = on_cpu(args), {k: on_cpu(v) for k, v in kwargs.items()}
        with torch.no_grad():
            out = func(*cpu_args, **cpu_kwargs)
    except Exception:  # noqa: BLE001 - torch's own kernel decides, and raises as it does on `meta`
        return None
    if type(out) is not torch.Tensor:
        return None
    grad = (torch.is_grad_enabled() and (out.dtype.is_floating_point or out.dtype.is_complex)
            and any(t.requires_grad for t in tensors))
    return fresh_meta(tuple(out.shape), (out.contiguous() if contiguous else out).stride(), out.dtype, grad)


SDPA = "scaled_dot_product_attention"
SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


def attention_on_meta(func: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> Any:
    """scaled_dot_product_attention's output on `meta` from the same call on CPU zeros (`shaped_on_cpu`, with no
    dropout, which would draw random numbers, and a contiguous output, as `meta` gives it), or None to run torch's
    own `meta` kernel: torch's math path in Python reference ops, one to four milliseconds a call. Where the two
    devices' checks differ (a mask with is_causal, which `meta` refuses; a mask of more dimensions than the query,
    which only `meta` broadcasts), or the scores would not be small, torch's own kernel runs."""
    if len(args) > len(SDPA_ARGS) or any(k not in SDPA_ARGS for k in kwargs):
        return None
    bound = dict(zip(SDPA_ARGS, args)) | kwargs
    q, k, v, mask = (bound.get(name) for name in SDPA_ARGS[:4])
    torch = _torch()
    tensors = (torch.Tensor, torch.nn.Parameter)
    if (not all(type(t) in tensors for t in (q, k, v)) or (mask is not None and type(mask) not in tensors)
            or any(type(bound.get(name)) not in (type(None), bool, int, float) for name in SDPA_ARGS[4:])):
        return None
    if (mask is not None and (bound.get("is_causal") or mask.dim() > q.dim())) or q.dim() < 2 or k.dim() < 2 \
            or math.prod(q.shape[:-1]) * k.shape[-2] > SMALL:
        return None
    return shaped_on_cpu(func, SDPA, (), bound | {"dropout_p": 0.0}, contiguous=True)


def fresh_meta(shape: tuple, stride: tuple, dtype: Any, grad: bool) -> Any:
    """An empty `meta` tensor of this layout; with grad, a non-leaf (as an op's output is), so that an in-place
    op on it is allowed as it is on the output of the op it stands for."""
    out = _torch().empty_strided(shape, stride, dtype=dtype, device="meta")
    return out.requires_grad_().clone() if grad else out


def tensors_in(value: Any) -> list[Any]:
    """The tensors in value, in order, looking into lists, tuples and dicts."""
    Tensor, nested = _torch().Tensor, (list, tuple, dict)
    if isinstance(value, Tensor):
        return [value]
    out: list[Any] = []
    if isinstance(value, nested):
        for v in value.values() if isinstance(value, dict) else value:
            if isinstance(v, Tensor):
                out.append(v)
            elif isinstance(v, nested):
                out += tensors_in(v)
    return out


def plain_attributes(model: Any, off: Callable[[Any], bool]) -> dict[int, tuple[Any, str]]:
    """id -> (tensor, what it is) for each tensor attribute of the model's modules that `off` picks: a plain
    attribute, which is not a registered buffer and so does not move with the model."""
    torch, origins = _torch(), {}
    for mod_name, mod in model.named_modules():
        for attr, value in vars(mod).items():
            if isinstance(value, torch.Tensor) and off(value):
                owner = f"{type(mod).__name__}{f' ({mod_name})' if mod_name else ''}"
                origins[id(value)] = (value, f"the plain attribute self.{attr} of {owner}, which "
                                             "is not a registered buffer and so did not move with the model")
    return origins


def describe_tensor(t: Any, origins: dict[int, tuple[Any, str]], device: str) -> str:
    """A finding's words for tensor t on `device`: its dtype, shape and where it was made (`origins`)."""
    known = origins.get(id(t))
    made = known[1] if known and known[0] is t else "a tensor the forward pass made there"
    return f"a {str(t.dtype).replace('torch.', '')} tensor of shape {list(t.shape)} on {device}: {made}"


class ModuleStack:
    """The labels of the model's modules being called during a trace (`top`: the innermost), from two hooks for
    every module call (torch's global ones, entered with `with`), not two registered on each module."""

    def __init__(self, model: Any) -> None:
        self.labels = {id(mod): f"{type(mod).__name__}{f' ({mod_name})' if mod_name else ''}"
                       for mod_name, mod in model.named_modules()}
        self.names: list[str] = []
        self.hooks: list[Any] = []

    def top(self) -> str:
        return self.names[-1] if self.names else ""

    def __enter__(self) -> ModuleStack:
        hooks = _torch().nn.modules.module

        def enter(m: Any, _args: Any) -> None:
            if id(m) in self.labels:
                self.names.append(self.labels[id(m)])

        def leave(m: Any, _args: Any, _out: Any) -> None:
            if id(m) in self.labels and self.names:
                self.names.pop()

        self.hooks = [hooks.register_module_forward_pre_hook(enter), hooks.register_module_forward_hook(leave)]
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self.hooks:
            h.remove()


def trace_devices(model: Any, X: Any, *, layouts: dict[tuple, tuple] | None = None,
                  disguise: str | None = None) -> dict[str, Any] | None:
    """Run model(X) once and report the first op that combines tensors of different devices, or None.

    X and the model's parameters and buffers live on one device (`meta`: nothing is computed). A
    TorchFunctionMode sees every torch call, so a table made on the CPU inside forward (or kept as a plain
    attribute) is caught even where an op would accept it (on torch 2.13 a matmul of a meta tensor with a CPU
    tensor succeeds); 0-dim CPU tensors count as numbers, as on a GPU. The report says which tensor, made where
    (module, line, op, shape), met which op. With `layouts`, calls of FRESH_OPS reuse the output layout of an
    identical earlier call (`meta_memo`). With `disguise` (a device type such as "cuda"), the pass sees its
    `meta` tensors as on that device (`Disguise`); a finding then names that device. Code that asks `meta` what
    it cannot answer (values, data_ptr, repr) is judged by `trace_on_cpu`, never by this trace.
    """
    torch = _torch()
    from torch.overrides import TorchFunctionMode

    device = X.device
    mask = Disguise(device, disguise) if disguise and device.type == "meta" else None
    origins = plain_attributes(model, lambda value: value.device != device)  # id -> (tensor, where it was made)
    stack = ModuleStack(model)
    Tensor = torch.Tensor

    def describe(t: Any) -> str:
        return describe_tensor(t, origins, t.device.type)

    class Tracker(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            name = getattr(func, "__name__", str(func))
            if mask is not None:
                shown = mask.shown(func, name, args)
                if shown is not Disguise.REAL:
                    return shown
                func, name, args, kwargs = mask.unmask(func, name, args, kwargs)
            if name == "__get__" and len(args) == 1 and not kwargs:  # a property of one tensor (x.shape, x.T):
                return func(*args)  # one tensor cannot mix devices, and what a property returns is not recorded
            inputs = tensors_in(args) + tensors_in(kwargs) if kwargs else tensors_in(args)
            devices = [t.device for t in inputs]
            off = [t for t, d in zip(inputs, devices, strict=True)
                   if d != device and not (d.type == "cpu" and t.dim() == 0)]
            if off and device in devices and name not in MOVES:
                raise DeviceMismatch({"op": name, "module": stack.top(),
                                      "line": student_line(), "device": disguise if mask else device.type,
                                      "tensor": describe(off[0]), "shape": list(off[0].shape)})
            if (layouts is not None and name in FRESH_OPS and device.type == "meta" and "out" not in kwargs
                    and all(d == device for d in devices)):
                out = meta_memo(func, args, kwargs, layouts)
            else:
                out = func(*args, **kwargs)
            if type(out) is Tensor:
                made = [out] if out.device != device else []
            else:
                made = [t for t in tensors_in(out) if t.device != device]
            if made and name not in ("__get__",):
                parent = next((origins[id(t)][1] for t in off if id(t) in origins and origins[id(t)][0] is t),
                              None)
                where = parent or (f"made by torch.{name} at {student_line() or 'an unknown line'}"
                                   f"{' in ' + stack.top() if stack.top() else ''}")
                for t in made:
                    origins.setdefault(id(t), (t, where))
            return out

    try:
        with stack, Tracker():
            out = model(X)
        bad = [t for t in tensors_in(out) if t.device != device]
        if bad:
            return {"op": "the returned logits", "module": type(model).__name__, "line": "",
                    "device": disguise if mask else device.type, "tensor": describe(bad[0]),
                    "shape": list(bad[0].shape)}
    except DeviceMismatch as exc:
        return exc.finding
    return None


class Disguise:
    """How a traced forward pass is shown its tensors on another device type (`trace_devices` on `meta`, and
    `trace_on_cpu`): their device properties read as that device (cuda:0: is_cuda True, is_meta False,
    get_device 0), and that device, passed to a torch call, means the real one again (`unmask`, for `meta`)."""

    REAL = object()  # shown(): nothing to show instead, run the call as it is

    def __init__(self, real: Any, shown_type: str) -> None:
        torch = _torch()
        self.real, self.shown_device, self.shown_type = real, torch.device(shown_type, 0), shown_type
        self.props = {"device": self.shown_device, "is_meta": False, "is_cuda": shown_type == "cuda",
                      "is_cpu": False}
        self.tensors, self.device_types, self.to = (torch.Tensor, torch.nn.Parameter), (torch.device, str), \
            torch.Tensor.to

    def shown(self, func: Any, name: str, args: Any, here: Callable[[Any], bool] | None = None) -> Any:
        """What a device query on one of the traced tensors (those on the real device, or those `here` picks)
        returns, or REAL for any other call."""
        if not args or type(args[0]) not in self.tensors or not (
                here(args[0]) if here is not None else args[0].device == self.real):
            return self.REAL
        if name == "__get__" and len(args) == 1:
            return self.props.get(getattr(getattr(func, "__self__", None), "__name__", ""), self.REAL)
        if name == "get_device" and len(args) == 1:
            return 0
        return self.REAL

    def _real(self, value: Any) -> Any:
        if type(value) is self.device_types[0] and value.type == self.shown_type:
            return self.real
        if type(value) is str and value.split(":")[0] == self.shown_type:
            return self.real
        return value

    def unmask(self, func: Any, name: str, args: Any, kwargs: dict[str, Any]) -> tuple[Any, str, Any, dict]:
        """The call with the shown device replaced by the real one (.cuda() becomes .to(meta)); most calls name
        no device at all and are returned as they are."""
        if name in ("cuda", self.shown_type) and args and isinstance(args[0], self.tensors[0]):
            return self.to, "to", (args[0], self.real), {}
        kinds = self.device_types
        if not any(type(a) in kinds for a in args) and not any(type(v) in kinds for v in kwargs.values()):
            return func, name, tuple(args), dict(kwargs)
        return func, name, tuple(self._real(a) for a in args), {k: self._real(v) for k, v in kwargs.items()}


class Layouts:
    """The memo of `meta` output layouts (`meta_memo`) shared in one process: an entry is a fact about torch (an
    op's output layout for given argument layouts), whichever trace made it. An attribute of an object, never a
    module-level table (the grader's guard reads a changed module table as tampering)."""

    def __init__(self) -> None:
        self.table: dict[tuple, tuple] = {}


LAYOUTS = Layouts()


def trace_devices_as_gpu(model: Any, X: Any, *, layouts: dict[tuple, tuple]) -> dict[str, Any] | None:
    """trace_devices on `meta` shown as cuda (`Disguise`), as the forward pass runs on a GPU: its finding, or None.

    Code that treats `meta` as a special case (moves its tables only there) is traced as it runs on a GPU, and
    a table left on the CPU still meets the `meta` tensors. Only when that pass fails for another reason (a
    cuda-only API such as torch.cuda.current_device()) is the forward pass traced again on `meta` as it is."""
    try:
        return trace_devices(model, X, layouts=layouts, disguise="cuda")
    except Exception:  # noqa: BLE001 - not a device mismatch: trace it as plain meta, whose errors are the caller's
        return trace_devices(model, X, layouts=layouts)


class Undecided(Exception):
    """A trace on the CPU met a call it cannot show as on the other device (a tensor's storage): no decision."""


UNSHOWN = frozenset({"untyped_storage", "storage", "_typed_storage", "is_pinned", "pin_memory", "share_memory_",
                     "is_shared", "__cuda_array_interface__", "__dlpack__", "__dlpack_device__"})
NUMPY, FORMAT = frozenset({"numpy", "__array__"}), frozenset({"__repr__", "__str__", "__format__"})


def trace_on_cpu(model: Any, X: Any, *, shown: str = "cuda") -> dict[str, Any] | None:
    """Run model(X) once on the CPU with real values shown as on `shown` (cuda:0): the first op that would mix
    devices there, or None; Undecided where a call of UNSHOWN met a tensor on that device.

    On the device are X, the model's registered parameters (`.to` keeps their objects) and copies of its buffers
    put in its tables for the pass (`.to` puts new ones there), read from nn.Module's own tables. A torch
    function mode keeps where each tensor made lives: on the device when the call names it (device=q.device,
    .to(q.device), .to(q), .cuda()) or, naming none, takes a tensor there; else on the CPU (torch.arange(T)).
    Values are real, so data-dependent code (asserts, isfinite, .item()) takes its real path. A tensor on the
    device answers device queries, repr, str and format as one there and refuses numpy() as it does; data_ptr
    is real. A finding (an op meeting a tensor of each device, not MOVES, a 0-dim CPU tensor counting as a
    number; a CPU tensor indexed by one on the device; numpy(); a returned tensor left on the CPU) is kept when
    it happens, whatever the code catches, and raised as a GPU raises. The CPU generator is left as it was."""
    torch = _torch()
    from torch.overrides import TorchFunctionMode

    cpu, Tensor = torch.device("cpu"), torch.Tensor
    on: dict[int, Any] = {id(X): X}  # id -> tensor, for the tensors on the shown device (kept alive: ids stay theirs)
    on.update((id(p), p) for p in module_state(model)["parameters"].values())
    swapped = [(buffers, k, b) for _, m in named_modules(model) for buffers in [tables(m)[2]]
               for k, b in buffers.items() if b is not None]
    origins = plain_attributes(model, lambda value: on.get(id(value)) is not value)
    mask, stack, found, unshown = Disguise(cpu, shown), ModuleStack(model), [], []

    def here(t: Any) -> bool:
        return on.get(id(t)) is t

    def finding(op: str, t: Any) -> DeviceMismatch:
        found.append({"op": op, "module": stack.top(), "line": student_line(), "device": shown,
                      "tensor": describe_tensor(t, origins, shown if here(t) else "cpu"), "shape": list(t.shape)})
        return DeviceMismatch(found[-1])

    def target(name: str, args: Any, kwargs: dict[str, Any]) -> tuple[str | None, Any, dict[str, Any]]:
        """Where the call puts what it makes ("on", "cpu", None: it names no device), and its args for the CPU."""
        if name == "cuda":
            return "on", (args[0], cpu), {k: v for k, v in kwargs.items() if k == "non_blocking"}
        moves, named = name in ("to", "type"), ["cpu"] if name == "cpu" else []

        def real(value: Any, key: str | int) -> Any:
            slot = key == "device" or (moves and key == 1)
            if moves and key == 1 and isinstance(value, Tensor):
                named.append("on" if here(value) else "cpu")
            elif type(value) is int and slot:
                named.append("on")
                return cpu
            elif type(value) is torch.device or (type(value) is str and slot):
                try:
                    kind = torch.device(value).type
                except (RuntimeError, TypeError):
                    return value
                if kind in (shown, "cpu"):
                    named.append("on" if kind == shown else "cpu")
                    return cpu
            return value

        args, kwargs = tuple(real(a, i) for i, a in enumerate(args)), {k: real(v, k) for k, v in kwargs.items()}
        return (named[-1] if named else None), args, kwargs

    class Shown(TorchFunctionMode):  # inside a repr: every tensor shown on the device (the repr's own ops)
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            got = mask.shown(func, getattr(func, "__name__", ""), args, lambda t: True)
            return func(*args, **(kwargs or {})) if got is Disguise.REAL else got

    class Tracker(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            name = getattr(func, "__name__", str(func))
            mine0 = bool(args) and isinstance(args[0], Tensor) and here(args[0])
            if mine0 and (got := mask.shown(func, name, args, here)) is not Disguise.REAL:
                return got
            if mine0 and name in UNSHOWN:
                unshown.append(name)
                raise Undecided(f"{name}() of a tensor on {shown} cannot be shown by a trace on the CPU")
            if mine0 and name in NUMPY:
                finding(name, args[0])
                raise TypeError(f"can't convert {shown}:0 device type tensor to numpy. Use Tensor.cpu() to copy "
                                "the tensor to host memory first.")
            if mine0 and name in FORMAT and not (name == "__format__" and args[0].dim() == 0):
                if name == "__format__" and args[1:] and args[1]:
                    raise TypeError("unsupported format string passed to Tensor.__format__")
                with Shown():
                    return torch._tensor_str._str(args[0])
            cuda = name in ("cuda", shown) and bool(args) and isinstance(args[0], Tensor)  # x.cuda(): x.to(cpu)
            func = Tensor.to if cuda else func
            where, args, kwargs = target("cuda" if cuda else name, args, kwargs or {})
            inputs = tensors_in(args) + tensors_in(kwargs) if kwargs else tensors_in(args)
            mine = [t for t in inputs if here(t)]
            off = [t for t in inputs if not here(t) and t.dim() > 0]
            if mine and off and name not in MOVES:
                raise finding(name, off[0])
            if name == "__getitem__" and off and off[0] is args[0] and any(here(t) for t in tensors_in(args[1:])):
                raise finding(name, args[0])  # a CPU tensor indexed by indices on the device
            out = func(*args, **kwargs)
            if isinstance(out, Tensor) and where and any(out is t for t in inputs) and (where == "on") != here(out):
                out = Tensor.clone(out)  # a move to the other device: a copy there, as on a GPU
            for t in tensors_in(out) if isinstance(out, (Tensor, tuple, list)) else ():
                if any(t is i for i in inputs):
                    continue  # an input returned as it is (in place, or a no-op): it stays where it is
                if where == "on" or (where is None and mine):
                    on[id(t)] = t
                else:  # what it was made from tells most (a slice of a plain attribute), else where it was made
                    parent = next((origins[id(i)][1] for i in inputs if origins.get(id(i), (None,))[0] is i), None)
                    made = f"made by torch.{name} at {student_line() or 'an unknown line'}"
                    origins.setdefault(id(t), (t, parent or made + (f" in {stack.top()}" if stack.top() else "")))
            return out

    rng = torch.get_rng_state()
    # as on a machine with one GPU: a branch on the query takes the path it takes where the input is on a GPU
    queries = {"is_available": torch.cuda.is_available, "device_count": torch.cuda.device_count}
    try:
        torch.cuda.is_available, torch.cuda.device_count = (lambda: shown == "cuda"), (lambda: int(shown == "cuda"))
        for buffers, k, b in swapped:  # each buffer's copy on the device, also under its id (`here` tells apart)
            if id(b) not in on:
                on[id(b)] = b.detach().clone().requires_grad_(b.requires_grad)
                on[id(on[id(b)])] = on[id(b)]
            buffers[k] = on[id(b)]
        with stack, Tracker():
            out = model(X)
        if not found and (bad := [t for t in tensors_in(out) if not here(t)]):
            finding("the returned logits", bad[0]).finding["module"] = type(model).__name__
    except Exception as exc:
        if not found and not unshown:
            raise exc.with_traceback(without_own_frames(exc.__traceback__)) from exc.__cause__
    finally:
        torch.cuda.is_available, torch.cuda.device_count = queries["is_available"], queries["device_count"]
        torch.set_rng_state(rng)
        for buffers, k, b in swapped:
            buffers[k] = b
    if unshown and not found:
        raise Undecided(f"{unshown[0]}() of a tensor on {shown} cannot be shown by a trace on the CPU")
    return found[0] if found else None


def without_own_frames(tb: Any) -> Any:
    """A traceback without this module's frames, so that an error of the student's code raised through the trace
    points at the student's line (error_record reads the innermost frame), as it does without the trace."""
    frames = []
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.replace("\\", "/").endswith("torch_trace.py"):
            frames.append(tb)
        tb = tb.tb_next
    out = None
    for t in reversed(frames):
        out = types.TracebackType(out, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return out


def device_finding(build: Callable[[], Any], x: Any) -> dict[str, Any]:
    """A device probe's output for build()(x), traced on real values on the CPU shown as cuda (`trace_on_cpu`):
    {"finding": the first op that would mix devices on a GPU, or None, "note": ""}. Only a pass that ran to its
    end or to a finding decides: any other error of the student's code (or Undecided) is raised, so the probe
    records it and its case does not pay. `build` builds the module on the CPU; x is a CPU tensor."""
    return {"finding": trace_on_cpu(build(), x), "note": ""}


__all__ = ["OWN_FILES", "MOVES", "DeviceMismatch", "student_line", "FRESH_OPS", "meta_memo", "ELEMENTWISE",
           "CPU_SHAPED", "SMALL", "shaped_on_cpu", "SDPA", "SDPA_ARGS", "attention_on_meta", "fresh_meta",
           "tensors_in", "plain_attributes", "describe_tensor", "ModuleStack", "trace_devices", "Disguise", "Layouts",
           "LAYOUTS", "trace_devices_as_gpu", "Undecided", "UNSHOWN", "NUMPY", "FORMAT", "trace_on_cpu",
           "without_own_frames", "device_finding"]
