"""Grading on a Dask cluster for real (a scheduler and two worker processes on the loopback address), on the demo
lesson's released sample class (tests/conftest.py: demo_course), and uid blocks that stay unique when several graders
run on one host."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from autograder.config import ROOT, Cluster
from autograder.course import Course
from autograder.grading.batch import grade_batch
from autograder.grading.cluster import ClusterError, grade_on_cluster
from autograder.grading.submissions import Submission
from autograder.sandbox.isolation import UID_LOCKS_ENV, reserve_uid_block
from helpers.cluster import LocalCluster, dask_env, wait_for

pytestmark = pytest.mark.sandbox  # the tiers are in pyproject.toml

# The demo release's sample class but its infinite loop (a wall timeout each time): the reference, the blank
# template, the catalogued mistake and the cheats (tampering, an unreadable file, a crash, a peek at reference/),
# each COPIES times over (copy0_reference, ...), so that a worker can be lost while most of the class still waits.
SAMPLES = ("reference", "blank", "mistake_center_rows", "adversarial_cheat_allclose", "adversarial_not_json",
           "adversarial_sys_exit", "adversarial_read_reference")
COPIES = 4
# and two inputs that cannot be read at all (judged unreadable on the worker, as locally): a text file, an empty zip
UNREADABLE = {"copy0_notes.txt": b"my answers are in the notebook", "copy0_empty.zip": b"PK\x05\x06" + bytes(18)}
SUBSET = (*(f"copy{n}_{name}" for n in range(COPIES) for name in SAMPLES),
          *(name.rsplit(".", 1)[0] for name in UNREADABLE))




@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    pytest.importorskip("distributed", reason="the cluster extra is not installed: pip install '.[cluster]'")
    started = LocalCluster(tmp_path_factory.mktemp("dask")).start(2)
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def sample_class(tmp_path_factory: pytest.TempPathFactory, demo_course: Course) -> tuple[Path, Path, bytes]:
    """The demo lesson's sample class (SUBSET), a copy of its course whose grading config asks for one submission
    per Dask task (batches small enough to lose one mid-class) and a short wait for a scheduler, and the
    grades.csv of a local run."""
    tmp = tmp_path_factory.mktemp("class")
    root = tmp / "lesson_demo"
    shutil.copytree(demo_course.lesson.root, root, ignore=shutil.ignore_patterns("__pycache__"))
    samples = root / "dist" / "samples"
    subs = tmp / "samples"
    subs.mkdir()
    for name in SAMPLES:
        found = [p for p in samples.iterdir() if p.name.removesuffix(".ipynb") == name]
        assert len(found) == 1, f"the demo release has no sample {name}: {sorted(p.name for p in samples.iterdir())}"
        for n in range(COPIES):
            shutil.copy(found[0], subs / f"copy{n}_{found[0].name}")
    for name, data in UNREADABLE.items():
        (subs / name).write_bytes(data)
    config = root / "grading_config.yaml"
    config.write_text(config.read_text() + "\ncluster:\n  batch: 1\n  connect_timeout_s: 20\n")
    grade_batch(subs, out=tmp / "local", course=Course.load(config), progress=False)
    return subs, config, (tmp / "local" / "grades.csv").read_bytes()


def _grade(subs: Path, out: Path, config: Path, address: str, *flags: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "autograder.cli", "--config", str(config), "grade", str(subs),
                             "--out", str(out), "--quiet", "--cluster", address, *flags], cwd=ROOT, env=dask_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.build  # the demo release's sample class (demo_course)
def test_a_class_graded_on_the_cluster_equals_a_local_run_and_resumes(
        tmp_path: Path, cluster: LocalCluster, sample_class: tuple[Path, Path, bytes]) -> None:
    subs, config, local = sample_class
    out = tmp_path / "out"
    text, _ = _grade(subs, out, config, cluster.address).communicate(timeout=900)
    assert f"graded {len(SUBSET)} submission(s), reused 0" in text, text + cluster.log()
    assert "sandbox: bwrap" in text or "sandbox: none" in text, text
    assert (out / "grades.csv").read_bytes() == local
    again = _grade(subs, out, config, cluster.address)
    text, _ = again.communicate(timeout=300)
    assert again.returncode == 0 and f"graded 0 submission(s), reused {len(SUBSET)}" in text, text
    assert (out / "grades.csv").read_bytes() == local
    # --only on the cluster: the named ones graded again (unchanged), the others kept as they were
    only = _grade(subs, out, config, cluster.address, "--only", "copy0_reference,copy0_empty")
    text, _ = only.communicate(timeout=300)
    assert only.returncode == 0, text + cluster.log()
    assert f"graded 2 submission(s), reused 0 unchanged result(s), kept {len(SUBSET) - 2} other" in text, text
    assert (out / "grades.csv").read_bytes() == local


@pytest.mark.build  # the demo release's sample class (demo_course)
def test_a_worker_killed_mid_class_loses_no_submission(
        tmp_path: Path, cluster: LocalCluster, sample_class: tuple[Path, Path, bytes]) -> None:
    subs, config, local = sample_class
    out = tmp_path / "out"
    run = _grade(subs, out, config, cluster.address)
    wait_for("a first result", lambda: run.poll() is not None or any((out / "results").glob("*.json")))
    victim = cluster.workers[0]
    assert run.poll() is None and victim.poll() is None, "the class ended before a worker could be lost"
    done_before = len(list((out / "results").glob("*.json")))
    victim.send_signal(signal.SIGKILL)
    assert victim.wait(timeout=60) == -signal.SIGKILL
    text, _ = run.communicate(timeout=900)
    assert done_before < len(SUBSET)
    assert run.returncode == 0, text + cluster.log()
    assert f"graded {len(SUBSET)} submission(s), reused 0" in text, text
    assert sorted(p.stem for p in (out / "results").glob("*.json")) == sorted(SUBSET)
    assert (out / "grades.csv").read_bytes() == local


@pytest.mark.build  # the demo release's sample class (demo_course)
def test_an_unreachable_scheduler_is_a_clear_error(tmp_path: Path, sample_class: tuple[Path, Path, bytes]) -> None:
    pytest.importorskip("distributed")
    subs, config, _ = sample_class
    with socket.socket() as s:  # a loopback port that nothing listens on
        s.bind(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    run = _grade(subs, tmp_path / "out", config, address)
    text, _ = run.communicate(timeout=300)
    assert run.returncode == 2 and "error: cannot reach the Dask scheduler at" in text and "Traceback" not in text, text


def test_the_plain_install_never_imports_dask() -> None:
    code = ("import sys, autograder.cli, autograder.grading.cluster; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=dask_env(), capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]", out


def test_without_dask_the_cluster_path_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    demo = Course.load(ROOT / "tests" / "fixtures" / "lesson_demo" / "grading_config.yaml")
    monkeypatch.setitem(sys.modules, "distributed", None)  # as if the cluster extra were not installed
    with pytest.raises(ClusterError, match=r"pip install '\.\[cluster\]'"):
        next(grade_on_cluster("tcp://127.0.0.1:1", [(Submission("x", Path("x"), b""), "k")], course=demo,
                              fingerprint="", settings=Cluster(), hide=()))


UID_POOL = """
import os, sys
from autograder.course import course_of
from autograder.sandbox import WorkerPool
os.getpid = lambda: 4242  # both processes: the same pid modulo 2000, as two graders on a busy host can have
lesson = course_of().lesson
with WorkerPool(1, memory_guard="watchdog", probe_module=lesson.checks_name, modules=lesson.sandbox_modules) as pool:
    print(pool._workers[0].uid if pool.drops_privileges else "no uid", flush=True)
    sys.stdin.read()
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="student code runs under uids of its own only when the grader is root")
def test_two_pools_on_one_host_get_disjoint_uid_blocks() -> None:
    procs = [subprocess.Popen([sys.executable, "-c", UID_POOL], cwd=ROOT, env=dask_env(), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        firsts = [int(p.stdout.readline()) for p in procs]  # type: ignore[union-attr]
    finally:
        for p in procs:
            p.communicate("", timeout=120)
    blocks = [set(range(u, u + 1024)) for u in firsts]
    assert not blocks[0] & blocks[1], firsts


def test_a_uid_block_is_free_again_when_its_holder_closes_or_dies(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(UID_LOCKS_ENV, str(tmp_path / "locks"))  # this test's own blocks
    block, fd = reserve_uid_block(7)
    other, fd2 = reserve_uid_block(7)
    assert (block, other) == (7, 8)
    os.close(fd)
    again, fd3 = reserve_uid_block(7)
    assert again == 7
    for f in (fd2, fd3):
        os.close(f)
    holder = subprocess.Popen([sys.executable, "-c",
                               "import sys; from autograder.sandbox.isolation import reserve_uid_block; "
                               "print(reserve_uid_block(7)[0], flush=True); sys.stdin.read()"],
                              cwd=ROOT, env=dask_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and int(holder.stdout.readline()) == 7
    block, fd = reserve_uid_block(7)
    assert block == 8
    os.close(fd)
    holder.kill()  # SIGKILL: the kernel releases its lock
    holder.wait()
    block, fd = reserve_uid_block(7)
    assert block == 7
    os.close(fd)
