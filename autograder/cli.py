"""Thin command line over the pipeline stages of the Lesson 83 homework: one verb per stage."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from autograder.build import BuildError
from autograder.config import DEFAULT_CONFIG, ROOT, ConfigError, command
from autograder.content import ContentError


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def cmd_release(args: argparse.Namespace) -> int:
    from autograder.build import release, stale_files

    if args.check:
        stale = stale_files(config_path=args.config)
        if stale:
            print("The committed student release is stale; run `make release` and commit:")
            print("\n".join(f"  {s}" for s in stale))
            return 1
        print("student_templates/ is up to date with assignments/ and reference/.")
        return 0
    rel = release(config_path=args.config)

    def shown(path: Path) -> Path:
        return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path

    print(f"student release:      {shown(rel.student_dir)}")
    print(f"Gradescope zip:       {shown(rel.gradescope_zip)}  (upload to Gradescope: grades with "
          "this package's sandboxed engine)")
    print(f"Otter autograder zip: {shown(rel.otter_zip)}  (the same tests run by `otter run`)")
    print(f"Otter output:         {shown(rel.otter_dir)}")
    print(f"nbgrader course:      {shown(rel.nbgrader_dir)}  (release/ is what students get)")
    return 0


def cmd_selfcheck(args: argparse.Namespace) -> int:
    from autograder.judge import grade_namespace, load_suite, notebook_env, reference_env

    suite = load_suite(args.config)
    template = suite.config.lesson.notebook
    ref = grade_namespace(suite, reference_env(suite), name="reference")
    env, _ = notebook_env(template)
    blank = grade_namespace(suite, env, name="blank template")
    rs, bs = ref.question_scores(), blank.question_scores()
    rows = [["question", "points", "reference", "blank"]]
    for q in suite.questions:
        if not q.cells:  # the milestone checkpoint: graded from uploaded files, not from the notebook
            rows.append([q.id, f"{q.points:g}", "(files)", "(files)"])
        elif q.graded and not q.manual:
            rows.append([q.id, f"{q.points:g}", f"{rs.get(q.id, 0):g}", f"{bs.get(q.id, 0):g}"])
        elif q.manual:
            rows.append([q.id, f"{q.points:g}", "manual", "manual"])
    rows.append(["total (notebook)", f"{suite.notebook_points:g}", f"{ref.total:g}", f"{blank.total:g}"])
    print(_table(rows))
    ok = ref.total == suite.notebook_points and blank.total == 0
    for c in ref.cases:
        if not c.passed:
            print(f"reference fails {c.message}")
    print("self-check passed: the reference earns full marks and the blank template earns none."
          if ok else "SELF-CHECK FAILED")
    return 0 if ok else 1


def cmd_grade(args: argparse.Namespace) -> int:
    from autograder.judge import NOT_GRADED, full_marks, grade_batch, load_suite

    try:
        summary = grade_batch(args.submissions, out=args.out, force=args.force, workers=args.workers,
                              config_path=args.config, progress=not args.quiet)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rows = [r for r in summary.rows if r["total"] is not None]
    print(f"graded {summary.graded_now} submission(s), reused {summary.reused} unchanged result(s); "
          f"sandbox: {summary.sandbox}")
    print("status:  " + ", ".join(f"{k} {v}" for k, v in sorted(summary.counts().items())))
    if rows:
        points = load_suite(args.config).question_points()
        table = [["question", "mean", "full marks"]]
        for q in summary.questions:
            mean = sum(r[q] for r in rows) / len(rows)
            full = sum(full_marks(r[q], points[q]) for r in rows)
            table.append([q, f"{mean:.2f}", f"{full}/{len(rows)}"])
        print(_table(table))
    left = [r for r in summary.rows if r["status"] == NOT_GRADED]
    for r in left:
        print(f"not graded: {r['id']}: {r['message']}")
    print(f"grades: {args.out / 'grades.csv'}   per-submission results: {args.out / 'results'}/")
    return 1 if left else 0


def cmd_gradescope(args: argparse.Namespace) -> int:
    """Grade one Gradescope submission folder and write its results.json (used by run_autograder)."""
    import json
    import shutil
    import tempfile

    from autograder.judge import grade_batch

    with tempfile.TemporaryDirectory(prefix="gradescope-") as tmp:
        subs = Path(tmp) / "in"
        # Links are copied as links and pipes or devices not at all: the grader refuses both, never follows them.
        shutil.copytree(args.submission, subs / "submission", symlinks=True,
                        copy_function=lambda src, dst: shutil.copy2(src, dst) if os.path.isfile(src) else None)
        summary = grade_batch(subs, out=Path(tmp) / "out", force=True, config_path=args.config, progress=False)
        row = json.loads((Path(tmp) / "out" / "summary.json").read_text())["rows"][0]
        if row["result"] is None:  # the grader failed (not the student): say so, and let Gradescope show an error
            results = {"score": 0, "output": f"Not graded: {row['message']} Ask your instructor to re-run the "
                                              "autograder.", "stdout_visibility": "hidden", "tests": []}
            record = {"status": row["status"], "total": 0}
        else:
            record = json.loads((Path(tmp) / "out" / "results" / row["result"]).read_text())
            results = record["gradescope"]
            results.setdefault("extra_data", {})["isolation"] = record.get("isolation", "")
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(results, indent=1))
    print(f"status: {record['status']}; score {record['total']:g}; sandbox: {summary.sandbox}; "
          f"isolation: {record.get('isolation', 'not started')}")
    return 0 if row["result"] is not None else 1


def cmd_report(args: argparse.Namespace) -> int:
    """Write the TA failure report (HTML folder and report.csv) of a graded batch; print index.html's path."""
    from autograder.report import write_report

    try:
        index = write_report(args.grades, out=args.out, config_path=args.config)
    except (FileNotFoundError, FileExistsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(index)
    return 0


def cmd_merge(args: argparse.Namespace) -> int:
    """Merge scores graded elsewhere (CSV: id and question or written-part columns) into grades.csv and
    summary.json."""
    from autograder.judge import MergeError, merge_scores

    try:
        done = merge_scores(args.grades, args.scores, config_path=args.config)
    except MergeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    merged = ", ".join(f"{col} {n}" for col, n in sorted(done["merged"].items())) or "nothing"
    print(f"merged: {merged} (scores kept for {done['students']} student(s) in merged_scores.json)")
    if done["ignored"]:
        print(f"ignored columns: {', '.join(done['ignored'])}")
    print(f"grades: {args.grades / 'grades.csv'}")
    return 0


class _ShowDefaults(argparse.ArgumentDefaultsHelpFormatter):
    """Help that ends each option with its default, unless it has none or its text already says it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, argparse.SUPPRESS) or "default:" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


CONFIG_HELP = "grading_config.yaml to use"


class _VerbParser(argparse.ArgumentParser):
    """A verb's parser: its help shows every default, and it takes --config after the verb too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _ShowDefaults)
        super().__init__(*args, **kwargs)
        self.add_argument("--config", type=Path, default=argparse.SUPPRESS,
                          help=f"{CONFIG_HELP} (default: {DEFAULT_CONFIG})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=command(), formatter_class=_ShowDefaults,
        description="The Lesson 83 homework package: one verb per pipeline stage, all listed below. "
                    f"`{command()} VERB --help` shows a verb's options and their defaults.")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help=CONFIG_HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="VERB", parser_class=_VerbParser)
    p = sub.add_parser("release", help="build the student release, the Otter zip and the nbgrader release")
    p.add_argument("--check", action="store_true", help="only report whether student_templates/ is stale")
    p.set_defaults(func=cmd_release)
    p = sub.add_parser("selfcheck", help="grade the reference and the blank template, print a table")
    p.set_defaults(func=cmd_selfcheck)
    p = sub.add_parser("grade", help="grade a folder of submissions in the sandbox")
    p.add_argument("submissions", type=Path, help="folder of .ipynb files, per-student folders or zips")
    p.add_argument("--out", type=Path, default=ROOT / "dist" / "grades", help="where to write the grades")
    p.add_argument("--force", action="store_true", help="regrade even unchanged submissions")
    p.add_argument("--workers", type=int, default=None,
                   help="parallel workers (default: execution.workers of the config)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_grade)
    p = sub.add_parser("gradescope", help="grade one Gradescope submission folder into results.json")
    p.add_argument("submission", type=Path, help="the submission folder (/autograder/submission)")
    p.add_argument("results", type=Path, help="where to write results.json")
    p.set_defaults(func=cmd_gradescope)
    p = sub.add_parser("report", help="TA failure report of a graded batch: HTML folder and report.csv")
    p.add_argument("grades", type=Path, help=f"folder written by `{command()} grade` (results/, grades.csv)")
    p.add_argument("--out", type=Path, default=ROOT / "dist" / "report", help="report folder (replaced whole)")
    p.set_defaults(func=cmd_report)
    p = sub.add_parser("merge", help="merge scores graded elsewhere (written answers, a platform's points) into "
                                     "grades.csv and summary.json")
    p.add_argument("grades", type=Path, help=f"folder written by `{command()} grade`")
    p.add_argument("scores", type=Path, nargs="+", help="CSV files: an id column and score columns named by "
                   "question (q9_written, m1_checkpoint) or written part (q9_buffer); blank cells are skipped")
    p.set_defaults(func=cmd_merge)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, ContentError, BuildError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
