"""Typed schema of grading_config.yaml: every key has a type and a default, unknown keys are errors."""

from __future__ import annotations

import os
import shlex
import sys
from functools import cache
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from autograder.sandbox import (
    CELL_TIMEOUT_S,
    CHECKPOINT_MEMORY_MB,
    CPU_TIMEOUT_S,
    MAX_OUTPUT_KB,
    MAX_PROCESSES,
    MEMORY_MB,
    MIB,
    PROBE_TIMEOUT_S,
    QUESTION_TIMEOUT_S,
    UPLOAD_CAP_MB,
    WALL_TIMEOUT_S,
)

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = ROOT / "grading_config.yaml"


@cache
def command() -> str:
    """The console command that runs autograder.cli (its name is defined once, in pyproject.toml's
    [project.scripts]), or `python -m autograder.cli` where the package is not installed."""
    from importlib.metadata import entry_points

    names = sorted(ep.name for ep in entry_points(group="console_scripts") if ep.value == "autograder.cli:main")
    return names[0] if names else "python -m autograder.cli"


def runnable_command() -> str:
    """`command()` as a TA can paste it into any shell, the virtual environment active or not: the console
    script now running by its full path, else the one installed beside this Python, else this Python (never
    resolved: a virtual environment's python is a link) with -m autograder.cli; quoted for a POSIX shell."""
    name = command()
    if " " in name:  # not installed as a console script
        return f"{shlex.quote(sys.executable)} -m autograder.cli"
    ran = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    for script in (ran, Path(sys.executable).parent / name):
        if script is not None and script.name == name and script.is_file() and os.access(script, os.X_OK):
            return shlex.quote(str(script.resolve()))
    return f"{shlex.quote(sys.executable)} -m autograder.cli"


class ConfigError(ValueError):
    """A grading_config.yaml problem, with the file and the key in the message."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Tolerances(_Strict):
    atol: float = Field(1e-4, gt=0, description="absolute tolerance of numeric checks")
    rtol: float = Field(1e-4, ge=0, description="relative tolerance of numeric checks")


class QuestionPoints(_Strict):
    points: float = Field(gt=0, description="points of the question (whether they are graded by hand is the "
                          "question's kind, in its front matter)")


class Execution(_Strict):
    cell_timeout_s: float = Field(CELL_TIMEOUT_S, gt=0,
                                  description="limit of one cell, in the student's CPU seconds (with a wall-clock "
                                  "backstop of three times it): a cell still running then is stopped and skipped, and "
                                  "the rest of the notebook runs without it")
    probe_timeout_s: float = Field(PROBE_TIMEOUT_S, gt=0,
                                   description="limit of one check (a probe of the student's code), in CPU seconds "
                                   "(a wall-clock backstop of three times it): a probe still running then is stopped "
                                   "and earns nothing; the probes after it run in a fresh run of the notebook")
    question_timeout_s: float = Field(QUESTION_TIMEOUT_S, gt=0,
                                      description="each question's share of the checks' CPU time (all its probes, over "
                                      "every run; a wall-clock backstop of three times it): once it is spent, the "
                                      "question's probes not yet run earn nothing (not run: time limit); the other "
                                      "questions keep their own shares")
    wall_timeout_s: float = Field(WALL_TIMEOUT_S, gt=0,
                                  description="wall-clock limit of the whole notebook (all its cells and the probes), "
                                  "the base of its backstop (three times it, less the waits for a CPU); a last "
                                  "resort, above cell_timeout_s")
    cpu_timeout_s: int = Field(CPU_TIMEOUT_S, gt=0,
                               description="CPU-time limit of the whole notebook; a last resort, above cell_timeout_s")
    memory_mb: int = Field(MEMORY_MB, gt=0, description="address-space limit per submission")
    max_processes: int = Field(MAX_PROCESSES, gt=0, description="process limit inside the sandbox")
    max_file_mb: int = Field(UPLOAD_CAP_MB, gt=0, description="largest file a submission may write")
    max_output_kb: int = Field(MAX_OUTPUT_KB, gt=0, description="captured output kept per submission")
    workers: int = Field(2, gt=0, description="submissions graded in parallel")

    @model_validator(mode="after")
    def _cell_limit_first(self) -> Execution:
        if self.cell_timeout_s >= min(self.wall_timeout_s, self.cpu_timeout_s):
            raise ValueError(f"cell_timeout_s ({self.cell_timeout_s:g}) must be below wall_timeout_s "
                             f"({self.wall_timeout_s:g}) and cpu_timeout_s ({self.cpu_timeout_s}), so that a slow "
                             "cell is stopped on its own before the whole-notebook limits stop the notebook")
        if self.probe_timeout_s > self.question_timeout_s:
            raise ValueError(f"probe_timeout_s ({self.probe_timeout_s:g}) must not be above question_timeout_s "
                             f"({self.question_timeout_s:g}): one check is part of its question's share")
        return self


class Submissions(_Strict):
    """What the grader reads from a class folder: regular files only, each capped before it is read."""

    max_notebook_mb: float = Field(20, gt=0, le=UPLOAD_CAP_MB,
                                   description="largest notebook read (a file or a zip member); the sandbox refuses "
                                   f"more than {UPLOAD_CAP_MB}")
    max_checkpoint_mb: float = Field(UPLOAD_CAP_MB, gt=0,
                                     description="largest checkpoint file read (each file the milestone declares)")
    max_zip_mb: float = Field(256, gt=0, description="largest zip opened (only its notebook and checkpoint "
                              "members are read, each under its own cap)")
    checkpoint_memory_mb: int = Field(CHECKPOINT_MEMORY_MB, gt=0,
                                      description="memory of the child process that loads and evaluates an uploaded "
                                      "checkpoint (sizes declared inside it can lie)")

    def cap(self, what: str) -> int:
        """The cap of `what` ("notebook", "checkpoint" or "zip") in bytes."""
        return int(getattr(self, f"max_{what}_mb") * MIB)


class Milestone(BaseModel):
    """The milestone section. `points` is the engine's: the points of the checkpoint question (the one its
    `checkpoint:` names). Every other key is the lesson's milestone plug-in's own rules, written once there: the
    course hands the whole section to the plug-in's parse_rules (autograder/lesson.py: MilestonePlugin) when it
    reads its suite, which rejects unknown keys as this schema does; a lesson without a plug-in takes no other
    key."""

    model_config = ConfigDict(extra="allow", frozen=True)
    points: float = Field(0, ge=0, description="points of the checkpoint verification (the question its "
                          "`checkpoint:` names)")


class Cluster(_Strict):
    """Grading on a Dask distributed cluster (autograder/grading/cluster.py, docs/cluster.md); `grade --cluster`
    overrides the address."""

    address: str | None = Field(None, pattern=r"^[a-z][a-z0-9+]*://\S+$",
                                description="the Dask scheduler, e.g. tcp://10.0.0.5:8786; none: grade on this "
                                "machine")
    batch: int = Field(4, gt=0, le=1000, description="submissions per Dask task: a worker runs as many tasks at "
                       "once as it has threads (its warm sandboxed zygotes), each task its submissions one by one")
    connect_timeout_s: float = Field(60, gt=0, description="how long to wait for the scheduler and a first worker")


class GradingConfig(_Strict):
    assignment: str = Field(pattern=r"^[a-z][a-z0-9_]*$", description="the lesson: assignments/<assignment>/ "
                            "and the files autograder/lesson.py names after it (found by autograder/course.py, "
                            "never by parsing the config); also the Otter and nbgrader name")
    total_points: float = Field(gt=0, description="sum of all question points")
    tolerances: Tolerances = Tolerances()
    questions: dict[str, QuestionPoints]
    execution: Execution = Execution()
    submissions: Submissions = Submissions()
    milestone: Milestone = Milestone()
    cluster: Cluster = Cluster()

    @model_validator(mode="after")
    def _points_add_up(self) -> GradingConfig:
        total = sum(q.points for q in self.questions.values()) + self.milestone.points
        if abs(total - self.total_points) > 1e-9:
            parts = " + ".join(f"{k} {v.points:g}" for k, v in self.questions.items())
            parts += f" + milestone {self.milestone.points:g}" if self.milestone.points else ""
            raise ValueError(f"question points do not add up: {parts} = {total:g}, but total_points is "
                             f"{self.total_points:g}; change a question's points or total_points")
        return self


def load_config(path: Path = DEFAULT_CONFIG) -> GradingConfig:
    """Read and validate the grading config; errors name the file and the offending key."""
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read the grading config: {exc}") from exc
    try:
        return GradingConfig.model_validate(raw or {})
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            key = ".".join(str(p) for p in err["loc"]) or "(top level)"
            what = "unknown key (check the spelling; allowed keys are listed in autograder/config.py)" \
                if err["type"] == "extra_forbidden" else err["msg"]
            lines.append(f"  {key}: {what}")
        raise ConfigError(f"{path}: invalid grading config:\n" + "\n".join(lines)) from None
