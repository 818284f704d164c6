"""What an nbgrader course holds that no build made (submissions, autograded and feedback folders, the gradebook's
students and submissions), read without changing anything, and the `make clean` that keeps such a course.

Standard library only: `make clean` runs this file as a script, with or without the project's environment
(`python3 autograder/release/keep.py dist`).
"""

from __future__ import annotations

import shutil
import sqlite3
import sys
from pathlib import Path

WORK_FOLDERS = ("submitted", "autograded", "feedback")  # what students and graders put in a course
GRADEBOOK = "gradebook.db"
GRADES_SUFFIX = "-grades"  # `nbgrader-autograde`'s default grades folder: COURSE-grades beside the course


def _query(db: Path, sql: str, *args: str) -> list[tuple]:
    """Rows of a read-only query of an nbgrader gradebook; [] where it has no such table (an empty database)."""
    if not db.is_file():
        return []
    con = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return con.execute(sql, args).fetchall()
    except sqlite3.OperationalError:
        return []
    finally:
        con.close()


def course_work(course: Path) -> list[str]:
    """What the course folder holds that a grader or student made, in words ([] for a course as built)."""
    held = []
    for name in WORK_FOLDERS:
        folder = course / name
        students = [p for p in folder.iterdir() if not p.name.startswith(".")] if folder.is_dir() else []
        if students:
            held.append(f"{name}/ ({len(students)} student{'s' * (len(students) != 1)})")
    db = course / GRADEBOOK
    students = _query(db, "select count(*) from student")
    submissions = _query(db, "select count(*) from submitted_assignment")
    counts = [f"{rows[0][0]} {what}" for rows, what in ((students, "students"), (submissions, "submissions"))
              if rows and rows[0][0]]
    if counts:
        held.append(f"{GRADEBOOK} ({', '.join(counts)})")
    return held


def submissions_of(course: Path, assignment: str) -> list[str]:
    """The students with work on `assignment` in the course: a submitted/, autograded/ or feedback/ folder or a
    submission in the gradebook."""
    students = {p.parent.name for name in WORK_FOLDERS for p in (course / name).glob(f"*/{assignment}")}
    students |= {row[0] for row in _query(
        course / GRADEBOOK, "select s.student_id from submitted_assignment s join assignment a "
        "on a.id = s.assignment_id where a.name = ?", assignment)}
    return sorted(students)


def gradebook_cells(course: Path, assignment: str) -> dict[str, float] | None:
    """The grade cells (grade id -> points) the gradebook holds for the assignment's notebook of the same name, or
    None where it holds none."""
    rows = _query(course / GRADEBOOK,
                  "select b.name, g.max_score from grade_cells g join base_cell b on b.id = g.id "
                  "join notebook n on n.id = b.notebook_id join assignment a on a.id = n.assignment_id "
                  "where a.name = ? and n.name = ?", assignment, assignment)
    return {name: float(points) for name, points in rows} or None


def kept_courses(dist: Path) -> dict[Path, str]:
    """The nbgrader courses directly in `dist` that hold work, and the grades folder of each where there is one:
    path -> why it is kept."""
    kept = {}
    for course in sorted(dist.iterdir()) if dist.is_dir() else ():
        work = course_work(course) if course.is_dir() and (course / "nbgrader_config.py").is_file() else []
        if work:
            kept[course] = ", ".join(work)
            grades = course.with_name(course.name + GRADES_SUFFIX)
            if grades.exists():
                kept[grades] = f"the grades of {course.name}/"
    return kept


def clean(dist: Path) -> dict[Path, str]:
    """Delete what the builds wrote in `dist`, but keep each nbgrader course that holds work and its grades folder;
    returns what was kept, and why."""
    kept = kept_courses(dist)
    if not kept:
        shutil.rmtree(dist, ignore_errors=True)
        return {}
    for path in dist.iterdir():
        if path not in kept:
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    return kept


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: keep.py DIST  (delete DIST but the nbgrader courses that hold work)", file=sys.stderr)
        return 2
    for path, why in clean(Path(argv[0])).items():
        print(f"kept {path}: {why}. Delete it yourself to start the course afresh.")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
