"""The Gradescope target: a zip that grades with this package's own engine (run_autograder, setup.sh and the
pinned requirements it installs, the engine and the lesson's sources)."""

from __future__ import annotations

import zipfile
from pathlib import Path

from autograder.authoring.compiled import COMPILED_DIR, COMPILED_FILE
from autograder.authoring.hidden_seed import seed_file
from autograder.authoring.suite import compile_suite
from autograder.config import ROOT
from autograder.course import Course
from autograder.release.common import TORCH_INDEX_URL, TORCH_VERSION


def gradescope_zip(name: str) -> str:
    return f"{name}-gradescope-autograder.zip"

BUNDLE_FILES = ("pyproject.toml", "grading_config.yaml")

# Never in the bundle: documentation and what only the repository's own tests use (the mutation suite's variants).
BUNDLE_SKIP = ("README.md", "variants.py")

BUNDLE_DIRS = ("autograder", "reference", "assignments")


# Gradescope: setup.sh builds this virtual environment once, when Gradescope builds the image; run_autograder
# grades with its python. It holds the pinned packages below and nothing of this package (which runs from
# /autograder/source/lesson83), so the sandbox, which must show the interpreter's folder, shows no reference/.
def gradescope_venv(name: str) -> str:
    return f"/autograder/{name}-venv"

GRADESCOPE_VENV = "/autograder/<lesson>-venv"  # gradescope_venv(name), for the comments below

# What the engine imports when it grades, pinned; pip adds their own dependencies. numpy 2.3+ and IPython 9
# need Python 3.11.
GRADESCOPE_REQUIREMENTS = f"""\
# Installed by setup.sh into {GRADESCOPE_VENV} (torch first, from the CPU index), then `pip freeze` is printed.
torch=={TORCH_VERSION}
numpy==2.2.6 ; python_version < "3.11"
numpy==2.4.6 ; python_version >= "3.11"
pydantic==2.14.4
PyYAML==6.0.4
Jinja2==3.1.6
nbformat==5.11.1
ipython==8.39.0 ; python_version < "3.11"
ipython==9.18.1 ; python_version >= "3.11"
matplotlib==3.10.9
"""


def run_autograder(name: str) -> str:
    """The bundle's run_autograder for lesson `name`."""
    GRADESCOPE_VENV = gradescope_venv(name)
    return f"""#!/usr/bin/env bash
# Gradescope entry point: grade /autograder/submission with the {name} engine (sandboxed, judged outside),
# with the python of the virtual environment that setup.sh built.
# Student code runs in bubblewrap where it can start; otherwise (or with LESSON83_SANDBOX=none) as an
# unprivileged uid that may read only what any user may. So, as Gradescope advises, the source (reference/,
# the hidden cases) and the results are closed to other users; /autograder and the venv stay open to them.
set -euo pipefail
mkdir -p /autograder/results
chmod o+rx /autograder
chmod o= /autograder/source /autograder/results
cd /autograder/source/{name}
python={GRADESCOPE_VENV}/bin/python
[ -x "$python" ] || python=python3  # no setup.sh (gradescope-sim): the caller's environment stands in
exec "$python" -m autograder.cli gradescope /autograder/submission /autograder/results/results.json
"""


def setup_sh(name: str) -> str:
    """The bundle's setup.sh for lesson `name`."""
    GRADESCOPE_VENV = gradescope_venv(name)
    return f"""#!/usr/bin/env bash
# Gradescope image set-up (runs once, as root, when Gradescope builds the image; Ubuntu 22.04 or 24.04).
# Installs into a virtual environment of its own, {GRADESCOPE_VENV}, made with the system python3 (3.10 or
# newer), never into the system Python (Ubuntu 24.04 refuses that: PEP 668):
#   1. apt: bubblewrap (the grader's sandbox) and python3-venv;
#   2. torch=={TORCH_VERSION}, the CPU build, from LESSON83_TORCH_INDEX_URL (default {TORCH_INDEX_URL};
#      set it empty to use pip's own index);
#   3. the pinned packages of requirements.txt (beside this file).
# This package itself is not installed: run_autograder runs it from /autograder/source/{name}.
# The environment is left readable by every user: without bubblewrap, student code runs from it as an
# unprivileged uid (where that uid could not read it, student code would run as root; the results say which).
# LESSON83_SKIP_APT=1 skips step 1 (for images that already have both packages, and for tests).
set -euo pipefail
umask 022
cd "$(dirname "$0")"
venv={GRADESCOPE_VENV}
torch_index=${{LESSON83_TORCH_INDEX_URL-{TORCH_INDEX_URL}}}
if [ "${{LESSON83_SKIP_APT:-0}}" != 1 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap python3-venv
fi
python3 -c 'import sys; assert sys.version_info >= (3, 10), "{name} needs Python 3.10 or newer"'
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet torch=={TORCH_VERSION} ${{torch_index:+--index-url "$torch_index"}}
"$venv/bin/python" -m pip install --quiet -r requirements.txt
chmod -R o+rX "$venv"
echo "{name}: installed in $venv ($("$venv/bin/python" --version)):"
"$venv/bin/python" -m pip freeze
"""


def gradescope_bundle(dest: Path, *, course: Course) -> Path:
    """A Gradescope autograder zip that grades with this package's own engine (not `otter run`): the engine
    from this package's folder, the course's lesson's sources and its config (as grading_config.yaml) from its
    course folder, with the course's hidden seed beside it when the course has one (the hidden cases' drawn
    arguments: autograder/authoring/hidden_seed.py), all under NAME/; and the compiled suite (NAME/compiled/:
    autograder/authoring/compiled.py), so that an upload reads no question file and computes no expected value
    (graders only: hidden from the sandbox as reference/ is)."""
    lesson = course.lesson
    name = lesson.name
    uploads = set(course.suite.checkpoint_files)  # the reference run's own files: the sample class's

    def wanted(path: Path) -> bool:
        """A lesson file the grader reads: the reference run's checkpoint files stay out (the grader's data beside
        them, such as the reference's per-window losses, goes in)."""
        return (path.is_file() and "__pycache__" not in path.parts and path.name not in BUNDLE_SKIP
                and not (lesson.checkpoint_dir in path.parents and path.name in uploads))

    def add(zf: zipfile.ZipFile, data: Path | bytes, arcname: str, mode: int = 0o644) -> None:
        info = zipfile.ZipInfo(arcname, date_time=(2026, 1, 1, 0, 0, 0))
        info.external_attr = mode << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        zf.writestr(info, data.read_bytes() if isinstance(data, Path) else data)

    dest.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(dest, "w") as zf:
        add(zf, run_autograder(name).encode(), "run_autograder", 0o755)
        add(zf, setup_sh(name).encode(), "setup.sh", 0o755)
        add(zf, GRADESCOPE_REQUIREMENTS.encode(), "requirements.txt")
        add(zf, compile_suite(course.suite), f"{name}/{COMPILED_DIR}/{COMPILED_FILE}")
        for file in BUNDLE_FILES:
            add(zf, course.path if file == "grading_config.yaml" else ROOT / file, f"{name}/{file}")
        seed = seed_file(course.path)
        if seed.is_file():  # the course's hidden seed, beside its config as the grader looks for it (grader-only)
            add(zf, seed, f"{name}/{seed_file(Path('grading_config.yaml')).name}", 0o600)
        for folder in BUNDLE_DIRS:
            root = ROOT if folder == "autograder" else lesson.root
            for path in sorted((root / folder).rglob("*")):
                if wanted(path):
                    add(zf, path, f"{name}/{path.relative_to(root)}")
    return dest
