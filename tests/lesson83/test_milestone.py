"""Tests of the milestone: TinyCharLM's structure, the data, training, checkpoints and verification."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pickle
import random
import re
import resource
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from statistics import NormalDist
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from autograder.config import ROOT
from autograder.course import Course, course_of
from autograder.model import Status
from helpers.milestone import other_weights, zip_bomb
from reference.lesson83 import TinyCharLM, apply_rope, rope_cache, sinusoidal_pe
from reference.lesson83_mistakes import MISTAKES

ms = course_of().lesson.plugin  # the milestone plug-in: assignments/lesson83/lesson83_checkpoint.py

CHECKPOINT = ROOT / "reference" / "lesson83_checkpoint"  # a quick-preset run of the reference, committed
lm = ms.LESSON.trainer  # lesson83_milestone
QUICK = lm.PRESETS["quick"]


def rules(**thresholds: dict[int, float]) -> Any:
    """The configured milestone rules (the plug-in's MilestoneRules) with the quick preset's thresholds replaced."""
    base = course_of().suite.milestone_rules
    quick = dataclasses.replace(base.presets["quick"], thresholds=thresholds)
    return dataclasses.replace(base, presets={**base.presets, "quick": quick})


def model_with_large_weights(pos: str, seed: int = 0) -> TinyCharLM:
    """A TinyCharLM whose weights are large enough that logits are O(1) and positions matter."""
    torch.manual_seed(seed)
    model = TinyCharLM(pos=pos, **lm.ARCH).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(std=1.0 if "emb" in name else 0.15)
    return model


def tokens_without_unk(*shape: int) -> torch.Tensor:
    return torch.randint(1, len(lm.VOCAB), shape, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("pos", lm.SCHEMES)
def test_output_shape(pos: str) -> None:
    logits = model_with_large_weights(pos)(tokens_without_unk(3, 50))
    assert logits.shape == (3, 50, len(lm.VOCAB))


@pytest.mark.parametrize("pos", lm.SCHEMES)
def test_causal(pos: str) -> None:
    model, X = model_with_large_weights(pos), tokens_without_unk(2, 96)
    Y = X.clone()
    Y[:, 60:] = (Y[:, 60:] % 27) + 1  # change every token from position 60 on
    with torch.no_grad():
        a, b = model(X), model(Y)
    torch.testing.assert_close(a[:, :60], b[:, :60], atol=1e-5, rtol=1e-5)
    assert (a[:, 60:] - b[:, 60:]).abs().amax() > 0.1


@pytest.mark.parametrize("pos", lm.SCHEMES)
def test_prefix_of_long_input(pos: str) -> None:
    model, X = model_with_large_weights(pos), tokens_without_unk(2, 512)
    with torch.no_grad():
        torch.testing.assert_close(model(X)[:, :128], model(X[:, :128]), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("pos", lm.SCHEMES)
def test_output_head_is_tied(pos: str) -> None:
    model, X = model_with_large_weights(pos), tokens_without_unk(2, 40)  # token 0 never in the input
    with torch.no_grad():
        before = model(X)
        model.token_emb.weight[0] += 1.0
        after = model(X)
    assert (after[..., 0] - before[..., 0]).abs().amin() > 1e-3
    torch.testing.assert_close(after[..., 1:], before[..., 1:])
    assert all(p.shape[0] != len(lm.VOCAB) for n, p in model.named_parameters() if n != "token_emb.weight")


def test_sinusoidal_table_is_a_buffer() -> None:
    model = TinyCharLM(pos="sinusoidal", **lm.ARCH)
    assert "pe" in dict(model.named_buffers()) and "pe" not in dict(model.named_parameters())
    expected = torch.tensor(sinusoidal_pe(lm.ARCH["max_len"], lm.ARCH["num_hiddens"]), dtype=torch.float32)
    torch.testing.assert_close(model.state_dict()["pe"], expected)


def test_parameters_and_state_dict_names() -> None:
    keys = {pos: set(TinyCharLM(pos=pos, **lm.ARCH).state_dict()) for pos in lm.SCHEMES}
    params = {pos: {n: p.shape for n, p in TinyCharLM(pos=pos, **lm.ARCH).named_parameters()}
              for pos in lm.SCHEMES}
    blocks = {f"blks.{i}.{m}.weight" for i in range(2) for m in ("qkv", "proj")}
    assert keys["none"] == {"token_emb.weight"} | blocks
    assert keys["rope"] == keys["alibi"] == keys["none"]
    assert params["rope"] == params["alibi"] == params["none"] == params["sinusoidal"]
    assert keys["sinusoidal"] == keys["none"] | {"pe"}
    assert keys["learned"] == keys["none"] | {"pos_emb.weight"}
    assert params["learned"]["pos_emb.weight"] == (lm.ARCH["max_len"], lm.ARCH["num_hiddens"])


def test_values_are_not_rotated() -> None:
    # With q = k = 0 every score is 0, so RoPE can only change the output through v.
    none = model_with_large_weights("none")
    rope = TinyCharLM(pos="rope", **lm.ARCH).eval()
    rope.load_state_dict(none.state_dict())
    d = lm.ARCH["num_hiddens"]
    with torch.no_grad():
        for model in (none, rope):
            for blk in model.blks:
                blk["qkv"].weight[: 2 * d] = 0.0
        X = tokens_without_unk(2, 64)
        torch.testing.assert_close(rope(X), none(X))


def test_corpus_vocab_and_windows() -> None:
    tokens = lm.corpus_tokens()
    assert len(tokens) == 173_428 and len(lm.VOCAB) == 28
    assert lm.VOCAB[:3] == ("<unk>", " ", "a") and tokens.min() >= 1 and tokens.max() == 27
    assert "".join(lm.VOCAB[i] for i in tokens[:16]) == "the time machine"
    X, Y = lm.windows(tokens, torch.tensor([5, 100_000]), 128)
    assert X.shape == Y.shape == (2, 128)
    assert torch.equal(X[1], tokens[100_000:100_128]) and torch.equal(Y[1], tokens[100_001:100_129])
    assert torch.equal(lm.val_starts(max_windows=300), 100_000 + 10 * torch.arange(300))
    assert torch.equal(lm.val_starts(), torch.arange(100_000, 103_000))


def test_preprocess() -> None:
    assert lm.preprocess("It's 1895--The Time\nMachine!") == "it s the time machine "


def test_corpus_hash_mismatch_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "timemachine.txt"
    bad.write_bytes(lm.data_path().read_bytes().replace(b"Time Traveller", b"Time Traveler", 1))
    with pytest.raises(ValueError, match="timemachine.txt.*sha256"):
        lm.load_corpus(path=bad)


def test_batch_starts_are_seeded_shuffles() -> None:
    a = lm.batch_starts(steps=3000, batch_size=64, seed=0)
    assert a.shape == (3000, 64) and 0 <= a.min() and a.max() < lm.NUM_TRAIN
    assert len(a.flatten()[: lm.NUM_TRAIN].unique()) == lm.NUM_TRAIN  # the first epoch is a permutation
    assert torch.equal(a, lm.batch_starts(steps=3000, batch_size=64, seed=0))
    assert not torch.equal(a, lm.batch_starts(steps=3000, batch_size=64, seed=1))


@pytest.mark.training
def test_quick_training_lowers_the_loss() -> None:
    _, history = lm.train(TinyCharLM, "rope", steps=40, batch_size=QUICK["batch_size"], context=QUICK["context"],
                          lr=QUICK["lr"], seed=0, device="cpu", progress=False, report_every=10)
    assert len(history) == 4
    assert history[-1] < history[0] - 0.2 and history[-1] < 3.0


@pytest.mark.training
def test_training_is_deterministic() -> None:
    def weights(seed: int) -> dict[str, torch.Tensor]:
        model, _ = lm.train(TinyCharLM, "learned", steps=4, batch_size=8, context=32, seed=seed, device="cpu",
                            progress=False)
        return model.state_dict()

    a, b, c = weights(0), weights(0), weights(1)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["pos_emb.weight"], c["pos_emb.weight"])


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A checkpoint of two briefly trained schemes, its table measured on 20 validation windows."""
    folder = tmp_path_factory.mktemp("tiny")
    models = {pos: lm.train(TinyCharLM, pos, steps=10, batch_size=8, context=64, device="cpu", progress=False)[0]
              for pos in ("rope", "alibi")}
    table = {pos: lm.evaluate_ppl(m, max_windows=20) for pos, m in models.items()}
    lm.save_checkpoint(models, table, preset="quick", pt_path=folder / "milestone.pt",
                       json_path=folder / "milestone.json")
    return folder / "milestone.pt", folder / "milestone.json"


@pytest.mark.training
def test_checkpoint_round_trip(tiny_checkpoint: tuple[Path, Path]) -> None:
    pt, js = tiny_checkpoint
    config, state_dicts = ms.load_checkpoint(pt)
    assert config["preset"] == "quick" and config["vocab"] == list(lm.VOCAB) and config["arch"] == lm.ARCH
    assert set(state_dicts) == {"rope", "alibi"}
    model = ms.build_model("rope", state_dicts["rope"])
    assert all(torch.equal(v, state_dicts["rope"][k]) for k, v in model.state_dict().items())
    assert json.loads(js.read_text())["preset"] == "quick"


@pytest.mark.training
@pytest.mark.sandbox
def test_verify_tiny_checkpoint(tiny_checkpoint: tuple[Path, Path], tmp_path: Path) -> None:
    pt, js = tiny_checkpoint
    strict = rules(alibi={128: 1.0})
    result = ms.verify_checkpoint(pt, js, schemes=("rope", "alibi"), rules=strict, max_windows=20)
    assert result["ok"] and result["preset"] == "quick"
    rope, alibi = result["schemes"]["rope"], result["schemes"]["alibi"]
    assert rope["passed"] and max(rope["rel_diff"].values()) < 1e-4
    assert alibi["agrees"] and not alibi["meets_thresholds"] and not alibi["passed"]
    assert "above the quick preset's bound 1" in alibi["message"]
    json.dumps(result)  # plain data

    claims = json.loads(js.read_text())  # every window of rope at 512 claimed 0.05 nats lower, consistently
    claims["window_loss"]["rope"]["512"] = [v - 0.05 for v in claims["window_loss"]["rope"]["512"]]
    claims["ppl"]["rope"]["512"] = lm.ppl_from_windows({512: claims["window_loss"]["rope"]["512"]})[512]
    (tmp_path / "milestone.json").write_text(json.dumps(claims))
    result = ms.verify_checkpoint(pt, (tmp_path / "milestone.json").read_bytes(), schemes=("rope",),
                                  rules=rules(), max_windows=20)
    assert not result["schemes"]["rope"]["agrees"] and result["schemes"]["rope"]["rel_diff"][512] > 0.04
    assert "same run" in result["schemes"]["rope"]["message"]
    assert result["schemes"]["rope"]["problem"] == "checkpoint_claims_disagree" and alibi["problem"] == \
        "checkpoint_above_bound" and rope["problem"] is None

    other = rules()
    other = dataclasses.replace(other, presets={"full": other.presets["quick"]})
    result = ms.verify_checkpoint(pt.read_bytes(), js, schemes=("rope",), rules=other, max_windows=20)
    assert not result["ok"] and "preset 'quick' earns no points" in result["message"]


def test_missing_checkpoint_says_what_to_upload(tmp_path: Path) -> None:
    result = ms.verify_checkpoint(tmp_path / "milestone.pt", tmp_path / "milestone.json")
    assert not result["ok"] and ms.verify_checkpoint(None, None)["message"] == result["message"]
    assert not result["ok"] and not any(r["passed"] for r in result["schemes"].values())
    assert "milestone.pt" in result["message"] and "Upload" in result["message"]


UNPICKLED = []


def _record_unpickling() -> str:
    UNPICKLED.append(True)
    return "payload"


class Payload:
    """An object whose unpickling would run code."""

    def __reduce__(self):
        return (_record_unpickling, ())


@pytest.mark.training
@pytest.mark.sandbox
def test_arbitrary_pickled_object_is_refused(tiny_checkpoint: tuple[Path, Path], tmp_path: Path) -> None:
    pt, js = tiny_checkpoint
    ckpt = torch.load(pt, weights_only=True)
    ckpt["config"]["note"] = Payload()
    torch.save(ckpt, tmp_path / "milestone.pt")
    with pytest.raises(pickle.UnpicklingError):
        ms.load_checkpoint(tmp_path / "milestone.pt")
    result = ms.verify_checkpoint(tmp_path / "milestone.pt", js)
    assert not result["ok"] and "plain weights" in result["message"]
    assert not UNPICKLED


@pytest.mark.training
@pytest.mark.sandbox
def test_wrong_weights_fail_only_their_scheme(tiny_checkpoint: tuple[Path, Path], tmp_path: Path) -> None:
    pt, js = tiny_checkpoint
    ckpt = torch.load(pt, weights_only=True)
    ckpt["state_dicts"]["alibi"]["pos_emb.weight"] = torch.zeros(512, 128)  # an unexpected key
    torch.save(ckpt, tmp_path / "milestone.pt")
    result = ms.verify_checkpoint(tmp_path / "milestone.pt", js, schemes=("alibi", "none"), max_windows=20)
    assert result["ok"]
    assert "do not fit" in result["schemes"]["alibi"]["message"]
    assert "no weights for 'none'" in result["schemes"]["none"]["message"]
    assert not result["schemes"]["alibi"]["passed"] and not result["schemes"]["none"]["passed"]


@pytest.mark.sandbox
def test_committed_quick_checkpoint_verifies() -> None:
    result = ms.verify_checkpoint(CHECKPOINT / "milestone.pt", CHECKPOINT / "milestone.json")
    assert result["ok"] and result["preset"] == "quick"
    rows = result["schemes"]
    assert all(r["passed"] for r in rows.values()), result
    for flat in ("alibi", "none"):  # no absolute positions: as good at 512 as at 128
        assert rows[flat]["ppl"][512] < 1.1 * rows[flat]["ppl"][128]
    for pos in ("learned", "sinusoidal"):  # absolute tables degrade beyond the training length
        assert rows[pos]["ppl"][512] > 1.3 * rows[pos]["ppl"][128]
    assert min(rows, key=lambda p: rows[p]["ppl"][128]) == "rope"  # the best at the training length


def test_plot(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = lm.plot_table({"rope": {128: 5.0, 256: 9.0, 512: 30.0}}, path=tmp_path / "ppl.png")
    assert path is not None and path.read_bytes()[:4] == b"\x89PNG"


def test_model_rejects_unknown_scheme() -> None:
    with pytest.raises(ValueError, match="pos must be one of"):
        TinyCharLM(pos="relative", **{k: v for k, v in lm.ARCH.items()})
    assert isinstance(TinyCharLM(pos="none", vocab_size=28).token_emb, nn.Embedding)


@pytest.mark.training
def test_train_or_load_reuses_a_saved_run(tiny_checkpoint: tuple[Path, Path], capsys: pytest.CaptureFixture,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    pt, js = tiny_checkpoint
    monkeypatch.setattr(lm, "run_milestone", lambda *a, **k: pytest.fail("trained instead of loading"))
    models, table = lm.train_or_load(TinyCharLM, "quick", pt_path=pt, json_path=js)
    assert "loaded" in capsys.readouterr().out and set(models) == {"rope", "alibi"}
    saved = json.loads(js.read_text())["ppl"]
    assert table == {pos: {int(c): v for c, v in row.items()} for pos, row in saved.items()}
    _, state_dicts = ms.load_checkpoint(pt)
    assert all(torch.equal(v, state_dicts["rope"][k]) for k, v in models["rope"].state_dict().items())

    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")  # nbgrader runs every cell: never train there
    assert lm.train_or_load(TinyCharLM, "full", pt_path=pt, json_path=js) == ({}, {})
    assert lm.plot_table({}) is None


# --------------------------------------------------------------------------- a bare PyTorch image

BLOCKED = ("pydantic", "pydantic_core", "nbformat", "nbclient", "nbgrader", "otter", "IPython", "ipykernel")
BLOCKER = f'''
import sys
BLOCKED = {BLOCKED!r}
class _Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{{name}} is not installed on the device image (blocked by the test)")
        return None
sys.meta_path.insert(0, _Blocker())
'''


def image_env(tmp_path: Path) -> dict[str, str]:
    """An environment whose Python cannot import what the GPU image lacks (a sitecustomize blocker)."""
    (tmp_path / "blocker").mkdir(exist_ok=True)
    (tmp_path / "blocker" / "sitecustomize.py").write_text(BLOCKER)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "blocker"), str(ROOT)])}


def test_the_milestone_schema_is_written_once() -> None:
    """The engine's config declares only the milestone's points; the rest of the section is the plug-in's, parsed
    by its parse_rules for the grader and by load_rules (PyYAML alone) on a GPU image: the same rules."""
    from autograder.config import Milestone

    assert set(Milestone.model_fields) == {"points"}
    parsed = course_of().suite.milestone_rules
    assert isinstance(parsed, ms.MilestoneRules) and parsed == ms.load_rules() and parsed.presets


@pytest.mark.parametrize(("section", "words"), [
    ({"points": 8, "rel_tol": 0.02, "surplus": 1}, "milestone.surplus: unknown key"),
    ({"rel_tol": 0}, "milestone.rel_tol"),
    ({"verify_windows": 3001}, "milestone.verify_windows"),
    ({"verify_windows": True}, "milestone.verify_windows"),
    ({"sample_windows": 0}, "milestone.sample_windows"),
    ({"window_tol": 0}, "milestone.window_tol"),
    ({"deficit_audit": -1}, "milestone.deficit_audit"),
    ({"presets": {"quick": {"thresholds": {"relative": {128: 1.0}}}}}, "unknown scheme 'relative'"),
    ({"presets": {"quick": {"thresholds": {"rope": {1024: 1.0}}}}}, "context 1024 is not measured"),
    ({"presets": {"quick": {"credit": 1.5}}}, "milestone.presets.quick.credit"),
    ({"presets": ["quick"]}, "milestone.presets: expected a mapping"),
])
def test_rules_reader_rejects_what_the_schema_rejects(section: dict, words: str) -> None:
    with pytest.raises(ms.RulesError, match=re.escape(words)):
        ms.parse_rules(section)


@pytest.mark.training
@pytest.mark.sandbox
def test_training_and_verification_run_without_pydantic(tmp_path: Path) -> None:
    env = image_env(tmp_path)
    blocked = subprocess.run([sys.executable, "-c", "import pydantic"], env=env, capture_output=True, text=True)
    assert blocked.returncode != 0 and "blocked by the test" in blocked.stderr
    script = f'''
from pathlib import Path
from autograder.lesson import ENGINE_ROOT, lesson_named_in
lm = lesson_named_in(ENGINE_ROOT / "grading_config.yaml").trainer  # no pydantic: the config is not parsed here
from reference.lesson83 import TinyCharLM
out = Path({str(tmp_path)!r})
info = {{}}
model, history = lm.train(TinyCharLM, "rope", steps=3, batch_size=4, context=32, device="cpu", progress=False,
                          graph=True, info=info)
table = {{"rope": lm.evaluate_ppl(model, max_windows=5)}}
lm.save_checkpoint({{"rope": model}}, table, preset="quick", pt_path=out / "milestone.pt",
                   json_path=out / "milestone.json")
print("trained", len(history), info["graph"])
'''
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0 and "trained 1 False" in run.stdout, run.stderr[-2000:]
    verify = subprocess.run([sys.executable, "-m", "autograder.checkpoint", "--verify", "--out", str(tmp_path)],
                            env=env, capture_output=True, text=True, cwd=tmp_path)
    assert verify.returncode == 1, verify.stderr[-2000:]  # only one scheme was trained
    result = json.loads(verify.stdout)
    assert result["ok"] and result["schemes"]["rope"]["ppl"] and result["schemes"]["rope"]["problem"] in (
        None, "checkpoint_claims_disagree", "checkpoint_above_bound")  # 300 windows here, 5 in the table
    assert result["schemes"]["none"]["problem"] == "checkpoint_wrong_weights"


MILESTONE_FILES = ["assignments/lesson83/lesson83_milestone.py", "assignments/lesson83/lesson83_checkpoint.py",
                   "autograder/checkpoint.py", "autograder/lesson.py",
                   "assignments/lesson83/lesson83_checks.py",
                   "reference/lesson83.py", "benchmarks/gpu_check.py", "benchmarks/milestone_speed.py"]


def test_milestone_code_compiles_under_python_312(tmp_path: Path) -> None:
    found = subprocess.run(["pyenv", "which", "python"], env={**os.environ, "PYENV_VERSION": "3.12.1"},
                           capture_output=True, text=True) if shutil.which("pyenv") else None
    python = found.stdout.strip() if found and found.returncode == 0 else shutil.which("python3.12")
    if not python:
        pytest.skip("no Python 3.12 here (pyenv 3.12.1 or python3.12): cannot check the GPU image's Python")
    for rel in MILESTONE_FILES:
        done = subprocess.run([python, "-m", "py_compile", str(ROOT / rel)], capture_output=True, text=True,
                              env={**os.environ, "PYTHONPYCACHEPREFIX": str(tmp_path)})
        assert done.returncode == 0, f"{rel}: {done.stderr}"


# --------------------------------------------------------------------------- the graphed step and devices


@pytest.mark.training
def test_graphed_step_body_computes_what_train_computes() -> None:
    kw = {"steps": 8, "batch_size": 8, "context": 32, "lr": 3e-3, "seed": 0}
    for pos in ("rope", "alibi"):
        _, expected = lm.train(TinyCharLM, pos, device="cpu", progress=False, report_every=1, graph=False, **kw)
        torch.manual_seed(kw["seed"])
        model = TinyCharLM(pos=pos, **lm.ARCH)
        opt = torch.optim.AdamW(model.parameters(), lr=kw["lr"], weight_decay=0.0)
        tokens = lm.corpus_tokens()
        starts = lm.batch_starts(steps=kw["steps"], batch_size=kw["batch_size"], seed=kw["seed"])
        offsets, index, total = torch.arange(kw["context"] + 1), torch.zeros(1, dtype=torch.long), torch.zeros(())
        body = []
        for _ in range(kw["steps"]):
            lm.train_step(model, opt, tokens, starts, offsets, index, total, amp_dtype=None)
            body.append(total.item())
            total.zero_()
        assert index.item() == kw["steps"]
        assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(body, expected, strict=True)), (body, expected)
        info: dict = {}
        _, looped = lm.train(TinyCharLM, pos, device="cpu", progress=False, report_every=1, graph=True, info=info,
                             **kw)
        assert looped == pytest.approx(expected, rel=1e-5) and not info["graph"] and "GPU" in info["note"]


class CpuTablesInForward(TinyCharLM):
    """Builds the RoPE tables on the CPU inside forward: right on a CPU, a crash on a GPU."""

    def attend(self, q, k, v):
        if self.pos == "rope":
            cos, sin = rope_cache(q.shape[-2], self.head_dim)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return super().attend(q, k, v)


@pytest.mark.training
def test_trainer_refuses_a_model_with_cpu_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="register_buffer") as info:
        lm.train(CpuTablesInForward, "rope", steps=2, batch_size=2, context=16, device="cpu", progress=False)
    assert "rope_cache" in str(info.value) and "shape [32, " in str(info.value)
    monkeypatch.setattr(lm, "train", lambda *a, **k: pytest.fail("trained before checking every scheme"))
    with pytest.raises(ValueError, match="pos='rope'"):
        lm.run_milestone(CpuTablesInForward, "quick", progress=False)
    with pytest.raises(ValueError, match="pos='rope'"):
        lm.train_or_load(CpuTablesInForward, "quick", retrain=True)
    lm.check_devices(TinyCharLM, "rope")  # the reference is clean


def _template_lm() -> type[nn.Module]:
    """The student template's TinyCharLM as the student first sees it: its three marked places still `...`."""
    import nbformat

    nb = nbformat.read(str(ROOT / "student_templates" / "lesson83" / "lesson83.ipynb"), as_version=4)
    source = next(c.source for c in nb.cells if c.cell_type == "code" and c.source.startswith("class TinyCharLM"))
    env: dict[str, Any] = {"torch": torch, "nn": nn, "F": F, "math": math}
    exec(compile(source, "template", "exec"), env)  # noqa: S102 - the template's own cell
    return env["TinyCharLM"]


def test_the_training_cell_on_an_unfilled_model_names_the_method_to_fill(tmp_path: Path) -> None:
    """Issue 42, item 7: the training cell run before TinyCharLM is filled says which stub to fill (not a raw
    TypeError from the first forward pass); the reference passes the same check untouched."""
    blank = _template_lm()
    with pytest.raises(NotImplementedError, match=r"TinyCharLM\.add_positions still returns `\.\.\.`") as info:
        lm.train_or_load(blank, "quick", retrain=True, pt_path=tmp_path / "m.pt", json_path=tmp_path / "m.json")
    assert "fill the three marked places" in str(info.value) and info.value.__cause__ is None

    class HalfFilled(blank):  # type: ignore[misc, valid-type]
        def add_positions(self, H: torch.Tensor) -> torch.Tensor:
            return H

    with pytest.raises(NotImplementedError, match=r"\.attend still returns `\.\.\.`"):
        lm.run_milestone(HalfFilled, "quick", progress=False)
    assert not (tmp_path / "m.pt").exists()
    lm.check_filled(TinyCharLM, "rope")  # the reference is filled


# --------------------------------------------------------------------------- hostile uploads


@pytest.mark.parametrize("claims", [
    {"preset": "quick", "ppl": {"rope": {"128": 0, "256": 0, "512": 0}}},
    {"preset": "quick", "ppl": {"rope": {"128": -5.0, "256": -5.0, "512": -5.0}}},
    {"preset": "quick", "ppl": {"rope": {"128": True, "256": 1, "512": 1}}},
    {"preset": "quick", "ppl": {"rope": {"128": "5", "256": "5", "512": "5"}}},
    {"preset": "quick", "ppl": {"rope": [5, 5, 5]}},
    {"preset": "quick", "ppl": [1, 2]},
    {"preset": ["quick"], "ppl": {}},
    {"preset": {"a": 1}, "ppl": {}},
    [1, 2, 3],
    "quick",
])
@pytest.mark.training
@pytest.mark.sandbox
def test_hostile_claims_give_a_verdict(tiny_checkpoint: tuple[Path, Path], claims: object) -> None:
    pt, _ = tiny_checkpoint
    result = ms.verify_checkpoint(pt, json.dumps(claims).encode(), schemes=("rope",), rules=rules(),
                                  max_windows=20)
    assert not result["schemes"]["rope"]["passed"] and result["schemes"]["rope"]["message"]
    json.dumps(result)


@pytest.mark.parametrize("text", [
    b'{"preset": "quick", "ppl": {"rope": {"128": NaN, "256": NaN, "512": NaN}}}',
    b'{"preset": "quick", "ppl": {"rope": {"128": Infinity, "256": 1e999, "512": -Infinity}}}',
    b'{"preset": "quick", "ppl": {"rope": {"128": 1e400, "256": 1e400, "512": 1e400}}}',
    b'{"preset": "quick", "ppl": {"rope": {"128": ' + b"9" * 5000 + b', "256": 1, "512": 1}}}',
    b"[" * 200_000 + b"]" * 200_000,
    b'{"preset": "quick", "ppl": ' + b'{"a": ' * 200_000 + b"1" + b"}" * 200_000 + b"}",
    b"\xff\xfe not json",
])
@pytest.mark.training
@pytest.mark.sandbox
def test_malformed_claims_give_a_verdict(tiny_checkpoint: tuple[Path, Path], text: bytes) -> None:
    pt, _ = tiny_checkpoint
    result = ms.verify_checkpoint(pt, text, schemes=("rope",), rules=rules(), max_windows=20)
    assert not result["schemes"]["rope"]["passed"]
    assert result["schemes"]["rope"]["problem"] == "checkpoint_unreadable", result



@pytest.mark.sandbox
def test_compressed_checkpoint_is_read_in_a_limited_child(tmp_path: Path) -> None:
    zip_bomb(tmp_path / "milestone.pt", mib=256)
    assert (tmp_path / "milestone.pt").stat().st_size < 4 * 2**20
    claims = json.dumps({"preset": "quick", "ppl": {}}).encode()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = ms.verify_checkpoint(tmp_path / "milestone.pt", claims, schemes=("rope",), rules=rules(),
                                  max_windows=20, memory_mb=96)
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert not result["ok"] and result["problem"] == "checkpoint_unreadable"
    assert "could not be read" in result["message"] and "allocate" in result["message"], result["message"]
    assert grown_mb < 64, f"the grader process grew by {grown_mb:.0f} MB"


@pytest.mark.training
@pytest.mark.sandbox
def test_a_reader_that_runs_too_long_gives_a_verdict(tiny_checkpoint: tuple[Path, Path],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    pt, js = tiny_checkpoint
    monkeypatch.setattr(ms, "_MEASURED", {})
    monkeypatch.setattr(ms, "_CONFIGS", {})
    # 300 windows take seconds; the started verifier's child has 0.5 s
    result = ms.verify_checkpoint(pt, js, schemes=("rope",), rules=rules(), max_windows=300, timeout_s=0.5,
                                  method="prefix")
    assert not result["ok"] and "longer than" in result["message"] and result["problem"] == "checkpoint_unreadable"


@pytest.mark.training
@pytest.mark.sandbox
def test_same_weights_are_evaluated_once(tiny_checkpoint: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    pt, js = tiny_checkpoint
    first = ms.verify_checkpoint(pt, js, schemes=("rope",), rules=rules(), max_windows=20)
    monkeypatch.setattr(ms, "_run_child", lambda *a, **k: pytest.fail("evaluated the same weights again"))
    again = ms.verify_checkpoint(pt.read_bytes(), js, schemes=("rope",), rules=rules(), max_windows=20)
    assert again["schemes"]["rope"]["ppl"] == first["schemes"]["rope"]["ppl"]


# --------------------------------------------------------------------------- training progress


@pytest.mark.training
def test_progress_names_the_scheme_and_the_time_left(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    tiny = {"steps": 4, "batch_size": 2, "context": 16, "lr": 1e-3, "seed": 0, "eval_windows": 2}
    monkeypatch.setitem(lm.PRESETS, "tiny", tiny)
    lm.run_milestone(TinyCharLM, "tiny", schemes=("rope", "alibi"), device="cpu")
    out = capsys.readouterr().out
    for n, pos in enumerate(("rope", "alibi"), 1):
        assert re.search(rf"scheme {n}/2 {pos} \[#{{20}}\] 4/4 loss [\d.]+ [\d,]+ tok/s, about \d+ s left", out), out
        assert f"scheme {n}/2 {pos}: validation perplexity measured in" in out


def test_time_left_counts_the_later_schemes_and_evaluations() -> None:
    # 100 of 1000 steps done at 0.1 s a step, scheme 2 of 5: 900 more steps here and 3 x 1000 in the later schemes.
    assert lm.time_left(done=100, steps=1000, per_step=0.1, stage=(2, 5)) == pytest.approx(390.0)
    assert lm.time_left(done=1000, steps=1000, per_step=0.06, stage=(5, 5), later_s=7.5) == pytest.approx(7.5)
    assert lm.time_left(done=500, steps=1000, per_step=0.1) == pytest.approx(50.0)
    assert [lm.duration(s) for s in (0.4, 59, 390, 3725)] == ["0 s", "59 s", "6 min 30 s", "1 h 02 min"]


# --------------------------------------------------------------------------- verification at class scale


@pytest.mark.parametrize("pos", lm.SCHEMES)
def test_one_pass_gives_every_context(pos: str) -> None:
    """measure_ppl reads 128 and 256 from the prefixes of one 512-token pass: the same as a pass per context."""
    model = ms.build_model(pos, ms.load_checkpoint(CHECKPOINT / "milestone.pt")[1][pos])
    expected = lm.evaluate_ppl(model, batch_size=4, max_windows=6)
    got = ms.measure_ppl(model, tokens=lm.corpus_tokens(), batch_size=4, max_windows=6)
    assert set(got) == set(lm.CONTEXTS)
    assert all(abs(got[c] - expected[c]) <= 1e-5 * expected[c] for c in lm.CONTEXTS), (got, expected)


@pytest.mark.parametrize("pos", lm.SCHEMES)
def test_chunked_attention_gives_the_reference_forward(pos: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The verifier's attention by query chunks (CausalChunks around the reference TinyCharLM, unchanged) gives
    the plain forward's logits up to float rounding, at 512 tokens and at lengths with a short last chunk; at 512
    every block's attention really runs as 8 chunks (ALiBi's mask is recognised as causal)."""
    model = ms.build_model(pos, ms.load_checkpoint(CHECKPOINT / "milestone.pt")[1][pos])
    X, _ = lm.windows(lm.corpus_tokens(), lm.val_starts(max_windows=3), 512)
    queries: list[int] = []
    real = ms._SDPA
    monkeypatch.setattr(ms, "_SDPA", lambda q, *a, **kw: queries.append(q.shape[-2]) or real(q, *a, **kw))
    with torch.inference_mode():
        for length in (512, 200, 64):
            plain = model(X[:, :length])
            queries.clear()
            with ms.CausalChunks():
                chunked = model(X[:, :length])
            torch.testing.assert_close(chunked, plain, rtol=1e-5, atol=1e-5)
            if length == 512:
                assert queries == [ms.CAUSAL_CHUNK] * (2 * 512 // ms.CAUSAL_CHUNK), queries


def test_chunked_attention_leaves_other_attention_alone() -> None:
    """Only causal self-attention is chunked: a mask that lets a query see a later key (even one), a boolean mask,
    or keys of another length go to PyTorch's attention unchanged, so the result is bit for bit the same."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 200, 32, generator=gen) for _ in range(3))
    causal = torch.zeros(200, 200).masked_fill(torch.ones(200, 200, dtype=torch.bool).triu(1), float("-inf"))
    peeks = causal.clone()
    peeks[10, 150] = 0.0  # row 10 may see key 150, past its chunk's end
    for kwargs in ({"attn_mask": peeks}, {"attn_mask": torch.zeros(200, 200)}, {"attn_mask": causal == 0},
                   {}):
        assert torch.equal(ms.chunked_attention(q, k, v, **kwargs), F.scaled_dot_product_attention(q, k, v, **kwargs))
    short = k[..., :100, :], v[..., :100, :]
    assert torch.equal(ms.chunked_attention(q, *short), F.scaled_dot_product_attention(q, *short))
    torch.testing.assert_close(ms.chunked_attention(q, k, v, attn_mask=causal),
                               F.scaled_dot_product_attention(q, k, v, is_causal=True), rtol=1e-5, atol=1e-6)


@pytest.mark.training
@pytest.mark.sandbox
def test_same_weights_asked_twice_at_once_run_one_child(tiny_checkpoint: tuple[Path, Path],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """grade_batch verifies ahead in a thread while the consumer may ask for the same weights: one child."""
    pt, js = tiny_checkpoint
    monkeypatch.setattr(ms, "_MEASURED", {})
    monkeypatch.setattr(ms, "_CONFIGS", {})
    monkeypatch.setattr(ms, "_WINDOWS", {})
    real, calls = ms._run_child, []

    def slow_child(*args: object, **kwargs: object) -> dict:
        calls.append(1)
        time.sleep(1.0)  # long enough for the second thread to arrive while this one runs
        return real(*args, **kwargs)

    monkeypatch.setattr(ms, "_run_child", slow_child)
    with ThreadPoolExecutor(2) as ex:
        no_flags = dataclasses.replace(rules(), deficit_audit=1e-9)  # the drawn windows only: one child
        monkeypatch.setattr(ms, "sample_size", lambda *a, k0, **kw: k0)
        results = list(ex.map(lambda data: ms.verify_checkpoint(data, js, schemes=("rope",), rules=no_flags),
                              (pt, pt.read_bytes())))
    assert len(calls) == 1
    assert results[0]["schemes"]["rope"]["ppl"] == results[1]["schemes"]["rope"]["ppl"]


@pytest.mark.sandbox
def test_an_unreadable_checkpoint_is_read_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hostile file verified ahead costs its child's time once, not again when its run is judged."""
    (tmp_path / "milestone.pt").write_bytes(b"not a checkpoint")
    claims = json.dumps({"preset": "quick", "ppl": {}}).encode()
    first = ms.verify_checkpoint(tmp_path / "milestone.pt", claims, schemes=("rope",), rules=rules())
    monkeypatch.setattr(ms, "_run_child", lambda *a, **k: pytest.fail("read the same bytes again"))
    again = ms.verify_checkpoint(tmp_path / "milestone.pt", claims, schemes=("rope",), rules=rules())
    assert not first["ok"] and again["message"] == first["message"] and "plain weights" in again["message"]


class WaitingPool:
    """A sandbox stand-in whose run returns once the submission's checkpoint is being verified (or after 20 s)."""

    sandbox = "fake"
    isolation = "fake"  # the pool's isolation: neither bubblewrap nor none
    limits_lowered: list[str] = []  # the pool's: none lowered
    verifying = threading.Event()
    waited: list[bool] = []

    def __init__(self, size: int = 1, **_: object) -> None:
        pass

    def run(self, source: bytes, *, probes: list) -> Any:
        from autograder.sandbox import ExecResult

        WaitingPool.waited.append(WaitingPool.verifying.wait(20))
        return ExecResult(Status.GRADED, sandbox="fake")

    def __enter__(self) -> WaitingPool:
        return self

    def __exit__(self, *_: object) -> None:
        pass


@pytest.mark.sandbox
def test_grade_batch_verifies_checkpoints_beside_the_sandboxed_runs(course: Course, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from autograder.grading import batch, runner

    verdict = {"ok": True, "message": "checkpoint loaded", "problem": None, "preset": "quick", "credit": 1.0,
               "seconds": 0.0, "schemes": {pos: {"passed": True, "message": "ok"} for pos in lm.SCHEMES}}

    def verify(*args: object, **kwargs: object) -> dict:
        WaitingPool.verifying.set()
        return verdict

    monkeypatch.setattr(runner, "WorkerPool", WaitingPool)
    monkeypatch.setattr(ms, "verify_checkpoint", verify)
    WaitingPool.verifying.clear()
    WaitingPool.waited.clear()
    student = tmp_path / "subs" / "ada"
    student.mkdir(parents=True)
    (student / "lesson83.ipynb").write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4,
                                                         "nbformat_minor": 5}))
    for name in ("milestone.pt", "milestone.json"):
        shutil.copy(CHECKPOINT / name, student / name)
    summary = batch.grade_batch(tmp_path / "subs", out=tmp_path / "out", progress=False, course=course)
    assert WaitingPool.waited == [True], "the checkpoint was verified only after its sandboxed run"
    assert [r["m1_checkpoint"] for r in summary.rows] == [course_of().config.milestone.points]


@pytest.mark.sandbox
def test_committed_checkpoints_keep_their_verdicts_at_the_configured_windows() -> None:
    """100 windows in one pass (grading_config.yaml): the reference still agrees with room to spare, and the
    sample class's inflated claims (x 0.9) still disagree."""
    config = course_of().suite.milestone_rules
    claims = json.loads((CHECKPOINT / "milestone.json").read_text())
    result = ms.verify_checkpoint(CHECKPOINT / "milestone.pt", CHECKPOINT / "milestone.json", rules=config)
    assert all(r["passed"] and max(r["rel_diff"].values()) < config.rel_tol / 2 for r in result["schemes"].values())
    inflated = claims | {"ppl": {p: {c: v * 0.9 for c, v in row.items()} for p, row in claims["ppl"].items()}}
    result = ms.verify_checkpoint(CHECKPOINT / "milestone.pt", json.dumps(inflated).encode(), rules=config)
    assert {r["problem"] for r in result["schemes"].values()} == {"checkpoint_claims_disagree"}


@pytest.mark.training
@pytest.mark.sandbox
def test_distinct_checkpoints_are_read_by_one_started_verifier(tiny_checkpoint: tuple[Path, Path], tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Class scale: one process imports torch once and reads checkpoint after checkpoint, each in a child with
    its own memory limit (a compressed checkpoint in between costs only its child)."""
    pt, js = tiny_checkpoint
    zip_bomb(tmp_path / "bomb.pt", mib=256)
    real, started = subprocess.Popen, []

    def popen(*args: Any, **kwargs: Any) -> subprocess.Popen:
        started.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", popen)
    results = [ms.verify_checkpoint(other_weights(pt, 1), js, schemes=("rope",), rules=rules(), max_windows=4),
               ms.verify_checkpoint(tmp_path / "bomb.pt", js, schemes=("rope",), rules=rules(), max_windows=4,
                                    memory_mb=96),
               ms.verify_checkpoint(other_weights(pt, 2), js, schemes=("rope",), rules=rules(), max_windows=4)]
    assert len(started) <= 1, f"a process was started per checkpoint: {started}"
    assert results[0]["ok"] and results[2]["ok"] and results[0]["schemes"]["rope"]["ppl"]
    assert results[0]["schemes"]["rope"]["ppl"] != results[2]["schemes"]["rope"]["ppl"]
    assert not results[1]["ok"] and "allocate" in results[1]["message"], results[1]["message"]


@pytest.mark.training
@pytest.mark.sandbox
def test_a_verifier_killed_from_outside_is_started_again(tiny_checkpoint: tuple[Path, Path]) -> None:
    """The grader's own reader dying is not the student's failure: the request is retried on a fresh one."""
    pt, js = tiny_checkpoint
    assert ms.verify_checkpoint(other_weights(pt, 3), js, schemes=("rope",), rules=rules(), max_windows=4)["ok"]
    for verifier in ms._POOL.idle:
        assert verifier.proc is not None
        verifier.proc.kill()
        verifier.proc.wait()
    result = ms.verify_checkpoint(other_weights(pt, 4), js, schemes=("rope",), rules=rules(), max_windows=4)
    assert result["ok"] and result["schemes"]["rope"]["ppl"], result["message"]


@pytest.mark.sandbox
def test_grade_batch_verifies_checkpoints_side_by_side(course: Course, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Two cores verify two checkpoints at once while the notebooks run (a class of 300 needs both)."""
    from autograder.grading import batch, runner

    verdict = {"ok": True, "message": "checkpoint loaded", "problem": None, "preset": "quick", "credit": 1.0,
               "seconds": 0.0, "schemes": {pos: {"passed": True, "message": "ok"} for pos in lm.SCHEMES}}
    both, met = threading.Barrier(2, timeout=20), []

    def verify(*args: object, **kwargs: object) -> dict:
        if threading.current_thread() is not threading.main_thread():  # verified ahead
            try:
                both.wait()
                met.append(True)
            except threading.BrokenBarrierError:
                met.append(False)
            WaitingPool.verifying.set()
        return verdict

    monkeypatch.setattr(runner, "WorkerPool", WaitingPool)
    monkeypatch.setattr(ms, "verify_checkpoint", verify)
    monkeypatch.setattr(batch, "VERIFY_SLOTS", 2)
    WaitingPool.verifying.clear()
    WaitingPool.waited.clear()
    for name in ("ada", "bob"):
        student = tmp_path / "subs" / name
        student.mkdir(parents=True)
        (student / "lesson83.ipynb").write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4,
                                                             "nbformat_minor": 5}))
        for file in ("milestone.pt", "milestone.json"):
            shutil.copy(CHECKPOINT / file, student / file)
    summary = batch.grade_batch(tmp_path / "subs", out=tmp_path / "out", progress=False, course=course)
    assert met == [True, True], "the two checkpoints were not verified at the same time"
    assert [r["m1_checkpoint"] for r in summary.rows] == [course_of().config.milestone.points] * 2


# --------------------------------------------------------------------------- verification by sampled windows (issue 23)


def _claims() -> dict[str, Any]:
    return json.loads((CHECKPOINT / "milestone.json").read_text())


def _lie(claims: dict[str, Any], change: Any) -> bytes:
    """claims with every window loss v of window i replaced by change(i, v), the perplexities recomputed."""
    windows = {p: {c: [change(i, v) for i, v in enumerate(row)] for c, row in r.items()}
               for p, r in claims["window_loss"].items()}
    ppl = {p: {str(c): v for c, v in lm.ppl_from_windows({int(c): row for c, row in r.items()}).items()}
           for p, r in windows.items()}
    return json.dumps(claims | {"window_loss": windows, "ppl": ppl}).encode()


def _drawn(seed: int, *, n: int, k: int) -> set[int]:
    """The windows an rng seeded `seed` draws for the five schemes, as the grader draws them."""
    rng = random.Random(seed)
    return set().union(*(rng.sample(range(n), n)[:k] for _ in lm.SCHEMES))


def test_the_reference_windows_cover_every_claimed_window() -> None:
    ref, claims = ms.reference_windows(), _claims()
    assert set(ref) == set(lm.SCHEMES) and all(len(row[c]) == lm.NUM_VAL for row in ref.values() for c in lm.CONTEXTS)
    for pos in lm.SCHEMES:  # the committed run's own windows are every 10th: the same losses, rounded to 1e-3
        got = claims["window_loss"][pos]["512"]
        assert max(abs(v - ref[pos][512][10 * i]) for i, v in enumerate(got)) <= 5e-4 + 1e-6


def test_claimed_perplexities_are_the_exp_mean_of_the_claimed_windows() -> None:
    claims = _claims()
    for pos, row in claims["window_loss"].items():
        exact = lm.ppl_from_windows({int(c): v for c, v in row.items()})
        assert all(claims["ppl"][pos][str(c)] == v for c, v in exact.items())


@pytest.mark.sandbox
def test_honest_reference_passes_with_a_few_windows() -> None:
    config = course_of().suite.milestone_rules
    result = ms.verify_checkpoint(CHECKPOINT / "milestone.pt", CHECKPOINT / "milestone.json", rules=config,
                                  rng=random.Random(3))
    rows = result["schemes"].values()
    assert all(r["passed"] and r["checked"] == config.sample_windows and r["flagged"] == 0 for r in rows), result
    assert all(max(r["rel_diff"].values()) < 1e-5 for r in rows)


@pytest.mark.sandbox
def test_a_concentrated_lie_is_caught_by_the_deficit_audit(monkeypatch: pytest.MonkeyPatch) -> None:
    """3% of the windows claimed at loss 0 (every perplexity over 5% too low): the random sample misses them (the
    seed is chosen so), the audit of windows claimed far below the reference-based prediction catches them;
    without the audit (and with the random sample alone) the lie would pass."""
    config, claims = course_of().suite.milestone_rules, _claims()
    n = len(claims["window_loss"]["rope"]["128"])
    lied = sorted(set(range(0, n, 7)) - _drawn(5, n=n, k=config.sample_windows))[: 3 * n // 100]
    data = _lie(claims, lambda i, v: 0.0 if i in lied else v)
    lower = json.loads(data)["ppl"]
    assert all(claims["ppl"][p][c] / lower[p][c] > 1.05 for p in lower for c in lower[p])
    result = ms.verify_checkpoint(CHECKPOINT / "milestone.pt", data, rules=config, rng=random.Random(5))
    for row in result["schemes"].values():
        assert row["problem"] == "checkpoint_claims_disagree" and row["flagged"] >= len(lied), row
        assert "recomputed windows differ" in row["message"] and row["whole"]
    no_flags = dataclasses.replace(config, deficit_audit=1e-9)
    monkeypatch.setattr(ms, "sample_size", lambda *a, k0, **kw: k0)  # no more uniform draws either
    escaped = ms.verify_checkpoint(CHECKPOINT / "milestone.pt", data, rules=no_flags, rng=random.Random(5))
    assert all(r["passed"] for r in escaped["schemes"].values()), "the seed should miss the lied windows"


@pytest.mark.sandbox
def test_a_spread_lie_is_caught_by_the_random_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every window claimed 0.04 nats lower (every perplexity 4% too low): any drawn window shows it, and the
    figures re-evaluated as a whole then disagree."""
    monkeypatch.setattr(ms, "sample_size", lambda *a, k0, **kw: k0)
    config = dataclasses.replace(course_of().suite.milestone_rules, deficit_audit=1e-9)
    data = _lie(_claims(), lambda i, v: v - 0.04)
    result = ms.verify_checkpoint(CHECKPOINT / "milestone.pt", data, rules=config, rng=random.Random(1))
    assert {r["problem"] for r in result["schemes"].values()} == {"checkpoint_claims_disagree"}


@pytest.mark.sandbox
def test_an_aggregate_that_disagrees_with_its_windows_is_rejected() -> None:
    """rope at 128 claimed 1% lower than its own windows give (within the old 2% tolerance): rejected."""
    claims = _claims()
    claims["ppl"]["rope"]["128"] *= 0.99
    result = ms.verify_checkpoint(CHECKPOINT / "milestone.pt", json.dumps(claims).encode(), rng=random.Random(0))
    rope = result["schemes"]["rope"]
    assert rope["problem"] == "checkpoint_claims_disagree" and "its own per-window losses give" in rope["message"]
    assert all(result["schemes"][p]["passed"] for p in lm.SCHEMES if p != "rope")


@pytest.mark.sandbox
def test_old_format_claims_get_a_message_not_a_crash() -> None:
    claims = {k: v for k, v in _claims().items() if k != "window_loss"}
    result = ms.verify_checkpoint(CHECKPOINT / "milestone.pt", json.dumps(claims).encode())
    assert result["ok"] and {r["problem"] for r in result["schemes"].values()} == {"checkpoint_old_format"}
    assert all("Re-run the milestone cell" in r["message"] for r in result["schemes"].values())
    assert "checkpoint_old_format" in ms.PROBLEMS


def test_the_sample_is_secret_and_stable_within_a_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same files draw the same windows in one grading run (verified ahead, then judged: evaluated once);
    another run (another secret from the operating system) draws others; nothing else decides them."""
    first = ms.secret_rng("pt:json:rope").sample(range(300), 12)
    assert ms.secret_rng("pt:json:rope").sample(range(300), 12) == first
    assert ms.secret_rng("pt:json:alibi").sample(range(300), 12) != first
    monkeypatch.setattr(ms, "_SECRET", os.urandom(32))
    assert ms.secret_rng("pt:json:rope").sample(range(300), 12) != first


@pytest.mark.training
def test_an_old_format_run_is_upgraded_without_training(tiny_checkpoint: tuple[Path, Path], tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    pt, js = tiny_checkpoint
    shutil.copy(pt, tmp_path / "milestone.pt")
    record = json.loads(js.read_text())
    (tmp_path / "milestone.json").write_text(json.dumps({k: v for k, v in record.items() if k != "window_loss"}))
    monkeypatch.setattr(lm, "run_milestone", lambda *a, **k: pytest.fail("trained instead of loading"))
    _, table = lm.train_or_load(TinyCharLM, "quick", pt_path=tmp_path / "milestone.pt",
                                json_path=tmp_path / "milestone.json")
    assert json.loads((tmp_path / "milestone.json").read_text())["window_loss"] == record["window_loss"]
    assert table == {pos: {int(c): v for c, v in row.items()} for pos, row in record["ppl"].items()}


MILESTONE_MISTAKES = [m.id for m in MISTAKES if m.question == "m1_tinycharlm"]


@pytest.mark.training
@pytest.mark.sandbox
@pytest.mark.parametrize("mistake", MILESTONE_MISTAKES)
def test_each_milestone_mistake_keeps_its_verdict(mistake: str, tmp_path: Path) -> None:
    """The benchmark's checkpoint of the mistake (reference weights in the mistaken class, tuned, claims measured by
    it on 300 windows): the sampled grader gives each scheme the verdict of the whole re-evaluation before it."""
    from autograder.lesson import load_module

    # by path: benchmarks/ is a folder of scripts, not a package an installed copy or a clean clone can import
    mistake_checkpoints = load_module("checkpoint_verify_benchmark",
                                      ROOT / "benchmarks" / "checkpoint_verify.py").mistake_checkpoints
    built = mistake_checkpoints(tmp_path, schemes=lm.SCHEMES, tune_steps=20, claim_windows=QUICK["eval_windows"],
                                only=(mistake,))
    pt, js, touched = built[f"mistake_{mistake}"]
    if not touched:
        pytest.skip("its weights and claims are the reference checkpoint's")
    before = ms.verify_checkpoint(pt, js, schemes=touched, method="prefix")
    after = ms.verify_checkpoint(pt, js, schemes=touched)
    verdict = {pos: (row["passed"], row["problem"]) for pos, row in before["schemes"].items()}
    assert {pos: (row["passed"], row["problem"]) for pos, row in after["schemes"].items()} == verdict


def test_a_model_that_strays_from_the_reference_gets_more_draws() -> None:
    """The uniform draws grow with the residual spread the drawn windows show, so that a lie hidden in the model's
    own excess over the reference's line still escapes with probability <= 1% (docs/milestone.md)."""
    sizes = [ms.sample_size(s, n=300, k0=16, delta=0.0158, audit=5.0) for s in (0.0, 0.03, 0.05, 0.1, 0.16)]
    assert sizes[0] == sizes[1] == 16 and sizes[1] < sizes[2] < sizes[3] < sizes[4] <= 300
    for k, spread in ((sizes[3], 0.1), (sizes[4], 0.16)):  # the worst lie fraction f meets the bound
        hidden = [spread * NormalDist().pdf(NormalDist().inv_cdf(1 - f / 100)) for f in range(1, 100)]
        assert all((1 - f / 100) ** k * math.exp(-5 * max(0.0, 1 - h / 0.0158)) <= 0.01 + 1e-9
                   for f, h in zip(range(1, 100), hidden, strict=True))
