"""TA failure report: a static HTML folder (index, one page per student) and report.csv from a graded batch.

model (students, clusters, stored records), code (notebook cells, AST analysis), compare (expected versus
received), render (pages from templates/ and static/), write (the folder, swapped in atomically), moved (the
compare page: what moved since an earlier run)."""

from autograder.grading.bindings import stub_state
from autograder.report.code import code_cells, code_view, submission_cells, written_answers
from autograder.report.compare import compare, detail, gate_of
from autograder.report.model import (
    UNFINISHED,
    UNRECOGNISED,
    Cluster,
    Student,
    catalogue,
    clusters,
    load_students,
    plain_math,
    record_problem,
)
from autograder.report.render import MANUAL_CSV, SCRIPT, SCRIPT_HASH, checkpoint_table, question_code
from autograder.report.write import MARKER, regrade_command, write_report

__all__ = ["MANUAL_CSV", "MARKER", "SCRIPT", "SCRIPT_HASH", "UNFINISHED", "UNRECOGNISED", "Cluster", "Student",
           "catalogue", "checkpoint_table", "clusters", "code_cells", "code_view", "compare", "detail", "gate_of",
           "load_students", "plain_math", "question_code", "record_problem", "regrade_command",
           "stub_state", "submission_cells", "write_report", "written_answers"]
