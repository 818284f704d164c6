"""Start a new lesson from the template folder beside this module: `python -m autograder.authoring.scaffold NAME DIR`.

The template (autograder/authoring/lesson_template/) is a course folder for one small torch lesson: a grading
config, an intro, a function question, a multiple-choice question, a checks module on the engine's kit, a reference
and a catalogue of mistakes. Every file name and text holds __LESSON__ where the lesson's name goes; a file's
`.tmpl` suffix (which keeps the engine's linters off the template) is dropped. docs/authoring.md explains each file.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from autograder import COMMAND
from autograder.lesson import NAME

TEMPLATE = Path(__file__).resolve().parent / "lesson_template"
PLACEHOLDER = "__LESSON__"


def scaffold(name: str, *, into: Path) -> Path:
    """Write the template for lesson `name` into the folder `into` (created; it must not hold a grading config) and
    return the new grading_config.yaml."""
    if not NAME.match(name):
        raise ValueError(f"lesson name {name!r}: lower-case letters, digits and _, starting with a letter")
    if (into / "grading_config.yaml").exists():
        raise FileExistsError(f"{into / 'grading_config.yaml'} exists: scaffold a new lesson into a new folder")
    for source in sorted(p for p in TEMPLATE.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        rel = str(source.relative_to(TEMPLATE)).replace(PLACEHOLDER, name).removesuffix(".tmpl")
        target = into / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(source.read_text().replace(PLACEHOLDER, name))
    return into / "grading_config.yaml"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m autograder.authoring.scaffold", description=__doc__)
    parser.add_argument("name", help="the lesson's name (assignment:), e.g. lesson84")
    parser.add_argument("folder", type=Path, help="the new course folder")
    args = parser.parse_args(argv)
    config = scaffold(args.name, into=args.folder)
    print(f"new lesson {args.name}: {config}\nnext: {COMMAND} --lesson {config.parent} release, then selfcheck")


if __name__ == "__main__":
    main()
