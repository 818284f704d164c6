"""Grading a class on a Dask distributed cluster: each Dask worker grades batches on its own warm sandboxed pool."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from autograder.authoring.suite import Suite
from autograder.config import Cluster
from autograder.course import Course, course_of
from autograder.grading.gradebook import RunFacts
from autograder.grading.judge import judge_exec, judge_unreadable
from autograder.grading.runner import make_pool, probe_order
from autograder.grading.submissions import Submission
from autograder.model import SubmissionResult
from autograder.sandbox import WorkerPool, choose_isolation, permit_unsandboxed

log = logging.getLogger(__name__)

Graded = tuple[SubmissionResult, RunFacts | None]  # a result and the sandbox's facts stored beside it
INSTALL_HINT = "pip install '.[cluster]' (Dask distributed) on this machine and on every worker"


class ClusterError(RuntimeError):
    """The cluster cannot be used at all (Dask missing, no scheduler, no worker); the message says what to do."""


# --------------------------------------------------------------------------- on each Dask worker

_GRADERS: dict[tuple[str, tuple[str, ...]], tuple[Suite, WorkerPool]] = {}
_GRADERS_LOCK = threading.Lock()


def worker_isolation() -> tuple[str, str]:
    """On a Dask worker: the isolation its sandboxed pool would get ("bubblewrap", "unprivileged uid" or "none")
    and, for "none", what to install or change there (fallback.choose_isolation, as a local run chooses)."""
    iso = choose_isolation()
    return iso.kind, iso.refusal()


def _grader(config_path: str, hide: tuple[str, ...], allow_unsandboxed: bool = False) -> tuple[Suite, WorkerPool]:
    """This worker process's suite and sandboxed pool for a config (read here, once: the worker is another
    process), made at its first batch and kept warm for the next ones: one zygote per thread of the Dask worker
    (the batches it runs at once)."""
    from distributed import get_worker

    with _GRADERS_LOCK:
        if (config_path, hide) not in _GRADERS:
            course = course_of(Path(config_path))  # this process's one root: the config read here, once
            suite = course.suite
            suite.expected  # noqa: B018 - the reference values, computed once per worker
            pool = make_pool(course, size=get_worker().state.nthreads, hide=hide, allow_unsandboxed=allow_unsandboxed)
            _GRADERS[(config_path, hide)] = (suite, pool)
        return _GRADERS[(config_path, hide)]


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:300]}"


def grade_chunk(config_path: str, fingerprint: str, subs: list[Submission],
                hide: tuple[str, ...], allow_unsandboxed: bool = False) -> list[Graded | str]:
    """One Dask task, on a worker: run and judge each submission as a local run does (the sandbox, then judging
    and checkpoint verification in this grader process); per submission its result, or why it was not graded.
    A worker where nothing would confine student code refuses (UnsandboxedError) unless `allow_unsandboxed`."""
    permit_unsandboxed(allow_unsandboxed)  # this worker's checkpoint readers too
    suite, pool = _grader(config_path, hide, allow_unsandboxed)
    if suite.fingerprint != fingerprint:
        return [f"not graded: the Dask worker's lesson files differ from this machine's (suite {suite.fingerprint}, "
                f"here {fingerprint}); deploy the same files at the same path on every worker and restart them"] * \
            len(subs)
    probes = probe_order(suite)
    out: list[Graded | str] = []
    for sub in subs:
        if sub.source is None:
            try:
                out.append((judge_unreadable(suite, sub), None))
            except Exception as exc:  # noqa: BLE001 - the grader failed on this one; the others go on
                out.append(f"the grader failed on this submission ({_why(exc)}); run the grade command again")
            continue
        try:
            res = pool.run(sub.source, probes=probes)
        except Exception as exc:  # noqa: BLE001
            out.append(f"not graded: the sandbox failed while running it ({_why(exc)}); nothing was stored, run "
                       "the grade command again")
            continue
        try:
            out.append((judge_exec(suite, sub, res), RunFacts.of(res)))
        except Exception as exc:  # noqa: BLE001
            out.append(f"the grader failed on this submission ({_why(exc)}); run the grade command again")
    return out


# --------------------------------------------------------------------------- on the machine that runs `grade`

def grade_on_cluster(address: str, todo: list[tuple[Submission, str]], *, course: Course, fingerprint: str,
                     settings: Cluster, hide: tuple[str, ...],
                     allow_unsandboxed: bool = False) -> Iterator[tuple[Submission, str, Graded | str]]:
    """Grade (submission, key) pairs on the Dask cluster at `address`; yields each with its result (or why it was
    not graded) as its batch comes back. Batches of settings.batch submissions go out as Dask tasks, two per
    worker thread at a time (one running, one waiting: the warm zygotes never wait for the scheduler). A batch
    whose worker is lost is run again by Dask on another worker; a batch that fails (Dask gives up on it, or
    the grader raised) is submitted once more, and a second failure leaves its submissions for a re-run.
    ClusterError before the first batch where a worker would run student code unconfined (isolation "none"),
    unless `allow_unsandboxed`."""
    try:
        from distributed import Client, as_completed
    except ImportError as exc:
        raise ClusterError(f"grading on a cluster needs Dask: {INSTALL_HINT}") from exc
    try:
        client = Client(address, timeout=f"{settings.connect_timeout_s}s", set_as_default=False)
    except (OSError, TimeoutError) as exc:
        raise ClusterError(f"cannot reach the Dask scheduler at {address} ({_why(exc)}); start it (`dask "
                           "scheduler`) or fix the address given by --cluster or cluster.address") from exc
    with client:
        try:
            client.wait_for_workers(1, timeout=settings.connect_timeout_s)
        except TimeoutError as exc:
            raise ClusterError(f"no Dask worker joined the scheduler at {address} within "
                               f"{settings.connect_timeout_s:g} s; start workers (docs/cluster.md)") from exc
        bare = {w: why for w, (kind, why) in client.run(worker_isolation).items() if kind == "none"}
        if bare and not allow_unsandboxed:
            raise ClusterError(f"Dask worker {', '.join(sorted(bare))}: {next(iter(bare.values()))}")
        chunks = [todo[i:i + settings.batch] for i in range(0, len(todo), settings.batch)][::-1]
        sent: dict[str, tuple[list[tuple[Submission, str]], int]] = {}
        run = uuid.uuid4().hex[:12]

        def submit(chunk: list[tuple[Submission, str]], attempt: int) -> Any:
            fut = client.submit(grade_chunk, str(course.path), fingerprint, [s for s, _ in chunk], hide,
                                allow_unsandboxed, key=f"grade-{run}-{len(sent)}-{uuid.uuid4().hex[:8]}", pure=False)
            sent[fut.key] = (chunk, attempt)
            return fut

        def window() -> int:
            return max(2, 2 * sum(client.nthreads().values()))

        pending = as_completed([submit(chunks.pop(), 1) for _ in range(min(len(chunks), window()))],
                               loop=client.loop)
        try:
            for fut in pending:
                chunk, attempt = sent.pop(fut.key)
                try:
                    got = fut.result()
                except Exception as exc:  # noqa: BLE001 - a lost batch is tried once more, then left for a re-run
                    if attempt == 1:
                        log.warning("batch %s failed (%s); submitting it again", fut.key, _why(exc))
                        pending.add(submit(chunk, 2))
                        continue
                    got = [f"not graded: the cluster failed twice on its batch ({_why(exc)}); run the grade "
                           "command again"] * len(chunk)
                finally:
                    fut.release()
                while chunks and len(sent) < window():
                    pending.add(submit(chunks.pop(), 1))
                for (sub, key), one in zip(chunk, got):
                    yield sub, key, one
        except Exception as exc:  # noqa: BLE001 - the scheduler itself is gone: the rest waits for a re-run
            why = f"not graded: the Dask scheduler was lost ({_why(exc)}); run the grade command again"
            for chunk in [c for c, _ in sent.values()] + chunks:
                for sub, key in chunk:
                    yield sub, key, why
