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
