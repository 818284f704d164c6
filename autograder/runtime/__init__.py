"""The runtime shipped next to every lesson's checks module: the checks runtime (checks_runtime.py, numpy only) and
the kit modules a lesson may import besides it (generic checks, the PyTorch kit); `runtime_files` lists them all."""

from __future__ import annotations

from pathlib import Path

CORE = "checks_runtime"  # the one every lesson's checks module imports (`from checks_runtime import *`)


def runtime_files() -> dict[str, Path]:
    """Module name -> file of every runtime module (each .py of this folder but __init__), the core first: what the
    release may ship, the sandbox stages and the guard watches, derived from the folder so none is forgotten."""
    here = Path(__file__).resolve().parent
    names = sorted(p.stem for p in here.glob("*.py") if p.stem != "__init__")
    return {n: here / f"{n}.py" for n in sorted(names, key=lambda n: n != CORE)}


def runtime_modules() -> tuple[str, ...]:
    """The runtime modules' names, as a lesson's checks module imports them (top-level, next to the notebook)."""
    return tuple(runtime_files())
