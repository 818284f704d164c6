"""The runtime shipped next to every lesson's checks module: the checks runtime (checks_runtime.py, numpy only), the
engine's codec of plain data it imports (plain_codec.py, which the engine imports too) and the kit modules a lesson
may import besides it (generic checks, the PyTorch kit); `runtime_files` lists them all, `runtime_for` those a
lesson's checks module needs."""

from __future__ import annotations

import ast
from pathlib import Path

CORE = "checks_runtime"  # the one every lesson's checks module imports (`from checks_runtime import *`)
CODEC = "plain_codec"  # the engine's codec, which the core imports: `autograder.runtime.plain_codec` in the engine


def runtime_files() -> dict[str, Path]:
    """Module name -> file of every runtime module (each .py of this folder but __init__), the core first: what the
    release may ship, the sandbox stages and the guard watches, derived from the folder so none is forgotten."""
    here = Path(__file__).resolve().parent
    names = sorted(p.stem for p in here.glob("*.py") if p.stem != "__init__")
    return {n: here / f"{n}.py" for n in sorted(names, key=lambda n: n != CORE)}


def runtime_modules() -> tuple[str, ...]:
    """The runtime modules' names, as a lesson's checks module imports them (top-level, next to the notebook)."""
    return tuple(runtime_files())


def runtime_for(checks: Path) -> dict[str, Path]:
    """Module name -> file of the runtime modules that the checks module at `checks` needs, each after the modules it
    imports: the core and what it imports (the codec), then the kit modules `checks` imports, directly or through
    each other. What a lesson ships, stages in the sandbox and loads its own copies of (autograder/lesson.py)."""
    files = runtime_files()
    out: dict[str, Path] = {}
    seen: set[str] = set()

    def visit(name: str) -> None:
        seen.add(name)
        for needed in imported_modules(files[name]):
            if needed in files and needed not in seen:
                visit(needed)
        out[name] = files[name]

    visit(CORE)
    for name in imported_modules(checks):
        if name in files and name not in seen:
            visit(name)
    return out


def imported_modules(path: Path) -> list[str]:
    """The top-level modules a Python file imports (`import a.b` and `from a import b` give a; relative imports
    none), in the order written."""
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append(node.module.split(".")[0])
    return out
