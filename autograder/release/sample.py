"""The sample class: the reference, the blank template, one notebook per catalogued mistake and a few cheats, all
made from the student template (and the notebook the reference fills in, which the tests use too)."""

from __future__ import annotations

import ast
import copy
import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import nbformat

from autograder.authoring.questions import solution_source
from autograder.lesson import Lesson

ANSWER_TAG = "otter_assign_solution_cell"

ADVERSARIAL = {
    "cheat_allclose": "import numpy as np, torch\nnp.allclose = lambda *a, **k: True\n"
                      "torch.allclose = lambda *a, **k: True\nnp.testing.assert_allclose = lambda *a, **k: None",
    "infinite_loop": "while True:\n    pass",
    "sys_exit": "import sys\nsys.exit(0)",
}  # and read_reference: print the reference file, by its path on the grading machine (write_samples)


def defined_names(source: str) -> list[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    return [n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)]


def _strip_markers(source: str) -> str:
    return "\n".join(line for line in source.splitlines()
                     if line.strip() not in ("# BEGIN SOLUTION", "# END SOLUTION"))


def _reference_filled(template: Path, answers: dict[str, str] | None,
                      lesson: Lesson) -> tuple[nbformat.NotebookNode, dict[int, list[str]]]:
    """The student template with every stub replaced by the lesson's reference and the multiple-choice cell filled,
    and the names each replaced cell defines, by cell index."""
    nb = nbformat.read(str(template), as_version=4)
    names_at: dict[int, list[str]] = {}
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or ANSWER_TAG not in cell.metadata.get("tags", []):
            continue
        names = defined_names(cell.source)
        if names:
            cell.source = _strip_markers(solution_source(names, template, "sample", lesson.reference_file))
            names_at[i] = names
        elif answers and any(var in cell.source for var in answers):
            cell.source = "\n".join(f'{k} = "{v}"' for k, v in answers.items())
    return nb, names_at


def _with_extra(filled: nbformat.NotebookNode, names_at: dict[int, list[str]],
                extra: dict[str, str]) -> nbformat.NotebookNode:
    """A copy of a filled notebook with `extra` code appended to the first cell that defines each name."""
    nb, extra = copy.deepcopy(filled), dict(extra)
    for i, names in names_at.items():
        for name in names:
            if name in extra:
                nb.cells[i].source += "\n\n\n" + extra.pop(name)
    return nb


def filled_notebook(template: Path, *, extra: dict[str, str] | None = None,
                    answers: dict[str, str] | None = None, lesson: Lesson) -> nbformat.NotebookNode:
    """The student template with every stub replaced by the lesson's reference (its course's: `course.lesson`, never
    found from the notebook's name); `extra` appends code to the cell
    that defines a name (a catalogued mistake), `answers` fills the multiple-choice cell."""
    nb, names_at = _reference_filled(template, answers, lesson)
    return _with_extra(nb, names_at, extra or {})


def _lowered(value: Any) -> Any:
    """Claims made 10% lower: every float of JSON data times 0.9 (integers, strings and booleans as they are)."""
    if isinstance(value, dict):
        return {k: _lowered(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_lowered(v) for v in value]
    return value * 0.9 if isinstance(value, float) else value


def write_samples(template: Path, dest: Path, *, answers: dict[str, str], lesson: Lesson,
                  checkpoint_files: Sequence[str] = ()) -> list[Path]:
    """Sample class: the reference (a folder with the milestone checkpoint's files, when the lesson declares them
    and has a committed run of them: Lesson.checkpoint_dir), the same with every number its JSON files claim 10%
    lower, the blank template, one per catalogued mistake and a few cheats."""
    checkpoint = lesson.checkpoint_dir
    adversarial = ADVERSARIAL | {"read_reference": f"print(open({str(lesson.reference_file)!r}).read())"}
    dest.mkdir(parents=True, exist_ok=True)
    written = []

    def save(name: str, nb: nbformat.NotebookNode) -> None:
        path = dest / f"{name}.ipynb"
        nbformat.write(nb, str(path))
        written.append(path)

    reference_nb, names_at = _reference_filled(template, answers, lesson)  # filled once: each sample is a copy
    if checkpoint_files and checkpoint.is_dir():
        for name, claims in (("reference", lambda v: v), ("checkpoint_inflated_claims", _lowered)):
            folder = dest / name
            folder.mkdir()
            nbformat.write(copy.deepcopy(reference_nb), str(folder / template.name))
            for file in checkpoint_files:
                if file.endswith(".json"):
                    record = claims(json.loads((checkpoint / file).read_text()))
                    (folder / file).write_text(json.dumps(record, indent=2) + "\n")
                else:
                    shutil.copy(checkpoint / file, folder / file)
            written.append(folder)
    else:
        save("reference", copy.deepcopy(reference_nb))
    save("blank", nbformat.read(str(template), as_version=4))
    for m in lesson.mistakes:
        target = defined_names(m.code)[0]
        save(f"mistake_{m.id}", _with_extra(reference_nb, names_at, {target: m.code}))
    for name, code in adversarial.items():
        nb = copy.deepcopy(reference_nb)
        nb.cells.insert(3, nbformat.v4.new_code_cell(code))
        save(f"adversarial_{name}", nb)
    (dest / "adversarial_not_json.ipynb").write_text("this is not a notebook {")
    written.append(dest / "adversarial_not_json.ipynb")
    return written
