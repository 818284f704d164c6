"""Grading a class, as its steps: select, reuse, run (here or on a cluster), judge, review, store, tables, feedback;
every file it reads or writes goes through the Gradebook."""

from __future__ import annotations

import difflib
import os
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from autograder.checkpoint import (
    VERIFY_SLOTS,
    reader_isolation,
    reader_limits_lowered,
    reads_checkpoint,
    warm_reader,
)
from autograder.course import Course
from autograder.grading.feedback import write_feedback
from autograder.grading.gradebook import Gradebook, Record, RunFacts, record_key
from autograder.grading.judge import judge_checkpoint, judge_exec, judge_unreadable
from autograder.grading.phases import figure, phase, span, timed
from autograder.grading.review import review_decisions, reviewed
from autograder.grading.runner import make_pool, probe_order
from autograder.grading.submissions import Submission, find_submissions
from autograder.grading.tables import UNSANDBOXED, Tables, failure_text, stored_records, write_tables
from autograder.model import SubmissionResult
from autograder.sandbox import ExecResult, WorkerPool, require_isolation


@dataclass
class BatchSummary:
    """What a batch run did: per-status counts, mean score per question, and where the files are."""

    out: Path
    tables: Tables  # the rows, the summary and the records they were made from
    graded_now: int
    reused: int
    sandbox: str
    questions: list[str] = field(default_factory=list)
    limits_lowered: list[str] = field(default_factory=list)  # configured limits an operator's ulimit lowered
    # this process's CPU seconds per submission judged here: {"judge": [...], "store": [...]} (benchmarks)
    cpu: dict[str, list[float]] = field(default_factory=lambda: {"judge": [], "store": []})
    kept: int = 0  # with `only`: the other submissions whose stored results were kept as they were

    @property
    def rows(self) -> list[dict[str, Any]]:
        """grades.csv's rows (id, total, a cell per question, status, message)."""
        return self.tables.rows

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.rows:
            out[r["status"]] = out.get(r["status"], 0) + 1
        return out


class UnknownSubmission(LookupError):
    """An id given to `only` that names no submission of the class; the message lists the nearest ids."""


def select(subs: list[Submission], only: list[str], *, where: Path) -> set[str]:
    """The ids of the submissions `only` names (each by its id as in grades.csv, or its entry's name);
    UnknownSubmission naming every id that matches none, with the nearest ids."""
    by_name = {s.id: s.id for s in subs} | {s.name: s.id for s in subs} | {f"{s.name}/": s.id for s in subs}
    if not only:
        raise UnknownSubmission(f"--only names no submission of {where}; give ids as in grades.csv")
    unknown = [i for i in only if i not in by_name]
    if unknown:
        ids = [s.id for s in subs]
        lines = []
        for i in unknown:
            near = difflib.get_close_matches(i, ids, n=5, cutoff=0.5)
            lines.append(f"no submission {i!r} in {where}; nearest ids: {', '.join(near)}" if near
                         else f"no submission {i!r} in {where} (ids are as in grades.csv: {', '.join(ids[:8])}"
                              f"{', ...' if len(ids) > 8 else ''})")
        raise UnknownSubmission("; ".join(lines))
    return {by_name[i] for i in only}


@dataclass
class Plan:
    """What a batch will do: the submissions to run (with their keys), the records it keeps or reuses, and the
    submissions it cannot grade (id -> why)."""

    todo: list[tuple[Submission, str]] = field(default_factory=list)
    records: dict[str, Record] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    reused: int = 0
    kept: int = 0


def plan_batch(subs: list[Submission], book: Gradebook, *, chosen: set[str] | None, force: bool, fingerprint: str,
               files: list[str], decisions: dict[str, str]) -> Plan:
    """Reuse or run each submission: a stored record whose key (notebook, checkpoint files, suite) and TA decision
    still hold is reused (unless `force`); with `chosen` (--only) the others keep their stored records as they are."""
    plan = Plan()
    for sub in subs:
        if chosen is not None and sub.id not in chosen:  # left as it is: its stored result, if any, is its row
            if book.has_record(sub.result_name):
                plan.kept += 1
                plan.records |= stored_records(book, [sub], plan.failed)
            else:
                plan.failed[sub.id] = "not graded yet: left out by --only; run the grade command without --only"
            continue
        key = record_key(sub, fingerprint, files)
        stored = None if chosen is not None or force else book.stored_record(sub.result_name, key)
        if stored is not None and stored.judged_under(decisions.get(sub.id)):
            plan.reused += 1
            plan.records[sub.id] = stored
        else:
            plan.todo.append((sub, key))
    return plan


class Storer:
    """Judge, review and store one submission at a time: its record is written atomically as soon as it is known
    and kept for the tables; a failure of the grader itself becomes that submission's reason, not the batch's."""

    def __init__(self, course: Course, book: Gradebook, plan: Plan, decisions: dict[str, str]) -> None:
        self.suite, self.book, self.plan, self.decisions = course.suite, book, plan, decisions
        self.revisit = self.suite.revisit()
        self.cpu: dict[str, list[float]] = {"judge": [], "store": []}  # thread CPU of judging and storing each

    def save(self, sub: Submission, key: str, judge: Callable[[], SubmissionResult], run: RunFacts | None) -> None:
        try:
            t0 = time.thread_time()
            result = judge()
            review = reviewed(self.suite, sub.source, result, cleared=self.decisions.get(sub.id),
                              events=run.tripwire if run is not None else [])
            t1 = time.thread_time()
            read = bool(reader_isolation()) and reads_checkpoint(self.suite.checkpoint_files, sub.files)
            record = Record(key, os.path.abspath(sub.path), result, result.gradescope(revisit=self.revisit), run,
                            review, reader_isolation() if read else "")  # as run.isolation says the notebook's
            self.book.write_record(sub.result_name, record)
            self.plan.records[sub.id] = record
            self.cpu["judge"].append(t1 - t0)
            self.cpu["store"].append(time.thread_time() - t1)
        except Exception as exc:  # noqa: BLE001 - the grader failed on this one; the others go on
            self.plan.failed[sub.id] = (f"the grader failed on this submission ({failure_text(exc)}); run the grade "
                                        "command again")

    def fail(self, sub: Submission, why: str) -> None:
        self.plan.failed[sub.id] = why


def _run_isolated(pool: WorkerPool, todo: list[tuple[Submission, str]], probes: list[tuple[Any, ...]],
                  workers: int) -> Iterator[tuple[Submission, str, ExecResult | BaseException]]:
    """Run each submission on the pool; yields (submission, key, result or the exception pool.run raised)."""
    with ThreadPoolExecutor(max_workers=max(1, workers)) as ex:
        futures = {ex.submit(pool.run, sub.source, probes=probes): (sub, key) for sub, key in todo}
        for fut in as_completed(futures):
            sub, key = futures[fut]
            exc = fut.exception()
            yield sub, key, exc if exc is not None else fut.result()


def _progress(done: int, total: int, start: float) -> None:
    width = 30
    filled = int(width * done / total)
    print(f"\rgrading [{'#' * filled}{'.' * (width - filled)}] {done}/{total} {time.monotonic() - start:5.1f}s",
          end="", file=sys.stderr, flush=True)


def grade_batch(submissions: Path, *, out: Path = Path("grades"), force: bool = False,
                workers: int | None = None, course: Course, progress: bool = True,
                entries: list[Submission] | None = None, cluster: str | None = None,
                only: list[str] | None = None, allow_unsandboxed: bool = False,
                sandbox_first: bool | None = None) -> BatchSummary:
    """Grade every submission under `submissions` into the grades folder `out` (the Gradebook: results/, grades.csv,
    summary.json, feedback/; `entries`: the submissions already read, in place of every entry of `submissions`,
    e.g. an nbgrader course's `submitted/<student>/<assignment>/` folders; `submissions` is then only hidden from
    the sandbox).

    Every input is isolated: whatever goes wrong reading, running, judging or storing one becomes that row's
    status and message, and the batch goes on; grades.csv and summary.json are always written. A failure of
    the grader itself (the sandbox, judging, storing) gives the row status "not graded" and stores nothing, so
    a re-run grades it. Resumable: a submission whose stored result has the same content and suite
    fingerprint is not run again (unless `force`); each result is written atomically as soon as it is known.
    `out` defaults to ./grades in the current folder: the course's own folder, never the installed package.
    cluster: the address of a Dask scheduler (default: the config's cluster.address; none: grade here); its
    workers run and judge the submissions (autograder/grading/cluster.py), this process stores the results.
    Before the first submission: UnsandboxedError where nothing would confine student code (no bubblewrap, no uid
    drop; on a cluster, on any worker), unless `allow_unsandboxed`; then every row and the summary say so.
    only: the ids (as in grades.csv) of the submissions to grade again, changed or not (say, after replacing a
    student's notebook); every other row is written from its stored result, untouched, and every merged score
    is kept. UnknownSubmission, before anything is written, for an id that names no submission.
    sandbox_first: start the local sandbox before the suite and the submissions are read, so that they overlap; it
    is closed unused when nothing turns out to need it. None (the default): only for a first run, when `out` holds
    no stored result yet (everything is graded then, so the sandbox is all but always needed; a re-run, which may
    find nothing to grade, starts it only once it knows it will use it).
    """
    config = course.config
    address = cluster or config.cluster.address
    hide = (submissions.resolve(), out.resolve())
    workers = workers or config.execution.workers
    early = None
    if not address:  # a cluster's workers are asked before their first batch
        require_isolation(allow_unsandboxed=allow_unsandboxed)  # refuses here, before anything is read or written
        if sandbox_first is None:
            sandbox_first = only is None and not Gradebook(out).record_names()
        early = _start_pool(course, workers=workers, hide=hide) if sandbox_first else None
    try:
        with phase("suite"):
            suite = course.suite
        subs = entries if entries is not None else find_submissions(submissions, limits=config.submissions,
                                                                    files=suite.checkpoint_files,
                                                                    notebook=f"{config.assignment}.ipynb")
        chosen = select(subs, only, where=submissions) if only is not None else None
        book = Gradebook(out)
        book.results_dir.mkdir(parents=True, exist_ok=True)
        decisions = review_decisions(book)  # a TA's cleared review flags: a new decision judges that one again
        plan = plan_batch(subs, book, chosen=chosen, force=force, fingerprint=suite.fingerprint,
                          files=suite.checkpoint_files, decisions=decisions)
    except BaseException:
        if early is not None:
            _close_unused(early)
        raise
    storer = Storer(course, book, plan, decisions)
    if address and plan.todo:
        sandbox, lowered = _grade_on_cluster(address, plan.todo, course=course, hide=hide, storer=storer,
                                             progress=progress, allow_unsandboxed=allow_unsandboxed), []
    else:
        sandbox, lowered = _grade_here(plan.todo, course=course, hide=hide, storer=storer,
                                       workers=workers, progress=progress, starting=early)
    with phase("writing"):
        tables = write_tables(suite, subs, book, records=plan.records, failed=plan.failed, limits_lowered=lowered)
        write_feedback(suite, book, tables)  # feedback/<id>.html: each student's safe view
    graded_now = len(plan.todo) - len(set(plan.failed) & {s.id for s, _ in plan.todo})
    return BatchSummary(out, tables, graded_now, plan.reused, sandbox, list(suite.question_points()), lowered,
                        storer.cpu, plan.kept)


def _start_pool(course: Course, *, workers: int, hide: tuple[Path, ...]) -> Future[WorkerPool]:
    """The local pool of sandboxed workers, starting (seconds) in a thread of its own."""
    starter = ThreadPoolExecutor(1)
    starting = starter.submit(timed("sandbox start", make_pool), course, size=workers, hide=hide)
    starter.shutdown(wait=False)
    return starting


def _close_unused(starting: Future[WorkerPool]) -> None:
    """Close a pool started ahead that nothing needs, once it has started (never waited for here)."""
    starting.add_done_callback(lambda f: f.result().close() if f.exception() is None else None)


def _grade_here(todo: list[tuple[Submission, str]], *, course: Course, hide: tuple[Path, ...], storer: Storer,
                workers: int, progress: bool, starting: Future[WorkerPool] | None = None) -> tuple[str, list[str]]:
    """Run, judge and store `todo` on a local pool of sandboxed workers (`starting`: one started ahead); (the sandbox
    used, the limits an operator's ulimit lowered)."""
    suite = course.suite
    sandbox, lowered = "not started", []
    runnable = [(s, k) for s, k in todo if s.source is not None]
    pool_starting = None
    if runnable:  # the sandboxed workers start (seconds) while this process computes the reference values
        pool_starting = starting or _start_pool(course, workers=workers, hide=hide)
    elif starting is not None:
        _close_unused(starting)
    plugin = suite.lesson.plugin_file
    if plugin is not None and suite.checkpoint_cases and any(
            reads_checkpoint(suite.checkpoint_files, s.files) and not s.file_problems for s, _ in runnable):
        warm_reader(plugin, shipped=suite.lesson.shipped_files)  # its reader starts beside the workers
    if todo:
        with phase("expected values"):
            suite.expected  # noqa: B018 - the reference values, computed now while the sandboxed workers start
    # Checkpoints are verified ahead, beside the sandboxed runs; judging a run then finds its verdict measured
    # (verify_checkpoint evaluates the same weights once and waits for a verification already under way).
    ahead = ThreadPoolExecutor(VERIFY_SLOTS)
    for sub, _ in runnable if suite.checkpoint_cases else ():
        if reads_checkpoint(suite.checkpoint_files, sub.files) and not sub.file_problems:
            ahead.submit(timed("checkpoint", judge_checkpoint), suite, sub.files)
    for sub, key in todo:
        if sub.source is None:
            storer.save(sub, key, partial(judge_unreadable, suite, sub), None)
    if pool_starting is not None:
        try:
            pool = pool_starting.result()
        except Exception as exc:  # noqa: BLE001 - no sandbox: every runnable submission is left for a re-run
            for sub, _ in runnable:
                storer.fail(sub, f"not graded: the sandbox could not start ({failure_text(exc)}); run the grade "
                                 "command again")
        else:
            start, done = time.monotonic(), 0
            with pool:
                sandbox, lowered = pool.sandbox, list(pool.limits_lowered)
                if pool.isolation == "none":  # allowed unsandboxed: the summary says so, as every row does
                    sandbox = f"none, {UNSANDBOXED}"
                run_start = time.monotonic()
                for sub, key, res in _run_isolated(pool, runnable, probe_order(suite), workers):
                    done += 1
                    if isinstance(res, BaseException):
                        storer.fail(sub, f"not graded: the sandbox failed while running it ({failure_text(res)}); "
                                         "nothing was stored, run the grade command again")
                    else:
                        span("notebook run (cells and checks)", run_start, time.monotonic())  # when recording phases
                        figure("cells: child CPU s", res.timing.get("cells", 0.0))
                        figure("checks: child CPU s", sum(res.timing.get("probes", {}).values()))
                        figure("notebook run: wall s", res.wall_s)
                        with phase("judging (the checkpoint's wait included)"):
                            storer.save(sub, key, partial(judge_exec, suite, sub, res), RunFacts.of(res))
                    if progress:
                        _progress(done, len(runnable), start)
            if progress:
                print(file=sys.stderr)
    ahead.shutdown(cancel_futures=True)
    if any(reads_checkpoint(suite.checkpoint_files, s.files) for s, _ in todo):
        lowered += reader_limits_lowered()
    return sandbox, lowered


def _grade_on_cluster(address: str, todo: list[tuple[Submission, str]], *, course: Course, hide: tuple[Path, ...],
                      storer: Storer, progress: bool, allow_unsandboxed: bool = False) -> str:
    """Grade `todo` on the Dask cluster at `address`, storing each result here as it comes back; the sandboxes
    the workers used ("bwrap", "none", or both)."""
    from autograder.grading.cluster import grade_on_cluster

    start, done, sandboxes = time.monotonic(), 0, set()
    for sub, key, got in grade_on_cluster(address, todo, course=course, fingerprint=course.suite.fingerprint,
                                          settings=course.config.cluster, hide=tuple(map(str, hide)),
                                          allow_unsandboxed=allow_unsandboxed):
        done += 1
        if isinstance(got, str):
            storer.fail(sub, got)
        else:
            result, run = got
            if run is not None:
                sandboxes.add(f"none, {UNSANDBOXED}" if run.isolation == "none" else run.sandbox)
            storer.save(sub, key, lambda result=result: result, run)
        if progress:
            _progress(done, len(todo), start)
    if progress:
        print(file=sys.stderr)
    return ", ".join(sorted(sandboxes - {""})) or "not started"
