"""One Gradescope upload, fast and judged as before (issue 43, item 1): the bundle ships its suite compiled (the
questions as read, the expected values), which a course read from the bundle uses without
reading a question file or importing torch, and only where its files are those it was compiled from; one upload
starts one sandboxed worker, before the suite is read; the timing record is opt-in and never in results.json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import zipfile
from pathlib import Path
from typing import Any

import pytest

from autograder.config import ConfigError
from autograder.course import Course
from autograder.grading import batch
from autograder.release.gradescope import gradescope_bundle
from autograder.runtime.plain_codec import to_plain

READ = """
import hashlib, json, sys
from autograder.course import Course
from autograder.runtime.plain_codec import to_plain
course = Course.load("grading_config.yaml")
suite = course.suite
expected = suite.expected
parts = [c.part for c in suite.checkpoint_cases]
before = {"torch": "torch" in sys.modules, "checks": course.lesson.checks_name in sys.modules}
print(json.dumps({"compiled": suite.compiled is not None, "fingerprint": suite.fingerprint, "parts": parts,
                  "expected": hashlib.sha256(json.dumps(to_plain(expected), sort_keys=True).encode()).hexdigest(),
                  "cases": [c.id for c in suite.cases], "before": before, "rules": repr(suite.milestone_rules),
                  "files": all(q.path.is_file() and q.path.is_relative_to(course.lesson.root)
                               for q in suite.questions)}))
"""


def _plain_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the bundle's own engine, from its folder


def _read(src: Path) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-c", READ], cwd=src, capture_output=True, text=True, env=_plain_env(),
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def bundle(course: Course, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("bundle")
    zipfile.ZipFile(gradescope_bundle(tmp / "autograder.zip", course=course)).extractall(tmp / "source")
    return tmp / "source" / course.lesson.name


def _digest(expected: dict[str, Any]) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(to_plain(expected), sort_keys=True).encode()).hexdigest()


def test_the_bundle_reads_its_compiled_suite_without_torch(bundle: Path, course: Course) -> None:
    """Read from the bundle: the same fingerprint, cases, checkpoint parts, expected values and rules as the
    package's own suite, with neither torch nor the checks module imported to read the suite, its expected values
    and the checkpoint's parts (the checkpoint's plug-in is imported when its rules are asked for)."""
    suite = course.suite
    got = _read(bundle)
    assert got["compiled"] and got["fingerprint"] == suite.fingerprint
    assert got["cases"] == [c.id for c in suite.cases]
    assert got["parts"] == [c.part for c in suite.checkpoint_cases] and got["parts"]
    assert got["expected"] == _digest(suite.expected)
    assert got["before"] == {"torch": False, "checks": False}
    assert got["rules"] == repr(suite.milestone_rules) and got["files"]  # each question's file: the bundle's


def test_a_changed_bundle_reads_its_sources_again(bundle: Path, course: Course, tmp_path: Path) -> None:
    """A question file edited (its prose alone) after compiling: the compiled suite is not used; a config whose
    milestone section is wrong is the config's error, named so, as in a course never compiled."""
    import shutil

    copy = tmp_path / course.lesson.name
    shutil.copytree(bundle, copy)
    question = sorted((copy / "assignments" / course.lesson.name).glob("q*.md"))[0]
    question.write_text(question.read_text() + "\nOne more line of prose.\n")
    got = _read(copy)
    assert not got["compiled"] and got["fingerprint"] == course.suite.fingerprint  # prose: the same fingerprint
    assert got["expected"] == _digest(course.suite.expected) and got["before"]["torch"]
    config = copy / "grading_config.yaml"
    config.write_text(config.read_text().replace("milestone:\n", "milestone:\n  no_such_rule: 1\n", 1))
    with pytest.raises(ConfigError, match="no_such_rule"):
        Course.load(config).suite  # noqa: B018


def test_one_upload_starts_one_worker_before_the_suite_is_read(course: Course, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """grade_gradescope asks for a pool of one worker, and asks before the suite is read (reading it waits here
    until the pool is asked for: on the old order it would wait in vain)."""
    from autograder.grading.gradescope import grade_gradescope

    fresh = Course.load(course.path)
    asked: list[int] = []
    started = threading.Event()
    read = Course.read_suite

    def fake_pool(course: Course, *, size: int, **_: Any) -> Any:
        asked.append(size)
        started.set()
        raise RuntimeError("no sandbox in this test")

    def waiting_read(self: Course, **kwargs: Any) -> Any:
        started.wait(timeout=20)
        return read(self, **kwargs)

    monkeypatch.setattr(batch, "make_pool", fake_pool)
    monkeypatch.setattr(Course, "read_suite", waiting_read)
    upload = tmp_path / "upload"
    upload.mkdir()
    (upload / f"{course.lesson.name}.ipynb").write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4,
                                                                     "nbformat_minor": 5}))
    run = grade_gradescope(upload, tmp_path / "results.json", course=fresh)
    assert asked == [1] and started.is_set()
    assert not run.graded and "sandbox could not start" in json.loads((tmp_path / "results.json").read_text())["output"]


def test_the_timing_record_is_opt_in(tmp_path: Path) -> None:
    """With $LESSON83_PHASES the phases and figures are written at exit; without it nothing is."""
    code = ("from autograder.grading import phases\n"
            "phases.started('start-up')\n"
            "with phases.phase('work'):\n    sum(range(1000))\n"
            "phases.figure('cpu', 0.25)\nphases.figure('cpu', 0.5)\n")
    target = tmp_path / "phases.json"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "LESSON83_PHASES": str(target)}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(target.read_text())
    assert [s["phase"] for s in data["spans"]] == ["start-up", "work"] and data["figures"] == {"cpu": 0.75}
    assert 0 <= data["spans"][0]["start"] <= data["spans"][0]["end"] <= data["spans"][1]["start"] <= data["end"]
    target.unlink()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if k != "LESSON83_PHASES"}, timeout=120)
    assert proc.returncode == 0 and not target.exists()
