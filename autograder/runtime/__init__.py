"""The checks runtime shipped next to every lesson's checks module: every .py of this folder but this one."""

from __future__ import annotations

from pathlib import Path

RUNTIME_DIR = Path(__file__).resolve().parent


def runtime_files() -> dict[str, Path]:
    """Top-level module name -> file of every runtime module (each .py here but __init__.py, by name): shipped
    beside the lesson's checks module, staged in the sandbox and guarded there under that name."""
    return {p.stem: p for p in sorted(RUNTIME_DIR.glob("*.py")) if p.name != "__init__.py"}


def runtime_modules() -> tuple[str, ...]:
    """The runtime modules' top-level names (checks_runtime, ...)."""
    return tuple(runtime_files())
