"""Judging: probe outputs in, per-case verdicts and per-question scores out (runs in the clean grader)."""

from __future__ import annotations

import ast
import csv
import hashlib
import io
import json
import os
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from functools import cache, partial
from pathlib import Path
from typing import Any

import nbformat

from autograder import lesson83_checks as checks
from autograder.config import DEFAULT_CONFIG, GradingConfig, load_config
from autograder.content import (
    ASSIGNMENT_DIR,
    REFERENCE_FILE,
    Question,
    expected_values,
    load_questions,
    mc_answers,
)
from autograder.execute import SKIP_TAGS, Limits, WorkerPool
from autograder.lesson83_milestone import SCHEMES
from autograder.milestone import MAX_CHECKPOINT_MB, verify_checkpoint

CHECKPOINT_QUESTION = "m1_checkpoint"
CHECKPOINT_FILES = ("milestone.pt", "milestone.json")


@dataclass
class CaseResult:
    """The verdict on one test case."""

    id: str
    question: str
    points: float
    max_points: float
    passed: bool
    hidden: bool
    message: str = ""
    diagnosis: str | None = None
    received: Any = None  # the probe output of a failed case (plain data), for the TA report


@dataclass
class SubmissionResult:
    """Everything the grader concluded about one submission."""

    submission: str
    status: str
    cases: list[CaseResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def question_scores(self) -> dict[str, float]:
        scores: dict[str, float] = {}
        for c in self.cases:
            scores[c.question] = round(scores.get(c.question, 0.0) + c.points, 4)
        return scores

    @property
    def total(self) -> float:
        return round(sum(c.points for c in self.cases), 4)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"total": self.total, "questions": self.question_scores()}


@dataclass(frozen=True)
class Suite:
    """All graded cases with their reference values: the single definition both graders use."""

    config: GradingConfig
    questions: tuple[Question, ...]
    cases: tuple[dict[str, Any], ...]
    expected: dict[str, dict[str, Any]]

    @property
    def notebook_points(self) -> float:
        """Points a notebook alone can earn (every probe case)."""
        return round(sum(c["points"] for c in self.cases), 4)

    @property
    def auto_points(self) -> float:
        """All automatically graded points: the notebook's and the milestone checkpoint's."""
        return round(self.notebook_points + self.config.milestone.points, 4)

    def question_points(self) -> dict[str, float]:
        """Automatically graded questions (grades.csv columns) and their points, checkpoint last."""
        return {q.id: q.points for q in self.questions if q.graded and not q.manual}

    @property
    def checkpoint_cases(self) -> list[dict[str, Any]]:
        """One case per scheme for the milestone checkpoint (none when the config gives it no points)."""
        pts = self.config.milestone.points
        if not pts:
            return []
        share = [round(pts / len(SCHEMES), 4) for _ in SCHEMES]
        share[-1] = round(pts - sum(share[:-1]), 4)
        return [{"id": f"{CHECKPOINT_QUESTION}/{pos}", "question": CHECKPOINT_QUESTION, "points": p,
                 "hidden": False, "scheme": pos} for pos, p in zip(SCHEMES, share)]


def load_suite(config_path: Path = DEFAULT_CONFIG) -> Suite:
    """The suite for a config file (cached per resolved path: computing reference values takes seconds)."""
    return _load_suite(Path(config_path).resolve())


@cache
def _load_suite(config_path: Path) -> Suite:
    config = load_config(config_path)
    questions = load_questions(config)
    cases = tuple(c for q in questions for c in q.cases)
    expected = expected_values(questions)
    if config.milestone.points:  # graded from uploaded files, not from the notebook: no probe cases
        milestone = next((q for q in questions if q.id.startswith("m1")), None)
        questions.append(Question(CHECKPOINT_QUESTION, "Milestone M1 — checkpoint",
                                  milestone.path if milestone else config_path, [], [], [], [],
                                  points=config.milestone.points))
    return Suite(config, tuple(questions), cases, expected)


def judge_outputs(suite: Suite, outputs: dict[str, dict[str, Any]]) -> list[CaseResult]:
    """Judge probe outputs (case id -> plain data); a case with no output fails with a clear message.

    A case that `requires` value cases of its question passes only when they pass too (recursively): a
    property such as "shuffling the input shuffles the output" also holds of code that returns zeros.
    """
    verdicts: dict[str, checks.Verdict] = {}
    for case in suite.cases:
        got = outputs.get(case["id"])
        if got is None:
            verdicts[case["id"]] = checks.Verdict(False, f"{case['id']}: no result: the submission stopped "
                                                  "before this case could run.")
        else:
            verdicts[case["id"]] = checks.judge(case, got, suite.expected[case["id"]])
    by_id = {c["id"]: c for c in suite.cases}

    def holds(case_id: str) -> bool:  # its own check and every requirement pass (content.py forbids cycles)
        case = by_id[case_id]
        return verdicts[case_id].passed and all(holds(f"{case['question']}/{r}") for r in case.get("requires", []))

    results = []
    for case in suite.cases:
        verdict, got = verdicts[case["id"]], outputs.get(case["id"])
        blocked = [f"{case['question']}/{r}" for r in case.get("requires", []) if not holds(f"{case['question']}/{r}")]
        if verdict.passed and blocked:
            verdict = checks.Verdict(False, f"{case['id']}: earns its points only once {' and '.join(blocked)} "
                                     f"passes: make {blocked[0]} pass first. This property also holds of code "
                                     "that computes nothing (zeros, an identity), so it counts only with correct "
                                     "values.")
        received = None if verdict.passed or got is None else checks.to_plain(got)
        results.append(CaseResult(case["id"], case["question"], case["points"] if verdict.passed else 0.0,
                                  case["points"], verdict.passed, case["hidden"], verdict.message,
                                  verdict.diagnosis, received))
    return results


def judge_checkpoint(suite: Suite, files: dict[str, bytes], problems: list[str] | None = None) -> list[CaseResult]:
    """Milestone checkpoint cases: re-evaluate milestone.pt on the CPU and compare with milestone.json."""
    cases = suite.checkpoint_cases
    if not cases:
        return []
    pt, claims = files.get("milestone.pt"), files.get("milestone.json")
    if problems:
        verdict = {"ok": False, "message": "; ".join(problems), "credit": 0.0, "schemes": {}}
    else:
        verdict = verify_checkpoint(pt, claims, rules=suite.config.milestone)
    out = []
    for case in cases:
        row = verdict["schemes"].get(case["scheme"], {})
        passed = bool(verdict["ok"] and row.get("passed"))
        earned = round(case["points"] * verdict["credit"], 4) if passed else 0.0
        if passed:
            message = "" if verdict["credit"] == 1 else (f"{case['id']}: the {verdict['preset']} preset earns "
                                                         f"{verdict['credit']:.0%} of these points")
        else:
            message = f"{case['id']}: {row.get('message') or verdict['message']}"
        received = {k: {str(c): v for c, v in row[k].items()} for k in ("ppl", "claimed", "thresholds")
                    if row.get(k)}
        problem = None if passed else row.get("problem") or verdict.get("problem")
        out.append(CaseResult(case["id"], case["question"], earned, case["points"], passed, False, message,
                              problem, received or None))
    return out


def probe_namespace(suite: Suite, env: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Run every probe against a namespace in this process (for trusted code: the reference, templates)."""
    return {c["id"]: checks.run_probe(env, c["probe"], c["args"]) for c in suite.cases}


def grade_namespace(suite: Suite, env: dict[str, Any], *, name: str) -> SubmissionResult:
    return SubmissionResult(name, "graded", judge_outputs(suite, probe_namespace(suite, env)))


def reference_env(suite: Suite) -> dict[str, Any]:
    from reference.mistakes import reference_namespace

    return reference_namespace() | mc_answers(list(suite.questions))


def _is_otter_cell(source: str) -> bool:
    return "otter" in source or "grader." in source


def notebook_env(path: Path) -> tuple[dict[str, Any], list[str]]:
    """Execute a trusted notebook's code cells in this process (Otter's own cells skipped).

    Used for the committed student template in the self-check; student submissions go through the
    sandboxed executor instead. A cell that raises is recorded and execution continues; cells tagged
    as the sandbox skips them (training) are skipped here too.
    """
    nb = nbformat.read(str(path), as_version=4)
    env: dict[str, Any] = {"__name__": "__main__"}
    errors = []
    for n, cell in enumerate(nb.cells):
        skipped = set(SKIP_TAGS) & set(cell.metadata.get("tags", []))
        if cell.cell_type != "code" or _is_otter_cell(cell.source) or skipped:
            continue
        try:
            exec(compile(ast.parse(cell.source), f"{path.name}[cell {n}]", "exec"), env)  # noqa: S102
        except Exception as exc:  # noqa: BLE001 - a failing cell is recorded, the next cells still run
            errors.append(f"cell {n}: {type(exc).__name__}: {exc}")
    return env, errors


# --------------------------------------------------------------------------- batch grading

STATUS_WORDS = {"ok": "graded", "timeout": "timed out", "oom": "out of memory", "unreadable": "could not be read",
                "crashed": "crashed", "tampering": "tampering detected"}


@dataclass
class Submission:
    """One input: an id, the notebook bytes (or why there are none) and where it came from."""

    id: str
    path: Path
    source: bytes | None
    problem: str = ""
    files: dict[str, bytes] = field(default_factory=dict)  # milestone.pt / milestone.json, when uploaded
    file_problems: list[str] = field(default_factory=list)


def _from_zip(path: Path) -> Submission:
    """The one .ipynb inside a zip (and milestone.pt/.json if present), read in memory; nothing else in
    the zip (a .OTTER_LOG) is ever loaded."""
    sid = path.stem
    try:
        with zipfile.ZipFile(path) as zf:
            members = [i for i in zf.infolist() if "__MACOSX" not in i.filename and not i.is_dir()
                       and not Path(i.filename).name.startswith(".")]
            names = [i.filename for i in members if i.filename.endswith(".ipynb")]
            if len(names) != 1:
                return Submission(sid, path, None, f"the zip holds {len(names)} notebooks (.ipynb); upload "
                                  "exactly one")
            info = zf.getinfo(names[0])
            if info.file_size > 64 * 2**20:
                return Submission(sid, path, None, f"{names[0]} is larger than 64 MiB")
            sub = Submission(sid, path, zf.read(names[0]))
            for name in CHECKPOINT_FILES:
                found = [(i.file_size, partial(zf.read, i)) for i in members if Path(i.filename).name == name]
                _attach(sub, name, found, "zip")
            return sub
    except (zipfile.BadZipFile, OSError) as exc:
        return Submission(sid, path, None, f"not a readable zip: {exc}")


def _attach(sub: Submission, name: str, found: list[tuple[int, Callable[[], bytes]]], where: str) -> None:
    """Keep the one file called `name` (its size and a reader), or note why it cannot be used."""
    if len(found) > 1:
        sub.file_problems.append(f"the {where} holds {len(found)} files named {name}; keep one")
    elif found and found[0][0] > MAX_CHECKPOINT_MB * 2**20:
        sub.file_problems.append(f"{name} is larger than {MAX_CHECKPOINT_MB} MiB")
    elif found:
        sub.files[name] = found[0][1]()


def _files_in_folder(folder: Path, sub: Submission) -> Submission:
    """Attach milestone.pt/.json found anywhere in a submission folder."""
    for name in CHECKPOINT_FILES:
        paths = sorted(p for p in folder.rglob(name) if ".ipynb_checkpoints" not in p.parts and p.is_file())
        _attach(sub, name, [(p.stat().st_size, p.read_bytes) for p in paths], "folder")
    return sub


def find_submissions(folder: Path) -> list[Submission]:
    """Every input under `folder`: notebooks, per-student folders, or zips; each becomes exactly one row."""
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such folder of submissions")
    subs: list[Submission] = []
    for path in sorted(folder.iterdir()):
        if path.name.startswith("."):
            continue
        sid = path.stem if path.is_file() else path.name
        if path.is_dir():
            notebooks = sorted(p for p in path.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
            if len(notebooks) == 1:
                subs.append(_files_in_folder(path, Submission(sid, notebooks[0], notebooks[0].read_bytes())))
            else:
                zips = sorted(path.rglob("*.zip"))
                if not notebooks and len(zips) == 1:
                    sub = _from_zip(zips[0])
                    sub.id = sid
                    if not sub.files and not sub.file_problems:
                        _files_in_folder(path, sub)  # the export zip, with the checkpoint uploaded beside it
                    subs.append(sub)
                else:
                    subs.append(Submission(sid, path, None, f"the folder holds {len(notebooks)} notebooks; "
                                           "submit exactly one .ipynb"))
        elif path.suffix == ".zip":
            subs.append(_from_zip(path))
        elif path.suffix == ".ipynb":
            subs.append(Submission(sid, path, path.read_bytes()))
        else:
            subs.append(Submission(sid, path, None, f"{path.name} is not a notebook (.ipynb), a zip or a folder"))
    ids = [s.id for s in subs]
    for s in subs:
        if ids.count(s.id) > 1:
            s.id = s.path.name  # lesson83.ipynb and lesson83.zip side by side keep apart
    return subs


def suite_fingerprint(config_path: Path = DEFAULT_CONFIG) -> str:
    """Changes whenever a question, the reference, a check, the executor or the config changes."""

    here = Path(__file__).parent
    files = [config_path, REFERENCE_FILE, REFERENCE_FILE.with_name("mistakes.py"),
             *sorted(ASSIGNMENT_DIR.glob("*.md")),
             *(here / m for m in ("lesson83_checks.py", "content.py", "execute.py", "wire.py", "judge.py",
                                "milestone.py", "lesson83_milestone.py"))]
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def _write_atomic(path: Path, text: str) -> None:

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def gradescope_results(result: SubmissionResult, *, stdout: str = "") -> dict[str, Any]:
    """The Gradescope results.json of one submission (hidden cases count but stay hidden)."""
    tests = [{"name": c.id, "score": c.points, "max_score": c.max_points,
              "output": c.message or "passed", "visibility": "hidden" if c.hidden else "visible"}
             for c in result.cases if c.max_points > 0]
    notes = "\n".join(result.notes)
    return {"score": result.total, "tests": tests, "output": f"Status: {result.status}\n{notes}".strip(),
            "stdout_visibility": "hidden", "extra_data": {"status": result.status, "stdout": stdout[:4000]}}


def _result_from_exec(suite: Suite, sub: Submission, status: str, outputs: dict[str, Any],
                      notes: list[str]) -> SubmissionResult:
    cases = judge_outputs(suite, outputs) + judge_checkpoint(suite, sub.files, sub.file_problems)
    return SubmissionResult(sub.id, STATUS_WORDS[status], cases, list(notes))


@dataclass
class BatchSummary:
    """What a batch run did: per-status counts, mean score per question, and where the files are."""

    out: Path
    rows: list[dict[str, Any]]
    graded_now: int
    reused: int
    sandbox: str

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.rows:
            out[r["status"]] = out.get(r["status"], 0) + 1
        return out


def grade_batch(submissions: Path, *, out: Path, force: bool = False, workers: int | None = None,
                config_path: Path = DEFAULT_CONFIG, progress: bool = True) -> BatchSummary:
    """Grade every submission under `submissions` into `out`: results/<id>.json, grades.csv, summary.json.

    Resumable: a submission whose stored result has the same content and suite fingerprint is not run
    again (unless `force`); each result is written atomically as soon as it is known, so a batch killed
    at any point and re-run ends with every submission graded exactly once.
    """
    config = load_config(config_path)
    fingerprint = suite_fingerprint(config_path)
    subs = find_submissions(submissions)
    results_dir = out / "results"
    todo, reused = [], 0
    for sub in subs:
        extra = b"".join(hashlib.sha256(sub.files.get(n, b"")).digest() for n in CHECKPOINT_FILES)
        key = hashlib.sha256((sub.source or sub.problem.encode()) + extra + "".join(sub.file_problems).encode()
                             + fingerprint.encode()).hexdigest()
        sub_file = results_dir / f"{sub.id}.json"
        if not force and sub_file.exists():
            try:
                if json.loads(sub_file.read_text()).get("key") == key:
                    reused += 1
                    continue
            except ValueError:
                pass  # a damaged result is graded again
        todo.append((sub, key))

    def save(sub: Submission, key: str, result: SubmissionResult, extra: dict[str, Any]) -> None:
        record = {"key": key, "path": str(sub.path.resolve()), **result.to_dict(), **extra,
                  "gradescope": gradescope_results(result, stdout=extra.get("stdout", ""))}
        _write_atomic(results_dir / f"{sub.id}.json", json.dumps(record, indent=1))

    sandbox = "not started"
    runnable = [(s, k) for s, k in todo if s.source is not None]
    pool_starting = None
    if runnable:  # the sandboxed workers start (seconds) while this process computes the reference values
        ex = config.execution
        limits = Limits(wall_s=ex.wall_timeout_s, cpu_s=ex.cpu_timeout_s, memory_mb=ex.memory_mb,
                        processes=ex.max_processes, file_mb=ex.max_file_mb, output_kb=ex.max_output_kb)
        starter = ThreadPoolExecutor(1)
        pool_starting = starter.submit(WorkerPool, workers or ex.workers, limits=limits,
                                       hide=(submissions.resolve(), out.resolve()))
        starter.shutdown(wait=False)
    suite = load_suite(config_path)
    for sub, key in todo:
        if sub.source is None:
            save(sub, key, _result_from_exec(suite, sub, "unreadable", {}, [sub.problem]), {})
    if pool_starting is not None:
        probes = [(c["id"], c["probe"], c["args"]) for c in suite.cases]
        by_id = {s.id: (s, k) for s, k in runnable}
        start, done = time.monotonic(), 0
        with pool_starting.result() as pool:
            sandbox = pool.sandbox
            for sid, ex_result in pool.run_many(((s.id, s.source) for s, _ in runnable), probes=probes):
                sub, key = by_id[sid]
                result = _result_from_exec(suite, sub, ex_result.status, ex_result.outputs, ex_result.notes)
                if ex_result.tampering:
                    result.notes.append("tampering: " + "; ".join(ex_result.tampering[:5]))
                save(sub, key, result, {"stdout": ex_result.stdout, "wall_s": round(ex_result.wall_s, 3),
                                        "sandbox": ex_result.sandbox, "memory_guard": ex_result.memory_guard})
                done += 1
                if progress:
                    width = 30
                    filled = int(width * done / len(runnable))
                    print(f"\rgrading [{'#' * filled}{'.' * (width - filled)}] {done}/{len(runnable)} "
                          f"{time.monotonic() - start:5.1f}s", end="", file=sys.stderr, flush=True)
        if progress:
            print(file=sys.stderr)
    rows = write_tables(suite, subs, out)
    return BatchSummary(out, rows, len(todo), reused, sandbox)


def write_tables(suite: Suite, subs: list[Submission], out: Path) -> list[dict[str, Any]]:
    """grades.csv and summary.json from the stored results of exactly these submissions (atomic writes)."""

    qids = list(suite.question_points())
    rows = []
    for sub in subs:
        record = json.loads((out / "results" / f"{sub.id}.json").read_text())
        row = {"id": sub.id, "total": record["total"]}
        row |= {q: record["questions"].get(q, 0.0) for q in qids}
        row["status"] = record["status"]
        rows.append(row)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=["id", "total", *qids, "status"], lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    _write_atomic(out / "grades.csv", buf.getvalue())
    means = {q: round(sum(r[q] for r in rows) / len(rows), 3) if rows else 0.0 for q in qids}
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    summary = {"submissions": len(rows), "status_counts": counts, "mean_per_question": means,
               "max_per_question": suite.question_points(),
               "mean_total": round(sum(r["total"] for r in rows) / len(rows), 3) if rows else 0.0,
               "auto_points": suite.auto_points}
    _write_atomic(out / "summary.json", json.dumps(summary, indent=1))
    return rows
