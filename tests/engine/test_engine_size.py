"""No engine file over 600 lines (issue 22): each module of autograder/ holds one job that its name says."""

from __future__ import annotations

from pathlib import Path

ENGINE = Path(__file__).resolve().parents[2] / "autograder"
MAX_LINES = 600

# Path under autograder/ -> the work that splits it. The coordinator removes an entry when that work is merged; an
# entry that is no longer over the limit fails below, so the list only shrinks.
STILL_BEING_SPLIT: dict[str, str] = {}


def oversized(root: Path, *, limit: int = MAX_LINES) -> dict[str, int]:
    """Every Python file under root with more than `limit` lines: path relative to root -> its line count."""
    sizes = {p.relative_to(root).as_posix(): len(p.read_text().splitlines()) for p in sorted(root.rglob("*.py"))}
    return {path: n for path, n in sizes.items() if n > limit}


def test_no_engine_file_is_over_600_lines() -> None:
    found = {path: n for path, n in oversized(ENGINE).items() if path not in STILL_BEING_SPLIT}
    assert found == {}, f"autograder/ files over {MAX_LINES} lines (split them by job): {found}"


def test_the_allow_list_only_holds_files_still_over_the_limit() -> None:
    over = oversized(ENGINE)
    done = [path for path in STILL_BEING_SPLIT if path not in over]
    assert done == [], f"no longer over {MAX_LINES} lines: remove them from STILL_BEING_SPLIT: {done}"


def test_a_long_file_is_found(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "short.py").write_text("x = 1\n" * MAX_LINES)
    assert oversized(tmp_path) == {"pkg/long.py": MAX_LINES + 1}
