"""Judging: probe outputs in, per-case verdicts and per-question scores out (runs in the clean grader)."""

from __future__ import annotations

import ast
import csv
import hashlib
import io
import json
import os
import re
import stat
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from functools import cache, partial
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

import nbformat

from autograder.config import DEFAULT_CONFIG, GradingConfig, Submissions, command, load_config
from autograder.content import (
    Question,
    expected_values,
    load_questions,
    mc_answers,
)
from autograder.execute import SKIP_TAGS, ExecResult, Limits, WorkerPool
from autograder.milestone import verify_checkpoint

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
    notes: list[str] = field(default_factory=list)  # for TAs: everything, the sandbox's words included
    student_notes: list[str] = field(default_factory=list)  # written by the grader alone; the student sees them

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
        schemes = self.config.lesson.trainer.SCHEMES
        share = [round(pts / len(schemes), 4) for _ in schemes]
        share[-1] = round(pts - sum(share[:-1]), 4)
        return [{"id": f"{CHECKPOINT_QUESTION}/{pos}", "question": CHECKPOINT_QUESTION, "points": p,
                 "hidden": False, "scheme": pos} for pos, p in zip(schemes, share)]


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
        milestone = next((q for q in questions if q.kind == "milestone"), None)
        questions.append(Question(CHECKPOINT_QUESTION, "Milestone M1 — checkpoint",
                                  milestone.path if milestone else config_path, [], [], [], [],
                                  points=config.milestone.points))
    return Suite(config, tuple(questions), cases, expected)


def judge_outputs(suite: Suite, outputs: dict[str, dict[str, Any]]) -> list[CaseResult]:
    """Judge probe outputs (case id -> plain data); a case with no output fails with a clear message.

    A case that `requires` value cases of its question passes only when they pass too (recursively): a
    property such as "shuffling the input shuffles the output" also holds of code that returns zeros.
    """
    checks = suite.config.lesson.checks
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

    results, waits = [], {}
    for case in suite.cases:
        verdict, got = verdicts[case["id"]], outputs.get(case["id"])
        blocked = [f"{case['question']}/{r}" for r in case.get("requires", []) if not holds(f"{case['question']}/{r}")]
        waits[case["id"]] = blocked
        verdict = checks.gated(case, verdict, [(cid, verdicts[cid]) for cid in blocked])
        received = None if verdict.passed or got is None else checks.to_plain(got)
        results.append(CaseResult(case["id"], case["question"], case["points"] if verdict.passed else 0.0,
                                  case["points"], verdict.passed, case["hidden"], verdict.message,
                                  verdict.diagnosis, received))
    return _one_line_per_stub(results, waits, stub=checks.STUB)


def _one_line_per_stub(results: list[CaseResult], waits: dict[str, list[str]], *, stub: str) -> list[CaseResult]:
    """Failures of one question that come from stubs not filled in read as one line: the first case says it;
    the question's other stub failures, and the properties that wait only for them, point to it."""
    stubs = {r.id for r in results if not r.passed and stub in r.message}
    first: dict[str, CaseResult] = {}
    for r in results:
        if r.id in stubs:
            first.setdefault(r.question, r)
    for r in results:
        lead = first.get(r.question)
        if lead is None or r is lead or r.passed:
            continue
        if r.id in stubs or (waits.get(r.id) and set(waits[r.id]) <= stubs):
            r.message = f"{r.id}: not filled in yet (see {lead.id})"
    return results


def judge_checkpoint(suite: Suite, files: dict[str, bytes], problems: list[str] | None = None) -> list[CaseResult]:
    """Milestone checkpoint cases: re-evaluate milestone.pt on the CPU and compare with milestone.json."""
    cases = suite.checkpoint_cases
    if not cases:
        return []
    pt, claims = files.get("milestone.pt"), files.get("milestone.json")
    if problems:
        verdict = {"ok": False, "message": "; ".join(problems), "problem": "checkpoint_unreadable", "credit": 0.0,
                   "schemes": {}}
    else:
        try:
            verdict = verify_checkpoint(pt, claims, rules=suite.config.milestone,
                                        memory_mb=suite.config.submissions.checkpoint_memory_mb)
        except Exception as exc:  # noqa: BLE001 - hostile files (deep JSON, odd types) cost this part, not the batch
            verdict = {"ok": False, "problem": "checkpoint_unreadable", "credit": 0.0, "schemes": {},
                       "message": f"the checkpoint could not be verified ({type(exc).__name__}: {str(exc)[:200]}); "
                                  "re-save it with save_checkpoint and upload milestone.pt and milestone.json of "
                                  "the same run"}
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
    run_probe = suite.config.lesson.checks.run_probe
    return {c["id"]: run_probe(env, c["probe"], c["args"]) for c in suite.cases}


def grade_namespace(suite: Suite, env: dict[str, Any], *, name: str) -> SubmissionResult:
    return SubmissionResult(name, "graded", judge_outputs(suite, probe_namespace(suite, env)))


def reference_env(suite: Suite) -> dict[str, Any]:
    return suite.config.lesson.namespace() | mc_answers(list(suite.questions))


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


# --------------------------------------------------------------------------- reading submissions

STATUS_WORDS = {"ok": "graded", "timeout": "timed out", "oom": "out of memory", "unreadable": "could not be read",
                "crashed": "crashed", "tampering": "tampering detected"}
NOT_GRADED = "not graded"  # the grader failed on it (sandbox, judging, storing): nothing stored, a re-run grades it
MAX_FOLDER_ENTRIES = 10_000  # files and folders looked at inside one student's folder
SKIP_DIRS = (".ipynb_checkpoints", "__MACOSX")
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


class Refused(ValueError):
    """A submission file the grader will not read; the message names the file and says what to do."""


def spreadsheet_text(text: str) -> str:
    """A CSV cell that a spreadsheet shows as text: one that starts like a formula gets a leading apostrophe."""
    return "'" + text if text[:1] in FORMULA_STARTS else text


def display_name(name: str) -> str:
    """A file name as readable text: bytes that are not UTF-8 and unprintable characters become escapes."""
    text = os.fsencode(name).decode("utf-8", "backslashreplace")
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def _kind(mode: int) -> str:
    kinds = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
             (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"))
    return next((word for test, word in kinds if test(mode)), "not a regular file")


def _too_big(label: str, size: int, limit: int) -> str:
    return (f"{label} is {size / 2**20:.1f} MiB, over the {limit / 2**20:g} MiB limit (grading_config.yaml, "
            "submissions): remove large outputs or files (Kernel > Restart & Clear Output) and submit again")


@contextmanager
def open_regular(path: Path, *, limit: int, label: str) -> Iterator[BinaryIO]:
    """`path` open for reading when it is a regular file of at most `limit` bytes; anything else is Refused.

    A symbolic link is never followed (O_NOFOLLOW) and a FIFO or device is never waited on (O_NONBLOCK, and the
    type is checked on the open file); the size is checked before a byte is read.
    """
    mode = os.lstat(path).st_mode
    if not stat.S_ISREG(mode):
        raise Refused(f"{label} is {_kind(mode)}, not a regular file; the grader never follows links or opens "
                      "pipes and devices: put the file itself in the submissions folder")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise Refused(f"{label} could not be opened ({exc.strerror}); check that it is a file you can read") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"{label} is {_kind(st.st_mode)}, not a regular file; put the file itself there")
        if st.st_size > limit:
            raise Refused(_too_big(label, st.st_size, limit))
        yield f


def read_regular(path: Path, *, limit: int, label: str) -> bytes:
    """The bytes of a regular file of at most `limit` bytes (see open_regular); never more are read."""
    with open_regular(path, limit=limit, label=label) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise Refused(_too_big(label, len(data), limit))
    return data


def _read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, *, limit: int, label: str) -> bytes:
    """A zip member of at most `limit` bytes: its declared size is checked, then at most limit + 1 are inflated."""
    if info.file_size > limit:
        raise Refused(_too_big(label, info.file_size, limit))
    with zf.open(info) as member:
        data = member.read(limit + 1)
    if len(data) > limit:
        raise Refused(f"{label} inflates to more than its declared size and over the {limit / 2**20:g} MiB limit; "
                      "zip the files again")
    return data


@dataclass
class Submission:
    """One input: an id, the notebook bytes (or why there are none) and where it came from."""

    id: str
    path: Path  # the notebook or zip the source was read from (the entry itself when there is none)
    source: bytes | None
    problem: str = ""
    files: dict[str, bytes] = field(default_factory=dict)  # milestone.pt / milestone.json, when uploaded
    file_problems: list[str] = field(default_factory=list)
    name: str = ""  # the entry's name in the class folder (os.fsdecode: non-UTF-8 bytes are surrogates)
    folder: bool = False
    result_name: str = ""  # its file under results/

    @property
    def raw_name(self) -> bytes:
        return os.fsencode(self.name) + (b"/" if self.folder else b"")


def _attach(sub: Submission, name: str, readers: list[Callable[..., bytes]], where: str, cap: int) -> None:
    """Keep the one file called `name` (read under `cap`), or note why it cannot be used."""
    if len(readers) > 1:
        sub.file_problems.append(f"the {where} holds {len(readers)} files named {name}; keep one")
    elif readers:
        try:
            sub.files[name] = readers[0](limit=cap)
        except Refused as exc:
            sub.file_problems.append(str(exc))


def _zip_link(info: zipfile.ZipInfo) -> bool:
    return stat.S_ISLNK(info.external_attr >> 16)


def _read_zip(sub: Submission, path: Path, limits: Submissions, with_files: bool) -> None:
    """The one .ipynb inside a zip (and milestone.pt/.json if present), read in memory under the caps; nothing
    else in the zip (a .OTTER_LOG, a link) is ever read."""
    label = display_name(path.name)
    with open_regular(path, limit=limits.cap("zip"), label=label) as f:
        try:
            zf = zipfile.ZipFile(f)
        except zipfile.BadZipFile as exc:
            raise Refused(f"{label} is not a readable zip ({exc}); zip the notebook again") from None
        with zf:
            members = [i for i in zf.infolist() if "__MACOSX" not in i.filename and not i.is_dir()
                       and not PurePosixPath(i.filename).name.startswith(".") and not _zip_link(i)]
            notebooks = [i for i in members if i.filename.endswith(".ipynb")]
            if len(notebooks) != 1:
                raise Refused(f"{label} holds {len(notebooks)} notebooks (.ipynb); upload a zip with exactly one")
            nb = notebooks[0]
            sub.source = _read_member(zf, nb, limit=limits.cap("notebook"),
                                      label=f"{label}: {display_name(nb.filename)}")
            for name in CHECKPOINT_FILES if with_files else ():
                found = [i for i in members if PurePosixPath(i.filename).name == name]
                _attach(sub, name, [partial(_read_member, zf, i, label=f"{label}: {display_name(i.filename)}")
                                    for i in found], "zip", limits.cap("checkpoint"))


def _walk(folder: Path) -> tuple[list[Path], list[tuple[Path, str]]]:
    """Regular files under `folder`, never following a link, and the entries skipped with what they are."""
    files: list[Path] = []
    skipped: list[tuple[Path, str]] = []
    stack, seen = [folder], 0
    while stack:
        with os.scandir(stack.pop()) as it:
            entries = sorted(it, key=lambda e: os.fsencode(e.name))
        for e in entries:
            seen += 1
            if seen > MAX_FOLDER_ENTRIES:
                raise Refused(f"{display_name(folder.name)}/ holds more than {MAX_FOLDER_ENTRIES} files; upload "
                              "the notebook (and the milestone files) alone")
            if e.is_dir(follow_symlinks=False):
                if e.name not in SKIP_DIRS:
                    stack.append(Path(e.path))
            elif e.is_file(follow_symlinks=False):
                files.append(Path(e.path))
            else:
                skipped.append((Path(e.path), _kind(e.stat(follow_symlinks=False).st_mode)))
    return sorted(files), skipped


def _read_folder(sub: Submission, limits: Submissions, with_files: bool) -> None:
    """A per-student folder: its one notebook (or one zip), and milestone.pt/.json found anywhere in it."""
    folder = sub.path
    files, skipped = _walk(folder)

    def label(p: Path) -> str:
        return f"{display_name(folder.name)}/{display_name(str(p.relative_to(folder)))}"

    notebooks = [p for p in files if p.suffix == ".ipynb" and not p.name.startswith(".")]
    zips = [p for p in files if p.suffix == ".zip" and not p.name.startswith(".")]
    if len(notebooks) == 1:
        sub.path = notebooks[0]
        sub.source = read_regular(notebooks[0], limit=limits.cap("notebook"), label=label(notebooks[0]))
    elif not notebooks and len(zips) == 1:
        sub.path = zips[0]
        _read_zip(sub, zips[0], limits, with_files)
        if sub.files or sub.file_problems:
            return  # the zip carried the checkpoint
    else:
        why = f"{display_name(folder.name)}/ holds {len(notebooks)} notebooks (.ipynb); submit exactly one"
        if skipped:
            why += "; not read: " + ", ".join(f"{label(p)} ({kind})" for p, kind in skipped[:5])
        raise Refused(why)
    for name in CHECKPOINT_FILES if with_files else ():
        found = [p for p in files if p.name == name]
        _attach(sub, name, [partial(read_regular, p, label=label(p)) for p in found], "folder",
                limits.cap("checkpoint"))
        odd = [(p, kind) for p, kind in skipped if p.name == name]
        if not found and odd:
            sub.file_problems.append(f"{label(odd[0][0])} is {odd[0][1]}, not a regular file; the grader never "
                                     f"follows links: upload {name} itself")


def read_entry(path: Path, *, limits: Submissions | None = None, with_files: bool = True) -> Submission:
    """One input of a class folder (a notebook, a zip or a per-student folder), read under the caps.

    Never raises for anything the input is or holds: why it cannot be graded becomes the Submission's `problem`.
    """
    limits = limits or Submissions()
    label = display_name(path.name)
    sub = Submission(label, path, None, name=path.name)
    try:
        mode = os.lstat(path).st_mode
        if stat.S_ISDIR(mode):
            sub.folder = True
            _read_folder(sub, limits, with_files)
        elif not stat.S_ISREG(mode):
            raise Refused(f"{label} is {_kind(mode)}; the grader reads only regular files and folders and never "
                          "follows links: put the notebook itself in the submissions folder")
        elif path.suffix == ".zip":
            _read_zip(sub, path, limits, with_files)
        elif path.suffix == ".ipynb":
            sub.source = read_regular(path, limit=limits.cap("notebook"), label=label)
        else:
            raise Refused(f"{label} is not a notebook (.ipynb), a zip or a folder")
    except Refused as exc:
        sub.source, sub.problem = None, str(exc)
    except Exception as exc:  # noqa: BLE001 - whatever goes wrong reading one input is that input's row alone
        sub.source, sub.problem = None, f"{label} could not be read ({type(exc).__name__}: {str(exc)[:300]})"
    return sub


def submission_ids(entries: list[tuple[str, bool]]) -> list[str]:
    """Readable, unique ids for the entries (name, is a folder) of one class folder.

    An entry is known by its stem (`alice` for alice.ipynb or alice.zip, the name of a folder). Entries that
    share one are known by their whole name (`alice.ipynb`, `alice.zip`, `alice/`), and any still shared by
    that name plus `~` and 8 hex digits of the SHA-256 of the raw name. Bytes that are not UTF-8 and
    unprintable characters are written as escapes (`caf\\xe9`). The ids depend only on the names in the folder.
    """
    def form(name: str, folder: bool, level: int) -> str:
        text = display_name(name if folder else PurePosixPath(name).stem) if level == 0 else \
            display_name(name) + ("/" if folder else "")
        return text if level < 2 else f"{text}~{hashlib.sha256(os.fsencode(name)).hexdigest()[:8]}"

    levels = [0] * len(entries)
    while True:
        ids = [form(name, folder, lv) for (name, folder), lv in zip(entries, levels)]
        groups: dict[str, list[int]] = {}
        for i, sid in enumerate(ids):
            groups.setdefault(sid, []).append(i)
        bump = []
        for group in (g for g in groups.values() if len(g) > 1):
            low = min(levels[i] for i in group)  # the entries still known by a shorter form give way first
            bump += [i for i in group if levels[i] == low and low < 2]
        if not bump:
            return ids
        for i in bump:
            levels[i] += 1


_PLAIN_ID = re.compile(r"[a-z0-9_][a-z0-9_.-]{0,99}")


def result_file_name(sid: str, raw_name: bytes) -> str:
    """The file under results/ for a submission: its id when that is a plain lower-case name, else a safe slug
    of the id, `~` and 12 hex digits of the SHA-256 of the raw entry name (never too long, never shared, even on
    a case-insensitive disk)."""
    if _PLAIN_ID.fullmatch(sid) and not sid.endswith("."):
        return f"{sid}.json"
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", sid).strip("._-")[:60] or "submission"
    return f"{slug}~{hashlib.sha256(raw_name).hexdigest()[:12]}.json"


def find_submissions(folder: Path, *, limits: Submissions | None = None) -> list[Submission]:
    """Every input under `folder`: notebooks, per-student folders, or zips; each becomes exactly one row.

    Names starting with a dot are not inputs. Nothing is followed out of `folder` (links are refused).
    """
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such folder of submissions")
    with os.scandir(folder) as it:
        names = sorted((e.name for e in it if not e.name.startswith(".")), key=os.fsencode)
    subs = [read_entry(folder / name, limits=limits) for name in names]
    for sub, sid in zip(subs, submission_ids([(s.name, s.folder) for s in subs])):
        sub.id = sid
        sub.result_name = result_file_name(sid, sub.raw_name)
    return subs


# --------------------------------------------------------------------------- batch grading


def suite_fingerprint(config_path: Path = DEFAULT_CONFIG) -> str:
    """Changes whenever a question, the reference, a check, the executor or the config changes."""

    here = Path(__file__).parent
    files = [config_path, *load_config(config_path).lesson.source_files,
             *(here / m for m in ("content.py", "execute.py", "wire.py", "judge.py", "milestone.py", "lesson.py"))]
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


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


STUDENT_HELP = {
    "timed out": "The notebook as a whole ran past its time limit; what the cells before the running one "
                 "defined was still graded, the rest earns nothing. Look for an endless loop, or training "
                 "outside the cell tagged for it.",
    "out of memory": "The notebook used more memory than the grader allows; the cases that had not run earn "
                     "nothing. Look for very large arrays.",
    "crashed": "The notebook stopped the grader (sys.exit, exit() or a fatal error); the cases that had not run "
               "earn nothing. Run it from the top (Kernel > Restart & Run All) to find where.",
    "tampering detected": "The notebook changed the grading environment (for example replaced a numpy or torch "
                          "function); your points come from your outputs alone, and a TA will review it.",
}


def gradescope_results(result: SubmissionResult, *, suite: Suite) -> dict[str, Any]:
    """The Gradescope results.json of one submission, the student's view of it.

    Visible cases keep their messages (their probes run before any hidden one). A hidden case says only that it
    failed and which idea to revisit: never its inputs, expected or received values; and nothing the student's
    process wrote or raised (notes, stdout) reaches this view. The TA's copy in results/ keeps everything.
    """
    revisit = {c["id"]: str(c.get("revisit") or "") for c in suite.cases}
    tests, hidden_failed = [], {}
    for c in result.cases:
        if c.max_points <= 0:
            continue
        output = c.message or "passed"
        if c.hidden:
            output = "passed" if c.passed else f"a hidden case of {c.question} failed; revisit: {revisit.get(c.id)}"
            if not c.passed:
                hidden_failed.setdefault(c.question, revisit.get(c.id) or "")
        tests.append({"name": c.id, "score": c.points, "max_score": c.max_points, "output": output,
                      "visibility": "hidden" if c.hidden else "visible"})
    lines = [f"Status: {result.status}", STUDENT_HELP.get(result.status, ""), *result.student_notes]
    if result.status != STATUS_WORDS["unreadable"]:  # nothing ran: the reading problem says it all
        lines += [f"{q}: a hidden case failed. Revisit: {why}" for q, why in hidden_failed.items()]
    return {"score": result.total, "tests": tests, "output": "\n".join(x for x in lines if x),
            "stdout_visibility": "hidden", "extra_data": {"status": result.status}}


def _result_from_exec(suite: Suite, sub: Submission, status: str, outputs: dict[str, Any],
                      notes: list[str], student_notes: list[str] | None = None) -> SubmissionResult:
    cases = judge_outputs(suite, outputs) + judge_checkpoint(suite, sub.files, sub.file_problems)
    return SubmissionResult(sub.id, STATUS_WORDS[status], cases, list(notes), list(student_notes or []))


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


def grade_batch(submissions: Path, *, out: Path, force: bool = False, workers: int | None = None,
                config_path: Path = DEFAULT_CONFIG, progress: bool = True) -> BatchSummary:
    """Grade every submission under `submissions` into `out`: results/<file>.json, grades.csv, summary.json.

    Every input is isolated: whatever goes wrong reading, running, judging or storing one becomes that row's
    status and message, and the batch goes on; grades.csv and summary.json are always written. A failure of
    the grader itself (the sandbox, judging, storing) gives the row status "not graded" and stores nothing, so
    a re-run grades it. Resumable: a submission whose stored result has the same content and suite
    fingerprint is not run again (unless `force`); each result is written atomically as soon as it is known.
    """
    config = load_config(config_path)
    fingerprint = suite_fingerprint(config_path)
    subs = find_submissions(submissions, limits=config.submissions)
    results_dir = out / "results"
    results_dir.mkdir(parents=True, exist_ok=True)
    failed: dict[str, str] = {}  # id -> why the grader could not grade it in this run
    todo, reused = [], 0
    for sub in subs:
        key = _key(sub, fingerprint)
        if not force and _stored_key(results_dir / sub.result_name) == key:
            reused += 1
        else:
            todo.append((sub, key))

    def save(sub: Submission, key: str, judge: Callable[[], SubmissionResult], extra: dict[str, Any]) -> None:
        try:
            result = judge()
            record = {"key": key, "path": os.path.abspath(sub.path), **result.to_dict(), **extra,
                      "gradescope": gradescope_results(result, suite=suite)}
            _write_atomic(results_dir / sub.result_name, json.dumps(record, indent=1))
        except Exception as exc:  # noqa: BLE001 - the grader failed on this one; the others go on
            failed[sub.id] = f"the grader failed on this submission ({_why(exc)}); run the grade command again"

    sandbox = "not started"
    runnable = [(s, k) for s, k in todo if s.source is not None]
    pool_starting = None
    n_workers = workers or config.execution.workers
    if runnable:  # the sandboxed workers start (seconds) while this process computes the reference values
        ex = config.execution
        limits = Limits(wall_s=ex.wall_timeout_s, cell_s=ex.cell_timeout_s, cpu_s=ex.cpu_timeout_s,
                        memory_mb=ex.memory_mb,
                        processes=ex.max_processes, file_mb=ex.max_file_mb, output_kb=ex.max_output_kb)
        starter = ThreadPoolExecutor(1)
        pool_starting = starter.submit(WorkerPool, n_workers, limits=limits, probe_module=config.lesson.checks_name,
                                       modules=config.lesson.sandbox_modules,
                                       hide=(submissions.resolve(), out.resolve()))
        starter.shutdown(wait=False)
    suite = load_suite(config_path)
    # Checkpoints are verified ahead, beside the sandboxed runs; judging a run then finds its verdict measured
    # (verify_checkpoint evaluates the same weights once and waits for a verification already under way).
    ahead = ThreadPoolExecutor(1)
    for sub, _ in runnable if suite.checkpoint_cases else ():
        if "milestone.pt" in sub.files and not sub.file_problems:
            ahead.submit(judge_checkpoint, suite, sub.files)
    for sub, key in todo:
        if sub.source is None:
            save(sub, key, partial(_result_from_exec, suite, sub, "unreadable", {}, [sub.problem], [sub.problem]),
                 {})
    if pool_starting is not None:
        # Visible cases first: what a student sees never comes from a process that has run a hidden probe.
        probes = [(c["id"], c["probe"], c["args"], bool(c["hidden"]))
                  for c in sorted(suite.cases, key=lambda c: bool(c["hidden"]))]
        try:
            pool = pool_starting.result()
        except Exception as exc:  # noqa: BLE001 - no sandbox: every runnable submission is left for a re-run
            for sub, _ in runnable:
                failed[sub.id] = f"not graded: the sandbox could not start ({_why(exc)}); run the grade command again"
        else:
            start, done = time.monotonic(), 0
            with pool:
                sandbox = pool.sandbox
                for sub, key, res in _run_isolated(pool, runnable, probes, n_workers):
                    done += 1
                    if isinstance(res, BaseException):
                        failed[sub.id] = (f"not graded: the sandbox failed while running it ({_why(res)}); "
                                          "nothing was stored, run the grade command again")
                    else:
                        save(sub, key, partial(_judge_exec, suite, sub, res),
                             {"stdout": res.stdout, "wall_s": round(res.wall_s, 3), "sandbox": res.sandbox,
                               "memory_guard": res.memory_guard, "isolation": res.isolation})
                    if progress:
                        width = 30
                        filled = int(width * done / len(runnable))
                        print(f"\rgrading [{'#' * filled}{'.' * (width - filled)}] {done}/{len(runnable)} "
                              f"{time.monotonic() - start:5.1f}s", end="", file=sys.stderr, flush=True)
            if progress:
                print(file=sys.stderr)
    ahead.shutdown(cancel_futures=True)
    rows = write_tables(suite, subs, out, failed=failed)
    return BatchSummary(out, rows, len(todo) - len(failed), reused, sandbox, list(suite.question_points()))


def _judge_exec(suite: Suite, sub: Submission, res: ExecResult) -> SubmissionResult:
    student = [f"cells {res.skipped_cells} were not run (tagged for training)"] if res.skipped_cells else []
    student += res.student_notes  # time limits: the grader's words, the cell's first line from the notebook
    result = _result_from_exec(suite, sub, res.status, res.outputs, res.notes, student)
    if res.tampering:
        result.notes.append("tampering: " + "; ".join(res.tampering[:5]))
    return result


def _row(suite: Suite, sub: Submission, out: Path, failed: dict[str, str]) -> dict[str, Any]:
    """The grades.csv row of one submission: from its stored result, or "not graded" with the reason."""
    qids = list(suite.question_points())
    why = failed.get(sub.id)
    if why is None:
        try:
            record = json.loads((out / "results" / sub.result_name).read_text(encoding="utf-8"))
            row = {"id": sub.id, "total": float(record["total"])}
            row |= {q: float(record["questions"].get(q, 0.0)) for q in qids}
            notes = [str(n) for n in record.get("notes", [])]
            status = str(record["status"])
            why_first = [n for n in notes if not n.startswith(("cell ", "skipped cells"))] or notes
            message = "" if status == "graded" else "; ".join(why_first)
            return row | {"status": status, "message": " ".join(message.split())[:300]}
        except Exception as exc:  # noqa: BLE001 - a damaged store is one row's problem
            why = f"not graded: its stored result could not be read ({_why(exc)}); run the grade command again"
    return {"id": sub.id, "total": None, **dict.fromkeys(qids), "status": NOT_GRADED, "message": why}


def full_marks(score: float | None, points: float) -> bool:
    """The one definition of "full marks": a score that reaches the question's points (not the batch's best)."""
    return score is not None and score >= points - 1e-6


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
    out: dict[str, dict[str, float]] = {}
    for n, cells in enumerate(table[1:], start=2):
        rec = dict(zip(header, cells))
        sid = rec.get("id", "").strip()
        sid = sid[1:] if sid[:1] == "'" and sid[1:2] in FORMULA_STARTS else sid  # as spreadsheet_text wrote it
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
        rows = json.loads((out / "summary.json").read_text(encoding="utf-8"))["rows"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise MergeError(f"{out}: no summary.json of a graded batch; run `{command()} grade` first ({exc})") from None
    subs = [Submission(str(r["id"]), Path(), None, result_name=str(r.get("result") or "")) for r in rows]
    failed = {str(r["id"]): str(r.get("message") or NOT_GRADED) for r in rows if not r.get("result")}
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
    write_tables(suite, subs, out, failed=failed)
    return {"merged": counts, "ignored": sorted(ignored), "students": len(stored)}


def write_tables(suite: Suite, subs: list[Submission], out: Path, *,
                 failed: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """grades.csv and summary.json of exactly these submissions (atomic writes); one row each, always.

    A row that is not graded has empty score cells; every cell that came from a student is spreadsheet-safe.
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
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["id", "total", *columns, "status", "message"])
    for r in rows:
        writer.writerow([spreadsheet_text(r["id"]), *("" if r[k] is None else r[k] for k in ("total", *columns)),
                         r["status"], spreadsheet_text(r["message"])])
    _write_atomic(out / "grades.csv", buf.getvalue())
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
               "rows": [{"id": r["id"], "result": None if r["status"] == NOT_GRADED else sub.result_name,
                         "status": r["status"], "message": r["message"]} for r, sub in zip(rows, subs)]}
    _write_atomic(out / "summary.json", json.dumps(summary, indent=1))
    return rows
