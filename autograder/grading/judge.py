"""Judging one submission: probe outputs and checkpoint files in, per-case verdicts and scores out (runs in the
clean grader process, never in the sandbox)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autograder.authoring.suite import Suite
from autograder.checkpoint import UNREADABLE, reader_limits_lowered, reads_checkpoint
from autograder.grading.causes import first_causes, named_functions
from autograder.grading.submissions import Submission
from autograder.model import (
    CAUSES,
    NOT_RUN,
    CaseResult,
    CheckpointVerdict,
    PartVerdict,
    Reason,
    Status,
    SubmissionResult,
)
from autograder.pyast import compile_tree, parse
from autograder.runtime.plain_codec import to_plain
from autograder.sandbox import SKIP_TAGS, ExecResult


def output_reason(got: Any, *, stub: str, not_run: bool) -> str:
    """Why a case with this probe output failed, before its question's other cases are looked at: no output (a
    time limit, or the notebook stopped), an error the student's code raised (a blank stub, a name not defined,
    another error), else a wrong answer."""
    if got is None:
        return Reason.TIME_LIMIT if not_run else Reason.STOPPED
    err = got.get("error") if isinstance(got, dict) else None
    if not isinstance(err, dict):
        return Reason.MISMATCH
    if stub in str(err.get("message", "")):
        return Reason.BLANK
    return Reason.MISSING if err.get("type") == "NameError" else Reason.RAISED


def judge_outputs(suite: Suite, outputs: dict[str, dict[str, Any]],
                  not_run: dict[str, str] | None = None) -> list[CaseResult]:
    """Judge probe outputs (case id -> plain data); a case with no output fails with a clear message, and one whose
    probe never ran for time (`not_run`: case id -> why, in the grader's words) says so.

    A case that `requires` value cases of its question passes only when they are genuine attempts (they pass,
    or their output is not a do-nothing one: checks.attempt_gap), recursively: a property such as "shuffling the
    input shuffles the output" also holds of code that returns zeros, but one wrong value must not zero it.
    """
    checks = suite.lesson.checks
    verdicts: dict[str, checks.Verdict] = {}
    plain = {c.id: c.plain() for c in suite.cases}  # the lesson's checks read a case as plain data
    for case in suite.cases:
        got = outputs.get(case.id)
        if got is None and case.id in (not_run or {}):
            verdicts[case.id] = checks.Verdict(False, f"{case.id}: {NOT_RUN}: {(not_run or {})[case.id]}.")
        elif got is None:
            verdicts[case.id] = checks.Verdict(False, f"{case.id}: no result: the submission stopped "
                                               "before this case could run.")
        else:
            verdicts[case.id] = checks.judge(plain[case.id], got, suite.expected[case.id])
    by_id = {c.id: c for c in suite.cases}
    # A lesson's checks may say when a failed value case still opens its gates (a genuine attempt); by default
    # only a passed one does.
    attempted = getattr(checks, "attempted", lambda verdict: verdict.passed)

    def holds(case_id: str) -> bool:  # a genuine attempt, and so is every requirement (content.py forbids cycles)
        return attempted(verdicts[case_id]) and all(holds(r) for r in by_id[case_id].required)

    # A public case's arguments and expected value ship with the notebook, so passing it shows nothing a lookup of
    # the visible answers could not: it pays only once a hidden case of its question that requires nothing (a
    # value case) holds, where the question has one, or a public value case fails yet holds (close to the
    # reference or a known mistake without being it: computed, not looked up).
    evidence: dict[str, list[str]] = {}
    for c in suite.cases:
        if c.hidden and not c.requires:
            evidence.setdefault(c.question, []).append(c.id)
    computed = {c.question for c in suite.cases
                if not c.hidden and not c.requires and not verdicts[c.id].passed and holds(c.id)}
    left_out = {c.id for c in suite.cases if _raised_earlier(c.args, outputs.get(c.id), stub=checks.STUB)}
    results, waits, upstream = [], {}, {}
    unstored = set(getattr(checks, "UNSTORED", ()))  # what a probe records for the contract alone
    for case in suite.cases:
        verdict, got = verdicts[case.id], outputs.get(case.id)
        reason = output_reason(got, stub=checks.STUB, not_run=case.id in (not_run or {}))
        blocked = [r for r in case.required if not holds(r)]
        waits[case.id] = blocked
        if blocked and set(blocked) <= left_out:  # waits only for cases that cannot be judged: neither can it
            left_out.add(case.id)
        gate = checks.gated(plain[case.id], verdict, [(cid, verdicts[cid]) for cid in blocked])
        if gate is not verdict and not gate.passed:  # the gate's message: the case waits (its cause: below)
            reason = Reason.WAITS
        verdict = gate
        upstream[case.id] = verdict.upstream or ""
        shown_by = [] if case.hidden or case.question in computed else evidence.get(case.question, [])
        if verdict.passed and shown_by and not any(holds(e) for e in shown_by):
            reason = Reason.UNSHOWN
            verdict = checks.Verdict(False, f"{case.id}: passes here, but earns its points only once the "
                                     "question's hidden cases show that the code computes what the question asks.")
        if verdict.passed:
            reason = Reason.PASSED
        elif verdict.diagnosis and reason in (Reason.MISMATCH, Reason.RAISED):
            reason = Reason.CATALOGUED
        shown = not verdict.passed and got is not None  # a failed case that ran: the report compares the two
        kept = {k: v for k, v in got.items() if k not in unstored} if isinstance(got, dict) else got
        received = to_plain(kept) if shown else None  # the contract's own calls are judged, never shown
        expected = to_plain(suite.expected[case.id]["value"]) if shown else None
        results.append(CaseResult(case.id, case.question, case.points if verdict.passed else 0.0,
                                  case.points, verdict.passed, case.hidden, verdict.message,
                                  verdict.diagnosis, received, expected, reason))
    words = suite.lesson.runtime.NOT_FILLED  # a blank stub's words, as the lesson's runtime spells them
    results = _rescaled(_one_gate_line(_one_line_per_stub(results, waits, stub=checks.STUB, words=words), waits),
                        left_out, upstream)
    _reasons_of_waits(results, waits)
    return results


def _reasons_of_waits(results: list[CaseResult], waits: dict[str, list[str]]) -> None:
    """A case that waits only for cases stopped by one cause (a blank stub, a time limit, a missing definition...)
    has that cause for its reason (in place)."""
    by_id = {r.id: r for r in results}
    for r in results:
        if r.passed or r.reason != Reason.WAITS or not waits.get(r.id):
            continue
        causes = {by_id[w].reason for w in waits[r.id] if w in by_id}
        if len(causes) == 1 and (cause := causes.pop()) in CAUSES:
            r.reason = cause


def _one_gate_line(results: list[CaseResult], waits: dict[str, list[str]]) -> list[CaseResult]:
    """A question's gate is said once: its first gated case says why; the others point to it. A case that waits only
    for cases that never ran (a time limit) did not run either, in effect, and says so."""
    first: dict[str, CaseResult] = {}
    never = {r.id for r in results if not r.passed and r.reason == Reason.TIME_LIMIT and not waits.get(r.id)}
    for r in results:
        if not r.passed and waits.get(r.id) and set(waits[r.id]) <= never:
            r.message = f"{r.id}: {NOT_RUN}: it waits for {' and '.join(waits[r.id])}, which did not run."
            r.reason = Reason.TIME_LIMIT
        if r.passed or not waits.get(r.id) or r.reason in (Reason.TIME_LIMIT, Reason.BLANK):
            continue
        lead = first.setdefault(r.question, r)
        if lead is not r:
            r.message = f"{r.id}: waits for {' and '.join(waits[r.id])}, as {lead.id} says"
    return results


def _raised_earlier(args: dict[str, Any], got: Any, *, stub: str) -> bool:
    """Whether a case that builds on an earlier question (args["basis"]) raised the error that question's own
    function raised in its basis probe: the same type at the same line of one of the functions the basis names
    (its `names`), or the same type and message. A blank stub is not such an error (it earns nothing)."""
    basis = args.get("basis") if isinstance(args, dict) else None
    mine = got.get("basis") if isinstance(got, dict) and isinstance(basis, dict) else None
    err, first = (got.get("error"), mine.get("error")) if isinstance(mine, dict) else (None, None)
    if not (isinstance(err, dict) and isinstance(first, dict)) or stub in str(first.get("message", "")):
        return False
    where = str(first.get("where", ""))
    in_named = where.rsplit(" in ", 1)[-1] in set(basis.get("names", [])) and where == err.get("where")
    return err.get("type") == first.get("type") and (in_named or err.get("message") == first.get("message"))


def _rescaled(results: list[CaseResult], left_out: set[str], upstream: dict[str, str]) -> list[CaseResult]:
    """One penalty per mistake when it raises: a case whose earlier question's function raised (and those that
    wait only for such cases) is left out of its question's total, which the question's other cases make up
    (it earns the share they earn); the error costs points in the earlier question only. A question with no
    other case to judge earns nothing for it (no evidence), as before."""
    for question in {r.question for r in results if r.id in left_out}:
        judged = [r for r in results if r.question == question and r.id not in left_out]
        total = sum(r.max_points for r in judged)
        if total <= 0:
            continue
        share = sum(r.points for r in judged) / total
        for r in results:
            if r.question == question and r.id in left_out:
                note = upstream.get(r.id, "").partition("This comes from ")[2] or "an earlier question."
                r.points, r.passed, r.diagnosis = round(r.max_points * share, 4), share >= 1 - 1e-9, None
                r.reason = Reason.EARLIER
                r.message = (f"{r.id}: left out of this question's total. This comes from {note} It costs points "
                             f"there only: this case earns the share the question's other cases earn ({share:.0%}).")
    return results


def _one_line_per_stub(results: list[CaseResult], waits: dict[str, list[str]], *, stub: str,
                       words: str) -> list[CaseResult]:
    """Failures of one question that come from stubs not filled in read as one line: the first case says it;
    the question's other stub failures, and the properties that wait only for them, point to it."""
    stubs = {r.id for r in results if not r.passed and r.reason == Reason.BLANK and stub in r.message}
    first: dict[str, CaseResult] = {}
    for r in results:
        if r.id in stubs:
            first.setdefault(r.question, r)
    for r in results:
        lead = first.get(r.question)
        if lead is None or r is lead or r.passed:
            continue
        if r.id in stubs or (waits.get(r.id) and set(waits[r.id]) <= stubs):
            r.message, r.reason = f"{r.id}: {words} (see {lead.id})", Reason.BLANK
    return results


def judge_checkpoint(suite: Suite, files: dict[str, bytes], problems: list[str] | None = None) -> list[CaseResult]:
    """Milestone checkpoint cases: the lesson's plug-in verifies the uploaded files, one verdict per part."""
    cases = suite.checkpoint_cases
    if not cases:
        return []
    plugin = suite.lesson.plugin
    if problems:
        verdict = CheckpointVerdict(False, "; ".join(problems), UNREADABLE)
    else:
        try:
            verdict = plugin.verify(files, rules=suite.milestone_rules,
                                    memory_mb=suite.config.submissions.checkpoint_memory_mb)
        except Exception as exc:  # noqa: BLE001 - hostile files (deep JSON, odd types) cost this part, not the batch
            verdict = CheckpointVerdict(False, f"the checkpoint could not be verified ({type(exc).__name__}: "
                                     f"{str(exc)[:200]}); {plugin.UNVERIFIED}", UNREADABLE)
    out = []
    for case in cases:
        row = verdict.parts.get(case.part, PartVerdict(False))
        passed = bool(verdict.ok and row.passed)
        earned = round(case.points * verdict.credit, 4) if passed else 0.0
        if passed:
            message = "" if verdict.credit == 1 else (f"{case.id}: the {verdict.label} preset earns "
                                                      f"{verdict.credit:.0%} of these points")
        else:
            message = f"{case.id}: {row.message or verdict.message}"
        received = row.received
        problem = None if passed else row.problem or verdict.problem
        reason = Reason.PASSED if passed else Reason.CATALOGUED if problem else Reason.MISMATCH
        out.append(CaseResult(case.id, case.question, earned, case.points, passed, False, message,
                              problem, received or None, reason=reason))
    return out


def probe_namespace(suite: Suite, env: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Run every probe against a namespace in this process (for trusted code: the reference, templates)."""
    run_probe = suite.lesson.checks.run_probe
    return {c.id: run_probe(env, c.probe, c.args) for c in suite.cases}


def grade_namespace(suite: Suite, env: dict[str, Any], *, name: str) -> SubmissionResult:
    """Judge a trusted namespace (the reference, a template) on every probe case."""
    return SubmissionResult(name, Status.GRADED, judge_outputs(suite, probe_namespace(suite, env)),
                            fingerprint=suite.fingerprint)


def _is_otter_cell(source: str) -> bool:
    return "otter" in source or "grader." in source


def notebook_env(path: Path) -> tuple[dict[str, Any], list[str]]:
    """Execute a trusted notebook's code cells in this process (Otter's own cells skipped).

    Used for the committed student template in the self-check; student submissions go through the
    sandboxed executor instead. A cell that raises is recorded and execution continues; cells tagged
    as the sandbox skips them (training) are skipped here too.
    """
    import nbformat  # here, not at the top: importing it builds jsonschema's format grammars (seconds of CPU)

    nb = nbformat.read(str(path), as_version=4)
    env: dict[str, Any] = {"__name__": "__main__"}
    errors = []
    for n, cell in enumerate(nb.cells):
        skipped = set(SKIP_TAGS) & set(cell.metadata.get("tags", []))
        if cell.cell_type != "code" or _is_otter_cell(cell.source) or skipped:
            continue
        try:
            exec(compile_tree(parse(cell.source), f"{path.name}[cell {n}]"), env)  # noqa: S102
        except Exception as exc:  # noqa: BLE001 - a failing cell is recorded, the next cells still run
            errors.append(f"cell {n}: {type(exc).__name__}: {exc}")
    return env, errors


def judge_submission(suite: Suite, sub: Submission, status: str, outputs: dict[str, Any],
                     notes: list[str], student_notes: list[str] | None = None,
                     not_run: dict[str, str] | None = None) -> SubmissionResult:
    """One submission's result: its probe outputs (`status`: the executor's Status word for the run) and its checkpoint
    files judged against the suite."""
    cases = judge_outputs(suite, outputs, not_run) + judge_checkpoint(suite, sub.files, sub.file_problems)
    read = suite.checkpoint_cases and reads_checkpoint(suite.checkpoint_files, sub.files) and not sub.file_problems
    notes = [*notes, *(reader_limits_lowered() if read else [])]  # an operator's lower limits, if any
    picked = [sub.picked] if sub.picked else []  # which of several notebooks was graded: both are told
    return SubmissionResult(sub.id, status, cases, [*notes, *picked], [*(student_notes or []), *picked],
                            suite.fingerprint)


def judge_unreadable(suite: Suite, sub: Submission) -> SubmissionResult:
    """The result of a submission that could not be read: nothing ran, its reading problem says why."""
    return judge_submission(suite, sub, Status.UNREADABLE, {}, [sub.problem], [sub.problem])


def judge_exec(suite: Suite, sub: Submission, res: ExecResult) -> SubmissionResult:
    """The result of a submission's sandboxed run."""
    student = named_functions(suite, res.student_notes)  # time limits: the grader's words, the cells' first lines
    student += [f"cells {res.skipped_cells} were not run (tagged for training)"] if res.skipped_cells else []
    result = judge_submission(suite, sub, res.status, res.outputs, res.notes, student, res.not_run)
    if sub.source is not None:  # the first real cause of what failed: a syntax error, a stub left blank
        result.student_notes[:0] = first_causes(suite, sub.source, result.cases, res.notes)
    if res.tampering:
        result.notes.append("tampering: " + "; ".join(res.tampering[:5]))
    return result
