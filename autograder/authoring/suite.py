"""The suite: every graded case with its reference values, the checkpoint's cases, and the suite's fingerprint."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pickle
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from autograder import COMMAND, env_name
from autograder.authoring.compiled import Compiled, load_compiled, texts_hash, versions
from autograder.authoring.content import expected_values
from autograder.authoring.hidden_seed import course_seed
from autograder.authoring.questions import Question, checkpoint_of, load_questions, mc_answers
from autograder.config import ConfigError, GradingConfig, load_config
from autograder.lesson import Lesson
from autograder.model import Case, CheckpointCase
from autograder.runtime.plain_codec import from_plain, to_plain


@dataclass(frozen=True)
class Deferred:
    """Milestone rules parsed when first asked for: a compiled course's, checked when it was compiled."""

    config_path: Path
    config: GradingConfig
    lesson: Lesson

    def parse(self) -> Any:
        return milestone_rules(self.config_path, self.config, self.lesson)


def checkpoint_shares(points: float, *, lesson: Lesson, parts: Sequence[str] = ()) -> dict[str, float]:
    """The milestone checkpoint's points per part its plug-in grades (PARTS: for example one per scheme, or `parts`,
    a compiled course's copy of them): equal shares, the last one taking the rounding."""
    schemes = tuple(parts) or tuple(lesson.plugin.PARTS)  # the plug-in only when the lesson grades a checkpoint
    share = [round(points / len(schemes), 4) for _ in schemes]
    share[-1] = round(points - sum(share[:-1]), 4)
    return dict(zip(schemes, share))


@dataclass(frozen=True)
class Suite:
    """All graded cases with their reference values: the single definition the build, both graders and the
    report use. The reference values are computed (seconds) the first time they are asked for."""

    config: GradingConfig
    lesson: Lesson  # the lesson the config grades (the course's: autograder/course.py)
    questions: tuple[Question, ...]  # the authored questions, then the checkpoint's when it has points
    cases: tuple[Case, ...]
    fingerprint: str = ""  # suite_fingerprint of the files it was read from
    # the config's milestone section as the lesson's plug-in parsed it (milestone_rules), or, in a compiled course
    # whose rules were checked when it was compiled, Deferred: parsed when first asked for (the plug-in imported then)
    rules: Any = None
    config_path: Path | None = None  # the config it was read from (a compiled course keeps its data beside it)
    compiled: Compiled | None = None  # a compiled course's: its expected values

    @cached_property
    def milestone_rules(self) -> Any:
        """The config's milestone section as the lesson's plug-in parsed it (None when it holds only zero points)."""
        return self.rules.parse() if isinstance(self.rules, Deferred) else self.rules

    @cached_property
    def expected(self) -> dict[str, dict[str, Any]]:
        """Case id -> the reference's canonical output and the catalogued mistakes it catches: read from the
        expected-values cache when it holds this suite's (see `cached_expected`), else computed and stored."""
        return cached_expected(self)

    def computed_expected(self) -> dict[str, dict[str, Any]]:
        """The expected values computed afresh, never read from the cache (the release builds from these), and
        stored in the cache for the runs that follow; `expected` returns them from now on."""
        self.__dict__["expected"] = cached_expected(self, fresh=True)
        return self.expected

    @property
    def authored(self) -> list[Question]:
        """The questions read from the assignment's sources (the checkpoint's is made by the suite)."""
        return [q for q in self.questions if q.id != self.checkpoint_question]

    @property
    def checkpoint_question(self) -> str:
        """The milestone checkpoint's question id (its grades.csv column) as the lesson declares it, or "" when the
        checkpoint is not graded."""
        checkpoint = checkpoint_of(self.questions)
        return checkpoint.id if checkpoint is not None and self.config.milestone.points else ""

    @property
    def checkpoint_files(self) -> tuple[str, ...]:
        """The files of the milestone checkpoint that students upload, as the lesson declares them (none when the
        lesson declares no checkpoint)."""
        checkpoint = checkpoint_of(self.questions)
        return tuple(checkpoint.files) if checkpoint is not None else ()

    @property
    def notebook_points(self) -> float:
        """Points a notebook alone can earn (every probe case)."""
        return round(sum(c.points for c in self.cases), 4)

    @property
    def auto_points(self) -> float:
        """All automatically graded points: the notebook's and the milestone checkpoint's."""
        return round(self.notebook_points + self.config.milestone.points, 4)

    def question_points(self) -> dict[str, float]:
        """Automatically graded questions (grades.csv columns) and their points, checkpoint last."""
        return {q.id: q.points for q in self.questions if q.graded and not q.manual}

    def revisit(self) -> dict[str, str]:
        """Case id -> the idea a failed case sends the student back to."""
        return {c.id: c.revisit for c in self.cases}

    @property
    def checkpoint_cases(self) -> list[CheckpointCase]:
        """One case per scheme for the milestone checkpoint (none when the config gives it no points)."""
        pts = self.config.milestone.points
        if not pts:
            return []
        shares = checkpoint_shares(pts, lesson=self.lesson, parts=self.compiled.parts if self.compiled else ())
        qid = self.checkpoint_question
        return [CheckpointCase(f"{qid}/{pos}", qid, p, pos) for pos, p in shares.items()]


ENGINE_ROOT = Path(__file__).resolve().parent.parent  # autograder/
# What the fingerprint hashes of the engine: every module of these packages and these top-level modules, found in
# the package (never a hand list of files): a module added to or renamed in them is covered by the next fingerprint.
JUDGING_PACKAGES = ("authoring", "grading", "sandbox", "runtime")
JUDGING_MODULES = ("wire.py", "model.py", "checkpoint.py", "lesson.py", "config.py")


def engine_files(root: Path = ENGINE_ROOT) -> tuple[str, ...]:
    """The engine's files whose change changes what the grader judges (paths under autograder/). The rule: every
    .py file of the packages that read the questions and compute expected values (authoring/), run and judge
    submissions and store their results (grading/), confine student code (sandbox/) and ship the checks runtime
    (runtime/), and the top-level modules they share: the wire format, the typed data, the checkpoint engine, the
    lesson descriptor and the config's schema, whose defaults are limits and tolerances (JUDGING_MODULES). The
    report, the release writers and the command line change no judgement and are left out. `root`: the folder
    holding the packages (autograder/)."""
    found = [p.relative_to(root).as_posix() for pkg in JUDGING_PACKAGES for p in (root / pkg).rglob("*.py")]
    return tuple(sorted(found)) + JUDGING_MODULES


CACHE_ENV = env_name("CACHE")  # a folder for the expected-values cache; "off" turns the cache off


def cache_dir() -> Path | None:
    """Where expected values are kept between runs: $LESSON83_CACHE, else the user's cache folder. Never a path
    the sandbox can read: bubblewrap mounts an empty tmpfs over /root, /home and /tmp, and the folder is closed
    to other users (mode 0700) for the unprivileged-uid fallback."""
    chosen = os.environ.get(CACHE_ENV)
    if chosen == "off":
        return None
    if chosen:
        return Path(chosen)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / COMMAND


def _cache_file(suite: Suite) -> Path | None:
    folder = cache_dir()
    if folder is None or not suite.fingerprint:
        return None
    import numpy
    import torch

    return folder / f"expected-{suite.fingerprint}-torch{torch.__version__}-numpy{numpy.__version__}.json"


def cached_expected(suite: Suite, *, fresh: bool = False) -> dict[str, dict[str, Any]]:
    """The suite's expected values, computed once per suite fingerprint (the config, the lesson's sources and the
    engine files) and torch/numpy version, and kept as plain JSON (the runtime's codec). Every run uses the values as
    read back from that JSON (the form the generated test files hold), cached or not, so a cached run judges
    exactly as a computing one. Computing them takes about 12 CPU-seconds for the shipped lesson."""
    shipped = suite.compiled
    if (not fresh and shipped is not None and shipped.versions == versions()
            and set(shipped.expected) == {c.id for c in suite.cases}):  # a compiled course's, as computed
        return from_plain(shipped.expected)
    path = _cache_file(suite)
    if path is not None and path.is_file() and not fresh:
        try:
            data = json.loads(path.read_text())
            if data.get("fingerprint") == suite.fingerprint and set(data["expected"]) == {c.id for c in suite.cases}:
                return from_plain(data["expected"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass  # unreadable or another suite's: computed again below and rewritten
    expected = expected_values(suite.authored, lesson=suite.lesson)
    text = json.dumps({"fingerprint": suite.fingerprint, "expected": to_plain(expected)})
    if path is not None:
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".expected-", suffix=".tmp")  # mode 0600
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(tmp, path)
        except OSError:
            pass  # a read-only home: the values are computed again next time
    return from_plain(json.loads(text)["expected"])


def compile_suite(suite: Suite) -> bytes:
    """The compiled form of `suite` (autograder/authoring/compiled.py: a release bundle's), its rules checked and its
    expected values computed here, by reading them."""
    suite.milestone_rules  # noqa: B018 - a bad milestone section fails the release, not an upload
    root = suite.lesson.root  # each question's file relative to it: the reader's own lesson is bound instead
    questions = [dataclasses.replace(q, lesson=None, path=q.path.relative_to(root) if q.path.is_relative_to(root)
                                     else q.path) for q in suite.authored]
    parts = tuple(suite.lesson.plugin.PARTS) if suite.config.milestone.points else ()
    return pickle.dumps(Compiled(suite.fingerprint, texts_hash(suite.lesson), versions(), questions,
                                 to_plain(suite.expected), parts), protocol=pickle.HIGHEST_PROTOCOL)


def graded_part(questions: Sequence[Question]) -> str:
    """What grading reads of the question files, as canonical text: each question's id, points and graded names,
    and each case as the checks receive it (its probe, arguments, check, tolerances, texts, points). The questions'
    prose, which students read and grading does not, is left out: a text-only edit keeps every stored result."""
    data = [{"id": q.id, "points": q.points, "solution": sorted(q.solution), "written": [p.part for p in q.written],
             "cases": [c.plain() for c in q.cases]} for q in questions]
    return json.dumps(data, sort_keys=True, default=repr)


def suite_fingerprint(config_path: Path, lesson: Lesson, *, assignments: Path | None = None,
                      reference_file: Path | None = None, questions: Sequence[Question] | None = None) -> str:
    """Changes whenever a case, a point, the reference, the catalogue, a check, the engine or the config changes,
    not when only a question's prose does (by default the lesson's own sources; `assignments` and `reference_file`
    stand in for a copy of them). questions: the questions read from those files (read here when not given)."""
    if questions is None:
        questions = load_questions(load_config(config_path), lesson, assignments, reference_file,
                                   seed=lambda: course_seed(config_path))
    lesson_files = [f for f in lesson.source_files if f.suffix != ".md"]  # the questions: through graded_part
    if reference_file is not None:
        lesson_files = [reference_file if f == lesson.reference_file else f for f in lesson_files]
    files = [config_path, *lesson_files, *(ENGINE_ROOT / m for m in engine_files())]
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    h.update(b"questions\0" + graded_part(questions).encode())
    return h.hexdigest()[:16]


def read_suite(config_path: Path, config: GradingConfig, lesson: Lesson, *, assignments: Path | None = None,
               reference_file: Path | None = None) -> Suite:
    """The suite of a config (read from `config_path`), its lesson and the lesson's sources (or a copy of them),
    read afresh (Course.suite keeps one per course)."""
    compiled = load_compiled(config_path, lesson) if assignments is None and reference_file is None else None
    if compiled is not None:  # a release bundle: its questions as compiled, where its files are those it was from
        fingerprint = suite_fingerprint(config_path, lesson, questions=compiled.questions)
        if fingerprint == compiled.fingerprint:  # the rules were checked when compiled: parsed when asked for
            return _suite(config, lesson, list(compiled.questions), fingerprint, Deferred(config_path, config, lesson),
                          config_path, compiled)
    rules = milestone_rules(config_path, config, lesson)  # first: a bad section is the config's error, named so
    questions = load_questions(config, lesson, assignments, reference_file, seed=lambda: course_seed(config_path))
    fingerprint = suite_fingerprint(config_path, lesson, assignments=assignments, reference_file=reference_file,
                                    questions=questions)
    return _suite(config, lesson, questions, fingerprint, rules, config_path)


def _suite(config: GradingConfig, lesson: Lesson, questions: list[Question], fingerprint: str, rules: Any,
           config_path: Path, compiled: Compiled | None = None) -> Suite:
    cases = tuple(c for q in questions for c in q.cases)
    if config.milestone.points:  # graded from uploaded files, not from the notebook: no probe cases
        milestone = next(q for q in questions if q.checkpoint is not None)  # load_questions: there is one
        assert milestone.checkpoint is not None
        questions.append(Question(milestone.checkpoint.id, milestone.checkpoint.title, milestone.path, [], [], [], [],
                                  points=config.milestone.points))
    return Suite(config, lesson, tuple(questions), cases, fingerprint, rules, config_path, compiled)


def milestone_rules(config_path: Path, config: GradingConfig, lesson: Lesson) -> Any:
    """The config's milestone section parsed by the lesson's plug-in (parse_rules: the one definition of its
    schema), or None when the section holds nothing but zero points (the plug-in is then never imported);
    ConfigError naming the file and the key."""
    section = config.milestone.model_dump()
    if set(section) == {"points"} and not config.milestone.points:
        return None
    try:
        if lesson.plugin_file is None and set(section) != {"points"}:
            raise ValueError(f"milestone.{next(k for k in section if k != 'points')}: unknown key (lesson "
                             f"{lesson.name} has no milestone plug-in to read it)")
        return lesson.plugin.parse_rules(section, where="milestone")
    except ValueError as exc:  # the plug-in's RulesError, LessonError
        raise ConfigError(f"{config_path}: invalid grading config:\n  {exc}") from None


def reference_env(suite: Suite) -> dict[str, Any]:
    """The reference solution's namespace, with the right multiple-choice answers."""
    return suite.lesson.namespace() | mc_answers(list(suite.questions))
