"""The report package's own files: its templates and static files ship with an installed copy, no module is over
600 lines, and the page's Content-Security-Policy allows exactly the script it ships."""

from __future__ import annotations

import ast
import base64
import hashlib
import re
from fnmatch import fnmatch
from pathlib import Path

from autograder.report import SCRIPT, SCRIPT_HASH, write_report  # noqa: F401 - the import path the CLI uses

PACKAGE = Path(__file__).resolve().parents[2] / "autograder"
REPORT = PACKAGE / "report"


def test_every_template_and_static_file_is_package_data() -> None:
    """setuptools' globs are relative to the package's folder (pyproject.toml, [tool.setuptools.package-data])."""
    line = re.search(r"^autograder = (\[.*\])$", (PACKAGE.parent / "pyproject.toml").read_text(), re.M)
    assert line, "pyproject.toml lists no package-data for autograder"
    globs = ast.literal_eval(line.group(1))
    files = [p.relative_to(PACKAGE).as_posix() for d in ("templates", "static") for p in (REPORT / d).iterdir()
             if p.is_file()]
    assert files
    assert [f for f in files if not any(fnmatch(f, g) for g in globs)] == []


def test_no_report_module_is_over_600_lines() -> None:
    sizes = {p.name: len(p.read_text().splitlines()) for p in REPORT.glob("*.py")}
    assert {name: n for name, n in sizes.items() if n > 600} == {}


def test_the_policy_hash_is_that_of_the_shipped_script() -> None:
    shipped = (REPORT / "static" / "report.js").read_text(encoding="utf-8")
    assert SCRIPT == shipped
    assert SCRIPT_HASH == base64.b64encode(hashlib.sha256(shipped.encode("utf-8")).digest()).decode("ascii")
