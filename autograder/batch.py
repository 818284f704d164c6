"""Grading a class: the batch run (sandbox, judging, storing each result), grades.csv and summary.json, and merging
scores graded elsewhere."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import suppress
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from autograder.authoring.questions import Question
from autograder.authoring.suite import Suite, load_suite, suite_fingerprint
from autograder.config import DEFAULT_CONFIG, GradingConfig, command, load_config
from autograder.config import Cluster as ClusterSettings
from autograder.judge import judge_checkpoint, judge_exec, judge_unreadable
from autograder.milestone import VERIFY_SLOTS, reader_limits_lowered
from autograder.results import Status, SubmissionResult, csv_text, full_marks, spreadsheet_text
from autograder.sandbox.limits import Limits
from autograder.sandbox.pool import WorkerPool
from autograder.sandbox.protocol import ExecResult
from autograder.submissions import CHECKPOINT_FILES, Submission, find_submissions


def _write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a short-named temporary file beside it, renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".part")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with suppress(OSError):
            os.unlink(tmp)
        raise


def _key(sub: Submission, fingerprint: str) -> str:
    h = hashlib.sha256(sub.source if sub.source is not None
                       else b"problem\0" + sub.problem.encode("utf-8", "backslashreplace"))
    for name in CHECKPOINT_FILES:
        h.update(hashlib.sha256(sub.files.get(name, b"")).digest())
    h.update("\0".join(sub.file_problems).encode("utf-8", "backslashreplace") + fingerprint.encode())
    return h.hexdigest()


def _stored_key(path: Path) -> str | None:
    try:
        key = json.loads(path.read_text(encoding="utf-8")).get("key")
    except (OSError, ValueError, AttributeError):
        return None  # absent or damaged: graded again
    return key if isinstance(key, str) else None


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:300]}"


@dataclass
class BatchSummary:
    """What a batch run did: per-status counts, mean score per question, and where the files are."""

    out: Path
    rows: list[dict[str, Any]]
    graded_now: int
    reused: int
    sandbox: str
    questions: list[str] = field(default_factory=list)
    limits_lowered: list[str] = field(default_factory=list)  # configured limits an operator's ulimit lowered
    # this process's CPU seconds per submission judged here: {"judge": [...], "store": [...]} (benchmarks)
    cpu: dict[str, list[float]] = field(default_factory=lambda: {"judge": [], "store": []})

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.rows:
            out[r["status"]] = out.get(r["status"], 0) + 1
        return out


def _run_isolated(pool: WorkerPool, todo: list[tuple[Submission, str]], probes: list[tuple[Any, ...]],
                  workers: int) -> Iterator[tuple[Submission, str, ExecResult | BaseException]]:
    """Run each submission on the pool; yields (submission, key, result or the exception pool.run raised)."""
    with ThreadPoolExecutor(max_workers=max(1, workers)) as ex:
        futures = {ex.submit(pool.run, sub.source, probes=probes): (sub, key) for sub, key in todo}
        for fut in as_completed(futures):
            sub, key = futures[fut]
            exc = fut.exception()
            yield sub, key, exc if exc is not None else fut.result()


def sandbox_limits(config: GradingConfig) -> Limits:
    """The sandbox's limits from the config's execution section."""
    ex = config.execution
    return Limits(wall_s=ex.wall_timeout_s, cell_s=ex.cell_timeout_s, cpu_s=ex.cpu_timeout_s, memory_mb=ex.memory_mb,
                  processes=ex.max_processes, file_mb=ex.max_file_mb, output_kb=ex.max_output_kb)


def probe_order(suite: Suite) -> list[tuple[Any, ...]]:
    """The probes of a run, visible cases first: what a student sees never comes from a process that has run a
    hidden probe."""
    return [(c["id"], c["probe"], c["args"], bool(c["hidden"]))
            for c in sorted(suite.cases, key=lambda c: bool(c["hidden"]))]


def _progress(done: int, total: int, start: float) -> None:
    width = 30
    filled = int(width * done / total)
    print(f"\rgrading [{'#' * filled}{'.' * (width - filled)}] {done}/{total} {time.monotonic() - start:5.1f}s",
          end="", file=sys.stderr, flush=True)


def grade_batch(submissions: Path, *, out: Path = Path("grades"), force: bool = False,
                workers: int | None = None, config_path: Path = DEFAULT_CONFIG, progress: bool = True,
                entries: list[Submission] | None = None, cluster: str | None = None) -> BatchSummary:
    """Grade every submission under `submissions` into `out`: results/<file>.json, grades.csv, summary.json
    (`entries`: the submissions already read, in place of every entry of `submissions`, e.g. an nbgrader
    course's `submitted/<student>/<assignment>/` folders; `submissions` is then only hidden from the sandbox).

    Every input is isolated: whatever goes wrong reading, running, judging or storing one becomes that row's
    status and message, and the batch goes on; grades.csv and summary.json are always written. A failure of
    the grader itself (the sandbox, judging, storing) gives the row status "not graded" and stores nothing, so
    a re-run grades it. Resumable: a submission whose stored result has the same content and suite
    fingerprint is not run again (unless `force`); each result is written atomically as soon as it is known.
    `out` defaults to ./grades in the current folder: the course's own folder, never the installed package.
    cluster: the address of a Dask scheduler (default: the config's cluster.address; none: grade here); its
    workers run and judge the submissions (autograder/cluster.py), this process stores the results.
    """
    config = load_config(config_path)
    fingerprint = suite_fingerprint(config_path)
    subs = entries if entries is not None else find_submissions(submissions, limits=config.submissions)
    results_dir = out / "results"
    results_dir.mkdir(parents=True, exist_ok=True)
    failed: dict[str, str] = {}  # id -> why the grader could not grade it in this run
    cpu: dict[str, list[float]] = {"judge": [], "store": []}  # thread CPU of judging and storing each result
    todo, reused = [], 0
    for sub in subs:
        key = _key(sub, fingerprint)
        if not force and _stored_key(results_dir / sub.result_name) == key:
            reused += 1
        else:
            todo.append((sub, key))

    def save(sub: Submission, key: str, judge: Callable[[], SubmissionResult], extra: dict[str, Any]) -> None:
        try:
            t0 = time.thread_time()
            result = judge()
            t1 = time.thread_time()
            record = {"key": key, "path": os.path.abspath(sub.path), **result.to_dict(), **extra,
                      "gradescope": result.gradescope(revisit=suite.revisit())}
            _write_atomic(results_dir / sub.result_name, json.dumps(record, indent=1))
            cpu["judge"].append(t1 - t0)
            cpu["store"].append(time.thread_time() - t1)
        except Exception as exc:  # noqa: BLE001 - the grader failed on this one; the others go on
            failed[sub.id] = f"the grader failed on this submission ({_why(exc)}); run the grade command again"

    sandbox, lowered = "not started", []
    address = cluster or config.cluster.address
    if address and todo:
        suite = load_suite(config_path)
        sandbox = _grade_on_cluster(address, todo, config_path=config_path, fingerprint=fingerprint,
                                    settings=config.cluster, hide=(submissions.resolve(), out.resolve()),
                                    save=save, failed=failed, progress=progress)
        rows = write_tables(suite, subs, out, failed=failed)
        return BatchSummary(out, rows, len(todo) - len(failed), reused, sandbox, list(suite.question_points()),
                            cpu=cpu)
    runnable = [(s, k) for s, k in todo if s.source is not None]
    pool_starting = None
    n_workers = workers or config.execution.workers
    if runnable:  # the sandboxed workers start (seconds) while this process computes the reference values
        starter = ThreadPoolExecutor(1)
        pool_starting = starter.submit(WorkerPool, n_workers, limits=sandbox_limits(config),
                                       probe_module=config.lesson.checks_name,
                                       modules=config.lesson.sandbox_modules,
                                       hide=(submissions.resolve(), out.resolve()))
        starter.shutdown(wait=False)
    suite = load_suite(config_path)
    if todo:
        suite.expected  # noqa: B018 - the reference values, computed now while the sandboxed workers start
    # Checkpoints are verified ahead, beside the sandboxed runs; judging a run then finds its verdict measured
    # (verify_checkpoint evaluates the same weights once and waits for a verification already under way).
    ahead = ThreadPoolExecutor(VERIFY_SLOTS)
    for sub, _ in runnable if suite.checkpoint_cases else ():
        if "milestone.pt" in sub.files and not sub.file_problems:
            ahead.submit(judge_checkpoint, suite, sub.files)
    for sub, key in todo:
        if sub.source is None:
            save(sub, key, partial(judge_unreadable, suite, sub), {})
    if pool_starting is not None:
        probes = probe_order(suite)
        try:
            pool = pool_starting.result()
        except Exception as exc:  # noqa: BLE001 - no sandbox: every runnable submission is left for a re-run
            for sub, _ in runnable:
                failed[sub.id] = f"not graded: the sandbox could not start ({_why(exc)}); run the grade command again"
        else:
            start, done = time.monotonic(), 0
            with pool:
                sandbox, lowered = pool.sandbox, list(pool.limits_lowered)
                for sub, key, res in _run_isolated(pool, runnable, probes, n_workers):
                    done += 1
                    if isinstance(res, BaseException):
                        failed[sub.id] = (f"not graded: the sandbox failed while running it ({_why(res)}); "
                                          "nothing was stored, run the grade command again")
                    else:
                        save(sub, key, partial(judge_exec, suite, sub, res),
                             {"stdout": res.stdout, "wall_s": round(res.wall_s, 3), "sandbox": res.sandbox,
                               "memory_guard": res.memory_guard, "isolation": res.isolation})
                    if progress:
                        _progress(done, len(runnable), start)
            if progress:
                print(file=sys.stderr)
    ahead.shutdown(cancel_futures=True)
    lowered += reader_limits_lowered() if any("milestone.pt" in s.files for s, _ in todo) else []
    rows = write_tables(suite, subs, out, failed=failed, limits_lowered=lowered)
    return BatchSummary(out, rows, len(todo) - len(failed), reused, sandbox, list(suite.question_points()), lowered,
                        cpu)


def _grade_on_cluster(address: str, todo: list[tuple[Submission, str]], *, config_path: Path, fingerprint: str,
                      settings: ClusterSettings, hide: tuple[Path, ...],
                      save: Callable[[Submission, str, Callable[[], SubmissionResult], dict[str, Any]], None],
                      failed: dict[str, str], progress: bool) -> str:
    """Grade `todo` on the Dask cluster at `address`, storing each result here as it comes back; the sandboxes
    the workers used ("bwrap", "none", or both)."""
    from autograder.cluster import grade_on_cluster

    start, done, sandboxes = time.monotonic(), 0, set()
    for sub, key, got in grade_on_cluster(address, todo, config_path=config_path.resolve(), fingerprint=fingerprint,
                                          settings=settings, hide=tuple(map(str, hide))):
        done += 1
        if isinstance(got, str):
            failed[sub.id] = got
        else:
            result, extra = got
            sandboxes.add(extra.get("sandbox") or "")
            save(sub, key, lambda result=result: result, extra)
        if progress:
            _progress(done, len(todo), start)
    if progress:
        print(file=sys.stderr)
    return ", ".join(sorted(sandboxes - {""})) or "not started"


def _row(suite: Suite, sub: Submission, out: Path, failed: dict[str, str]) -> dict[str, Any]:
    """The grades.csv row of one submission: from its stored result, or "not graded" with the reason."""
    qids = list(suite.question_points())
    why = failed.get(sub.id)
    if why is None:
        try:
            record = json.loads((out / "results" / sub.result_name).read_text(encoding="utf-8"))
            row = {"id": sub.id, **SubmissionResult.from_dict(record).csv_row(qids)}
            if record.get("isolation") == "none":  # said on the row itself: grades a TA can trust less
                row["message"] = f"{UNSANDBOXED}; {row['message']}".rstrip("; ")
            return row
        except Exception as exc:  # noqa: BLE001 - a damaged store is one row's problem
            why = f"not graded: its stored result could not be read ({_why(exc)}); run the grade command again"
    return {"id": sub.id, "total": None, **dict.fromkeys(qids), "status": Status.NOT_GRADED, "message": why}


UNSANDBOXED = ("graded WITHOUT a sandbox (no bubblewrap, no uid drop): student code ran as the grader's user "
               "and could read what it can")


MERGED_FILE = "merged_scores.json"  # scores graded elsewhere (by hand, by another platform), kept by `merge`


class MergeError(ValueError):
    """A scores file that cannot be merged; the message names the file, the row and the column."""


def merge_columns(suite: Suite) -> dict[str, float]:
    """Columns a scores file may fill, with their maximum: every graded question, and each written part."""
    cols = {q.id: q.points for q in suite.questions if q.graded}
    for q in suite.questions:
        cols |= {p.part: round(q.points / len(q.written), 4) for p in q.written}
    return cols


def merged_scores(out: Path) -> dict[str, dict[str, float]]:
    """The scores `merge` stored in `out` (student id -> column -> score); {} when there are none."""
    try:
        data = json.loads((out / MERGED_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise MergeError(f"{out / MERGED_FILE}: cannot be read ({exc})") from None
    try:
        return {str(k): {str(c): float(v) for c, v in row.items()} for k, row in data["scores"].items()}
    except (KeyError, TypeError, ValueError, AttributeError):
        raise MergeError(f"{out / MERGED_FILE}: not a file written by `{command()} merge`") from None


def merged_value(q: Question, scores: dict[str, float]) -> float | None:
    """A question's merged score for one student: its own column, else the sum of its written parts once every
    part is scored; None when nothing was merged for it."""
    value = scores.get(q.id)
    parts = [scores.get(p.part) for p in q.written]
    if value is None and parts and all(v is not None for v in parts):
        value = round(sum(v for v in parts if v is not None), 4)
    return value


def _apply_merged(suite: Suite, row: dict[str, Any], scores: dict[str, float]) -> None:
    """Put a student's merged scores into their row (a question's column replaces the grader's score)."""
    for q in suite.questions:
        value = merged_value(q, scores)
        if value is not None and q.id in row:
            row["total"] = round(row["total"] - (row[q.id] or 0.0) + value, 4)
            row[q.id] = value


def read_scores_csv(path: Path, *, suite: Suite, ids: list[str]) -> tuple[dict[str, dict[str, float]], list[str]]:
    """The scores a CSV holds (id -> column -> score; blank cells are left out) and the columns it ignores.

    Raises MergeError, naming the row and the column, for an unknown student, an unknown question-like
    column or a score that is not a number between 0 and the column's points.
    """
    limits = merge_columns(suite)
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            table = list(csv.reader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise MergeError(f"{path}: cannot be read ({exc})") from exc
    if not table or "id" not in table[0]:
        raise MergeError(f"{path}: the first row must name the columns, one of them `id`")
    header = [h.strip() for h in table[0]]
    unknown = [h for h in header if re.match(r"^[qm]\d", h) and h not in limits and not h.endswith(" answer")]
    if unknown:
        raise MergeError(f"{path}: unknown score columns {unknown}; known: {sorted(limits)}")
    score_cols = [h for h in header if h in limits]
    if not score_cols:
        raise MergeError(f"{path}: no score column; name one of {sorted(limits)}")
    known = set(ids)
    written = {spreadsheet_text(i): i for i in ids}
    out: dict[str, dict[str, float]] = {}
    for n, cells in enumerate(table[1:], start=2):
        rec = dict(zip(header, cells))
        sid = rec.get("id", "").strip()
        sid = sid if sid in known else written.get(sid, sid)  # the id as spreadsheet_text wrote it
        if not sid and not any(rec.get(c, "").strip() for c in score_cols):
            continue
        if sid not in known:
            raise MergeError(f"{path}: row {n}: no student {sid!r} in this batch")
        for col in score_cols:
            text = rec.get(col, "").strip()
            if not text:
                continue
            try:
                value = float(text)
            except ValueError:
                raise MergeError(f"{path}: row {n} ({sid}), {col}: {text!r} is not a number") from None
            if not 0 <= value <= limits[col] + 1e-9:
                raise MergeError(f"{path}: row {n} ({sid}), {col}: {value:g} is outside 0 to {limits[col]:g}")
            out.setdefault(sid, {})[col] = round(value, 4)
    return out, [h for h in header if h not in limits and h != "id"]


def merge_scores(out: Path, files: list[Path], *, config_path: Path = DEFAULT_CONFIG) -> dict[str, Any]:
    """Merge scores graded elsewhere (a TA's written-answer scores, a platform's own points) into the batch in
    `out`: they are kept in merged_scores.json (a later file or run wins per student and column) and
    grades.csv and summary.json are written again with them. Returns what was merged."""
    suite = load_suite(config_path)
    try:
        before = json.loads((out / "summary.json").read_text(encoding="utf-8"))
        rows, lowered = before["rows"], list(before.get("limits_lowered") or [])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise MergeError(f"{out}: no summary.json of a graded batch; run `{command()} grade` first ({exc})") from None
    subs = [Submission(str(r["id"]), Path(), None, result_name=str(r.get("result") or "")) for r in rows]
    failed = {str(r["id"]): str(r.get("message") or Status.NOT_GRADED) for r in rows if not r.get("result")}
    stored = merged_scores(out)
    counts, ignored = {}, set()
    for path in files:
        scores, skipped = read_scores_csv(path, suite=suite, ids=[s.id for s in subs])
        ignored |= set(skipped)
        for sid, cols in scores.items():
            stored.setdefault(sid, {}).update(cols)
            for col in cols:
                counts[col] = counts.get(col, 0) + 1
    sources = [str(p) for p in files]
    _write_atomic(out / MERGED_FILE, json.dumps({"sources": sources, "scores": stored}, indent=1))
    write_tables(suite, subs, out, failed=failed, limits_lowered=lowered)
    return {"merged": counts, "ignored": sorted(ignored), "students": len(stored)}


def write_tables(suite: Suite, subs: list[Submission], out: Path, *, failed: dict[str, str] | None = None,
                 limits_lowered: list[str] | None = None) -> list[dict[str, Any]]:
    """grades.csv and summary.json of exactly these submissions (atomic writes); one row each, always.

    A row that is not graded has empty score cells; every cell that came from a student is spreadsheet-safe.
    limits_lowered: the configured limits that the grader's own hard limits lowered in the run (summary.json).
    Manual questions have a column too, empty until `merge` brings their scores (merged_scores.json), which
    also replace a question's automatic score when the scores file has that question's column.
    """
    qids = list(suite.question_points())
    manual = {q.id: q.points for q in suite.questions if q.graded and q.manual}
    try:
        merged, merge_problem = merged_scores(out), ""
    except MergeError as exc:  # the grades are written all the same; the summary says why the scores are missing
        merged, merge_problem = {}, str(exc)
    rows = []
    for sub in subs:
        row = _row(suite, sub, out, failed or {}) | dict.fromkeys(manual)
        if row["total"] is not None:
            _apply_merged(suite, row, merged.get(sub.id, {}))
        rows.append(row)
    columns = [*qids, *manual]
    table = [["id", "total", *columns, "status", "message"]]
    table += [[r["id"], *("" if r[k] is None else r[k] for k in ("total", *columns)), r["status"], r["message"]]
              for r in rows]
    _write_atomic(out / "grades.csv", csv_text(table))
    scored = [r for r in rows if r["total"] is not None]
    points = suite.question_points() | manual

    def mean(q: str) -> float | None:
        have = [r[q] for r in scored if r[q] is not None]
        return round(sum(have) / len(have), 3) if have else (0.0 if q in qids else None)

    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    summary = {"submissions": len(rows), "status_counts": counts, "mean_per_question": {q: mean(q) for q in columns},
               "max_per_question": points,
               "full_marks_per_question": {q: sum(full_marks(r[q], points[q]) for r in scored) for q in columns},
               "mean_total": round(sum(r["total"] for r in scored) / len(scored), 3) if scored else 0.0,
               "auto_points": suite.auto_points, "manual_points": round(sum(manual.values()), 4),
               "merged": {"file": MERGED_FILE, "students": len(merged), "problem": merge_problem}
               if merged or merge_problem else None,
               "limits_lowered": list(limits_lowered or []),
               "rows": [{"id": r["id"], "result": None if r["status"] == Status.NOT_GRADED else sub.result_name,
                         "status": r["status"], "message": r["message"]} for r, sub in zip(rows, subs)]}
    _write_atomic(out / "summary.json", json.dumps(summary, indent=1))
    return rows
