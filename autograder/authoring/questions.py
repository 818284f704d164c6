"""The authored source: question files under assignments/, read into questions, cells and cases."""

from __future__ import annotations

import ast
import json
import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, ValidationInfo, field_validator

from autograder.authoring.hidden_seed import drawn
from autograder.authoring.templating import TemplateError, fmt, render, table
from autograder.config import GradingConfig
from autograder.lesson import Lesson, LessonError, front_matter
from autograder.model import Case

LETTERS = ("A", "B", "C", "D")  # a multiple-choice item's options, in display order
STATED_POINTS = re.compile(r"\d\s*(points?|pts?|marks?)\b", re.I)  # "(5 points)": the builder writes it
DIRECTIVE = re.compile(r"^<!--\s*(solution|tests|choices|written|cell)\s*-->\s*$")


class ContentError(ValueError):
    """A problem in the authored source, with the file and the question in the message."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CaseSpec(_Strict):
    """One test case: which probe to run, on which inputs, and how to judge it."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    hidden: bool = False
    weight: float = Field(1, ge=0)
    probe: str
    args: dict[str, Any] = {}
    # Integer arguments of a hidden case drawn per release from the course's hidden seed (hidden_seed.py): the
    # values written in `args` stand only where no seed is given. The reader consumes it: no Case carries it.
    drawn: list[str] = []
    check: str
    what: str | None = None
    first: str | None = None
    second: str | None = None
    why: str | None = None
    words: list[str] = []
    dtype: str | None = None
    atol: float | None = None
    rtol: float | None = None
    diagnosis: str | None = None  # the catalogued mistake behind any failure of this property check
    # Value cases of the same question that must pass before this (property) case earns its points: a
    # property such as "PE[pos + k] is a rotation of PE[pos]" also holds of a table of zeros.
    requires: list[str] = []
    # A failing value case still opens those gates when its output matches the reference after these
    # normalisations (the lesson's checks name them: say, the first half of the last axis), or lies within this
    # relative error of the reference; a match with a catalogued mistake always does.
    near: list[str] = []
    within: float | None = Field(None, gt=0, lt=1)
    # Its points rest on a fact the student's process reports (storage, device placement): a review flag on the
    # notebook holds them for a TA (autograder/grading/review.py).
    claim: bool = False
    revisit: str

    @field_validator("probe", "check")
    @classmethod
    def _known(cls, v: str, info: ValidationInfo) -> str:
        checks = (info.context or {})["checks"]
        known = checks.PROBES if info.field_name == "probe" else checks.CHECKS
        if v not in known:
            raise ValueError(f"unknown {info.field_name} {v!r}; known: {sorted(known)}")
        return v


class Choice(_Strict):
    """A multiple-choice item; the first option is the right one until the builder shuffles them."""

    var: str = Field(pattern=r"^[a-z][a-z0-9_]*$")  # starts with the question's number: q2_ in q2_pick
    prompt: str
    options: list[str] = Field(min_length=4, max_length=4)
    why: str
    # For the TA report (never shipped): the misconception behind each wrong option, in the order of options[1:].
    misconceptions: list[str] = Field([], max_length=3)
    _lesson: str = PrivateAttr("")  # the lesson's name: with var, the seed of the shuffle

    @field_validator("misconceptions")
    @classmethod
    def _one_per_wrong_option(cls, v: list[str]) -> list[str]:
        if v and len(v) != 3:
            raise ValueError("name one misconception per wrong option (3), in the order of the options")
        return v


class WrittenPart(_Strict):
    """A hand-graded written answer with its model answer."""

    part: str = Field(pattern=r"^[a-z][a-z0-9_]*$")  # starts with the question's number: q3_ in q3_explain
    prompt: str
    answer: str


class Checkpoint(_Strict):
    """A milestone's checkpoint, declared by its question: the files students upload next to the notebook, graded
    after submission (the config's milestone points) as their own grades.csv column."""

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_]*$")  # the column, and the nbgrader grade cell
    title: str
    files: list[str] = Field(min_length=1)  # plain file names, the trained weights first

    @field_validator("files")
    @classmethod
    def _plain_names(cls, files: list[str]) -> list[str]:
        bad = [f for f in files if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", f)]
        if bad:
            raise ValueError(f"{', '.join(map(repr, bad))}: a checkpoint file is a plain file name")
        return files


Kind = Literal["prose", "cases", "choices", "manual", "milestone"]  # autograder/lesson.py: KINDS


class FrontMatter(_Strict):
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_]*$")
    # prose: no points; cases: graded by probe cases; choices: multiple choice; manual: written answers graded
    # by hand; milestone: graded by probe cases, and its checkpoint (the config's milestone points) from files.
    kind: Kind
    title: str
    solution: list[str] = []
    cases: list[CaseSpec] = []
    choices: list[Choice] = []
    written: list[WrittenPart] = []
    checkpoint: Checkpoint | None = None  # kind milestone only


@dataclass
class Cell:
    """One notebook cell before it is turned into Otter or nbgrader form."""

    kind: Literal["markdown", "code", "solution", "tests", "choices", "written"]
    source: str = ""
    tags: list[str] = field(default_factory=list)  # e.g. milestone-train: never run by a grader


@dataclass
class Question:
    """A question file, validated and rendered."""

    id: str
    title: str
    path: Path
    solution: list[str]
    cases: list[Case]
    choices: list[Choice]
    written: list[WrittenPart]
    cells: list[Cell] = field(default_factory=list)
    points: float = 0.0
    manual: bool = False
    kind: Kind = "cases"
    lesson: Lesson | None = field(default=None, repr=False, compare=False)  # where it was loaded from
    checkpoint: Checkpoint | None = None  # a milestone's checkpoint, as its front matter declares it

    @property
    def graded(self) -> bool:
        """Every kind but prose carries points."""
        return self.kind != "prose"


# --------------------------------------------------------------------------- rendering helpers


def milestone_bounds(config: GradingConfig, lesson: Lesson) -> str:
    """Markdown table of the checkpoint thresholds per preset, scheme and context (from the config)."""
    lm = lesson.trainer
    rules = lesson.plugin.parse_rules(config.milestone.model_dump(), where="milestone") if lesson.plugin_file else None
    presets = getattr(rules, "presets", {})
    header = ["scheme", *(f"`{name}` preset: perplexity at most" for name in presets)]
    rows = [[f"`{pos}`", *("; ".join(f"{bound:g} at {c}" for c, bound in sorted(rule.thresholds.get(pos, {}).items()))
                         or "no bound" for rule in presets.values())] for pos in lm.SCHEMES]
    return table(header, rows)


def milestone_time(lesson: Lesson) -> dict[str, Any] | None:
    """The measured training time of the milestone, or None where the course has not measured it: the course's
    benchmarks/figures/NAME_milestone_time.json (written by its benchmark, so no time is typed into a text)."""
    path = lesson.root / "benchmarks" / "figures" / f"{lesson.name}_milestone_time.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _milestone_names(config: GradingConfig, lesson: Lesson) -> dict[str, Any]:
    """Template names of a lesson with a milestone trainer: `lm`, the trainer, `milestone_bounds` and
    `milestone_time` (the measured time, or None)."""
    if lesson.trainer_file is None:
        return {}
    return {"lm": lesson.trainer, "milestone_bounds": milestone_bounds(config, lesson),
            "milestone_time": milestone_time(lesson)}


def render_text(text: str, path: Path, qid: str, config: GradingConfig, lesson: Lesson, *,
                first_line: int | None = None, part: str = "the text") -> str:
    """Render a question's text: `ref` is the lesson's reference module, `checks` its checks module, `grading`
    the config, `fmt` and `table` (autograder/authoring/templating.py) format numbers; `lm`, `milestone_bounds` and
    `milestone_time` exist when the lesson has a milestone trainer. An error names the file's line (the text starts
    at `first_line` of the file) or, without it, the `part` of the front matter, and the expression."""
    import torch

    try:
        return render(text, dict(ref=lesson.reference, checks=lesson.checks, np=np, torch=torch, math=math,
                                 fmt=fmt, table=table, grading=config, **_milestone_names(config, lesson)))
    except TemplateError as exc:
        at = f"{path}:{first_line + exc.line - 1}" if first_line is not None and exc.line else f"{path}"
        inside = "" if first_line is not None and exc.line else f" in {part}"
        expression = f" `{exc.expression}`" if exc.expression else ""
        raise ContentError(f"{at}: question {qid}: cannot render{expression}{inside}: {exc}") from exc


def split_cells(body: str, path: Path, qid: str) -> list[Cell]:
    """Split a rendered body into cells at directive lines and fenced python blocks."""
    cells: list[Cell] = []
    buf: list[str] = []
    in_code = False

    tags: list[str] = []

    def flush(kind: Literal["markdown", "code"]) -> None:
        text = "\n".join(buf).strip("\n")
        if text.strip():
            cells.append(Cell(kind, text, list(tags) if kind == "code" else []))
        buf.clear()

    for line in body.splitlines():
        if in_code:
            if line.strip() == "```":
                flush("code")
                in_code = False
            else:
                buf.append(line)
        elif line.strip().startswith("```python"):
            flush("markdown")
            in_code = True
            tags = line.strip().removeprefix("```python").split()
        elif m := DIRECTIVE.match(line.strip()):
            flush("markdown")
            if m.group(1) != "cell":
                cells.append(Cell(m.group(1)))  # type: ignore[arg-type]
        else:
            buf.append(line)
    if in_code:
        raise ContentError(f"{path}: question {qid}: a ```python block is never closed")
    flush("markdown")
    return cells


# --------------------------------------------------------------------------- loading


def solution_source(names: list[str], path: Path, qid: str, reference_file: Path) -> str:
    """Source of the named reference definitions, solution markers included, checked for balance."""
    text = reference_file.read_text()
    tree = ast.parse(text)
    lines = text.splitlines()
    starts = [n.lineno - 1 for n in tree.body] + [len(lines)]
    found = {n.name: "\n".join(lines[starts[i]:starts[i + 1]]).rstrip() for i, n in enumerate(tree.body)
             if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    parts = []
    for name in names:
        if name not in found:
            raise ContentError(f"{path}: question {qid}: solution {name!r} is not defined in {reference_file}")
        src = found[name] or ""
        depth = 0
        for line in src.splitlines():
            if line.strip() == "# BEGIN SOLUTION":
                depth += 1
            elif line.strip() == "# END SOLUTION":
                depth -= 1
            if depth not in (0, 1):
                raise ContentError(f"{reference_file}: question {qid}: solution markers of {name!r} are "
                                   "nested or closed twice")
        if depth != 0:
            raise ContentError(f"{reference_file}: question {qid}: '# BEGIN SOLUTION' in {name!r} is never "
                               "closed by '# END SOLUTION'")
        if "# BEGIN SOLUTION" not in src:
            raise ContentError(f"{reference_file}: question {qid}: {name!r} has no '# BEGIN SOLUTION' "
                               "marker, so the student would receive the solution")
        parts.append(src)
    return "\n\n\n".join(parts)


def shuffled(choice: Choice) -> tuple[list[str], str]:
    """Options in display order and the letter of the right one (deterministic per variable)."""
    order = list(range(4))
    random.Random(f"{choice._lesson}/{choice.var}").shuffle(order)
    return [choice.options[i] for i in order], LETTERS[order.index(0)]


def _read(path: Path, lesson: Lesson) -> tuple[FrontMatter, str, int]:
    """The front matter, the Markdown body and the body's first line in the file."""
    try:
        raw, body = front_matter(path)
    except LessonError as exc:
        raise ContentError(str(exc)) from exc
    qid = raw.get("id", path.stem) if isinstance(raw, dict) else path.stem
    try:
        fm = FrontMatter.model_validate(raw, context={"checks": lesson.checks})
        text = path.read_text()
        return fm, body, text[:len(text) - len(body)].count("\n") + 1
    except ValidationError as exc:
        lines = [f"  {'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
        raise ContentError(f"{path}: question {qid}: invalid front matter:\n" + "\n".join(lines)) from None


def _cases(fm: FrontMatter, config: GradingConfig, lesson: Lesson, path: Path,
           seed: Callable[[], int] | None = None) -> list[Case]:
    specs = list(fm.cases)
    if fm.choices:
        names = [c.var for c in fm.choices]
        context = {"checks": lesson.checks}
        specs.append(CaseSpec.model_validate(
            {"name": "answers_valid", "weight": 0, "probe": "answers", "args": {"names": names},
             "check": "choices_valid", "revisit": "answer with a single letter string."}, context=context))
        specs += [CaseSpec.model_validate(
            {"name": f"correct_{c.var.removeprefix(_prefix(fm.id))}", "hidden": True, "probe": "answers",
             "args": {"names": [c.var]}, "check": "choice_correct", "revisit": c.prompt}, context=context)
            for c in fm.choices]
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ContentError(f"{path}: question {fm.id}: duplicate case names {sorted(names)}")
    _check_requires(specs, path, fm.id)
    qcfg = config.questions[fm.id]
    total_weight = sum(s.weight for s in specs)
    if total_weight <= 0:
        raise ContentError(f"{path}: question {fm.id}: the case weights add up to 0, so no case earns points")
    points = [round(qcfg.points * s.weight / total_weight, 4) for s in specs]
    last = max(i for i, s in enumerate(specs) if s.weight > 0)
    points[last] = round(qcfg.points - sum(points) + points[last], 4)
    known = {m.id: m for m in lesson.mistakes}
    out = []
    for spec, pts in zip(specs, points):
        case = spec.model_dump()
        case["args"] = _drawn_args(case["args"], spec, f"{fm.id}/{spec.name}", path, seed)
        del case["drawn"]
        if spec.diagnosis:
            if spec.diagnosis not in known:
                raise ContentError(f"{path}: question {fm.id}: case {spec.name}: unknown diagnosis "
                                   f"{spec.diagnosis!r}; known: {sorted(known)}")
            if not reads_diagnosis(lesson.checks.CHECKS[spec.check]):
                raise ContentError(f"{path}: question {fm.id}: case {spec.name}: `diagnosis:` has no effect here: "
                                   f"its check {spec.check!r} never reads case['known_cause'] (a value case names "
                                   "the mistake from the catalogue's outputs); remove it, or have the check pass "
                                   "case.get('known_cause') to fail()")
            case["known_cause"] = {"id": spec.diagnosis, "description": known[spec.diagnosis].description}
        case.update(id=f"{fm.id}/{spec.name}", question=fm.id, points=pts, words=tuple(spec.words),
                    requires=tuple(spec.requires), near=tuple(spec.near), atol=spec.atol or config.tolerances.atol,
                    rtol=spec.rtol or config.tolerances.rtol)
        out.append(Case(**case))
    return out


def _drawn_args(args: dict[str, Any], spec: CaseSpec, case_id: str, path: Path,
                seed: Callable[[], int] | None) -> dict[str, Any]:
    """The case's arguments with each one it draws (`drawn:`) replaced by its value under the course's hidden seed
    (`seed()`, asked only when a case draws); without a seed, as written. ContentError for a public case that draws
    (its arguments ship to students) or an argument that is not an integer of `args`."""
    if not spec.drawn:
        return args
    if not spec.hidden:
        raise ContentError(f"{path}: case {case_id}: `drawn:` is for hidden cases only (a public case's arguments "
                           "ship to students)")
    wrong = [n for n in spec.drawn if type(args.get(n)) is not int]
    if wrong or len(set(spec.drawn)) != len(spec.drawn):
        raise ContentError(f"{path}: case {case_id}: `drawn:` names integer arguments of `args`, each once; "
                           f"{', '.join(map(repr, wrong)) or 'a name repeated'} is not one")
    if seed is None:
        return args
    value = seed()
    return {k: drawn(value, case_id, k) if k in spec.drawn else v for k, v in args.items()}


def reads_diagnosis(fn: Any) -> bool:
    """Whether a check reads its case's `known_cause` (where `diagnosis:` goes): in its own code, or in a function of
    its module that it calls by name, however deep."""
    seen: set[int] = set()

    def reads(code: Any, names: dict[str, Any]) -> bool:
        if id(code) in seen:
            return False
        seen.add(id(code))
        consts = [c for c in code.co_consts if hasattr(c, "co_consts")]
        return "known_cause" in code.co_consts or any(reads(c, names) for c in consts) or any(
            reads(f.__code__, f.__globals__) for n in code.co_names
            if callable(f := names.get(n)) and hasattr(f, "__code__"))

    fn = getattr(fn, "__wrapped__", fn)
    return reads(fn.__code__, fn.__globals__)


def _check_requires(specs: list[CaseSpec], path: Path, qid: str) -> None:
    """`requires` names cases of the same question, never a hidden one from a public case, and has no cycle."""
    by_name = {s.name: s for s in specs}
    for spec in specs:
        for name in spec.requires:
            where = f"{path}: question {qid}: case {spec.name}: requires {name!r}"
            if name not in by_name:
                raise ContentError(f"{where}, which is not a case of this question; its cases: {sorted(by_name)}")
            if by_name[name].hidden and not spec.hidden:
                raise ContentError(f"{where}, a hidden case: a public case cannot wait for a hidden one")
    state: dict[str, str] = {}  # name -> "open" while on the current path, "done" once its requirements are

    def visit(name: str, trail: list[str]) -> None:
        if state.get(name) == "done":
            return
        if state.get(name) == "open":
            cycle = trail[trail.index(name):] + [name]
            raise ContentError(f"{path}: question {qid}: the requires of cases form a cycle: "
                               + " -> ".join(cycle))
        state[name] = "open"
        for required in by_name[name].requires:
            visit(required, [*trail, name])
        state[name] = "done"

    for spec in specs:
        visit(spec.name, [])


def _prefix(qid: str) -> str:
    """The prefix of a question's answer variables and written parts: its number and `_` (q2_ in q2_pick)."""
    return qid.split("_")[0] + "_"


def _check_kind(fm: FrontMatter, path: Path, config: GradingConfig) -> None:
    """What the declared kind needs: points (all but prose), its own kind of content, namespaced names."""
    where = f"{path}: question {fm.id} (kind: {fm.kind})"
    if fm.kind == "prose":
        if fm.id in config.questions:
            raise ContentError(f"{where}: prose carries no points; remove questions.{fm.id} from "
                               "grading_config.yaml or declare the question's kind")
        if fm.cases or fm.choices or fm.written or fm.solution:
            raise ContentError(f"{where}: prose has no solution, cases, choices or written parts")
        return
    if fm.id not in config.questions:
        raise ContentError(f"{path}: question {fm.id}: no points in grading_config.yaml (questions.{fm.id})")
    if fm.kind in ("cases", "milestone") and not fm.cases:
        raise ContentError(f"{path}: question {fm.id}: has no tests (add a `cases:` list)")
    if fm.kind == "choices" and not fm.choices:
        raise ContentError(f"{where}: needs `choices:`")
    if fm.kind == "manual" and not fm.written:
        raise ContentError(f"{path}: question {fm.id}: a manual question needs `written:` parts")
    if fm.kind != "choices" and fm.choices or fm.kind != "manual" and fm.written:
        raise ContentError(f"{where}: `choices:` belong to kind choices and `written:` parts to kind manual")
    if fm.checkpoint is not None and fm.kind != "milestone":
        raise ContentError(f"{where}: only a question of kind milestone declares a `checkpoint:`")
    if fm.kind == "milestone" and len(fm.solution) != 1:
        raise ContentError(f"{where}: a milestone names one solution, the model its checkpoint is loaded into")
    bad = [n for n in [c.var for c in fm.choices] + [w.part for w in fm.written] if not n.startswith(_prefix(fm.id))]
    if bad:
        raise ContentError(f"{where}: {', '.join(bad)}: answer variables and written parts start with "
                           f"{_prefix(fm.id)!r}")


ORDER = {"prose": 0, "milestone": 2}  # prose first, then the questions, then the milestones that build on them


def load_questions(config: GradingConfig, lesson: Lesson, directory: Path | None = None,
                   reference_file: Path | None = None, *, seed: Callable[[], int] | None = None) -> list[Question]:
    """Every question file of `lesson` (or of a copy of its sources, `directory`) in order, validated against the
    config and the reference (by default the lesson's). `seed`: the course's hidden seed, asked for once when a
    hidden case draws arguments from it (`drawn:`); without it they keep the values written in the file."""
    directory = directory or lesson.assignment_dir
    reference_file = reference_file or lesson.reference_file
    seed = cache(seed) if seed is not None else None  # one read (or draw) of the seed file per load
    read = [(path, *_read(path, lesson)) for path in sorted(directory.glob("*.md"))]
    if not read:
        raise ContentError(f"{directory}: no question files (*.md)")
    questions: list[Question] = []
    for path, fm, body, body_line in sorted(read, key=lambda r: (ORDER.get(r[1].kind, 1), r[0].stem)):
        fm.choices = [c.model_copy(update={  # choice texts are templates too (numbers from reference/)
            "prompt": render_text(c.prompt, path, fm.id, config, lesson, part=f"{c.var}'s prompt"),
            "why": render_text(c.why, path, fm.id, config, lesson, part=f"{c.var}'s why"),
            "options": [render_text(o, path, fm.id, config, lesson, part=f"{c.var}'s options") for o in c.options],
            "misconceptions": [render_text(m, path, fm.id, config, lesson, part=f"{c.var}'s misconceptions")
                               for m in c.misconceptions]})
            for c in fm.choices]
        for c in fm.choices:
            c._lesson = lesson.name
        if fm.id in {q.id for q in questions}:
            raise ContentError(f"{path}: question {fm.id}: the id is used by another file")
        _check_kind(fm, path, config)
        graded = fm.kind != "prose"
        qcfg = config.questions.get(fm.id)
        manual = fm.kind == "manual"
        q = Question(fm.id, fm.title, path, fm.solution, [], fm.choices, fm.written,
                     points=qcfg.points if qcfg else 0.0, manual=manual, kind=fm.kind, lesson=lesson,
                     checkpoint=fm.checkpoint)
        if graded and not manual:
            q.cases = _cases(fm, config, lesson, path, seed)
        q.cells = split_cells(render_text(body, path, fm.id, config, lesson, first_line=body_line), path, fm.id)
        if graded:
            _heading_points(q, config)
        kinds = [c.kind for c in q.cells]
        if fm.solution and kinds.count("solution") != 1:
            raise ContentError(f"{path}: question {fm.id}: needs exactly one <!-- solution --> line")
        if q.cases and kinds.count("tests") != 1:
            raise ContentError(f"{path}: question {fm.id}: needs exactly one <!-- tests --> line")
        if fm.solution:
            idx = kinds.index("solution")
            q.cells[idx].source = solution_source(fm.solution, path, fm.id, reference_file)
        questions.append(q)
    missing = set(config.questions) - {q.id for q in questions}
    if missing:
        raise ContentError(f"grading_config.yaml: questions {sorted(missing)} have points but no file in "
                           f"{directory}")
    if config.milestone.points and checkpoint_of(questions) is None:
        raise ContentError(f"grading_config.yaml: milestone.points gives the milestone's checkpoint "
                           f"{config.milestone.points:g} points, but no question of kind milestone in {directory} "
                           "declares it: add `checkpoint: {id, title, files}` to its front matter")
    return questions


def _heading_points(q: Question, config: GradingConfig) -> None:
    """Put the question's points in its heading (the first `## ` line): inside the closing "(`id`)" when the
    heading ends with it, else after it; a milestone adds its checkpoint's points, a manual question says so."""
    points = f"{q.points:g} points"
    if q.manual:
        points += ", graded by hand"
    elif q.kind == "milestone" and config.milestone.points:
        points += f"; {config.milestone.points:g} more for the checkpoint"
    for cell in q.cells:
        lines = cell.source.splitlines()
        at = next((i for i, line in enumerate(lines) if line.startswith("## ")), None)
        if cell.kind == "markdown" and at is not None:
            tail = f"(`{q.id}`)"
            head = lines[at].rstrip()
            if STATED_POINTS.search(head):
                source = q.path.read_text().splitlines()
                line = next((i + 1 for i, text in enumerate(source) if text.rstrip() == head), None)
                raise ContentError(f"{q.path}{f':{line}' if line else ''}: question {q.id}: the heading {head!r} "
                                   f"states points; the builder appends ({points}) from grading_config.yaml: "
                                   "write the heading without them")
            lines[at] = head[:-1] + f", {points})" if head.endswith(tail) else f"{head} ({points})"
            cell.source = "\n".join(lines)
            return
    raise ContentError(f"{q.path}: question {q.id}: no `## ` heading to show its points in")


def mc_answers(questions: list[Question]) -> dict[str, str]:
    return {c.var: shuffled(c)[1] for q in questions for c in q.choices}


def checkpoint_of(questions: list[Question] | tuple[Question, ...]) -> Checkpoint | None:
    """The milestone checkpoint that a question of the lesson declares, or None."""
    return next((q.checkpoint for q in questions if q.checkpoint is not None), None)
