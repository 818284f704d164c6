"""A checkpoint reader started ahead (the pool's warm: grade_batch calls it, through autograder.checkpoint's
warm_reader, when an upload holds a checkpoint): the first request takes the reader started ahead, whether or not
its start has ended, and no second one is started; a pool closed while its reader starts closes it once started."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from autograder.sandbox import reader_pool


class FakeReader:
    """Stands for a Verifier: its start waits for `go`, its requests answer at once."""

    made: list[FakeReader] = []

    def __init__(self, go: threading.Event) -> None:
        self.go, self.started, self.closed = go, False, False
        FakeReader.made.append(self)

    def start(self) -> FakeReader:
        self.go.wait(10)
        self.started = True
        return self

    def request(self, data: bytes, request: dict[str, Any], *, timeout_s: float) -> dict[str, Any]:
        return {"by": id(self), "started": self.started}

    def close(self) -> None:
        self.closed = True


def test_the_first_request_takes_the_reader_started_ahead(tmp_path: Path) -> None:
    FakeReader.made.clear()
    go = threading.Event()
    pool = reader_pool(tmp_path / "plugin.py", make=lambda plugin: FakeReader(go))
    pool.warm()
    pool.warm()  # one reader starting is enough
    answer: list[dict[str, Any]] = []
    asking = threading.Thread(target=lambda: answer.append(pool.request(b"", {}, timeout_s=5)))
    asking.start()
    asking.join(0.2)
    assert not answer  # waits for the reader that is starting rather than starting another
    go.set()
    asking.join(10)
    assert len(FakeReader.made) == 1 and answer == [{"by": id(FakeReader.made[0]), "started": True}]
    assert pool.request(b"", {}, timeout_s=5)["by"] == id(FakeReader.made[0])  # kept idle, reused
    pool.close()
    assert FakeReader.made[0].closed


def test_a_pool_closed_while_its_reader_starts_closes_it_once_started(tmp_path: Path) -> None:
    FakeReader.made.clear()
    go = threading.Event()
    pool = reader_pool(tmp_path / "plugin.py", make=lambda plugin: FakeReader(go))
    pool.warm()
    pool.close()
    assert FakeReader.made == [] or not FakeReader.made[0].closed
    go.set()
    for _ in range(100):
        if FakeReader.made and FakeReader.made[0].closed:
            break
        threading.Event().wait(0.05)
    assert len(FakeReader.made) == 1 and FakeReader.made[0].closed
