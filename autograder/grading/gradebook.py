"""The grades folder, one owner: every path under it (results, summary, grades.csv, merged scores, the TAs'
decision files, feedback, the leaderboard's roster) and its typed records, read and written only here (the folder's
table, with each file's writer, readers and schema: docs/layout.md)"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from autograder.grading.submissions import Submission, read_regular
from autograder.model import SubmissionResult

RESULTS_DIR = "results"  # one Record per submission, named by Submission.result_name
SUMMARY_FILE = "summary.json"
GRADES_CSV = "grades.csv"
MERGED_FILE = "merged_scores.json"  # scores graded elsewhere (by hand, by another platform), kept by `merge`
REVIEW_DECISIONS_FILE = "review_decisions.yaml"  # submission id -> the review digest a TA cleared
SIMILARITY_DECISIONS_FILE = "similarity_decisions.yaml"  # the TAs' word on each pair the similarity page lists
OLD_SIMILARITY_DECISIONS_FILE = "similarity_decisions.json"  # its name before it became YAML: still read
COMMENT_COLUMN = "comment"  # grades.csv's column of a TA's comments (once `merge` brought one); in a scores file too
FEEDBACK_DIR = "feedback"  # one page per student, safe to hand out
ROSTER_FILE = "leaderboard_roster.csv"  # id, pseudonym, opt_out: the leaderboard's page to post
MAX_RECORD_MB = 128  # a stored result larger than this is not read


def indented_json(obj: Any) -> str:
    """json.dumps(obj, indent=1), the same text, written by one recursive walk instead of the generators of json's
    pure-Python encoder (which an indent needs): a result's record in about half the time."""
    return _text(obj, "\n")


_ESCAPE = json.encoder.encode_basestring_ascii  # json.dumps's own string escaper (ensure_ascii)


def _float(o: float) -> str:
    return "NaN" if o != o else "Infinity" if o == math.inf else "-Infinity" if o == -math.inf else float.__repr__(o)


# scalars of these exact types, as json.dumps writes them (allow_nan: NaN, Infinity); subclasses go through _text
_SCALARS: dict[type, Callable[[Any], str]] = {str: _ESCAPE, int: int.__repr__, float: _float, bool: lambda o: "true"
                                              if o else "false", type(None): lambda o: "null"}


def _key(k: Any) -> str:
    """A dict key as json.dumps writes it (str, float, bool, None or int; TypeError for any other)."""
    if not isinstance(k, str):
        if isinstance(k, float):
            k = _float(k)
        elif k is True or k is False or k is None:
            k = "true" if k else "false" if k is False else "null"
        elif isinstance(k, int):
            k = int.__repr__(k)
        else:
            raise TypeError(f"keys must be str, int, float, bool or None, not {k.__class__.__name__}")
    return _ESCAPE(k)


def _text(o: Any, newline: str) -> str:
    """`o` as json.dumps(indent=1) writes it at the depth `newline` ("\n" and one space a level) gives."""
    scalar = _SCALARS.get(type(o))
    if scalar is not None:
        return scalar(o)
    if isinstance(o, str):
        return _ESCAPE(o)
    if o is None or o is True or o is False:
        return "null" if o is None else "true" if o else "false"
    if isinstance(o, int):
        return int.__repr__(o)
    if isinstance(o, float):
        return _float(o)
    inner = newline + " "
    if isinstance(o, (list, tuple)):
        if not o:
            return "[]"
        return "[" + inner + ("," + inner).join(
            f(v) if (f := _SCALARS.get(type(v))) is not None else _text(v, inner) for v in o) + newline + "]"
    if isinstance(o, dict):
        if not o:
            return "{}"
        return "{" + inner + ("," + inner).join(
            _key(k) + ": " + (f(v) if (f := _SCALARS.get(type(v))) is not None else _text(v, inner))
            for k, v in o.items()) + newline + "}"
    raise TypeError(f"Object of type {o.__class__.__name__} is not JSON serializable")


class MergeError(ValueError):
    """Scores that cannot be merged. Made from a list (`problems`: each names its file, line and column), the
    message lists them all and says that nothing was written; made from one text, it is that text."""

    def __init__(self, problems: str | list[str]) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        if isinstance(problems, str):
            super().__init__(problems)
            return
        n = len(self.problems)
        super().__init__(f"{n} problem{'s' if n != 1 else ''} in the scores; nothing was merged (fix "
                         f"{'every line' if n != 1 else 'it'}, then run merge again):\n"
                         + "\n".join(f"  {p}" for p in self.problems))


def write_atomic(path: Path, text: str) -> None:
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


def record_key(sub: Submission, fingerprint: str, files: Sequence[str]) -> str:
    """What a stored result is valid for: the submission's notebook (or why it is unreadable), its checkpoint
    files and the suite fingerprint; a stored result with another key is graded again."""
    h = hashlib.sha256(sub.source if sub.source is not None
                       else b"problem\0" + sub.problem.encode("utf-8", "backslashreplace"))
    for name in files:  # the checkpoint's (Suite.checkpoint_files)
        h.update(hashlib.sha256(sub.files.get(name, b"")).digest())
    h.update("\0".join(sub.file_problems).encode("utf-8", "backslashreplace") + fingerprint.encode())
    if sub.picked:  # which of several notebooks was graded, and which were left: the student is told
        h.update(b"picked\0" + sub.picked.encode("utf-8", "backslashreplace"))
    return h.hexdigest()


@dataclass
class RunFacts:
    """What the sandbox said of a run, stored beside its result (none for a submission that never ran)."""

    stdout: str
    wall_s: float
    sandbox: str
    memory_guard: str
    isolation: str
    tripwire: list[dict[str, Any]] = field(default_factory=list)  # the run-time tripwire's records (the review's)

    @classmethod
    def of(cls, res: Any) -> RunFacts:
        """The facts of a sandbox's ExecResult."""
        return cls(res.stdout, round(res.wall_s, 3), res.sandbox, res.memory_guard, res.isolation,
                   list(getattr(res, "tripwire", None) or []))


@dataclass
class Record:
    """One submission's stored result (results/<file>.json): the key it is valid for, where the notebook was, the
    grader's result, the sandbox's facts, the review block, the student's Gradescope view."""

    key: str
    path: str
    result: SubmissionResult
    gradescope: dict[str, Any]
    run: RunFacts | None = None
    review: dict[str, Any] = field(default_factory=dict)
    checkpoint_isolation: str = ""  # the checkpoint reader's isolation when it read one (run.isolation: the notebook's)

    @property
    def isolation(self) -> str:
        return self.run.isolation if self.run is not None else ""

    def judged_under(self, decision: str | None) -> bool:
        """Whether it was judged under the TA's current review decision for it (else it is judged again: a decision
        made after grading takes effect on the next run, and stays on every run after)."""
        return self.review.get("decision") == decision

    def to_json(self) -> dict[str, Any]:
        """The stored form (keys in a fixed order)."""
        data = {"key": self.key, "path": self.path, **self.result.to_dict()}
        if self.run is not None:
            data |= {"stdout": self.run.stdout, "wall_s": self.run.wall_s, "sandbox": self.run.sandbox,
                     "memory_guard": self.run.memory_guard, "isolation": self.run.isolation}
        data["review"] = self.review
        if self.checkpoint_isolation:
            data["checkpoint_isolation"] = self.checkpoint_isolation
        return data | {"gradescope": self.gradescope}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Record:
        """The record a stored form holds; RecordError (from SubmissionResult) or a TypeError/KeyError when it is
        not one."""
        result = SubmissionResult.from_dict(data)
        run = None
        if "isolation" in data:
            run = RunFacts(str(data.get("stdout") or ""), float(data.get("wall_s") or 0.0),
                           str(data.get("sandbox") or ""), str(data.get("memory_guard") or ""),
                           str(data.get("isolation") or ""))
        review = data.get("review")
        return cls(str(data.get("key") or ""), str(data.get("path") or ""), result,
                   dict(data.get("gradescope") or {}), run, review if isinstance(review, dict) else {},
                   str(data.get("checkpoint_isolation") or ""))


@dataclass
class SummaryRow:
    """One row of the batch in summary.json: the id, its result file (None when the grader failed on it)."""

    id: str
    result: str | None
    status: str
    message: str
    notes: list[str] = field(default_factory=list)  # what reading the class noticed (a notebook left, a duplicate)


@dataclass
class Summary:
    """summary.json: the batch's counts, means and rows, in the batch's order."""

    submissions: int
    status_counts: dict[str, int]
    mean_per_question: dict[str, float | None]
    max_per_question: dict[str, float]
    full_marks_per_question: dict[str, int]
    mean_total: float
    auto_points: float
    manual_points: float
    merged: dict[str, Any] | None
    limits_lowered: list[str]
    rows: list[SummaryRow]

    def to_json(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        data["rows"] = [{k: v for k, v in r.__dict__.items() if k != "notes" or v} for r in self.rows]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Summary:
        """summary.json as read (its rows are what every reader needs; the figures default to none); KeyError,
        TypeError or ValueError when it has no rows."""
        rows = [SummaryRow(str(r["id"]), r.get("result"), str(r.get("status") or ""), str(r.get("message") or ""),
                           [str(n) for n in r.get("notes") or ()]) for r in data["rows"]]
        if not all(isinstance(r.result, str | None) for r in rows):
            raise TypeError("a row's result is not a file name")
        return cls(int(data.get("submissions", len(rows))), dict(data.get("status_counts") or {}),
                   dict(data.get("mean_per_question") or {}), dict(data.get("max_per_question") or {}),
                   dict(data.get("full_marks_per_question") or {}), data.get("mean_total", 0.0),
                   data.get("auto_points", 0.0), data.get("manual_points", 0.0), data.get("merged"),
                   list(data.get("limits_lowered") or []), rows)


class Gradebook:
    """A grades folder: its paths, and its files read and written (atomically) as typed records."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)

    # ------------------------------------------------------------------ paths
    @property
    def results_dir(self) -> Path:
        return self.folder / RESULTS_DIR

    @property
    def summary_path(self) -> Path:
        return self.folder / SUMMARY_FILE

    @property
    def grades_csv(self) -> Path:
        return self.folder / GRADES_CSV

    @property
    def merged_path(self) -> Path:
        return self.folder / MERGED_FILE

    @property
    def review_decisions_path(self) -> Path:
        return self.folder / REVIEW_DECISIONS_FILE

    @property
    def similarity_decisions_path(self) -> Path:
        """The TAs' similarity decisions: the YAML file, else the JSON file of earlier releases when only it is
        there."""
        path = self.folder / SIMILARITY_DECISIONS_FILE
        old = self.folder / OLD_SIMILARITY_DECISIONS_FILE
        return old if old.is_file() and not path.exists() else path

    @property
    def feedback_dir(self) -> Path:
        return self.folder / FEEDBACK_DIR

    @property
    def roster_path(self) -> Path:
        return self.folder / ROSTER_FILE

    def record_path(self, name: str) -> Path:
        return self.results_dir / name

    def exists(self) -> bool:
        """Whether `grade` wrote here (a results folder or a summary)."""
        return self.results_dir.is_dir() or self.summary_path.is_file()

    # ------------------------------------------------------------------ records
    def write_record(self, name: str, record: Record) -> None:
        write_atomic(self.record_path(name), indented_json(record.to_json()))

    def read_record(self, name: str) -> Record:
        """The record stored as `name`; OSError, ValueError or a RecordError/TypeError/KeyError when there is none
        or it is not one."""
        return Record.from_json(json.loads(self.record_path(name).read_text(encoding="utf-8")))

    def stored_record(self, name: str, key: str) -> Record | None:
        """The record stored as `name` when it is valid for `key` and can be read, else None (graded again)."""
        try:
            data = json.loads(self.record_path(name).read_text(encoding="utf-8"))
            if not isinstance(data, dict) or data.get("key") != key:
                return None
            record = Record.from_json(data)
        except Exception:  # noqa: BLE001 - absent or damaged: graded again
            return None
        return record

    def has_record(self, name: str) -> bool:
        return self.record_path(name).is_file()

    def record_data(self, name: str) -> dict[str, Any]:
        """A stored result as plain data, read as hostile input (a regular file under MAX_RECORD_MB): the report's
        and the compare page's view; OSError/ValueError/RecursionError when it cannot be read."""
        raw = read_regular(self.record_path(name), limit=MAX_RECORD_MB * 2**20, label=f"{RESULTS_DIR}/{name}")
        data = json.loads(raw.decode("utf-8", "replace"))
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        return data

    def record_names(self) -> list[str]:
        """Every stored result's file name, sorted."""
        return sorted(p.name for p in self.results_dir.glob("*.json"))

    # ------------------------------------------------------------------ the tables
    def write_summary(self, summary: Summary) -> None:
        write_atomic(self.summary_path, json.dumps(summary.to_json(), indent=1))

    def read_summary(self) -> Summary:
        """summary.json; OSError, ValueError, KeyError or TypeError when there is none or it is not one."""
        data = json.loads(self.summary_path.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise TypeError("summary.json is not a JSON object")
        return Summary.from_json(data)

    def write_grades_csv(self, text: str) -> None:
        write_atomic(self.grades_csv, text)

    # ------------------------------------------------------------------ merged scores
    def _merged(self, command: str) -> dict[str, Any]:
        """merged_scores.json as data ({} when there is none); MergeError naming the file when it cannot be read."""
        try:
            data = json.loads(self.merged_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise MergeError(f"{self.merged_path}: cannot be read ({exc})") from None
        if not isinstance(data, dict):
            raise MergeError(f"{self.merged_path}: not a file written by `{command} merge`")
        return data

    def merged_scores(self, *, command: str) -> dict[str, dict[str, float]]:
        """The scores `merge` stored (student id -> column -> score); {} when there are none; MergeError (naming
        the file) when the file is not one `merge` wrote (`command`: the package's command, for the message)."""
        data = self._merged(command)
        try:
            return {str(k): {str(c): float(v) for c, v in row.items()} for k, row in data["scores"].items()} \
                if data else {}
        except (KeyError, TypeError, ValueError, AttributeError):
            raise MergeError(f"{self.merged_path}: not a file written by `{command} merge`") from None

    def merged_comments(self, *, command: str) -> dict[str, dict[str, str]]:
        """The comments `merge` stored (student id -> the column commented on, "" for the whole work -> text); {}
        when there are none; MergeError as merged_scores."""
        try:
            return {str(k): {str(c): str(v) for c, v in row.items()}
                    for k, row in self._merged(command).get("comments", {}).items()}
        except (TypeError, AttributeError):
            raise MergeError(f"{self.merged_path}: not a file written by `{command} merge`") from None

    def write_merged(self, scores: dict[str, dict[str, float]], *, sources: list[str],
                     comments: dict[str, dict[str, str]] | None = None) -> None:
        data: dict[str, Any] = {"sources": sources, "scores": scores}
        if comments:
            data["comments"] = comments
        write_atomic(self.merged_path, json.dumps(data, indent=1))

    # ------------------------------------------------------------------ the TAs' decision files (YAML)
    def review_decisions(self, *, help_text: str) -> dict[str, str]:
        """The TA's review decisions (submission id -> cleared digest); {} without the file; ValueError naming it
        (and `help_text`: how to write one) when it cannot be used."""
        path = self.review_decisions_path
        if not path.is_file():
            return {}
        try:
            raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ValueError(f"{path}: cannot read the TA's review decisions: {exc}; {help_text}") from None
        if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
            raise ValueError(f"{path}: expected lines `<submission id>: <digest>`; {help_text}")
        return {str(k): v for k, v in raw.items()}

    def similarity_decisions(self) -> tuple[Any, str]:
        """The similarity decisions file as data (YAML; the JSON of earlier releases reads the same) and a problem
        ("" when none); (None, "") without the file."""
        path = self.similarity_decisions_path
        try:
            return yaml.safe_load(path.read_text(encoding="utf-8")), ""
        except FileNotFoundError:
            return None, ""
        except (OSError, ValueError, yaml.YAMLError) as exc:
            return None, f"{path}: cannot be read ({exc}); its decisions are not shown"
