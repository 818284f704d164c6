"""Milestone stage: train the reference TinyCharLM on the protocol, and verify submitted checkpoints on the CPU."""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from autograder.config import Milestone, load_config
from autograder.lesson83_milestone import (
    ARCH,
    CONTEXTS,
    PRESETS,
    SCHEMES,
    VOCAB,
    evaluate_ppl,
    load_checkpoint,
    plot_table,
    run_milestone,
    save_checkpoint,
)
from reference.lesson83 import TinyCharLM

# Verification re-evaluates on 300 evenly spaced validation windows, starting at 100,000 + 10 i (i = 0..299).
VERIFY_WINDOWS = 300
VERIFY_BATCH = 50  # larger batches than the protocol's 16 run faster on a CPU and give the same mean
MAX_CHECKPOINT_MB = 64  # five models in float32 take about 4 MB
UPLOAD_HINT = ("Upload milestone.pt and milestone.json next to your notebook, exactly as the milestone's "
               "save cell writes them (save_checkpoint).")


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
    "checkpoint_above_bound": "the re-evaluated perplexity is above the preset's bound: check the positional "
                              "code, or train the full preset.",
    "checkpoint_preset_not_accepted": "the checkpoint was trained with a preset this course does not accept.",
}
_MEASURED: dict[tuple[str, str, int, int], dict[int, float]] = {}


def _row(message: str = "", problem: str | None = None) -> dict[str, Any]:
    return {"passed": False, "agrees": False, "meets_thresholds": False, "ppl": {}, "claimed": {},
            "rel_diff": {}, "thresholds": {}, "message": message, "problem": problem}


def _failure(message: str, schemes: Sequence[str], problem: str = "checkpoint_unreadable") -> dict[str, Any]:
    return {"ok": False, "message": message, "problem": problem, "preset": None, "credit": 0.0, "seconds": 0.0,
            "schemes": {pos: _row(message, problem) for pos in schemes}}


def _read(data: str | Path | bytes | None, name: str) -> bytes:
    if data is None:
        raise FileNotFoundError(name)
    if isinstance(data, bytes):
        return data
    path = Path(data)
    if path.stat().st_size > MAX_CHECKPOINT_MB * 2**20:
        raise ValueError(f"{name} is larger than {MAX_CHECKPOINT_MB} MB")
    return path.read_bytes()


def verify_checkpoint(pt: str | Path | bytes | None, claims: str | Path | bytes | None, *,
                      schemes: Sequence[str] = SCHEMES, rules: Milestone | None = None,
                      max_windows: int | None = None, batch_size: int = VERIFY_BATCH) -> dict[str, Any]:
    """Re-evaluate a submitted checkpoint on the CPU and compare with its claimed table and the thresholds.

    pt and claims are milestone.pt and milestone.json as paths or bytes (None: not submitted). rules are
    the milestone section of the grading config (default: grading_config.yaml): accepted presets with
    their credit and thresholds, rel_tol and the number of validation windows (max_windows overrides it).
    Returns plain data: ok, message, preset, credit, seconds and, per scheme, the re-evaluated ppl, the
    claimed ppl, the relative differences, the thresholds and the flags agrees, meets_thresholds, passed.
    """
    start = time.perf_counter()
    rules = rules or load_config().milestone
    try:
        pt_bytes = _read(pt, "milestone.pt")
        digest = hashlib.sha256(pt_bytes).hexdigest()
        config, state_dicts = load_checkpoint(pt_bytes)
    except FileNotFoundError:
        return _failure(f"milestone.pt was not found. {UPLOAD_HINT}", schemes, "checkpoint_missing")
    except Exception as err:  # weights_only refusals, corrupt zips, wrong layout, too large
        first = str(err).splitlines()[0] if str(err) else ""
        return _failure(f"milestone.pt could not be read as plain weights ({type(err).__name__}: {first}). "
                        f"{UPLOAD_HINT}", schemes)
    try:
        record = json.loads(_read(claims, "milestone.json"))
        preset, claimed_ppl = record["preset"], record["ppl"]
    except FileNotFoundError:
        return _failure(f"milestone.json was not found. {UPLOAD_HINT}", schemes, "checkpoint_missing")
    except (ValueError, KeyError, TypeError) as err:
        return _failure(f"milestone.json is not a milestone table ({type(err).__name__}: {err}). "
                        f"{UPLOAD_HINT}", schemes)
    if config.get("vocab") != list(VOCAB):
        return _failure("milestone.pt uses another vocabulary; train with the milestone's VOCAB.", schemes)
    if config.get("preset") != preset:
        return _failure(f"milestone.pt says preset {config.get('preset')!r} but milestone.json says "
                        f"{preset!r}; upload the two files from the same run.", schemes)
    if preset not in rules.presets:
        return _failure(f"preset {preset!r} earns no points here; train with one of "
                        f"{sorted(rules.presets)}.", schemes, "checkpoint_preset_not_accepted")
    rule = rules.presets[preset]
    windows = max_windows if max_windows is not None else rules.verify_windows
    results = {}
    for pos in schemes:
        row = results[pos] = _row()
        if pos not in state_dicts:
            row["message"] = f"no weights for {pos!r} in milestone.pt: train and save all five schemes"
            row["problem"] = "checkpoint_wrong_weights"
            continue
        try:
            model = build_model(pos, state_dicts[pos])
        except Exception as err:
            row["message"] = f"the {pos!r} weights do not fit TinyCharLM: {str(err).splitlines()[0]}"
            row["problem"] = "checkpoint_wrong_weights"
            continue
        key = (digest, pos, windows, batch_size)
        if key not in _MEASURED:  # the same weights uploaded twice are evaluated once
            _MEASURED[key] = evaluate_ppl(model, batch_size=batch_size, max_windows=windows)
        row["ppl"] = dict(_MEASURED[key])
        try:
            row["claimed"] = {c: float(claimed_ppl[pos][str(c)]) for c in CONTEXTS}
        except (KeyError, TypeError, ValueError):
            row["message"] = f"milestone.json has no perplexity for {pos!r} at every context {CONTEXTS}"
            row["problem"] = "checkpoint_unreadable"
            continue
        row["rel_diff"] = {c: abs(row["ppl"][c] - row["claimed"][c]) / row["claimed"][c] for c in CONTEXTS}
        row["agrees"] = all(d <= rules.rel_tol for d in row["rel_diff"].values())  # False for nan
        row["thresholds"] = bounds = dict(rule.thresholds.get(pos, {}))
        row["meets_thresholds"] = all(row["ppl"][c] <= bound for c, bound in bounds.items())
        row["passed"] = row["agrees"] and row["meets_thresholds"]
        notes = [] if row["agrees"] else [
            "milestone.json says " + "/".join(f"{row['claimed'][c]:.2f}" for c in CONTEXTS) + " but these "
            "weights give " + "/".join(f"{row['ppl'][c]:.2f}" for c in CONTEXTS) + f" (more than "
            f"{rules.rel_tol:.0%} apart): upload the two files from the same run"]
        notes += [f"perplexity {row['ppl'][c]:.2f} at context {c} is above the {preset} preset's bound "
                  f"{bound:g}: train longer or check the scheme" for c, bound in bounds.items()
                  if not row["ppl"][c] <= bound]
        row["message"] = "; ".join(notes) or "ok"
        row["problem"] = (None if row["passed"] else
                          "checkpoint_claims_disagree" if not row["agrees"] else "checkpoint_above_bound")
    return {"ok": True, "message": "checkpoint loaded", "preset": preset, "credit": rule.credit,
            "seconds": time.perf_counter() - start, "schemes": results}


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: train a preset with the reference model and save, or verify a checkpoint."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="quick")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--out", type=Path, default=Path("."), help="folder for milestone.pt/.json/.png")
    parser.add_argument("--verify", action="store_true", help="verify OUT/milestone.pt instead of training")
    args = parser.parse_args(argv)
    pt_path, json_path = args.out / "milestone.pt", args.out / "milestone.json"
    if args.verify:
        result = verify_checkpoint(pt_path if pt_path.exists() else None,
                                   json_path if json_path.exists() else None)
        print(json.dumps(result, indent=2))
        return 0 if result["ok"] and all(r["passed"] for r in result["schemes"].values()) else 1
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    models, table = run_milestone(TinyCharLM, args.preset, device=args.device)
    print(f"trained and evaluated in {time.perf_counter() - start:.0f} s")
    save_checkpoint(models, table, preset=args.preset, pt_path=pt_path, json_path=json_path)
    plot_table(table, path=args.out / "milestone.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
