"""The sandbox guard's sweep in this process: its one-loop check must never miss a change that the part-by-part
comparison reports (a change of each kind is reported and undone, and a sweep with nothing changed reports only
the check mark)."""

from __future__ import annotations

import builtins
import math

import torch

from autograder import wire
from autograder.sandbox.frames import CANARY
from autograder.sandbox.guard import GUARDED_MODULES, TamperGuard


def test_sweep_reports_and_undoes_each_kind_of_change() -> None:
    guard = TamperGuard(list(GUARDED_MODULES))
    table = next(d for d, _ in guard.tables.values())
    originals = (builtins.len, math.pi, torch.nn.Module.state_dict, wire.decode, TamperGuard.__doc__, dict(table))
    assert guard.sweep() == []
    guard.plant("n1")
    assert guard.sweep() == [f"{CANARY} n1"]  # the check mark alone: nothing else changed
    try:
        builtins.len = lambda obj: 0
        math.pi = 3.0
        torch.nn.Module.state_dict = lambda self, *a, **k: {}
        wire.decode = lambda data, **k: {}
        TamperGuard.__doc__ = "changed"
        table["__added_by_a_test"] = 1
        guard.plant("n2")
        facts = guard.sweep()
    finally:
        builtins.len, math.pi, torch.nn.Module.state_dict, wire.decode = originals[:4]
        TamperGuard.__doc__ = originals[4]
        table.clear()
        table.update(originals[5])
    assert f"{CANARY} n2" in facts
    for word in ("builtins.len", "math.pi", "torch.nn.Module.state_dict", "autograder.wire.decode",
                 "autograder.sandbox.guard.TamperGuard was changed", "a table of the grader's modules was changed"):
        assert any(word in f for f in facts), (word, facts)
    assert guard.sweep() == []  # undone by the sweep itself (the finally above only guards a failing test)


def test_a_replaced_code_or_defaults_is_reported_and_undone_but_a_functions_dict_is_not() -> None:
    guard = TamperGuard(list(GUARDED_MODULES))
    fn = wire.decode
    code, defaults, kwdefaults = fn.__code__, fn.__defaults__, fn.__kwdefaults__
    fn.__dict__["noted"] = 1  # a function's own dict, made after the snapshot: not guarded, never reported
    try:
        assert guard.sweep() == []
        for part, value in (("__code__", (lambda data, **k: {}).__code__), ("__defaults__", (0,)),
                            ("__kwdefaults__", {"max_bytes": 0})):
            setattr(fn, part, value)
            assert guard.sweep() == ["autograder.wire.decode was replaced (its code or defaults)"], part
            assert (fn.__code__, fn.__defaults__, fn.__kwdefaults__) == (code, defaults, kwdefaults)
            assert guard.sweep() == []
    finally:
        fn.__code__, fn.__defaults__, fn.__kwdefaults__ = code, defaults, kwdefaults
        fn.__dict__.pop("noted", None)


_IN_A_FRESH_PROCESS = """
import sys, torch
from autograder.sandbox.guard import GUARDED_MODULES, TamperGuard
from autograder.sandbox.zygote import settle_torch
settle_torch()
guard = TamperGuard(list(GUARDED_MODULES))
seen = []
sys.addaudithook(lambda event, args: seen.append(event))
for _ in range(10):
    assert guard.sweep() == []
print(len(seen))
compiled = torch.compile(lambda t: t * 2, backend="eager")
assert compiled(torch.ones(2)).tolist() == [2.0, 2.0] and "torch._dynamo" in sys.modules
torch.manual_seed(0)
print(guard.sweep())
"""


def test_a_sweep_raises_few_audit_events_and_torch_compile_is_no_tampering() -> None:
    """Each audit event is a call of the tripwire's hook: a sweep must not read every guarded function's code
    attribute by attribute. torch._dynamo, imported by the first torch.compile in a child (not by the zygote),
    wraps torch.manual_seed unless settle_torch did it before the guard's snapshot."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _IN_A_FRESH_PROCESS], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    events, facts = out.stdout.split("\n")[:2]
    assert int(events) <= 10 * 4, events  # one gc.get_referents a sweep (and the encoder's few reads)
    assert facts == "[]"
