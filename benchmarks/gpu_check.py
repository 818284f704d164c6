"""One command that settles the milestone's GPU goals: `python benchmarks/gpu_check.py` (about 5 minutes on one H200).

It needs only this repository and the GPU image's PyTorch (no pydantic, nothing installed). In order:

1. imports, and a few training steps of every scheme on the device (is the step captured as a CUDA graph?);
2. per scheme, the loss curve on CUDA against the CPU's over a few hundred quick-preset steps: graphed bf16,
   graphed bf16 without the cuDNN attention backend, eager bf16 and graphed float32/TF32;
3. per scheme, training steps per second at the full preset's shapes: the trainer (eager), the trainer as a
   CUDA graph and the straightforward loop of benchmarks/milestone_speed.py, and their ratios;
4. per scheme, GPU activities (kernels, copies) and host launch calls per step (torch.profiler), eager and
   graphed;
5. the full protocol (5 schemes x 3000 steps and the evaluation) timed from a fresh process
   (`python -m autograder.checkpoint --preset full --device cuda`);
6. the grader's own CPU re-verification of that checkpoint against the full preset's bounds;
7. the device trace against the device: each function of DEVICE_ZOO (honest code with asserts and data-dependent
   checks, tables left on the CPU, code that looks for the trace) decided by the probes' trace on CPU values
   shown as cuda (torch_trace.trace_on_cpu), then run on the GPU: a decision must match what the GPU does.

Every result is appended to $OUT/gpu_check.jsonl and every printed line to $OUT/gpu_check.log as soon as it
is known, so a run cut off at its time limit still reports what it measured ($OUT defaults to out/gpu_check).
--smoke runs the same code on the CPU with tiny sizes in well under a minute (tests/lesson83/test_gpu_check.py);
there section 7 checks the trace's decisions against the GPU outcomes the zoo expects.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from a bare copy of the repository
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

# Section 7: name -> (input kind, source defining Model, what a GPU run does: "follows" when forward runs and returns
# tensors on the input's device, "fails" otherwise). The source sees torch, nn, F and math.
ROPE = """
def rope_cache(T, d):
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = torch.outer(torch.arange(T, dtype=torch.float64), theta)
    return torch.cos(angles).float(), torch.sin(angles).float()

def apply_rope(x, cos, sin):
    h = x.shape[-1] // 2
    return torch.cat([x[..., :h] * cos - x[..., h:] * sin, x[..., :h] * sin + x[..., h:] * cos], -1)

def attend(q, k, v, cos, sin):
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)
"""
DEVICE_ZOO: dict[str, tuple[str, str, str]] = {
    "honest: isfinite check, tables moved": ("float", ROPE + """
class Model(nn.Module):
    def forward(self, q):
        if not torch.isfinite(q).all():
            raise ValueError("q holds a NaN or an infinity")
        cos, sin = (t.to(q.device) for t in rope_cache(q.shape[-2], q.shape[-1]))
        return attend(q, q * 1.0, q, cos, sin)
""", "follows"),
    "tables on the CPU after an isfinite check": ("float", ROPE + """
class Model(nn.Module):
    def forward(self, q):
        if not torch.isfinite(q).all():
            raise ValueError("q holds a NaN or an infinity")
        cos, sin = rope_cache(q.shape[-2], q.shape[-1])
        return attend(q, q * 1.0, q, cos, sin)
""", "fails"),
    "tables moved only when data_ptr() == 0": ("float", ROPE + """
class Model(nn.Module):
    def forward(self, q):
        cos, sin = rope_cache(q.shape[-2], q.shape[-1])
        if q.data_ptr() == 0:
            cos, sin = cos.to(q.device), sin.to(q.device)
        return attend(q, q * 1.0, q, cos, sin)
""", "fails"),
    "tables moved only when repr has no cuda": ("float", ROPE + """
class Model(nn.Module):
    def forward(self, q):
        cos, sin = rope_cache(q.shape[-2], q.shape[-1])
        if "cuda" not in repr(q):
            cos, sin = cos.to(q.device), sin.to(q.device)
        return attend(q, q * 1.0, q, cos, sin)
""", "fails"),
    "tables moved only when q.cpu() is q": ("float", ROPE + """
class Model(nn.Module):
    def forward(self, q):
        cos, sin = rope_cache(q.shape[-2], q.shape[-1])
        if q.cpu() is q:
            cos, sin = cos.to(q.device), sin.to(q.device)
        return attend(q, q * 1.0, q, cos, sin)
""", "fails"),
    "honest: print, format and .item()": ("float", """
class Model(nn.Module):
    def forward(self, q):
        note = f"{q.shape} {q.device} {q.abs().max().item():.3f} {q[0, 0, 0, 0]:.2f}"
        T = q.shape[-2]
        mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril() if note else None
        return F.scaled_dot_product_attention(q, q, q, attn_mask=mask) * torch.tensor(2.0)
""", "follows"),
    "a mask made without device=": ("float", """
class Model(nn.Module):
    def forward(self, q):
        T = q.shape[-2]
        scores = (q @ q.transpose(-2, -1)).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        return scores.softmax(-1) @ q
""", "fails"),
    "a CPU table indexed by positions on the device": ("float", """
class Model(nn.Module):
    def forward(self, q):
        table = torch.zeros(64, q.shape[-1])
        return q + table[torch.arange(q.shape[-2], device=q.device)]
""", "fails"),
    "a tensor on the device indexed by CPU positions": ("float", """
class Model(nn.Module):
    def forward(self, q):
        return q[:, :, torch.arange(q.shape[-2] - 1)] * 2
""", "follows"),
    "zeros_like on the CPU by name": ("float", """
class Model(nn.Module):
    def forward(self, q):
        return q + torch.zeros_like(q, device="cpu")
""", "fails"),
    "new_zeros, .to(q) and .cuda() follow": ("float", """
class Model(nn.Module):
    def forward(self, q):
        a = q.new_zeros(q.shape) + torch.arange(q.shape[-1]).to(q)
        return a + (torch.ones(q.shape[-1]).cuda() if q.is_cuda else 0.0)
""", "follows"),
    "numpy() of the input": ("float", """
class Model(nn.Module):
    def forward(self, q):
        return q * float(q.detach().numpy().max())
""", "fails"),
    "a returned tensor moved to the CPU": ("float", """
class Model(nn.Module):
    def forward(self, q):
        return (q * 2).cpu()
""", "fails"),
    "honest: an assert on token ids": ("tokens", """
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(28, 8)
    def forward(self, X):
        assert int(X.max()) < self.emb.num_embeddings, "a token id is out of range"
        return self.emb(X) + self.emb.weight[torch.arange(X.shape[1], device=X.device)]
""", "follows"),
    "positions on the CPU after an assert on token ids": ("tokens", """
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(28, 8)
    def forward(self, X):
        assert int(X.max()) < self.emb.num_embeddings, "a token id is out of range"
        return self.emb(X) + self.emb(torch.arange(X.shape[1]))
""", "fails"),
    "a plain attribute aliasing a buffer": ("tokens", """
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(28, 8)
        self.register_buffer("pe", torch.randn(64, 8))
        self.table = self.pe  # .to() puts a new tensor in the buffer table: this one stays behind
    def forward(self, X):
        return self.emb(X) + self.table[: X.shape[1]]
""", "fails"),
    "a list aliasing a parameter": ("tokens", """
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(28, 8)
        self.first = [self.emb.weight]  # .to() sets the parameter's .data: this one moves too
    def forward(self, X):
        return self.emb(X) + 0 * self.first[0][0]
""", "follows"),
}


def zoo_model(name: str) -> tuple[Any, Any]:
    """DEVICE_ZOO[name]'s model (seeded) and input, both on the CPU."""
    import math

    import torch.nn.functional as F
    from torch import nn

    kind, source, _ = DEVICE_ZOO[name]
    env: dict[str, Any] = {"torch": torch, "nn": nn, "F": F, "math": math}
    exec(source, env)  # noqa: S102 - the zoo's own code
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 8) if kind == "float" else torch.arange(12).reshape(2, 6) % 28
    return env["Model"](), x


def on_device(name: str, device: torch.device) -> str:
    """What DEVICE_ZOO[name] does on `device`: "follows" (it runs and returns tensors there) or "fails"."""
    model, x = zoo_model(name)
    try:
        out = model.to(device)(x.to(device))
    except Exception:  # noqa: BLE001 - a device error, or the numpy() of a GPU tensor
        return "fails"
    outs = [out] if isinstance(out, torch.Tensor) else [t for t in out if isinstance(t, torch.Tensor)]
    return "follows" if all(t.device == x.to(device).device for t in outs) else "fails"


class Recorder:
    """Prints and appends to $OUT/gpu_check.log; appends each result as one JSON line to gpu_check.jsonl."""

    def __init__(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.out, self.log, self.results = out, out / "gpu_check.log", out / "gpu_check.jsonl"
        self.log.write_text("")
        self.results.write_text("")

    def say(self, text: str = "") -> None:
        print(text, flush=True)
        with self.log.open("a") as f:
            f.write(text + "\n")

    def record(self, section: str, **data: Any) -> None:
        with self.results.open("a") as f:
            f.write(json.dumps({"section": section, "time": round(time.time(), 1), **data}, default=str) + "\n")


class Budget:
    """Seconds left of the run; the protocol and its verification keep `reserve` seconds for themselves."""

    def __init__(self, seconds: float, reserve: float) -> None:
        self.end, self.reserve = time.perf_counter() + seconds, reserve

    def left(self) -> float:
        return self.end - time.perf_counter()

    def allows_more(self) -> bool:
        return self.left() > self.reserve


def section(rec: Recorder, name: str, fn: Callable[[], None]) -> bool:
    """Run one section; an error is printed and recorded, and the next section still runs."""
    rec.say(f"\n== {name}")
    began = time.perf_counter()
    try:
        fn()
    except Exception as err:  # noqa: BLE001 - a broken section must not hide the others
        rec.say(f"{name}: FAILED: {type(err).__name__}: {err}")
        rec.record(name, ok=False, error=f"{type(err).__name__}: {err}", traceback=traceback.format_exc()[-3000:])
        return False
    rec.record(name, ok=True, seconds=round(time.perf_counter() - began, 2))
    return True


def rel_gap(a: Sequence[float], b: Sequence[float]) -> float:
    """Largest relative difference between two loss curves of the same length."""
    return max((abs(x - y) / abs(y) for x, y in zip(a, b, strict=True)), default=math.nan)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the sections in order and print what each found (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="CPU only, tiny sizes: checks the code, not speed")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default: $OUT or out/gpu_check)")
    parser.add_argument("--budget-s", type=float, default=290.0, help="stop starting optional work after this")
    parser.add_argument("--curve-steps", type=int, default=200, help="steps of each loss curve")
    parser.add_argument("--speed-steps", type=int, default=300, help="timed steps of each speed run")
    parser.add_argument("--schemes", nargs="+", default=None, help="default: all five (--smoke: rope, alibi)")
    args = parser.parse_args(argv)
    out = args.out or Path(os.environ.get("OUT") or ROOT / "out" / "gpu_check")
    rec = Recorder(out)
    smoke = args.smoke
    cuda = torch.cuda.is_available() and not smoke
    device = torch.device("cuda" if cuda else "cpu")
    curve_steps, speed_steps = (8, 3) if smoke else (args.curve_steps, args.speed_steps)
    budget = Budget(math.inf if smoke else args.budget_s, reserve=150.0)
    facts = {"torch": torch.__version__, "python": sys.version.split()[0], "cuda": cuda, "smoke": smoke,
             "gpu": torch.cuda.get_device_name() if cuda else None, "threads": torch.get_num_threads()}
    rec.say(f"gpu_check: {json.dumps(facts)}; results in {out}")
    rec.record("start", **facts)
    if not cuda and not smoke:
        rec.say("no CUDA device: nothing to measure (run with --smoke for the CPU code path)")
        return 1
    mods: dict[str, Any] = {}

    def imports() -> None:
        from autograder.lesson import ENGINE_ROOT, lesson_named_in

        ms = lesson_named_in(ENGINE_ROOT / "grading_config.yaml").plugin
        from benchmarks import milestone_speed as speed
        from reference.lesson83 import TinyCharLM

        lm = ms.LESSON.trainer
        mods.update(lm=lm, ms=ms, speed=speed, model=TinyCharLM)
        absent = [name for name in ("pydantic", "nbformat", "otter") if name in sys.modules]
        rec.say(f"imports ok (the milestone path imported none of pydantic, nbformat, otter: {not absent})")
        for pos in args.schemes or (["rope", "alibi"] if smoke else lm.SCHEMES):
            info: dict[str, Any] = {}
            _, history = lm.train(TinyCharLM, pos, steps=lm.GRAPH_WARMUP + 2, batch_size=4 if smoke else 64,
                                  context=32 if smoke else 128, device=device, progress=False, info=info)
            ok = all(math.isfinite(h) for h in history)
            rec.say(f"  {pos:<10} {lm.GRAPH_WARMUP + 2} steps: loss {history[-1]:.3f} finite={ok} "
                    f"graph={info['graph']} {info['note']}")
            rec.record("first_steps", scheme=pos, loss=history, graph=info["graph"], note=info["note"])

        class Syncing(TinyCharLM):  # reads a value back inside forward: cannot be captured as a CUDA graph
            def forward(self, X: torch.Tensor) -> torch.Tensor:
                logits = super().forward(X)
                return logits if logits.abs().max().item() >= 0 else -logits

        info = {}
        _, history = lm.train(Syncing, "rope", steps=lm.GRAPH_WARMUP + 2, batch_size=4, context=32, device=device,
                              progress=False, info=info)
        rec.say(f"  a model that syncs in forward: graph={info['graph']}, loss {history[-1]:.3f}; note: "
                f"{info['note'] or '-'}")
        rec.record("fallback", graph=info["graph"], note=info["note"], loss=history)

    if not section(rec, "imports and first steps", imports):
        return 1
    lm, ms, speed, model_cls = mods["lm"], mods["ms"], mods["speed"], mods["model"]
    schemes = args.schemes or (["rope", "alibi"] if smoke else list(lm.SCHEMES))  # smoke: the code, not all five
    quick, full = lm.PRESETS["quick"], lm.PRESETS["full"]

    def curves() -> None:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        shapes = {"batch_size": 4 if smoke else quick["batch_size"], "context": 32 if smoke else quick["context"],
                  "lr": quick["lr"], "steps": curve_steps, "report_every": max(1, curve_steps // 8),
                  "progress": False}
        no_cudnn = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
        variants: dict[str, Callable[[str], tuple[list[float], dict[str, Any]]]] = {}

        def run(pos: str, **kw: Any) -> tuple[list[float], dict[str, Any]]:
            info: dict[str, Any] = {}
            _, history = lm.train(model_cls, pos, device=device, info=info, **shapes, **kw)
            return history, info

        def without_cudnn(pos: str) -> tuple[list[float], dict[str, Any]]:
            with sdpa_kernel(no_cudnn):
                return run(pos, graph=True)

        variants = {"graphed-bf16": lambda pos: run(pos, graph=True), "graphed-bf16-no-cudnn": without_cudnn,
                    "eager-bf16": lambda pos: run(pos, graph=False),
                    "graphed-tf32": lambda pos: run(pos, graph=True, precision="tf32")}
        rec.say(f"{curve_steps} steps, batch {shapes['batch_size']}, context {shapes['context']}, lr {quick['lr']}; "
                f"mean loss per {shapes['report_every']} steps; gap = largest relative difference to the CPU")
        for pos in schemes:
            if not budget.allows_more():
                rec.say(f"  {pos}: skipped (time budget kept for the protocol)")
                continue
            info: dict[str, Any] = {}
            _, cpu = lm.train(model_cls, pos, device="cpu", info=info, **shapes)
            rec.say(f"  {pos:<10} cpu fp32              " + " ".join(f"{v:.3f}" for v in cpu))
            rows = {"cpu": cpu}
            for name, fn in variants.items():
                history, info = fn(pos)
                rows[name] = history
                eager = "" if info["graph"] or smoke or name.startswith("eager") else f" (eager: {info['note']})"
                rec.say(f"  {'':<10} {device.type} {name:<22}" + " ".join(f"{v:.3f}" for v in history)
                        + f"   gap {rel_gap(history, cpu):.2%}{eager}")
            rec.record("curve", scheme=pos, curves=rows, gaps={k: rel_gap(v, cpu) for k, v in rows.items()})

    def speeds() -> None:
        shapes = {"batch_size": 4 if smoke else full["batch_size"], "context": 32 if smoke else full["context"]}
        impls = {"trainer": speed.trainer_seconds,
                 "graphed": lambda pos, **kw: speed.trainer_seconds(pos, graph=True, **kw),
                 "simple": speed.straightforward_train}
        rec.say(f"steps/s over {speed_steps} steps (set-up excluded), batch {shapes['batch_size']}, context "
                f"{shapes['context']}; simple = textbook loop (explicit softmax, host batches, loss read every step)")
        rec.say(f"  {'scheme':<10} {'trainer':>9} {'graphed':>9} {'simple':>9}   "
                "graphed/simple trainer/simple graphed/trainer")
        ratios: dict[str, list[float]] = {"graphed/simple": [], "trainer/simple": [], "graphed/trainer": []}
        for pos in schemes:
            if not budget.allows_more():
                rec.say(f"  {pos}: skipped (time budget kept for the protocol)")
                continue
            rates = {}
            for name, fn in impls.items():
                fn(pos, steps=3, device=device, **shapes)  # warm-up
                rates[name] = speed_steps / fn(pos, steps=speed_steps, device=device, **shapes)
            mine = {"graphed/simple": rates["graphed"] / rates["simple"],
                    "trainer/simple": rates["trainer"] / rates["simple"],
                    "graphed/trainer": rates["graphed"] / rates["trainer"]}
            for k, v in mine.items():
                ratios[k].append(v)
            rec.say(f"  {pos:<10} {rates['trainer']:9.1f} {rates['graphed']:9.1f} {rates['simple']:9.1f}   "
                    + " ".join(f"{v:13.2f}x" for v in mine.values()))
            rec.record("speed", scheme=pos, steps_per_s=rates, ratios=mine)
        if all(ratios.values()):
            geo = {k: math.exp(sum(map(math.log, v)) / len(v)) for k, v in ratios.items()}
            rec.say("  geometric mean: " + "  ".join(f"{k} {v:.2f}x" for k, v in geo.items()))
            rec.record("speed_summary", geometric_mean=geo)

    def kernels() -> None:
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        shapes = {"batch_size": 4 if smoke else full["batch_size"], "context": 32 if smoke else full["context"]}
        launches = {"cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx",
                    "cudaGraphLaunch", "cuGraphLaunch"}

        def count(pos: str, steps: int, graph: bool) -> tuple[int, int]:
            with profile(activities=activities) as prof:
                lm.train(model_cls, pos, steps=steps, device=device, progress=False, graph=graph, **shapes)
            events = prof.events()
            gpu = sum(1 for e in events if e.device_type == DeviceType.CUDA)
            host = sum(1 for e in events if e.name in launches) if cuda else \
                sum(1 for e in events if e.name.startswith("aten::"))
            return gpu, host

        lo, hi = (4, 6) if smoke else (8, 24)
        what = "GPU activities and host launch calls" if cuda else "(CPU: aten ops)"
        rec.say(f"per step, from the difference of {hi}- and {lo}-step runs: {what}")
        for pos in schemes:
            if not budget.allows_more():
                rec.say(f"  {pos}: skipped (time budget kept for the protocol)")
                continue
            row = {}
            for graph in (False, True):
                (g1, h1), (g2, h2) = count(pos, lo, graph), count(pos, hi, graph)
                row["graphed" if graph else "eager"] = {"gpu": (g2 - g1) / (hi - lo), "host": (h2 - h1) / (hi - lo)}
            rec.say(f"  {pos:<10} " + "  ".join(f"{k}: {v['gpu']:.0f} on the GPU, {v['host']:.1f} launches"
                                                 for k, v in row.items()))
            rec.record("kernels", scheme=pos, per_step=row)

    def protocol() -> None:
        folder = out / "full"
        argv = [sys.executable, "-m", "autograder.checkpoint", "--preset", "full", "--device", device.type,
                "--out", str(folder)] + (["--smoke"] if smoke else [])
        rec.say("fresh process: " + " ".join(argv[1:]))
        began = time.perf_counter()
        proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True,
                              timeout=max(150.0, budget.left() - 20) if not smoke else 300)
        seconds = time.perf_counter() - began
        for line in proc.stdout.replace("\r", "\n").splitlines():
            if line.strip() and "[" not in line:  # the table and the totals, not the progress bars
                rec.say("  " + line)
        rec.say(f"  exit {proc.returncode}, {seconds:.1f} s from a fresh process (goal on one H200: under 60 s)")
        rec.record("protocol", seconds=seconds, returncode=proc.returncode, stderr=proc.stderr[-2000:],
                   table=json.loads((folder / "milestone.json").read_text()) if proc.returncode == 0 else None)
        if proc.returncode:
            raise RuntimeError(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed")

    def verify() -> None:
        folder = out / "full"
        result = ms.verify_checkpoint(folder / "milestone.pt", folder / "milestone.json",
                                      max_windows=20 if smoke else None)
        rec.say(f"grader's CPU re-verification: {result['message']}, preset {result['preset']}, "
                f"{result.get('seconds', 0):.1f} s")
        for pos, row in result["schemes"].items():
            ppl = "/".join(f"{row['ppl'][c]:.2f}" for c in sorted(row["ppl"])) or "-"
            bounds = ", ".join(f"{b:g} at {c}" for c, b in row["thresholds"].items()) or "-"
            rec.say(f"  {pos:<10} re-evaluated {ppl}  bounds {bounds}  {'PASS' if row['passed'] else 'FAIL'}: "
                    f"{row['message']}")
        rec.record("verify", result=result)

    def device_trace() -> None:
        from autograder.lesson import ENGINE_ROOT, lesson_named_in

        trace = lesson_named_in(ENGINE_ROOT / "grading_config.yaml").runtime_copies["torch_trace"]
        wrong = []
        for name, (_, _, expected) in DEVICE_ZOO.items():
            model, x = zoo_model(name)
            try:
                decided = "fails" if trace.trace_on_cpu(model, x) else "follows"
            except Exception as err:  # noqa: BLE001 - the trace decided nothing
                decided = f"undecided ({type(err).__name__})"
            real = on_device(name, device) if cuda else None
            truth = real or expected
            if decided != truth:
                wrong.append(name)
            rec.say(f"  {name:<50} trace: {decided:<10} {device.type if cuda else 'expected'}: {truth}"
                    f"{'' if decided == truth else '   MISMATCH'}")
            rec.record("device_trace", case=name, trace=decided, gpu=real, expected=expected)
        rec.say(f"  {len(DEVICE_ZOO) - len(wrong)} of {len(DEVICE_ZOO)} decisions match "
                f"{'the GPU' if cuda else 'the outcomes the zoo expects on a GPU (no GPU here)'}")
        if wrong:
            raise AssertionError(f"the trace's decision differs for: {', '.join(wrong)}")

    section(rec, "loss curves: CUDA against CPU", curves)
    section(rec, "training speed", speeds)
    section(rec, "kernels per step", kernels)
    if section(rec, "full protocol", protocol):
        section(rec, "checkpoint verification", verify)
    section(rec, "device trace against the device", device_trace)
    rec.say(f"\ndone; results in {rec.results} and {rec.log}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
