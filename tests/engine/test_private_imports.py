"""No module takes another module's private names: `from x import _y`, and `x._y` where `x` is an imported module
of this repository, fail here (import-linter, run by `make check`, keeps the layers and forbids circles, but has no
contract for underscore names). A module's own underscore names and dunder names are fine."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("autograder", "tests", "benchmarks")
# Temporary: the sandbox's files still share underscore names among themselves; removed when the sandbox branch
# lands (its front door, autograder/sandbox/__init__.py, makes them public).
# The folders tests import from by bare module name (pyproject.toml's pytest pythonpath) and the lessons' modules.
BARE = ("tests", "tests/engine", "tests/lesson83", "assignments/*", "tests/fixtures/*/assignments/*")


def project_modules() -> set[str]:
    """Every importable module name of this repository (dotted from the root, and bare from BARE's folders)."""
    names: set[str] = set()
    for top in ("autograder", "benchmarks", "reference", "tests"):
        for path in (ROOT / top).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    for pattern in BARE:
        for folder in ROOT.glob(pattern):
            names.update(p.stem for p in folder.glob("*.py"))
    return names


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_uses(path: Path, modules: set[str]) -> list[str]:
    """`from x import _y`, and `x._y` on a name bound to a module of the repository by an import, in one file."""
    tree = ast.parse(path.read_text(), str(path))
    bound: dict[str, str] = {}  # local name -> the repository's module it is bound to
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules or alias.name.split(".")[0] in modules:
                    bound[alias.asname or alias.name.split(".")[0]] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                if is_private(alias.name) and f"{node.module}.{alias.name}" not in modules:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: from {node.module} import {alias.name}")
                elif f"{node.module}.{alias.name}" in modules:
                    bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            base = node.value
            chain = []
            while isinstance(base, ast.Attribute):
                chain.append(base.attr)
                base = base.value
            if isinstance(base, ast.Name) and base.id in bound:
                dotted = ".".join([base.id, *reversed(chain)])
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {dotted}.{node.attr}")
    return found


def scanned_files() -> list[Path]:
    files = [p for top in SCANNED for p in sorted((ROOT / top).rglob("*.py"))]
    return [p for p in files if "fixtures" not in p.relative_to(ROOT).parts]


def test_no_module_takes_another_modules_private_names() -> None:
    modules = project_modules()
    found = [use for path in scanned_files() for use in private_uses(path, modules)]
    assert not found, "private names taken across modules (make them public):\n" + "\n".join(found)


def test_no_test_file_imports_another() -> None:
    """Tests share helpers through tests/helpers/ (a package), never by importing another test file or conftest."""
    names = {p.stem for p in (ROOT / "tests").rglob("*.py") if p.stem.startswith("test_") or p.stem == "conftest"}
    found = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            imported = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            found += [f"{path.relative_to(ROOT)}:{node.lineno}: {m}" for m in imported if m.split(".")[-1] in names]
    assert found == [], "move what they share into tests/helpers/:\n" + "\n".join(found)


def test_the_scan_sees_both_forms(tmp_path: Path) -> None:
    """The two forms are found, and neither a module's own names nor dunders are."""
    path = ROOT / "tests" / "engine" / "_private_probe.py"
    code = ("import autograder.report.render as render\nfrom autograder.report.text import _hidden\n"
            "from autograder import wire\nx = render._secret + wire._other + wire.__name__\n_own = 1\nprint(_own)\n")
    try:
        path.write_text(code)
        found = private_uses(path, project_modules())
    finally:
        path.unlink()
    assert [f.split(": ", 1)[1] for f in found] == ["from autograder.report.text import _hidden",
                                                      "render._secret", "wire._other"], found
