"""The docs hold for a newcomer who copies their commands (issue 33): every line of a ```bash block in README.md and
docs/*.md runs as written from the repository root after `make demo`, but for the lines NOT_RUN lists, each with
its reason; every path the docs and the shipped files name exists; every engine module is on the layout drawing;
the README's list of student files is the release's.

The slow test copies the working tree into a temporary folder, runs `make demo` there, then each block in a fresh
`bash -eu` at the copy's root, in document order, with the repository's `.venv/bin` off PATH (as in a newcomer's
shell: `make demo` activates nothing)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from autograder.config import ROOT
from autograder.course import course_of

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
VENV_BIN = ROOT / ".venv" / "bin"

# The lines of the docs' bash blocks that this test does not run, each with why. Every other line runs.
NOT_RUN: dict[str, str] = {
    "make demo": "the fixture runs it first (demo_root); every other line runs after it",
    "make test": "the whole suite, this test among them; CI runs it",
    "make check": "the quick tier of the suite; make test runs every test it runs",
    "python3 -m venv lesson83-env": "a student's own environment, from PyPI (network): "
                                    "test_deploy.py::test_student_laptop_setup_runs_the_checks runs these three lines",
    ". lesson83-env/bin/activate": "a student's own environment (see python3 -m venv lesson83-env)",
    "pip install torch==2.13.0 numpy matplotlib otter-grader jupyterlab --extra-index-url "
    "https://download.pytorch.org/whl/cpu": "a student's own environment, from PyPI (see python3 -m venv lesson83-env)",
    "pip install '.[cluster]'": "network; make setup installs the cluster extra into .venv",
    ".venv/bin/dask scheduler --host 127.0.0.1 --port 8786":
        "a cluster (runs until stopped): tests/engine/test_cluster_engine.py starts a scheduler and two such "
        "workers and grades a class on them",
    ".venv/bin/dask worker tcp://127.0.0.1:8786 --nthreads 1 --preload autograder.grading.cluster --memory-limit 0":
        "a cluster worker (runs until stopped): see the scheduler's line",
    ".venv/bin/lesson83 grade dist/samples/ --out dist/grades-cluster/ --cluster tcp://127.0.0.1:8786":
        "needs the scheduler and workers above: tests/engine/test_cluster_engine.py grades on them",
    "python benchmarks/gpu_check.py": "a GPU, on a bare PyTorch image's own python (about 5 minutes on an H200); "
                                      "test_gpu_check.py runs its --smoke mode",
    "python benchmarks/gpu_check.py --smoke": "that image's python: test_gpu_check.py runs it with this one",
    ".venv/bin/lesson83 --lesson courses/lesson84 release":
        "a scaffolded lesson's release (minutes): tests/engine/test_scaffold.py releases and self-checks one",
    ".venv/bin/lesson83 --lesson courses/lesson84 selfcheck":
        "a scaffolded lesson's self-check in the sandbox: tests/engine/test_scaffold.py runs it",
    ".venv/bin/python benchmarks/similarity.py": "a benchmark that fails over its 60 s goal, a timing on a shared "
                                                 "machine: tests/engine/test_similarity_benchmark.py runs it smaller",
}


@dataclass(frozen=True)
class Line:
    """One command line of a bash block (continuation lines joined), where it is and what it runs."""

    doc: Path
    lineno: int
    text: str

    @property
    def command(self) -> str:
        """The line without its trailing comment, its whitespace collapsed (NOT_RUN's key)."""
        return " ".join(re.split(r"\s#\s|\s#$", self.text, maxsplit=1)[0].split())

    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.lineno}"


def bash_blocks(doc: Path) -> list[list[Line]]:
    """The command lines of each ```bash block of `doc` (comment-only and blank lines left out)."""
    blocks: list[list[Line]] = []
    lines = doc.read_text().splitlines()
    n = 0
    while n < len(lines):
        if lines[n].strip() == "```bash":
            block: list[Line] = []
            n += 1
            while lines[n].strip() != "```":
                start, text = n + 1, lines[n].strip()
                while text.endswith("\\"):
                    n += 1
                    text = text[:-1] + " " + lines[n].strip()
                if text and not text.startswith("#"):
                    block.append(Line(doc, start, text))
                n += 1
            blocks.append(block)
        n += 1
    return blocks


def doc_lines() -> list[Line]:
    return [line for doc in DOCS for block in bash_blocks(doc) for line in block]


def newcomer_path() -> str:
    """PATH without this virtual environment's bin (a newcomer's shell after `make demo`)."""
    venv = {VENV_BIN.resolve(), Path(sys.executable).parent.resolve()}
    return os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if p and Path(p).resolve() not in venv)


def test_every_line_not_run_is_in_the_docs_with_its_reason() -> None:
    """NOT_RUN holds no line the docs no longer show (a renamed command would be run, or fail, instead)."""
    shown = {line.command for line in doc_lines()}
    stale = [c for c in NOT_RUN if c not in shown]
    assert not stale, "NOT_RUN lines no doc shows:\n" + "\n".join(stale)
    assert all(reason.strip() for reason in NOT_RUN.values())


def test_every_program_the_docs_call_is_found_from_the_repository_root() -> None:
    """A program the repository's .venv provides is called by its path (`.venv/bin/nbgrader`, or
    `../../.venv/bin/nbgrader` after `cd dist/nbgrader`): `make demo` activates no environment, so a bare
    `nbgrader` is "command not found" in the newcomer's shell (issue 33 finding 5)."""
    path, wrong = newcomer_path(), []
    for doc in DOCS:
        for block in bash_blocks(doc):
            cwd = ROOT
            for line in block:
                for part in re.split(r"&&|\|\||;|\|", line.command):
                    words = [w for w in part.split() if not re.fullmatch(r"[A-Z_]+=\S*", w)]
                    if not words:
                        continue
                    program = words[0]
                    if program == "cd" and len(words) > 1:
                        cwd = Path(os.path.normpath(cwd / words[1]))
                    elif "/" in program and not program.startswith("$"):
                        local = Path(os.path.normpath(cwd / program))
                        if local.is_relative_to(VENV_BIN) and not local.exists():
                            wrong.append(f"{line.where()}: {program} (no such file, from {cwd.relative_to(ROOT)}/)")
                    elif (VENV_BIN / program).is_file() and shutil.which(program, path=path) is None:
                        wrong.append(f"{line.where()}: `{program}` is only in .venv/bin: write .venv/bin/{program} "
                                     f"({line.command})")
    assert not wrong, "\n".join(wrong)


# Path-like names (`autograder/...`, `docs/...`) in the docs and in what ships; placeholders (NAME, <id>, *) skipped.
PATH_NAME = re.compile(r"(?<![\w/.~$-])((?:autograder|docs|tests|assignments|reference|benchmarks|student_templates)"
                       r"/[\w./{},-]*)")
SHIPPED = ("assignments", "reference", "autograder", "student_templates")
TEXT = {".md", ".py", ".yaml", ".json", ".ipynb", ".txt", ".j2", ".toml", ".html", ".css", ".js"}


# Dotted module names (`autograder.grading.cluster`, `autograder.milestone.measure_windows`): a module, or an
# attribute of one.
MODULE_NAME = re.compile(r"(?<![\w.])autograder(?:\.\w+)+")


def is_module(name: str) -> bool:
    parts = name.split(".")
    return any((ROOT.joinpath(*parts[:k]).with_suffix(".py")).is_file() or ROOT.joinpath(*parts[:k]).is_dir()
               for k in (len(parts), len(parts) - 1))


def named_paths() -> list[tuple[Path, str]]:
    files = list(DOCS)
    for folder in SHIPPED:
        files += [p for p in sorted((ROOT / folder).rglob("*"))
                  if p.is_file() and p.suffix in TEXT and "__pycache__" not in p.parts]
    found = []
    for file in files:
        text = file.read_text(errors="replace")
        for match in PATH_NAME.finditer(text):
            name = match.group(1).rstrip(".,")
            if "NAME" not in name and "{" not in name:
                found.append((file, name))
        found += [(file, m.group(0)) for m in MODULE_NAME.finditer(text)]
    return found


def test_every_path_the_docs_and_shipped_files_name_exists() -> None:
    """No stale `autograder/content.py` (now autograder/authoring/content.py), `autograder/judge.py` or
    `autograder.milestone`: every path named in README.md, docs/ and the shipped folders exists, from the
    repository root or from the naming file's own folder (a student's `tests/`), and every dotted module name is
    a module (or an attribute of one)."""
    missing = [f"{file.relative_to(ROOT)}: {name}" for file, name in named_paths()
               if not (is_module(name) if "/" not in name else (ROOT / name).exists() or (file.parent / name).exists())]
    assert not missing, "paths that do not exist:\n" + "\n".join(missing)


def test_the_layout_drawing_names_every_engine_module() -> None:
    """docs/layout.md draws every module of autograder/ by its file name, and names no module that is gone
    (docs/design.md points there for the list; issue 33: it listed `results` and `milestone`, long gone)."""
    drawing = (ROOT / "docs" / "layout.md").read_text()
    modules = {p.name for p in (ROOT / "autograder").rglob("*.py") if p.name != "__init__.py"}
    assert sorted(m for m in modules if m not in drawing) == [], "modules docs/layout.md does not draw"
    drawn = set(re.findall(r"\b(\w+\.py)\b", drawing.split("```")[1]))
    assert sorted(drawn - modules - {"__init__.py"}) == [], "docs/layout.md draws modules that are gone"


def test_design_names_live_modules_and_every_verb_of_the_cli() -> None:
    """docs/design.md's modules are autograder/'s (it listed `results` and `milestone`), and its list of the CLI's
    verbs is the parser's (it omitted `nbgrader-autograde`)."""
    design = (ROOT / "docs" / "design.md").read_text()
    modules = " ".join(design.split("Modules of `autograder/`", 1)[1].split("\n\n", 1)[0].split())
    files = {p.name for p in (ROOT / "autograder").rglob("*.py")}
    assert sorted(set(re.findall(r"`(\w+\.py)`", modules)) - files) == [], "modules design.md names that are gone"
    verbs = set(re.findall(r'sub\.add_parser\("([\w-]+)"', (ROOT / "autograder" / "cli.py").read_text()))
    listed = re.search(r"`lesson83 ([^`]*)`", modules.split("`cli.py`", 1)[1])
    assert listed is not None
    assert {v.split()[0] for v in listed.group(1).split(" | ")} == verbs


def test_pip_keeps_pypi_where_the_docs_add_the_torch_index() -> None:
    """Issue 40, finding 7: the README's student install for Linux added `--index-url …/whl/cpu`, which replaces
    PyPI, so otter-grader could not be found. Every `pip install` the docs show (in a bash block or inline) that
    names PyTorch's index adds it with --extra-index-url, as the Makefile does; the students' block does."""
    wrong = []
    for doc in DOCS:
        text = doc.read_text()
        for match in re.finditer(r"(?<![\w-])--index-url[ =]`?\S*download\.pytorch\.org", text):
            line = text.count("\n", 0, match.start()) + 1
            wrong.append(f"{doc.relative_to(ROOT)}:{line}: {text.splitlines()[line - 1].strip()}")
    assert not wrong, "pip's --index-url hides PyPI (otter-grader, numpy): use --extra-index-url\n" + "\n".join(wrong)
    students = (ROOT / "README.md").read_text().split("\n## For students\n", 1)[1].split("```bash\n", 1)[1]
    pip = next(x for x in students.split("```", 1)[0].splitlines() if x.startswith("pip install"))
    assert "torch==" in pip and "otter-grader" in pip
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in pip
    assert "--extra-index-url $(LESSON83_TORCH_INDEX_URL)" in (ROOT / "Makefile").read_text()


def test_the_readme_stays_a_newcomers_page() -> None:
    """Issue 42, finding 10: the README had grown to 318 lines. It keeps what a newcomer needs first, under 300
    lines, and links the rest in docs/ (each link to a file that exists: test_every_path_the_docs_...)."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 300
    linked = set(re.findall(r"\]\((docs/[\w.-]+\.md)", readme))
    assert {"docs/grading.md", "docs/nbgrader.md", "docs/contributing.md", "docs/authoring.md"} <= linked, linked


def test_the_readme_lists_every_file_students_get() -> None:
    """The README's "Open the notebook" line names every file and folder of the student release (it left out
    checks_runtime.py, which lesson83_checks.py imports): the release folder, and the lesson's shipped files."""
    lesson = course_of().lesson
    readme = (ROOT / "README.md").read_text()
    bullet = readme.split("**Open the notebook:**", 1)[1].split("\n- ", 1)[0]
    named = {n.rstrip("/") for n in re.findall(r"`([\w-]+(?:\.(?:py|ipynb|txt|json|csv)|/))`", bullet)}
    release = {p.name for p in lesson.student_dir.iterdir() if p.name != "__pycache__"}
    assert named == release
    assert {f.name for f in lesson.shipped_files} | {lesson.notebook.name, "tests"} == release


@pytest.fixture(scope="module")
def demo_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the working tree (git's tracked and untracked, not ignored, files) after `make demo`, with the
    repository's .venv linked in. The venv's editable install points at this checkout, so PYTHONPATH puts the
    copy's own package first (what `make demo` in a fresh clone has without it)."""
    if not VENV_BIN.is_dir():
        pytest.fail(f"no {VENV_BIN}: run make setup first")
    root = tmp_path_factory.mktemp("docs") / "repo"
    listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                            check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, root / name)
    (root / ".venv").symlink_to(ROOT / ".venv")
    # -o: the venv is set up already; make must not install into it from the copy
    demo = subprocess.run(["make", "-o", ".venv/.installed", "demo"], cwd=root, capture_output=True, text=True,
                          env=newcomer_env(root), timeout=1800)
    assert demo.returncode == 0, f"make demo:\n{demo.stdout[-3000:]}\n{demo.stderr[-3000:]}"
    return root


def newcomer_env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")}
    return env | {"PATH": newcomer_path(), "PYTHONPATH": str(root)}


@pytest.mark.build
@pytest.mark.sandbox
def test_every_command_in_the_docs_runs_as_written_after_make_demo(demo_root: Path) -> None:
    """Each bash block, but for its NOT_RUN lines, in a fresh `bash -eu -o pipefail` at the root of a checkout
    after `make demo`, README.md first and then docs/ by name (the README's grade, report and merge follow each
    other); every failure is listed, with its block's first line and the end of its output. On today's README
    (issue 33) the nbgrader block failed: `nbgrader: command not found` (exit 127)."""
    failed, without, ran = [], [], set()
    for doc in DOCS:
        for block in bash_blocks(doc):
            run = [line for line in block if line.command not in NOT_RUN]
            script = "\n".join(line.text for line in run)
            if not run or script in ran:  # a block shown twice (README.md and its doc) runs once
                continue
            ran.add(script)
            if re.search(r"^bwrap\b", script, re.M) and shutil.which("bwrap") is None:
                without.append(run[0].where())  # the docs say it needs bubblewrap (as test_deploy.py does)
                continue
            proc = subprocess.run(["bash", "-eu", "-o", "pipefail", "-c", script], cwd=demo_root,
                                  capture_output=True, text=True, env=newcomer_env(demo_root), timeout=1200)
            if proc.returncode != 0:
                failed.append(f"{run[0].where()} (exit {proc.returncode}):\n{script}\n--- output:\n"
                              f"{proc.stdout[-1500:]}\n{proc.stderr[-1500:]}")
    assert failed == [], "\n\n".join(failed)
    if without:
        pytest.skip(f"every other block ran; these need bubblewrap, not installed here: {', '.join(without)}")
