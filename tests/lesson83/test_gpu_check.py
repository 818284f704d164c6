"""The GPU check and the speed benchmark in their CPU smoke modes, so that neither rots before a GPU run."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from autograder.config import ROOT


def _load_speed():  # benchmarks/ is a folder of scripts, not an installed package
    spec = importlib.util.spec_from_file_location("milestone_speed", ROOT / "benchmarks" / "milestone_speed.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


speed = _load_speed()


@pytest.mark.training
def test_gpu_check_smoke_runs_every_section_on_the_cpu(tmp_path: Path) -> None:
    env = {**os.environ, "OUT": str(tmp_path / "out")}
    done = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--smoke"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "out" / "gpu_check.jsonl").read_text().splitlines()]
    finished = {r["section"]: r["ok"] for r in records if "ok" in r}
    assert finished == {"imports and first steps": True, "loss curves: CUDA against CPU": True,
                        "training speed": True, "kernels per step": True, "full protocol": True,
                        "checkpoint verification": True, "device trace against the device": True}, finished
    kinds = {r["section"] for r in records}
    assert {"first_steps", "fallback", "curve", "speed", "kernels", "protocol", "verify", "device_trace"} <= kinds
    traced = [r for r in records if r["section"] == "device_trace"]  # no GPU: the outcomes the zoo expects there
    assert traced and all(r["trace"] == r["expected"] and r["gpu"] is None for r in traced)
    assert {r["expected"] for r in traced} == {"fails", "follows"}
    curve = next(r for r in records if r["section"] == "curve")
    assert set(curve["curves"]) == {"cpu", "graphed-bf16", "graphed-bf16-no-cudnn", "eager-bf16", "graphed-tf32"}
    assert curve["gaps"]["graphed-bf16"] < 1e-5  # on the CPU the graphed body is the same math as train()
    verify = next(r for r in records if r["section"] == "verify")["result"]
    assert verify["ok"] and verify["preset"] == "full" and set(verify["schemes"]) == {
        "learned", "sinusoidal", "rope", "alibi", "none"}
    assert (tmp_path / "out" / "full" / "milestone.pt").exists()
    log = (tmp_path / "out" / "gpu_check.log").read_text()
    assert "grader's CPU re-verification" in log and log.rstrip().splitlines()[-1].startswith("done")


@pytest.mark.training
def test_milestone_speed_smoke() -> None:
    done = subprocess.run([sys.executable, "-m", "benchmarks.milestone_speed", "--steps", "2", "--warmup", "1",
                           "--schemes", "rope", "--devices", "cpu"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "cpu    rope" in done.stdout and "geometric mean" in done.stdout


def test_milestone_speed_resets_dynamo_and_puts_cuda_first(monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture) -> None:
    calls: list[str] = []

    def fake_trainer(pos: str, *, steps: int, batch_size: int, context: int, device: torch.device,
                     graph: bool = False, compile: bool = False) -> float:
        calls.append(f"{device.type} {pos} {'compiled' if compile else 'graphed' if graph else 'trainer'}")
        return 1.0

    monkeypatch.setattr(speed, "trainer_seconds", fake_trainer)
    monkeypatch.setattr(speed, "straightforward_train", lambda pos, **kw: calls.append(f"{kw['device']} {pos} simple")
                        or 2.0)
    monkeypatch.setattr(torch._dynamo, "reset", lambda: calls.append("reset"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "a pretend GPU")
    speed.main(["--compile", "--steps", "1000", "--warmup", "1", "--schemes", "rope", "alibi"])
    rows = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.startswith(("cuda ", "cpu "))]
    assert rows and rows[0] == "cuda" and rows[-1] == "cpu" and rows.index("cpu") > rows.count("cuda") - 1
    blocks = " | ".join(calls).split("reset")
    assert len(blocks) == 5  # once before each of 2 schemes on each of 2 devices
    for block in blocks[1:]:
        assert block.count("compiled") == 2  # the warm-up and the timed run share one dynamo cache
    assert any("graphed" in c for c in calls if c.startswith("cuda")) and not any(
        "graphed" in c for c in calls if c.startswith("cpu"))
