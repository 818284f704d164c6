"""read_regular reads a file's bytes up to a limit, never more: at the size the file had when it was opened (plus
one byte), and on, as far as the limit, when the file grew since (issue 43: asking for the whole limit at once
made reading a class's checkpoints ten times slower)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from autograder.grading import submissions
from autograder.grading.submissions import Refused, read_regular


def test_a_file_is_read_whole_up_to_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    for data in (b"", b"x", os.urandom(100_000)):
        path.write_bytes(data)
        assert read_regular(path, limit=len(data), label="f") == data
        assert read_regular(path, limit=10**7, label="f") == data
    with pytest.raises(Refused, match="over the"):
        read_regular(path, limit=99_999, label="f")


def _shrunk_stat(monkeypatch: pytest.MonkeyPatch, size: int) -> None:
    """os.fstat as the grader sees it says the file holds `size` bytes: the file grew after it was opened."""
    real = os.fstat

    class Grown:
        def __init__(self, st: os.stat_result) -> None:
            self.st = st

        def __getattr__(self, name: str) -> Any:
            return size if name == "st_size" else getattr(self.st, name)

    monkeypatch.setattr(submissions.os, "fstat", lambda fd: Grown(real(fd)))


def test_a_file_that_grew_after_it_was_opened_is_read_on_or_refused(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "grows.bin"
    data = os.urandom(5000)
    path.write_bytes(data)
    _shrunk_stat(monkeypatch, 100)
    assert read_regular(path, limit=6000, label="grows") == data  # read on past the size it had
    assert read_regular(path, limit=5000, label="grows") == data
    with pytest.raises(Refused, match="over the"):
        read_regular(path, limit=4999, label="grows")  # never more than the limit (and one byte) is read
