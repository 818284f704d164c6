"""Lesson 83's milestone plug-in (autograder/checkpoint.py): train the reference TinyCharLM on the protocol, and
verify submitted checkpoints on the CPU. The graders' own file: never shipped to students.

This module and everything it imports run on a bare PyTorch image (no pydantic). It defines the milestone
section's schema, once (MilestoneRules, parse_rules): the engine's config keeps only its `points` and hands the
whole section to parse_rules (autograder/authoring/suite.py: milestone_rules); load_rules reads it from
grading_config.yaml with PyYAML alone.
A submitted milestone.pt is loaded and evaluated in a child process confined as a notebook's (the notebooks'
sandbox, autograder/sandbox/files.py), with a memory, CPU-time and wall-clock limit, so a hostile file can only
ever give a verdict; the child is forked from a pre-started verifier process
(torch imported and the models built once), so a class of checkpoints pays the start-up once.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import hmac
import json
import math
import random
import secrets
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from autograder import checkpoint
from autograder.lesson import Lesson
from autograder.sandbox import CHECKPOINT_MEMORY_MB, UPLOAD_CAP_MB

ROOT = Path(__file__).resolve().parents[2]  # the course folder: assignments/NAME/ holds this file
# This plug-in's lesson, as its loader hands it over (the grader's course; autograder/checkpoint.py reader_lesson):
# its milestone trainer (shipped next to the notebook) and the reference model class its milestone question names.
LESSON: Lesson = checkpoint.reader_lesson(globals())
(ARCH, CONTEXTS, PRECISIONS, PRESETS, SCHEMES, VOCAB, corpus_tokens, evaluate_ppl, load_checkpoint, plot_table,
 run_milestone, save_checkpoint, val_starts, windows) = attrgetter(
    "ARCH", "CONTEXTS", "PRECISIONS", "PRESETS", "SCHEMES", "VOCAB", "corpus_tokens", "evaluate_ppl",
    "load_checkpoint", "plot_table", "run_milestone", "save_checkpoint", "val_starts", "windows")(LESSON.trainer)
ppl_from_windows = LESSON.trainer.ppl_from_windows
TinyCharLM = LESSON.milestone_model

DEFAULT_CONFIG = ROOT / "grading_config.yaml"
# Verification re-evaluates on verify_windows evenly spaced validation windows (grading_config.yaml; 100 start
# at 100,000 + 30 i), one forward pass of 512 tokens per window for all three contexts (measure_ppl; the reference
# model's causal attention computed by query chunks, CausalChunks below), on one
# thread per checkpoint (two threads on two cores cost more CPU for the same work; checkpoints run side by side).
VERIFY_BATCH = 4  # windows per pass: on one thread 1 to 10 cost the same (4: few page faults), 50 about 25% more
MAX_CHECKPOINT_MB = UPLOAD_CAP_MB  # five models in float32 take about 4 MB
MAX_CLAIMS_KB = 2048  # milestone.json: about 30 KB (quick) or 400 KB (full) of per-window losses
# The child that loads and evaluates a checkpoint may allocate this much beyond the started verifier (a
# legitimate checkpoint needs about 300 MB), and gets this much CPU and wall-clock time.
CHILD_MEMORY_MB = CHECKPOINT_MEMORY_MB
CHILD_TIMEOUT_S = 300
UNVERIFIED = "re-save it with save_checkpoint and upload milestone.pt and milestone.json of the same run"
UPLOAD_HINT = ("Upload milestone.pt and milestone.json next to your notebook, exactly as the milestone's "
               "save cell writes them (save_checkpoint).")

ESCAPE = 0.01  # the largest probability that claims more than rel_tol off escape (docs/milestone.md)
# The residual spread of the drawn windows (at least 16) times this is above the model's with probability 97.5% or
# more (chi-square with 14 degrees of freedom, sqrt(14 / 5.63) = 1.58) when its residuals are normal.
SPREAD_UPPER = 1.6

class RulesError(ValueError):
    """A problem in grading_config.yaml's milestone section, with the file and the key in the message."""


@dataclass(frozen=True)
class PresetRule:
    """Credit and perplexity bounds of one accepted preset."""

    credit: float = 1.0
    thresholds: dict[str, dict[int, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class MilestoneRules:
    """The milestone section of grading_config.yaml: the one definition of its keys and checks (the engine's
    config.Milestone declares only `points` and leaves the rest to parse_rules)."""

    points: float = 0.0
    rel_tol: float = 0.02
    verify_windows: int = 100
    sample_windows: int = 16
    window_tol: float = 0.002
    deficit_audit: float = 5.0
    presets: dict[str, PresetRule] = field(default_factory=dict)


def _number(value: Any, key: str, *, low: float, high: float = math.inf, low_open: bool = False,
            integer: bool = False) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and (not integer or isinstance(value, int))
    if not ok or not math.isfinite(value) or value > high or (value <= low if low_open else value < low):
        kind = "an integer" if integer else "a number"
        bounds = f"{'>' if low_open else '>='} {low:g}" + (f" and <= {high:g}" if high < math.inf else "")
        raise RulesError(f"{key}: expected {kind} {bounds}, got {value!r}")
    return value


def _mapping(value: Any, key: str, allowed: Sequence[str] | None = None) -> dict[Any, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RulesError(f"{key}: expected a mapping, got {type(value).__name__}")
    if allowed is not None and (extra := [k for k in value if k not in allowed]):
        raise RulesError(f"{key}.{extra[0]}: unknown key (allowed keys: {', '.join(allowed)})")
    return value


def parse_rules(section: Any, *, where: str = "milestone") -> MilestoneRules:
    """Validate a milestone section (a dict from YAML) into MilestoneRules; RulesError names the key."""
    raw = _mapping(section, where, ("points", "rel_tol", "verify_windows", "sample_windows", "window_tol",
                                    "deficit_audit", "presets"))
    presets = {}
    for name, rule in _mapping(raw.get("presets"), f"{where}.presets").items():
        key = f"{where}.presets.{name}"
        rule = _mapping(rule, key, ("credit", "thresholds"))
        thresholds: dict[str, dict[int, float]] = {}
        for pos, bounds in _mapping(rule.get("thresholds"), f"{key}.thresholds").items():
            if pos not in SCHEMES:
                raise RulesError(f"{key}.thresholds: unknown scheme {pos!r}; schemes are {', '.join(SCHEMES)}")
            row = {}
            for c, bound in _mapping(bounds, f"{key}.thresholds.{pos}").items():
                if c not in CONTEXTS:
                    raise RulesError(f"{key}.thresholds.{pos}: context {c!r} is not measured; use "
                                     f"{', '.join(map(str, CONTEXTS))}")
                row[c] = float(_number(bound, f"{key}.thresholds.{pos}.{c}", low=-math.inf))
            thresholds[pos] = row
        credit = float(_number(rule.get("credit", 1.0), f"{key}.credit", low=0, high=1))
        presets[str(name)] = PresetRule(credit=credit, thresholds=thresholds)
    return MilestoneRules(
        points=float(_number(raw.get("points", 0), f"{where}.points", low=0)),
        rel_tol=float(_number(raw.get("rel_tol", 0.02), f"{where}.rel_tol", low=0, low_open=True)),
        verify_windows=int(_number(raw.get("verify_windows", 100), f"{where}.verify_windows", low=0, high=3000,
                                   low_open=True, integer=True)),
        sample_windows=int(_number(raw.get("sample_windows", 16), f"{where}.sample_windows", low=0, high=3000,
                                   low_open=True, integer=True)),
        window_tol=float(_number(raw.get("window_tol", 0.002), f"{where}.window_tol", low=0, low_open=True)),
        deficit_audit=float(_number(raw.get("deficit_audit", 5.0), f"{where}.deficit_audit", low=0,
                                    low_open=True)),
        presets=presets)


def load_rules(path: Path = DEFAULT_CONFIG) -> MilestoneRules:
    """The milestone rules of a grading config, read with PyYAML alone (no pydantic)."""
    import yaml  # part of the PyTorch images this runs on; imported here so that importing stays light

    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise RulesError(f"{path}: cannot read the grading config: {exc}") from exc
    if not isinstance(raw, dict | None):
        raise RulesError(f"{path}: the grading config is not a mapping")
    return parse_rules((raw or {}).get("milestone"), where=f"{path}: milestone")


def build_model(pos: str, state_dict: Mapping[str, torch.Tensor]) -> TinyCharLM:
    """The reference architecture for pos with the given weights (strict: every name and shape must match)."""
    model = TinyCharLM(pos=pos, **ARCH)
    model.load_state_dict(state_dict, strict=True)
    return model.eval()


# Why a scheme of a checkpoint earns nothing: the diagnosis ids the grader and the TA report use.
PROBLEMS = {
    "checkpoint_missing": "milestone.pt or milestone.json was not uploaded: upload both next to the notebook.",
    "checkpoint_unreadable": "the upload is not a milestone checkpoint (not plain weights, not the milestone "
                             "table, another vocabulary, or files of two runs): re-save with save_checkpoint.",
    "checkpoint_wrong_weights": "a scheme is missing or its weights do not fit TinyCharLM (names or shapes "
                                "changed): keep the skeleton's names and train all five schemes.",
    "checkpoint_claims_disagree": "milestone.json does not match the uploaded weights: upload the two files "
                                  "of the same run.",
    "checkpoint_old_format": "milestone.json has no per-window losses (an older milestone trainer): re-run "
                             "the milestone cell, which rewrites it from the saved models without training.",
    "checkpoint_above_bound": "the re-evaluated perplexity is above the preset's bound: check the positional "
                              "code, or train the full preset.",
    "checkpoint_preset_not_accepted": "the checkpoint was trained with a preset this course does not accept.",
}
# The verifier's attention: causal self-attention split into query chunks of CAUSAL_CHUNK rows, chunk i computed
# against keys 0..end of chunk i only. PyTorch's CPU flash kernel computes every score of a row block up to 512
# keys and masks the future afterwards, so at 512 tokens it does the whole T x T square; the chunks skip about
# 40% of it. Same math (only which masked scores are computed changes): figures move by float rounding only.
CAUSAL_CHUNK = 64
_SDPA = F.scaled_dot_product_attention
_CAUSAL_MASKS: dict[tuple[int, torch.dtype], torch.Tensor] = {}


def _causal_float_mask(size: int, dtype: torch.dtype) -> torch.Tensor:
    key = (size, dtype)
    if key not in _CAUSAL_MASKS:
        future = torch.ones(size, size, dtype=torch.bool).triu(1)
        _CAUSAL_MASKS[key] = torch.zeros(size, size, dtype=dtype).masked_fill(future, float("-inf"))
    return _CAUSAL_MASKS[key]


def _hides_skipped(mask: torch.Tensor, size: int) -> bool:
    """Whether an additive float mask is -inf wherever the chunks skip a score (keys after a chunk's last query),
    so that skipping them changes nothing; checked on every call (a small part of the attention's cost)."""
    if not mask.is_floating_point() or mask.shape[-2:] != (size, size):
        return False
    return all(bool(torch.isneginf(mask[..., start:start + CAUSAL_CHUNK, start + CAUSAL_CHUNK:]).all())
               for start in range(0, size - CAUSAL_CHUNK, CAUSAL_CHUNK))


def chunked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
                      dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                      **options: Any) -> torch.Tensor:
    """F.scaled_dot_product_attention for causal self-attention, by query chunks of CAUSAL_CHUNK rows against
    the keys up to the chunk's end (is_causal=True, or an additive float mask that is -inf above the diagonal:
    ALiBi's); anything else goes to F.scaled_dot_product_attention unchanged."""
    size = q.shape[-2]
    causal_self = (dropout_p == 0.0 and not options and q.dim() == 4 and k.shape[-2] == v.shape[-2] == size
                   and size > CAUSAL_CHUNK and not (is_causal and attn_mask is not None)
                   and (is_causal or (attn_mask is not None and _hides_skipped(attn_mask, size))))
    if not causal_self:
        return _SDPA(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                     **options)
    mask = _causal_float_mask(size, q.dtype) if attn_mask is None else attn_mask
    out = torch.empty(q.shape[:-1] + v.shape[-1:], dtype=q.dtype, device=q.device)
    for start in range(0, size, CAUSAL_CHUNK):
        end = min(start + CAUSAL_CHUNK, size)
        if start == 0 and attn_mask is None:  # queries and keys both start at 0: PyTorch's own causal mask
            out[..., :end, :] = _SDPA(q[..., :end, :], k[..., :end, :], v[..., :end, :], is_causal=True,
                                      scale=scale)
        else:
            out[..., start:end, :] = _SDPA(q[..., start:end, :], k[..., :end, :], v[..., :end, :],
                                           attn_mask=mask[..., start:end, :end], scale=scale)
    return out


class CausalChunks(TorchFunctionMode):
    """Within `with CausalChunks():`, F.scaled_dot_product_attention runs as chunked_attention: the reference
    model's own forward pass, unchanged, with its causal attention computed by query chunks."""

    def __torch_function__(self, func: Any, types: Any, args: Sequence[Any] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        if func is F.scaled_dot_product_attention:
            return chunked_attention(*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))


# Per checkpoint digest: what the child found in its config, and per (scheme, windows, batch, method) its
# result; per (digest, memory_mb, timeout_s) why the child could not read it. A lock per digest makes a call
# for weights already being evaluated (grade_batch verifies ahead in a thread) wait for that result.
_CONFIGS: dict[str, dict[str, Any]] = {}
_MEASURED: dict[tuple[str, str, int, int, str], dict[str, Any]] = {}
_FAILED: dict[tuple[str, int, float], str] = {}
_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()
# sample (today's grader, issue 23): a secret random sample of windows, and those claimed far below the
# reference's prediction, recomputed against milestone.json's per-window losses (_verify_sampled). The whole
# re-evaluation of verify_windows windows before it: prefix: one 512-token pass per window with CausalChunks;
# plain: the same pass with the model's attention as it is (the grader before the chunks); legacy: one pass per
# context (evaluate_ppl). prefix, plain and legacy are kept for the benchmark (benchmarks/checkpoint_verify.py).
METHODS = ("sample", "prefix", "plain", "legacy")


def _lock(digest: str) -> threading.Lock:
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(digest, threading.Lock())


@torch.inference_mode()
def measure_ppl(model: torch.nn.Module, *, tokens: torch.Tensor, max_windows: int | None,
                batch_size: int = VERIFY_BATCH, contexts: Sequence[int] = CONTEXTS,
                chunked: bool = True) -> dict[int, float]:
    """Validation perplexity per context from one forward pass per window at the longest context.

    The windows of every context start at the same places (val_starts), and TinyCharLM is causal with
    positions counted from each window's start (all five schemes), so the first c logits of a 512-token
    window are those of the c-token window: the token-weighted mean losses equal evaluate_ppl's up to float
    rounding (about 1e-7 relative), for about 60% of its arithmetic. tokens: corpus_tokens(), read once.
    chunked: run the model's forward pass under CausalChunks (its attention by query chunks, the same
    figures up to float rounding); False: as the model computes it alone.
    """
    model.eval()
    starts = val_starts(max_windows=max_windows)
    longest = max(contexts)
    totals = torch.zeros(longest, dtype=torch.float64)
    for batch in starts.split(batch_size):
        X, Y = windows(tokens, batch, longest)
        with CausalChunks() if chunked else contextlib.nullcontext():
            logits = model(X)
        nll = F.cross_entropy(logits.float().transpose(1, 2), Y, reduction="none")  # (batch, longest)
        totals += nll.sum(0, dtype=torch.float64)
    prefix = totals.cumsum(0)
    return {c: math.exp(prefix[c - 1].item() / (len(starts) * c)) for c in contexts}


@torch.inference_mode()
def measure_windows(model: torch.nn.Module, *, tokens: torch.Tensor, starts: Sequence[int],
                    batch_size: int = VERIFY_BATCH, contexts: Sequence[int] = CONTEXTS) -> list[list[float]]:
    """Per window start, its mean loss (nats per token) at each context, from one forward pass at the longest
    context (the first c tokens' losses give context c, as in measure_ppl), attention by query chunks."""
    model.eval()
    longest, out = max(contexts), []
    for batch in torch.tensor(list(starts), dtype=torch.long).split(batch_size) if starts else ():
        X, Y = windows(tokens, batch, longest)
        with CausalChunks():
            logits = model(X)
        nll = F.cross_entropy(logits.float().transpose(1, 2), Y, reduction="none").double().cumsum(1)
        out += torch.stack([nll[:, c - 1] / c for c in contexts], 1).tolist()
    return out


def _row(message: str = "", problem: str | None = None) -> dict[str, Any]:
    return {"passed": False, "agrees": False, "meets_thresholds": False, "ppl": {}, "claimed": {},
            "rel_diff": {}, "thresholds": {}, "message": message, "problem": problem}


def _failure(message: str, schemes: Sequence[str], problem: str = "checkpoint_unreadable") -> dict[str, Any]:
    return {"ok": False, "message": message, "problem": problem, "preset": None, "credit": 0.0, "seconds": 0.0,
            "cpu_s": 0.0, "schemes": {pos: _row(message, problem) for pos in schemes}}


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number")


def read_claims(data: bytes) -> tuple[str, dict[str, Any], Any]:
    """The preset, the ppl table and the per-window losses (window_loss; None in an old-format file) of
    milestone.json; ValueError (never another exception) when malformed."""
    try:
        record = json.loads(data, parse_constant=_reject_constant)
    except RecursionError:
        raise ValueError("it is nested too deeply") from None
    except (UnicodeDecodeError, OverflowError) as err:
        raise ValueError(str(err)) from None
    if not isinstance(record, dict):
        raise ValueError(f"it holds a {type(record).__name__}, not a table")
    preset, ppl = record.get("preset"), record.get("ppl")
    if not isinstance(preset, str):
        raise ValueError(f"'preset' must be a preset name, got {type(preset).__name__}")
    if not isinstance(ppl, dict):
        raise ValueError(f"'ppl' must map schemes to perplexities, got {type(ppl).__name__}")
    return preset, ppl, record.get("window_loss")


def _claimed_windows(window_loss: Any, pos: str, n: int) -> dict[int, list[float]]:
    """One scheme's claimed per-window losses per context: n finite non-negative numbers each, else ValueError."""
    row = window_loss.get(pos) if isinstance(window_loss, dict) else None
    if not isinstance(row, dict):
        raise ValueError(f"milestone.json has no per-window losses for {pos!r}")
    out = {}
    for c in CONTEXTS:
        values = row.get(str(c))
        if not (isinstance(values, list) and len(values) == n and all(
                isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
                for v in values)):
            raise ValueError(f"milestone.json's per-window losses of {pos!r} at context {c} are not {n} "
                             "non-negative numbers (one per validation window of the preset)")
        out[c] = [float(v) for v in values]
    return out


def sample_size(spread: float, *, n: int, k0: int, delta: float, audit: float, escape: float = ESCAPE) -> int:
    """Uniform draws (at least k0, at most n) after which a lie of more than delta (nats, in the mean) escapes with
    probability <= escape for a model whose window losses scatter about the reference's line normally with
    standard deviation `spread`: a lie on a fraction f of the windows, hiding spread x phi(z_f) of its size in the
    model's own excess over the line (the top f of its residuals), escapes the draws with probability (1 - f)^k
    and the deficit audit with exp(-audit (1 - hidden / delta)) at most (docs/milestone.md)."""
    from statistics import NormalDist

    unit = NormalDist()
    grid = [(j + 0.5) / 400 for j in range(400)]
    hidden = [spread * unit.pdf(unit.inv_cdf(1 - f)) for f in grid]
    audit_miss = [math.exp(-audit * max(0.0, 1 - h / delta)) for h in hidden]
    need = max(math.ceil(math.log(escape / m) / math.log(1 - f)) if m > escape else 0
               for f, m in zip(grid, audit_miss, strict=True))
    return min(n, max(k0, need))


def _fit(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """Least-squares a, b of y ~ a + b x (b = 0 when x does not vary)."""
    mx, my = math.fsum(x) / len(x), math.fsum(y) / len(y)
    sxx = math.fsum((u - mx) ** 2 for u in x)
    b = math.fsum((u - mx) * (v - my) for u, v in zip(x, y, strict=True)) / sxx if sxx > 1e-12 else 0.0
    return my - b * mx, b


_REFERENCE_WINDOWS: dict[str, dict[int, list[float]]] = {}


def reference_windows() -> dict[str, dict[int, list[float]]]:
    """The reference model's loss on each of the 3,000 validation windows per scheme and context (the lesson's
    committed window_losses.json, rounded to 1e-3 nats; never shipped to students), read once."""
    if not _REFERENCE_WINDOWS:
        raw = json.loads((LESSON.checkpoint_dir / "window_losses.json").read_text())
        _REFERENCE_WINDOWS.update({pos: {int(c): v for c, v in row.items()} for pos, row in raw["loss"].items()})
    return _REFERENCE_WINDOWS


def _claimed_row(ppl: dict[str, Any], pos: str) -> dict[int, float]:
    """The claimed perplexity of one scheme per context: positive finite numbers only, else ValueError."""
    row = ppl.get(pos)
    if not isinstance(row, dict):
        raise ValueError(f"milestone.json has no perplexity for {pos!r} at every context {CONTEXTS}")
    out = {}
    for c in CONTEXTS:
        value = row.get(str(c))
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"milestone.json has no perplexity for {pos!r} at every context {CONTEXTS}")
        try:
            out[c] = float(value)
        except OverflowError:
            out[c] = math.inf
        if not (math.isfinite(out[c]) and out[c] > 0):
            raise ValueError(f"milestone.json gives {pos!r} the perplexity {value!r} at context {c}: a "
                             "perplexity is a positive finite number")
    return out


PARTS = SCHEMES  # the checkpoint's graded parts (autograder/checkpoint.py): one per scheme
VERIFY_SLOTS = checkpoint.VERIFY_SLOTS  # checkpoints verified side by side (grade_batch verifies ahead)
PLUGIN = Path(__file__).resolve()
SHIPPED = LESSON.shipped_files  # what stays readable in a started reader: what students have anyway
_POOL = checkpoint.reader_pool(PLUGIN, shipped=SHIPPED)
VerifierError = checkpoint.VerifierError
reader_limits_lowered = checkpoint.reader_limits_lowered


class Verifier(checkpoint.Verifier):
    """A pre-started reader of this plug-in (autograder/checkpoint.py): torch imported, the corpus read and the
    five models built once (reader_start); a child per milestone.pt, loaded with weights_only."""

    def __init__(self, *, threads: int = 1, startup_s: float = checkpoint.STARTUP_TIMEOUT_S) -> None:
        super().__init__(plugin=PLUGIN, shipped=SHIPPED, threads=threads, startup_s=startup_s)


def _run_child(pt_bytes: bytes, request: dict[str, Any], *, memory_mb: int, timeout_s: float,
               verifier: checkpoint.Verifier | None = None) -> dict[str, Any]:
    """Load and evaluate milestone.pt in a limited child of a verifier (the pool's unless one is given); any
    failure comes back as {"error": ...}."""
    return checkpoint.run_child(pt_bytes, request, plugin=PLUGIN, memory_mb=memory_mb, timeout_s=timeout_s,
                                verifier=verifier, shipped=SHIPPED)


def _evaluate(request: dict[str, Any], pt_bytes: bytes, tokens: torch.Tensor,
              models: dict[str, torch.nn.Module], heldout: torch.Tensor | None = None) -> dict[str, Any]:
    """Inside the limited child: load milestone.pt with weights_only=True and evaluate the requested schemes
    (models: the verifier's TinyCharLM per scheme, filled with the checkpoint's weights here)."""
    try:
        config, state_dicts = load_checkpoint(pt_bytes)
    except Exception as err:  # noqa: BLE001 - weights_only refusals, corrupt zips, out of memory, wrong layout
        first = str(err).splitlines()[0][:300] if str(err) else ""
        return {"error": f"{type(err).__name__}: {first}"}
    preset = config.get("preset") if isinstance(config.get("preset"), str) else None
    out: dict[str, Any] = {"config": {"preset": preset, "vocab_ok": config.get("vocab") == list(VOCAB)},
                           "schemes": {}}
    evaluate = (out["config"]["vocab_ok"] and preset is not None and preset == request["preset"]
                and preset in request["accepted"])
    for pos in request["schemes"] if evaluate else []:
        if pos not in state_dicts:
            out["schemes"][pos] = {"missing": True}
            continue
        try:
            model = models[pos]
            model.load_state_dict(state_dicts[pos], strict=True)
        except Exception as err:  # noqa: BLE001 - names, shapes or types that do not fit
            out["schemes"][pos] = {"unfit": (str(err).splitlines() or [type(err).__name__])[0][:300]}
            continue
        if request.get("method") == "heldout":  # the leaderboard's figures and the similarity sketch
            try:
                out["schemes"][pos] = _heldout_row(model, state_dicts[pos], heldout,
                                                   figures=pos in request.get("figures", ()))
            except Exception as err:  # noqa: BLE001 - out of memory while evaluating, no held-out text
                out["schemes"][pos] = {"unfit": f"evaluating them failed ({type(err).__name__})"}
            continue
        if request.get("method") == "sample":
            try:
                found = measure_windows(model, tokens=tokens, starts=request["starts"][pos])
            except Exception as err:  # noqa: BLE001 - out of memory while evaluating
                out["schemes"][pos] = {"unfit": f"evaluating them failed ({type(err).__name__})"}
                continue
            out["schemes"][pos] = {"windows": found}
            if request.get("heldout"):  # the held-out pass too, in the same child (heldout_figures keeps it)
                began = time.thread_time()
                with contextlib.suppress(Exception):  # tried again in a child of its own (heldout_figures)
                    out["schemes"][pos]["heldout_row"] = _heldout_row(model, state_dicts[pos], heldout, figures=True)
                out["heldout_cpu_s"] = out.get("heldout_cpu_s", 0.0) + time.thread_time() - began
            continue
        try:
            ppl = (evaluate_ppl(model, batch_size=request["batch"], max_windows=request["windows"])
                   if request.get("method") == "legacy" else
                   measure_ppl(model, tokens=tokens, batch_size=request["batch"], max_windows=request["windows"],
                               chunked=request.get("method") != "plain"))
        except Exception as err:  # noqa: BLE001 - out of memory while evaluating
            out["schemes"][pos] = {"unfit": f"evaluating them failed ({type(err).__name__})"}
            continue
        out["schemes"][pos] = {"ppl": {str(c): v for c, v in ppl.items()}}
    return out




def _heldout_row(model: torch.nn.Module, state_dict: Mapping[str, torch.Tensor], heldout: torch.Tensor | None, *,
                 figures: bool) -> dict[str, Any]:
    """One scheme's held-out figures from one pass (heldout_nll): its weights' sketch, its losses by segment and,
    with `figures`, its perplexity per context."""
    nll = heldout_nll(model, heldout)  # one pass: the outputs' fingerprint and the figures
    row = {"sketch": weight_sketch(state_dict), "heldout_losses": segment_losses(nll)}
    if figures:
        row["heldout"] = {str(c): v for c, v in ppl_of(nll).items()}
    return row


def reader_start() -> tuple[torch.Tensor, dict[str, torch.nn.Module], torch.Tensor]:
    """In a verifier process, once: torch on one thread, the corpus, the five models warmed up (the first forward
    pass sets up kernels once, here, not in every child)."""
    torch.set_num_threads(1)
    tokens = corpus_tokens()
    models = {pos: TinyCharLM(pos=pos, **ARCH).eval() for pos in SCHEMES}
    for model in models.values():
        measure_ppl(model, tokens=tokens, max_windows=1)
        measure_ppl(model, tokens=tokens, max_windows=1, chunked=False)
    return tokens, models, heldout_tokens()  # the held-out text is read now: its file is gone before a child runs


def reader_evaluate(request: dict[str, Any], data: bytes,
                    state: tuple[torch.Tensor, dict[str, torch.nn.Module], torch.Tensor]) -> dict[str, Any]:
    """In the limited child: milestone.pt's bytes evaluated as the request says (_evaluate)."""
    if request.get("threads", 1) != 1:
        torch.set_num_threads(int(request["threads"]))
    return _evaluate(request, data, *state)


def verify(files: dict[str, bytes], *, rules: Any, memory_mb: int) -> checkpoint.CheckpointVerdict:
    """The plug-in's verdict (autograder/checkpoint.py): verify_checkpoint's, one part per scheme."""
    found = verify_checkpoint(files.get("milestone.pt"), files.get("milestone.json"), rules=rules,
                              memory_mb=memory_mb)
    extra = heldout_figures(files.get("milestone.pt"), found, memory_mb=memory_mb)
    parts = {pos: checkpoint.PartVerdict(bool(row.get("passed")), row.get("message") or "", row.get("problem"),
                                         {k: {str(c): v for c, v in row[k].items()}
                                          for k in ("ppl", "claimed", "thresholds") if row.get(k)}
                                         | extra.get(pos, {}))
             for pos, row in found["schemes"].items()}
    return checkpoint.CheckpointVerdict(bool(found["ok"]), found["message"], found.get("problem"), found["credit"],
                              found.get("preset"), parts)



# ---------------------------------------------------------------- the leaderboard and the similarity sketch
# The leaderboard's figure (docs/leaderboard.md): the perplexity the reader child computes itself, per scheme and
# context, on text students never receive: chapters I-IV of another novel by the corpus's author (reference/, the
# graders' data; staged for reader_start only). Only a scheme whose claims agree with the grader's recomputation
# gets one. For the similarity report: a count sketch of the scheme's weights (fixed seed), and its losses on the
# held-out windows by 64-token runs (segment_losses: what the weights compute, found again under permuted units or
# reordered heads), from the same pass.
LEADERBOARD = {"metric": "held-out perplexity", "order": "asc", "axis": "context", "part": "scheme",
               "note": "each scheme's perplexity on text students never receive (chapters I-IV of another novel by "
                       "the corpus's author), computed by the grader's sandboxed checkpoint reader from the weights"}
HELDOUT_FILE = "heldout.txt"
HELDOUT_SHA256 = "a395154f42e8d2f07290b9a493ad292e37de32f597ce2de2cc20127aa6859f64"
# Evenly spaced windows of 513 tokens (of about 60 the text holds): each costs 0.02 CPU-s a checkpoint; 16 (until
# issue 43) cost a class of 300 12 s more on 2 cores for the same figure's error, about 2% (docs/leaderboard.md).
HELDOUT_WINDOWS = 12
SKETCH_SIZE = 256
SEGMENT = 64  # segment_losses: the held-out windows' losses by runs of this many tokens (8 per window, 96 in all)
SEGMENT_DECIMALS = 4  # ... stored to 1e-4 nats (float32 rounding moves them by about 1e-6)
SKETCH_SEED = 8311
# weights' digest -> scheme -> {"heldout", "sketch", "heldout_losses"}
_HELDOUT: dict[str, dict[str, dict[str, Any]]] = {}


def heldout_tokens(path: Path | None = None) -> torch.Tensor:
    """The held-out text's tokens, hash-checked (a changed file is an error naming it, never a silent figure)."""
    path = path or LESSON.checkpoint_dir / HELDOUT_FILE
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != HELDOUT_SHA256:
        raise ValueError(f"{path}: not the held-out text this plug-in knows (sha256 differs); restore it from git")
    return LESSON.trainer.encode(LESSON.trainer.preprocess(data.decode("utf-8")))


@torch.inference_mode()
def heldout_nll(model: torch.nn.Module, tokens: torch.Tensor | None, *, longest: int = max(CONTEXTS)) -> torch.Tensor:
    """Each token's loss (float64, shape (HELDOUT_WINDOWS, longest)) on HELDOUT_WINDOWS evenly spaced windows of
    the held-out tokens, one pass at the longest context per window."""
    if tokens is None:
        raise ValueError("no held-out text")
    model.eval()
    last = len(tokens) - longest - 1
    starts = torch.arange(HELDOUT_WINDOWS) * last // max(1, HELDOUT_WINDOWS - 1)
    rows = []
    for batch in starts.split(VERIFY_BATCH):
        X, Y = windows(tokens, batch, longest)
        with CausalChunks():
            logits = model(X)
        rows.append(F.cross_entropy(logits.float().transpose(1, 2), Y, reduction="none").double())
    return torch.cat(rows)


def ppl_of(nll: torch.Tensor, *, contexts: Sequence[int] = CONTEXTS) -> dict[int, float]:
    """Perplexity per context from heldout_nll's losses (the first c losses of each window giving context c, as
    measure_ppl)."""
    prefix = nll.sum(0).cumsum(0)
    return {c: math.exp(prefix[c - 1].item() / (len(nll) * c)) for c in contexts}


def heldout_ppl(model: torch.nn.Module, tokens: torch.Tensor | None, *,
                contexts: Sequence[int] = CONTEXTS) -> dict[int, float]:
    """Perplexity per context on HELDOUT_WINDOWS evenly spaced windows of the held-out tokens (heldout_nll)."""
    return ppl_of(heldout_nll(model, tokens, longest=max(contexts)), contexts=contexts)


def segment_losses(nll: torch.Tensor, *, size: int = SEGMENT) -> list[float]:
    """What the weights compute, whatever their parametrisation: the mean loss of each run of `size` tokens of
    heldout_nll's windows (window by window), rounded to SEGMENT_DECIMALS. Float32 rounding moves these means by
    about 1e-6 (units permuted, heads reordered, a machine of other kernels), so the stored digits are those it
    cannot move, but at a rounding boundary: the similarity report compares them with a tolerance of several
    steps, never for equality."""
    means = nll.reshape(nll.shape[0], -1, size).mean(-1).flatten()
    return [round(v, SEGMENT_DECIMALS) for v in means.tolist()]


def weight_sketch(state_dict: Mapping[str, torch.Tensor], *, size: int = SKETCH_SIZE) -> list[float]:
    """A count sketch of the weights (every parameter, in name order, added with a fixed random sign into one of
    `size` buckets, a fixed seed): two sketches are as far apart, relative to their norms, as the weights are, up
    to a few percent; identical weights give identical sketches."""
    flat = torch.cat([state_dict[k].detach().double().flatten() for k in sorted(state_dict)])
    gen = torch.Generator().manual_seed(SKETCH_SEED)
    bucket = torch.randint(size, (len(flat),), generator=gen)
    sign = torch.randint(2, (len(flat),), generator=gen).double() * 2 - 1
    out = torch.zeros(size, dtype=torch.float64).index_add_(0, bucket, flat * sign)
    return [round(v, 6) for v in out.tolist()]


def heldout_figures(pt: bytes | None, found: dict[str, Any], *, memory_mb: int) -> dict[str, dict[str, Any]]:
    """Per scheme of a checkpoint that loaded: its weights' sketch, its held-out losses by segment
    ("heldout_losses", segment_losses) and, when its claims agree with the grader's recomputation, its held-out
    perplexity per context ("leaderboard"; the others get no figure); each computed once per weights, in a reader
    child, from one pass over the held-out windows; {} when nothing loaded or the child failed (the verdict stands
    without them)."""
    if not found.get("ok") or not isinstance(pt, bytes):
        return {}
    digest = hashlib.sha256(pt).hexdigest()
    agree = [pos for pos, row in found["schemes"].items() if row.get("agrees")]
    with _lock(digest + ":heldout"):
        kept = _HELDOUT.setdefault(digest, {})
        todo = [pos for pos in found["schemes"] if pos not in kept or (pos in agree and "heldout" not in kept[pos])]
        if todo:
            answer = _run_child(pt, {"schemes": todo, "figures": [p for p in todo if p in agree],
                                     "preset": found.get("preset"), "accepted": [found.get("preset")],
                                     "method": "heldout"}, memory_mb=memory_mb, timeout_s=CHILD_TIMEOUT_S)
            rows = answer.get("schemes")
            if "error" in answer or not isinstance(rows, dict):
                return {}  # tried again next time; the verdict stands without them
            kept.update({pos: r for pos, r in rows.items() if isinstance(r, dict) and "sketch" in r})
    out = {}
    for pos in found["schemes"]:
        if pos in kept:
            out[pos] = {k: kept[pos][k] for k in ("sketch", "heldout_losses") if k in kept[pos]}
            if pos in agree and "heldout" in kept[pos]:
                out[pos]["leaderboard"] = kept[pos]["heldout"]
    return out


def _refused(error: str | None, claims_error: str | None, digest: str, preset: str | None, rules: Any,
             schemes: Sequence[str]) -> dict[str, Any] | None:
    """The whole checkpoint's failure before any scheme is judged (unreadable weights or table, another
    vocabulary, files of two runs, a preset that earns nothing), or None."""
    if error is not None:
        return _failure(f"milestone.pt could not be read as plain weights ({error}). {UPLOAD_HINT}", schemes)
    config = _CONFIGS[digest]
    if claims_error is not None:
        return _failure(f"milestone.json is not a milestone table ({claims_error}). {UPLOAD_HINT}", schemes)
    if not config["vocab_ok"]:
        return _failure("milestone.pt uses another vocabulary; train with the milestone's VOCAB.", schemes)
    if config["preset"] != preset:
        return _failure(f"milestone.pt says preset {config['preset']!r} but milestone.json says "
                        f"{preset!r}; upload the two files from the same run.", schemes)
    if preset not in rules.presets:
        return _failure(f"preset {preset!r} earns no points here; train with one of "
                        f"{sorted(rules.presets)}.", schemes, "checkpoint_preset_not_accepted")
    return None


def _judge_row(row: dict[str, Any], figures: Mapping[int, float], bounds: Mapping[int, float], *, preset: str,
               notes: list[str]) -> None:
    """Finish a scheme's row whose `agrees` is set: the preset's bounds on `figures` (the perplexities the row is
    judged by), whether it passed, its message (`notes` first) and its problem."""
    row["thresholds"] = dict(bounds)
    row["meets_thresholds"] = all(figures[c] <= bound for c, bound in bounds.items())
    row["passed"] = row["agrees"] and row["meets_thresholds"]
    notes = notes + [f"perplexity {figures[c]:.2f} at context {c} is above the {preset} preset's bound {bound:g}: "
                     "train longer or check the scheme" for c, bound in bounds.items() if not figures[c] <= bound]
    row["message"] = "; ".join(notes) or "ok"
    row["problem"] = (None if row["passed"] else
                      "checkpoint_claims_disagree" if not row["agrees"] else "checkpoint_above_bound")


def _loaded(preset: str, rule: Any, *, start: float, cpu_s: float, results: dict[str, Any]) -> dict[str, Any]:
    """The verdict on a checkpoint that loaded: the preset's credit and each scheme's row."""
    return {"ok": True, "message": "checkpoint loaded", "problem": None, "preset": preset,
            "credit": rule.credit, "seconds": time.perf_counter() - start, "cpu_s": cpu_s, "schemes": results}


def verify_checkpoint(pt: str | Path | bytes | None, claims: str | Path | bytes | None, *,
                      schemes: Sequence[str] = SCHEMES, rules: Any = None, max_windows: int | None = None,
                      batch_size: int = VERIFY_BATCH, memory_mb: int = CHILD_MEMORY_MB,
                      timeout_s: float = CHILD_TIMEOUT_S, method: str = "sample",
                      verifier: Verifier | None = None, rng: random.Random | None = None) -> dict[str, Any]:
    """Verify a submitted checkpoint on the CPU against its claimed table and the thresholds.

    pt and claims are milestone.pt and milestone.json as paths or bytes (None: not submitted). rules are
    the milestone section of the grading config (MilestoneRules, as parse_rules returns them; default: read from
    grading_config.yaml): accepted presets with their credit and thresholds, rel_tol, sample_windows, window_tol,
    deficit_audit and verify_windows (max_windows overrides it; the whole re-evaluation only). milestone.pt is
    loaded (weights_only=True) and evaluated in a child process limited to memory_mb beyond the verifier's size
    and to timeout_s; whatever the files hold, the answer is a verdict, never an exception. The child is forked
    from a pre-started Verifier (a pool of them, one per CPU up to 4, kept for the process; `verifier` picks one
    instead). Returns plain data: ok, message, problem, preset, credit, seconds, cpu_s (the children's CPU time,
    0 when nothing was evaluated) and, per scheme, ppl (the figures of these weights: re-evaluated, or estimated
    from the sampled windows), the claimed ppl, the relative differences (of each figure, or of the worst
    recomputed window), the thresholds and the flags agrees, meets_thresholds, passed. Nothing is evaluated
    twice per process for the same weights, also when two threads ask at once (the second waits for the first).
    method "sample" (the grader; _verify_sampled) recomputes a secret random sample of windows, drawn by `rng`
    when a test injects one, against milestone.json's per-window losses; the graders before it re-evaluate
    verify_windows windows and compare the three figures: "prefix" reads all contexts from one 512-token pass
    per window (measure_ppl) with the attention by query chunks (CausalChunks); "plain" is the same pass without
    the chunks; "legacy" runs evaluate_ppl's pass per context, as graders before issue 13 did.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    start = time.perf_counter()
    rules = rules or load_rules()
    try:
        pt_bytes = checkpoint.read_limited(pt, "milestone.pt", MAX_CHECKPOINT_MB * 2**20)
    except FileNotFoundError:
        return _failure(f"milestone.pt was not found. {UPLOAD_HINT}", schemes, "checkpoint_missing")
    except (OSError, ValueError) as err:
        return _failure(f"milestone.pt could not be read as plain weights ({type(err).__name__}: {err}). "
                        f"{UPLOAD_HINT}", schemes)
    try:
        claims_bytes = checkpoint.read_limited(claims, "milestone.json", MAX_CLAIMS_KB * 2**10)
    except FileNotFoundError:
        return _failure(f"milestone.json was not found. {UPLOAD_HINT}", schemes, "checkpoint_missing")
    except (OSError, ValueError) as err:
        return _failure(f"milestone.json is not a milestone table ({err}). {UPLOAD_HINT}", schemes)
    try:
        preset, claimed_ppl, window_loss = read_claims(claims_bytes)
        claims_error = None
    except ValueError as err:
        preset, claimed_ppl, window_loss, claims_error = None, {}, None, str(err)
    windows = max_windows if max_windows is not None else rules.verify_windows
    digest = hashlib.sha256(pt_bytes).hexdigest()
    accepted = sorted(rules.presets)
    wanted = list(schemes) if claims_error is None and preset in accepted else []
    cpu_s = 0.0
    if method == "sample":
        result = _verify_sampled(pt_bytes, digest, hashlib.sha256(claims_bytes).hexdigest(), preset, claimed_ppl,
                                 window_loss, claims_error, schemes=schemes, wanted=wanted, rules=rules,
                                 memory_mb=memory_mb, timeout_s=timeout_s, verifier=verifier, rng=rng, start=start)
        inexact = [pos for pos, row in result["schemes"].items() if row.get("inexact")]
        if inexact:  # not this checkpoint's own evaluation: the figures as a whole decide, as before issue 23
            whole = verify_checkpoint(pt_bytes, claims_bytes, schemes=inexact, rules=rules, max_windows=max_windows,
                                      memory_mb=memory_mb, timeout_s=timeout_s, method="prefix", verifier=verifier)
            result["cpu_s"] += whole["cpu_s"]
            for pos in inexact:
                row = whole["schemes"][pos]
                row["message"] = f"{result['schemes'][pos]['message']}; re-evaluated as a whole: {row['message']}"
                result["schemes"][pos] = row | {"checked": result["schemes"][pos]["checked"],
                                                "flagged": result["schemes"][pos]["flagged"], "whole": True}
            result["seconds"] = time.perf_counter() - start
        return result
    with _lock(digest):  # the same weights uploaded twice (or verified ahead) are evaluated once
        todo = [pos for pos in wanted if (digest, pos, windows, batch_size, method) not in _MEASURED]
        error = _FAILED.get((digest, memory_mb, timeout_s))
        if error is None and (digest not in _CONFIGS or todo):
            found = _run_child(pt_bytes, {"schemes": todo, "windows": windows, "batch": batch_size,
                                          "preset": preset, "accepted": accepted, "method": method},
                               memory_mb=memory_mb, timeout_s=timeout_s, verifier=verifier)
            cpu_s = float(found.get("cpu_s", 0.0))
            error = _kept(found, digest, memory_mb, timeout_s)
            if error is None:
                for pos, result in found.get("schemes", {}).items():
                    _MEASURED[(digest, pos, windows, batch_size, method)] = result
    refused = _refused(error, claims_error, digest, preset, rules, schemes)
    if refused is not None:
        return refused
    rule = rules.presets[preset]
    results = {}
    for pos in schemes:
        row = results[pos] = _row()
        measured = _MEASURED.get((digest, pos, windows, batch_size, method), {})
        if "ppl" not in measured:
            row["problem"] = "checkpoint_wrong_weights"
            row["message"] = (f"the {pos!r} weights do not fit TinyCharLM: {measured['unfit']}" if "unfit" in
                              measured else f"no weights for {pos!r} in milestone.pt: train and save all five "
                              "schemes")
            continue
        row["ppl"] = {int(c): v for c, v in measured["ppl"].items()}
        try:
            row["claimed"] = _claimed_row(claimed_ppl, pos)
        except ValueError as err:
            row["message"], row["problem"] = str(err), "checkpoint_unreadable"
            continue
        row["rel_diff"] = {c: abs(row["ppl"][c] - row["claimed"][c]) / row["claimed"][c] for c in CONTEXTS}
        row["agrees"] = all(d <= rules.rel_tol for d in row["rel_diff"].values())  # False for nan
        notes = [] if row["agrees"] else [
            "milestone.json says " + "/".join(f"{row['claimed'][c]:.2f}" for c in CONTEXTS) + " but these "
            "weights give " + "/".join(f"{row['ppl'][c]:.2f}" for c in CONTEXTS) + f" (more than "
            f"{rules.rel_tol:.0%} apart): upload the two files from the same run"]
        _judge_row(row, row["ppl"], rule.thresholds.get(pos, {}), preset=preset, notes=notes)
    return _loaded(preset, rule, start=start, cpu_s=cpu_s, results=results)


OLD_FORMAT = ("milestone.json has no per-window losses: it was written by an older milestone trainer. Re-run "
              "the milestone cell (train_or_load): it loads your saved models, measures them and rewrites "
              "milestone.json without training; then upload milestone.pt and milestone.json again")
_WINDOWS: dict[tuple[str, str, int], list[float]] = {}  # (digest, scheme, window start) -> loss per context
_UNFIT: dict[tuple[str, str], dict[str, Any]] = {}  # (digest, scheme) -> why its weights were not evaluated
_FITS: set[tuple[str, str]] = set()  # (digest, scheme) whose weights loaded into TinyCharLM


_SECRET = secrets.token_bytes(32)  # drawn from the operating system in the grading process, never stored


def write_reference_windows() -> Path:
    """Write the lesson's window_losses.json from its committed checkpoint: each scheme's loss on all validation
    windows, one 512-token pass each on one thread, rounded to 1e-3 (about 100 CPU-s, once)."""
    torch.set_num_threads(1)
    _, states = load_checkpoint(LESSON.checkpoint_dir / "milestone.pt")
    tokens, starts = corpus_tokens(), val_starts().tolist()
    loss = {}
    for pos in SCHEMES:
        rows = measure_windows(build_model(pos, states[pos]), tokens=tokens, starts=starts)
        loss[pos] = {str(c): [round(r[k], 3) for r in rows] for k, c in enumerate(CONTEXTS)}
    about = ("the reference checkpoint's loss (nats per token) on each of the 3,000 validation windows (starts "
             "100,000 + i) per scheme and context, one 512-token pass each (measure_windows), "
             "rounded to 1e-3: the grader's predictor of a submission's per-window losses; never shipped to students")
    rows = ",\n".join(f'    "{pos}": ' + json.dumps(row, separators=(",", ":")) for pos, row in loss.items())
    path = LESSON.checkpoint_dir / "window_losses.json"
    path.write_text('{\n  "about": ' + json.dumps(about) + ',\n  "loss": {\n' + rows + "\n  }\n}\n")
    return path


def secret_rng(key: str) -> random.Random:
    """The grader's window sampler for `key` (the checkpoint's and milestone.json's digests and a scheme): seeded
    by an HMAC of the key under a secret drawn from the operating system's randomness in this grading process, so
    nothing in a submission, and nothing its author can know, decides which windows are recomputed, while the same
    files verified twice in one run (verified ahead, then judged) draw the same windows and are evaluated once."""
    return random.Random(hmac.new(_SECRET, key.encode(), "sha256").digest())


def _kept(found: dict[str, Any], digest: str, memory_mb: int, timeout_s: float) -> str | None:
    """What a reader child answered for these weights, kept: its error (remembered for these limits unless it was
    the grader's own failure, which is tried again next time), or None with the checkpoint's config remembered."""
    if "error" in found or not isinstance(found.get("config"), dict):
        error = str(found.get("error"))
        if not found.get("infrastructure"):
            _FAILED[(digest, memory_mb, timeout_s)] = error
        return error
    _CONFIGS[digest] = found["config"]
    return None


def _measure(pt_bytes: bytes, digest: str, starts: Mapping[str, Sequence[int]], *, preset: str | None,
             accepted: list[str], memory_mb: int, timeout_s: float, verifier: Verifier | None,
             heldout: bool = False) -> tuple[str | None, float]:
    """Recompute in one limited child the windows (per scheme: their starts) not measured yet for these weights;
    with `heldout`, the held-out pass of each scheme that loads too, kept for heldout_figures (one child, not two,
    per checkpoint: its figure is shown only where the claims agree). The child's error, if any, and its CPU seconds
    (the held-out pass's left out: it verifies nothing)."""
    with _lock(digest):
        todo = {pos: [t for t in dict.fromkeys(ts) if (digest, pos, t) not in _WINDOWS]
                for pos, ts in starts.items() if (digest, pos) not in _UNFIT}
        todo = {pos: ts for pos, ts in todo.items() if ts or (digest, pos) not in _FITS}
        error = _FAILED.get((digest, memory_mb, timeout_s))
        if error is not None or (digest in _CONFIGS and not todo):
            return error, 0.0
        found = _run_child(pt_bytes, {"schemes": list(todo), "starts": todo, "windows": 0, "batch": VERIFY_BATCH,
                                      "preset": preset, "accepted": accepted, "method": "sample",
                                      "heldout": heldout and digest not in _HELDOUT},
                           memory_mb=memory_mb, timeout_s=timeout_s, verifier=verifier)
        error = _kept(found, digest, memory_mb, timeout_s)
        if error is None:
            for pos, result in found.get("schemes", {}).items():
                if "windows" in result:
                    _FITS.add((digest, pos))
                    _WINDOWS.update({(digest, pos, t): v for t, v in zip(todo[pos], result["windows"], strict=True)})
                    if isinstance(result.get("heldout_row"), dict):
                        with _lock(digest + ":heldout"):
                            _HELDOUT.setdefault(digest, {})[pos] = result["heldout_row"]
                else:
                    _UNFIT[(digest, pos)] = result
        return error, max(0.0, float(found.get("cpu_s", 0.0)) - float(found.get("heldout_cpu_s", 0.0)))


def _verify_sampled(pt_bytes: bytes, digest: str, claims_digest: str, preset: str | None,
                    claimed_ppl: dict[str, Any], window_loss: Any, claims_error: str | None, *,
                    schemes: Sequence[str], wanted: list[str], rules: Any, memory_mb: int, timeout_s: float,
                    verifier: Verifier | None, rng: random.Random | None, start: float) -> dict[str, Any]:
    """verify_checkpoint by samples (docs/milestone.md): each scheme's claimed perplexities must be the exp-mean
    of its claimed per-window losses; sample_windows windows drawn by `rng` (secret_rng unless a test injects
    one), and each other window with a probability proportional to how far its claim lies below the loss predicted
    from the reference's (a + b x reference loss, fitted on the drawn windows per context; deficit_audit), are
    recomputed and must agree within window_tol
    (the flagged ones only when the drawn ones agree: a disagreement already settles the verdict)."""
    accepted = sorted(rules.presets)
    all_starts = val_starts(max_windows=PRESETS[preset]["eval_windows"]).tolist() if preset in PRESETS else []
    n = len(all_starts)
    claims: dict[str, tuple[dict[int, float], dict[int, list[float]]]] = {}
    notes: dict[str, tuple[str, str]] = {}
    for pos in wanted:
        try:
            ppl = _claimed_row(claimed_ppl, pos)
            if window_loss is None:
                notes[pos] = (OLD_FORMAT, "checkpoint_old_format")
                continue
            claims[pos] = ppl, _claimed_windows(window_loss, pos, n)
        except ValueError as err:
            notes[pos] = (str(err), "checkpoint_unreadable")
    order = {pos: (rng or secret_rng(f"{digest}:{claims_digest}:{pos}")).sample(range(n), n) for pos in claims}
    sample = {pos: sorted(order[pos][:rules.sample_windows]) for pos in claims}
    common = {"preset": preset, "accepted": accepted, "memory_mb": memory_mb, "timeout_s": timeout_s,
              "verifier": verifier}
    first = {p: [all_starts[i] for i in ix] for p, ix in sample.items()} | dict.fromkeys(notes, [])  # fit only
    error, cpu_s = _measure(pt_bytes, digest, first, **common, heldout=verifier is None)
    flagged: dict[str, list[int]] = {}
    if error is None and claims:
        ref, base = reference_windows(), int(val_starts()[0])
        for pos, ix in sample.items():
            if (digest, pos) in _UNFIT or any(  # a disagreeing sample settles the verdict: nothing more to check
                    not abs(_WINDOWS[(digest, pos, all_starts[i])][k] - claims[pos][1][c][i]) <= rules.window_tol
                    for i in ix for k, c in enumerate(CONTEXTS)):
                continue
            # more uniform draws when the model's windows stray from the reference's line (sample_size), and window i
            # recomputed with probability min(1, deficit_i / scale): deficit_i is how far (beyond window_tol, in
            # the worst context) its claim lies below a + b x reference loss, fitted on the drawn windows;
            # scale = n (log(1 + rel_tol) - 2 window_tol) / deficit_audit (docs/milestone.md)
            delta = max(math.log1p(rules.rel_tol) - 2 * rules.window_tol, 1e-9)
            scale = n * delta / rules.deficit_audit
            deficit, spread = [0.0] * n, 0.0
            for k, c in enumerate(CONTEXTS):
                x = [ref[pos][c][all_starts[i] - base] for i in ix]
                y = [_WINDOWS[(digest, pos, all_starts[i])][k] for i in ix]
                a, b = _fit(x, y)
                spread = max(spread, math.sqrt(math.fsum((v - a - b * u) ** 2 for u, v in zip(x, y, strict=True))
                                               / max(1, len(ix) - 2)))
                claimed = claims[pos][1][c]
                for i in range(n):
                    gap = a + b * ref[pos][c][all_starts[i] - base] - claimed[i] - rules.window_tol
                    deficit[i] = max(deficit[i], gap)
            draws = (rng or secret_rng(f"{digest}:{claims_digest}:{pos}:audit")).random
            extra = {i for i in range(n) if draws() * scale < deficit[i]}
            extra |= set(order[pos][len(ix):sample_size(SPREAD_UPPER * spread, n=n, k0=len(ix), delta=delta,
                                                        audit=rules.deficit_audit)])
            flagged[pos] = sorted(extra - set(ix))
        if any(flagged.values()):
            error, more = _measure(pt_bytes, digest, {p: [all_starts[i] for i in ix] for p, ix in flagged.items()},
                                   **common)
            cpu_s += more
    refused = _refused(error, claims_error, digest, preset, rules, schemes)
    if refused is not None:
        return refused
    rule = rules.presets[preset]
    results = {}
    for pos in schemes:
        row = results[pos] = _row()
        unfit = _UNFIT.get((digest, pos), {"missing": True} if pos not in claims and pos not in notes else {})
        if unfit:
            row["problem"] = "checkpoint_wrong_weights"
            row["message"] = (f"the {pos!r} weights do not fit TinyCharLM: {unfit['unfit']}" if "unfit" in unfit
                              else f"no weights for {pos!r} in milestone.pt: train and save all five schemes")
            continue
        if pos in notes:
            row["message"], row["problem"] = notes[pos]
            continue
        row["claimed"], losses = claims[pos]
        ix, checked = sample[pos], sample[pos] + flagged.get(pos, [])
        true = {i: _WINDOWS[(digest, pos, all_starts[i])] for i in checked}
        gaps = {c: [true[i][k] - losses[c][i] for i in checked] for k, c in enumerate(CONTEXTS)}
        row["rel_diff"] = {c: max(abs(math.expm1(g)) for g in gaps[c]) for c in CONTEXTS}
        # the figures these weights give, estimated from the random sample alone (no reference involved)
        row["ppl"] = {c: row["claimed"][c] * math.exp(math.fsum(gaps[c][:len(ix)]) / len(ix)) for c in CONTEXTS}
        row["checked"], row["flagged"] = len(checked), len(checked) - len(ix)
        exact = ppl_from_windows(losses)
        inconsistent = [c for c in CONTEXTS if abs(exact[c] - row["claimed"][c]) > 1e-9 * exact[c]]
        wrong = [(c, i, g) for c in CONTEXTS for i, g in zip(checked, gaps[c], strict=True)
                 if not abs(g) <= rules.window_tol]
        row["agrees"] = not inconsistent and not wrong
        row["inexact"] = bool(wrong) and not inconsistent
        notes_ = [f"milestone.json gives {pos!r} the perplexity {row['claimed'][c]:.4f} at context {c} but its own "
                  f"per-window losses give {exact[c]:.4f}: upload milestone.json exactly as save_checkpoint wrote it"
                  for c in inconsistent[:1]]
        if wrong:
            c, i, g = max(wrong, key=lambda w: abs(w[2]))
            notes_.append(f"{len({w[1] for w in wrong})} of {len(checked)} recomputed windows differ from "
                          f"milestone.json (window {i} at context {c}: it says loss {losses[c][i]:.4f}, these weights "
                          f"give {losses[c][i] + g:.4f}; allowed {rules.window_tol:g})")
        _judge_row(row, row["claimed"], rule.thresholds.get(pos, {}), preset=preset, notes=notes_)
    return _loaded(preset, rule, start=start, cpu_s=cpu_s, results=results)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: train a preset with the reference model and save, or verify a checkpoint."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="quick")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--precision", choices=PRECISIONS, default="bf16",
                        help="CUDA only: bf16 autocast (default) or float32 with TF32 matrix products")
    parser.add_argument("--no-graph", action="store_true", help="CUDA only: train eagerly, not as a CUDA graph")
    parser.add_argument("--out", type=Path, default=Path("."), help="folder for milestone.pt/.json/.png")
    parser.add_argument("--verify", action="store_true", help="verify OUT/milestone.pt instead of training")
    parser.add_argument("--reference-windows", action="store_true", help="write the reference checkpoint's "
                        "loss on every validation window (the grader's predictor) next to it, and stop")
    parser.add_argument("--smoke", action="store_true", help=argparse.SUPPRESS)  # 3 steps of batch 4 (tests)
    args = parser.parse_args(argv)
    if args.reference_windows:
        write_reference_windows()
        return 0
    if args.smoke:  # this process only: a tiny run of the same code path, saved under the preset's name
        PRESETS[args.preset].update(steps=3, batch_size=4, eval_windows=20)
    pt_path, json_path = args.out / "milestone.pt", args.out / "milestone.json"
    if args.verify:
        result = verify_checkpoint(pt_path if pt_path.exists() else None,
                                   json_path if json_path.exists() else None)
        print(json.dumps(result, indent=2))
        return 0 if result["ok"] and all(r["passed"] for r in result["schemes"].values()) else 1
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    models, table = run_milestone(TinyCharLM, args.preset, device=args.device, precision=args.precision,
                                  graph=False if args.no_graph else None)
    print(f"trained and evaluated in {time.perf_counter() - start:.0f} s")
    save_checkpoint(models, table, preset=args.preset, pt_path=pt_path, json_path=json_path)
    plot_table(table, path=args.out / "milestone.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
