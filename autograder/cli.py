"""Thin command line over the pipeline stages of the homework package: one verb per stage."""

from __future__ import annotations

import argparse
import inspect
import os
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import yaml

from autograder.authoring.hidden_seed import course_seed, seed_file
from autograder.authoring.questions import ContentError
from autograder.config import DEFAULT_CONFIG, ROOT, ConfigError, command, runnable_command
from autograder.course import Course
from autograder.grading import batch
from autograder.grading.cluster import ClusterError
from autograder.grading.gradebook import ROSTER_FILE, Gradebook, MergeError
from autograder.grading.gradescope import grade_gradescope
from autograder.grading.merge import merge_scores
from autograder.grading.phases import write_record
from autograder.grading.submissions import OutputInClass, check_out_folder, class_ids, named_ids
from autograder.grading.summaries import grade_summary, not_graded, report_hint
from autograder.release import BuildError, release, stale_files
from autograder.report import write_report
from autograder.report.leaderboard import RosterError
from autograder.sandbox import UNSANDBOXED_HELP, UnsandboxedError
from autograder.selfcheck import selfcheck


def _default(stage: Callable[..., Any], name: str) -> Any:
    """The default of the keyword option `name` of a stage function: each default is written there, once."""
    return inspect.signature(stage).parameters[name].default


def cmd_release(args: argparse.Namespace, course: Course) -> int:
    if args.check:
        stale = stale_files(course=course)
        if stale:
            print(f"The committed student release is stale; run `{runnable_command()}{_config_flag(course)} release` "
                  "and commit:")
            print("\n".join(f"  {s}" for s in stale))
            return 1
        print("student_templates/ is up to date with assignments/ and reference/.")
        return 0
    if args.new_seed:  # before the suite is read: every case that draws from it draws again
        course_seed(course.path, fresh=True)
    rel = release(course=course, say=print)  # says what it will replace before it replaces anything

    def shown(path: Path) -> Path:
        return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path

    print(f"student release:      {shown(rel.student_dir)}")
    print(f"Gradescope zip:       {shown(rel.gradescope_zip)}  (upload to Gradescope: grades with "
          "this package's sandboxed engine)")
    print(f"Otter autograder zip: {shown(rel.otter_zip)}  (the same tests run by `otter run`)")
    print(f"Otter output:         {shown(rel.otter_dir)}")
    print(f"nbgrader course:      {shown(rel.nbgrader_dir)}  (release/ is what students get)")
    if seed_file(course.path).is_file():
        print(f"hidden seed:          {shown(seed_file(course.path))}  (grader-only: the hidden cases draw from it; "
              "keep it with the course, never ship it)")
    return 0


def cmd_selfcheck(args: argparse.Namespace, course: Course) -> int:
    check = selfcheck(course=course)
    print(check.text())
    return 0 if check.passed else 1


def _config_flag(course: Course) -> str:
    """` --config PATH` for a command a hint prints, when the course is not the package's default one."""
    return "" if course.is_default else f" --config {shlex.quote(str(course.path))}"


ONLY_RULE = ("grade again only this student (the id as in grades.csv, or the entry's file name), changed or not; "
             "give --only once per student. A value that is no student's id is read as ids separated by commas "
             "(--only alice,bob); one that is an id is never split, so an id holding a comma is named as it is")


def _ids(given: list[str] | None, submissions: Path) -> list[str] | None:
    """The ids every --only names (submissions.named_ids: the rule of ONLY_RULE); None when --only was not given."""
    if given is None:
        return None
    try:
        entries = class_ids(submissions)
    except OSError:  # no such folder: grading says so
        entries = []
    return named_ids(given, entries)


def cmd_grade(args: argparse.Namespace, course: Course) -> int:
    try:
        check_out_folder(args.submissions, args.out)  # before anything is read or written
        summary = batch.grade_batch(args.submissions, out=args.out, force=args.force, workers=args.workers,
                                    course=course, progress=not args.quiet, cluster=args.cluster,
                                    only=_ids(args.only, args.submissions), allow_unsandboxed=args.allow_unsandboxed)
    except (FileNotFoundError, ClusterError, batch.UnknownSubmission, UnsandboxedError, OutputInClass) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(grade_summary(summary, points=course.suite.question_points()))
    print(f"TA report: {report_hint(summary.out, command=runnable_command() + _config_flag(course))}")
    print(f"Feedback to hand out, one page per student: {Gradebook(summary.out.resolve()).feedback_dir}/")
    return 1 if not_graded(summary) else 0


def cmd_nbgrader_autograde(args: argparse.Namespace, course: Course) -> int:
    """Grade an nbgrader course's submitted/ with the sandboxed grader and write the scores into its gradebook."""
    from autograder.grading.nbgrader import NbgraderGradingError, nbgrader_autograde
    from autograder.release.common import tool_path

    try:
        if args.out is not None:  # the default, COURSE-grades, lies beside the course
            check_out_folder(args.course, args.out, what="nbgrader course folder")
        run = nbgrader_autograde(args.course, out=args.out, force=args.force, workers=args.workers,
                                 allow_unsandboxed=args.allow_unsandboxed, course=course,
                                 progress=not args.quiet)
    except (NbgraderGradingError, OutputInClass) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(grade_summary(run.summary, points=course.suite.question_points()))
    print(f"isolation: {run.isolation}")
    for student, why in run.flagged.items():
        print(f"flagged in the gradebook: {student}: {why}")
    folder = args.course.resolve()
    print(f"gradebook: {folder / 'gradebook.db'} (formgrader). Students' feedback pages: cd {shlex.quote(str(folder))}"
          f" && {shlex.quote(tool_path('nbgrader'))} generate_feedback {shlex.quote(course.config.assignment)} --force")
    print(f"TA report: {report_hint(run.summary.out, command=runnable_command() + _config_flag(course))}")
    if run.problem:
        print(run.problem, file=sys.stderr)
    for student, why in run.unrecorded.items():
        print(f"not shown by nbgrader as graded: {student}: {why}", file=sys.stderr)
    return 1 if run.problem or run.unrecorded or not_graded(run.summary) else 0


def cmd_gradescope(args: argparse.Namespace, course: Course) -> int:
    """Grade one Gradescope submission folder and write its results.json (used by run_autograder)."""
    run = grade_gradescope(args.submission, args.results_json, course=course, allow_unsandboxed=args.allow_unsandboxed)
    print(run.line)
    return 0 if run.graded else 1


def quick_exit(code: int) -> NoReturn:
    """End this process now, its results written and closed: the interpreter's teardown (half a second with torch
    loaded) is not the student's wait. The timing record is written first (its atexit would not run)."""
    sys.stdout.flush()
    sys.stderr.flush()
    write_record()
    os._exit(code)


def cmd_report(args: argparse.Namespace, course: Course) -> int:
    """Write the TA failure report (HTML folder and report.csv) of a graded batch; print index.html's path."""
    try:
        index = write_report(args.grades, out=args.out, course=course, roster=args.roster, compare=args.compare)
    except (FileNotFoundError, FileExistsError, RosterError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(index)
    return 0


def cmd_merge(args: argparse.Namespace, course: Course) -> int:
    """Merge scores graded elsewhere (CSV: id and question or written-part columns) into grades.csv and
    summary.json."""
    try:
        done = merge_scores(args.grades, args.scores, course=course)
    except MergeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    merged = ", ".join(f"{col} {n}" for col, n in sorted(done["merged"].items())) or "nothing"
    print(f"merged: {merged} (scores kept for {done['students']} student(s) in merged_scores.json)")
    if done["ignored"]:
        print(f"ignored columns: {', '.join(done['ignored'])}")
    print(f"grades: {Gradebook(args.grades).grades_csv}")
    return 0


class _ShowDefaults(argparse.ArgumentDefaultsHelpFormatter):
    """Help that ends each option with its default, unless it has none or its text already says it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, argparse.SUPPRESS) or "default:" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


CONFIG_HELP = "grading_config.yaml to use, or the course folder that holds it"  # read once here (a Course)
LESSON_HELP = ("the lesson to work on, by its course folder (the one holding its grading_config.yaml, as the "
               "scaffold writes it) or that config file: `--lesson courses/lesson84`; the same as --config")
DESCRIPTION = "One verb per pipeline stage, all listed below."


ASSIGNMENT_HELP = ("the assignment (lesson) to work on: the grading config whose `assignment:` is NAME, looked up "
                   "in --config, ./grading_config.yaml and assignments/NAME/grading_config.yaml (here and in the "
                   "package's folder); default: the assignment of --config")


class _VerbParser(argparse.ArgumentParser):
    """A verb's parser: its help shows every default, and it takes --config, --lesson and --assignment after the verb
    too."""

    chosen: Path = DEFAULT_CONFIG  # the config the command line names (main sets it before building the parsers)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _ShowDefaults)
        super().__init__(*args, **kwargs)
        self.add_argument("--config", "--lesson", metavar="PATH", type=Path, default=argparse.SUPPRESS,
                          help=f"{CONFIG_HELP}; --lesson FOLDER is the same (default: {self.chosen})")
        self.add_argument("--assignment", metavar="NAME", default=argparse.SUPPRESS, help=ASSIGNMENT_HELP)


def config_file(given: Path) -> Path:
    """The grading config that --config or --lesson names: the file itself, or FOLDER/grading_config.yaml."""
    if given.is_dir():
        if not (given / "grading_config.yaml").is_file():
            raise ConfigError(f"{given}: a course folder holds grading_config.yaml, and this one does not")
        return given / "grading_config.yaml"
    return given


class _EarlyParser(argparse.ArgumentParser):
    """A parser that raises (ValueError) where argparse would print and exit: the full parse says what is wrong."""

    def error(self, message: str) -> NoReturn:
        raise ValueError(message)


def _named_config(argv: list[str] | None) -> tuple[Path, str | None]:
    """The config the command line names (before the full parse, for the help) and its lesson's name, if readable."""
    early = _EarlyParser(add_help=False)
    early.add_argument("--config", "--lesson", type=Path, default=DEFAULT_CONFIG)
    early.add_argument("--assignment", default=None)
    try:
        known, _ = early.parse_known_args(argv)
        path = config_for(known.assignment, config=known.config) if known.assignment else config_file(known.config)
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (ValueError, OSError, UnicodeDecodeError, yaml.YAMLError):  # the full parse and the load say what is wrong
        return DEFAULT_CONFIG, None
    return path, raw.get("assignment") if isinstance(raw, dict) else None


def config_for(assignment: str, *, config: Path = DEFAULT_CONFIG) -> Path:
    """The grading config of `assignment`: one config per assignment, found where an instructor keeps it."""
    seen = []
    for path in dict.fromkeys(p.resolve() for p in (config, Path("grading_config.yaml"), Path("assignments") /
                              assignment / "grading_config.yaml", ROOT / "assignments" / assignment /
                              "grading_config.yaml")):
        if not path.is_file():
            continue
        seen.append(str(path))
        try:
            raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue
        if isinstance(raw, dict) and raw.get("assignment") == assignment:
            return path
    raise ConfigError(f"no grading config for assignment {assignment!r} (looked in: {', '.join(seen) or 'nothing'}); "
                      "pass its grading_config.yaml with --config")


def main(argv: list[str] | None = None) -> int:
    chosen, name = _named_config(argv)
    _VerbParser.chosen = chosen
    other = chosen.resolve() != DEFAULT_CONFIG.resolve()
    lesson = f"lesson {name}" if name else "the lesson"
    parser = argparse.ArgumentParser(
        prog=command() + (f" --lesson {shlex.quote(str(chosen.parent))}" if other else ""),
        formatter_class=_ShowDefaults,
        description=f"{lesson.capitalize()} ({chosen}). {DESCRIPTION} `{command()} "
                    f"{'--lesson FOLDER ' if other else ''}VERB --help` shows a verb's options and their defaults; "
                    "--lesson FOLDER (or --config) runs another lesson's course.")
    parser.add_argument("--config", "--lesson", metavar="PATH", type=Path, default=chosen,
                        help=f"{CONFIG_HELP}. {LESSON_HELP}")
    parser.add_argument("--assignment", metavar="NAME", default=None, help=ASSIGNMENT_HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="VERB", parser_class=_VerbParser)
    p = sub.add_parser("release", help="build the student release, the Otter zip and the nbgrader release")
    p.add_argument("--check", action="store_true", help="only report whether student_templates/ is stale")
    p.add_argument("--new-seed", action="store_true",
                   help="draw a new hidden seed first (a new term): every hidden case that draws from it changes, "
                        "and grades stored under the old one are graded again")
    p.set_defaults(func=cmd_release)
    p = sub.add_parser("selfcheck", help="grade the reference and the blank template, print a table")
    p.set_defaults(func=cmd_selfcheck)
    p = sub.add_parser("grade", help="grade a folder of submissions in the sandbox")
    p.add_argument("submissions", type=Path, help="folder of .ipynb files, per-student folders or zips")
    p.add_argument("--out", type=Path, default=_default(batch.grade_batch, "out"),
                   help="folder for the grades (results/, grades.csv, summary.json), kept between runs; default: "
                        f"./{_default(batch.grade_batch, 'out')} in the current folder")
    p.add_argument("--force", action="store_true", default=_default(batch.grade_batch, "force"),
                   help="regrade even unchanged submissions")
    p.add_argument("--workers", type=int, default=_default(batch.grade_batch, "workers"),
                   help="parallel workers (default: execution.workers of the config)")
    p.add_argument("--only", metavar="ID", action="append", default=_default(batch.grade_batch, "only"),
                   help=f"{ONLY_RULE}; every other row and every merged score is kept (default: every submission, "
                        "as usual)")
    p.add_argument("--cluster", metavar="tcp://HOST:PORT", default=_default(batch.grade_batch, "cluster"),
                   help="grade on the Dask cluster whose scheduler is there (pip install '.[cluster]'; "
                        "docs/cluster.md); default: cluster.address of the config, else this machine")
    p.add_argument("--allow-unsandboxed", action="store_true", help=UNSANDBOXED_HELP)
    p.add_argument("--quiet", action="store_true", default=not _default(batch.grade_batch, "progress"),
                   help="no progress bar")
    p.set_defaults(func=cmd_grade)
    p = sub.add_parser("nbgrader-autograde", help="grade an nbgrader course's submitted/ in the sandbox and write the "
                                                  "scores into its gradebook (in place of `nbgrader autograde`)")
    p.add_argument("course", type=Path, help="the nbgrader course folder (nbgrader_config.py, source/, submitted/)")
    p.add_argument("--out", type=Path, default=None,
                   help="where the grader's results and grades.csv go (default: COURSE-grades beside the course; "
                        "never inside it)")
    p.add_argument("--force", action="store_true", help="regrade even unchanged submissions")
    p.add_argument("--workers", type=int, default=None, help="parallel workers (default: execution.workers)")
    p.add_argument("--allow-unsandboxed", action="store_true",
                   help="grade even where neither bubblewrap nor root is available (student code then runs as "
                        "your user; every row says so)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_nbgrader_autograde)
    p = sub.add_parser("gradescope", help="grade one Gradescope submission folder into results.json")
    p.add_argument("submission", type=Path, help="the submission folder (/autograder/submission)")
    p.add_argument("results_json", metavar="RESULTS_JSON", type=Path, help="where to write results.json")
    p.add_argument("--allow-unsandboxed", action="store_true", help=UNSANDBOXED_HELP)
    p.set_defaults(func=cmd_gradescope)
    p = sub.add_parser("report", help="TA failure report of a graded batch: HTML folder and report.csv")
    p.add_argument("grades", type=Path, help=f"folder written by `{command()} grade` (results/, grades.csv)")
    p.add_argument("--out", type=Path, default=_default(write_report, "out"),
                   help=f"report folder (replaced whole); default: ./{_default(write_report, 'out')} in the current "
                        "folder")
    p.add_argument("--roster", type=Path, default=None,
                   help="the leaderboard's roster (CSV: id, pseudonym, opt_out) for the page to post; default: "
                        f"GRADES/{ROSTER_FILE} when present")
    p.add_argument("--compare", metavar="OLD_GRADES", type=Path, default=_default(write_report, "compare"),
                   help="an earlier run's grades folder of the same class: adds compare.html, each question's mean "
                        "and each student's scores before and after, and the cases whose verdict changed; default: "
                        "no compare page")
    p.set_defaults(func=cmd_report)
    p = sub.add_parser("merge", help="merge scores graded elsewhere (written answers, a platform's points) into "
                                     "grades.csv and summary.json")
    p.add_argument("grades", type=Path, help=f"folder written by `{command()} grade`")
    p.add_argument("scores", type=Path, nargs="+", help="CSV files: an id column and score columns named by "
                   "question (a manual one, the milestone checkpoint) or written part; blank cells are skipped")
    p.set_defaults(func=cmd_merge)
    args = parser.parse_args(argv)
    try:
        if args.assignment is not None:
            args.config = config_for(args.assignment, config=config_file(args.config))
        course = Course.load(config_file(args.config))  # the one parse of the config; every stage takes this object
        code = args.func(args, course)
        if args.func is cmd_gradescope and __name__ == "__main__":  # run_autograder's `python -m autograder.cli`
            quick_exit(code)
        return code
    except (ConfigError, ContentError, BuildError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
