"""Issue 41 item 5: no public pattern matches a hidden case. The weights a hidden case fills are drawn per release
from the course's hidden seed (autograder/authoring/hidden_seed.py), kept beside its grading config and never
shipped to students; the Otter zip's static hidden cases and the Gradescope bundle grade with the same draw; and a
value case's closeness (`within:`) never pays a LearnedPE that ignores its own table."""

from __future__ import annotations

import re
import shutil
import stat
import zipfile
from pathlib import Path

import pytest

from autograder.authoring.hidden_seed import course_seed, drawn, read_seed, seed_file, write_seed
from autograder.authoring.questions import ContentError, load_questions
from autograder.authoring.suite import Suite, reference_env
from autograder.config import ROOT, ConfigError
from autograder.course import Course
from autograder.grading.judge import grade_namespace

CONFIG = ROOT / "grading_config.yaml"
Q4_HIDDEN = "q4_learned_pe/hidden_full_length"


def _course(folder: Path) -> Course:
    """A course of its own (a copy of the package's grading config in `folder`) over the package's lesson."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(CONFIG, folder / "grading_config.yaml")
    return Course.load(folder / "grading_config.yaml")


def _authored(suite: Suite) -> dict[str, dict]:
    """Each case's arguments as the question files write them (no seed)."""
    return {c.id: c.args for q in load_questions(suite.config, suite.lesson) for c in q.cases}


def test_a_course_draws_its_hidden_seed_once_and_every_reader_gets_the_same_draw(tmp_path: Path) -> None:
    course = _course(tmp_path / "a")
    path = seed_file(course.path)
    assert not path.exists()
    suite = course.suite
    assert path.is_file() and stat.S_IMODE(path.stat().st_mode) == 0o600  # closed to the job's uid
    seed = read_seed(path)
    authored = _authored(suite)
    args = {c.id: c.args for c in suite.cases}
    drawing = {c.id for c in suite.cases if c.args != authored[c.id]}
    # Q4's hidden fill, the chosen tables of Q3's and Q4's hidden storage cases, M1's hidden weight fills
    assert Q4_HIDDEN in drawing and len(drawing) >= 15
    assert all(c.hidden for c in suite.cases if c.id in drawing)  # a public case keeps its fixed fill
    assert args[Q4_HIDDEN]["fill"] == drawn(seed, Q4_HIDDEN, "fill") != authored[Q4_HIDDEN]["fill"]
    assert args["q4_learned_pe/forward_adds_rows"]["arange_weights"] is True
    again = Course.load(course.path).suite  # another process of the same course: a grader, a worker, a resume
    assert {c.id: c.args for c in again.cases} == args and again.fingerprint == suite.fingerprint
    assert read_seed(path) == seed


def test_another_seed_draws_other_hidden_arguments_and_another_fingerprint(tmp_path: Path) -> None:
    """A new term's seed (`release --new-seed`) changes every drawn argument, and so the suite's fingerprint:
    results stored under the old draw are graded again, never reused."""
    course = _course(tmp_path / "a")
    first = course.suite
    old = read_seed(seed_file(course.path))
    new = course_seed(course.path, fresh=True)
    assert new != old and read_seed(seed_file(course.path)) == new
    second = Course.load(course.path).suite
    changed = {c.id for c, d in zip(first.cases, second.cases, strict=True) if c.args != d.args}
    assert Q4_HIDDEN in changed and all(c.hidden for c in second.cases if c.id in changed)
    assert second.fingerprint != first.fingerprint


def test_release_new_seed_draws_before_the_build_reads_the_suite(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """`release --new-seed` (a new term) draws the seed before the build reads the cases: what it ships holds the
    new draws; a plain `release` keeps the seed."""
    from autograder import cli
    from autograder.release import Release

    course = _course(tmp_path / "a")
    old = course_seed(course.path)
    built: list[dict] = []

    def fake_release(*, course: Course, say: object) -> Release:
        built.append({c.id: c.args for c in course.suite.cases})
        return Release(*(tmp_path / n for n in ("s", "g.zip", "o.zip", "o", "n")))

    monkeypatch.setattr(cli, "release", fake_release)
    assert cli.main(["--config", str(course.path), "release"]) == 0
    assert read_seed(seed_file(course.path)) == old
    assert cli.main(["--config", str(course.path), "release", "--new-seed"]) == 0
    new = read_seed(seed_file(course.path))
    assert new != old
    assert built[0][Q4_HIDDEN]["fill"] == drawn(old, Q4_HIDDEN, "fill")
    assert built[1][Q4_HIDDEN]["fill"] == drawn(new, Q4_HIDDEN, "fill")


def test_two_processes_drawing_at_once_keep_one_seed(tmp_path: Path) -> None:
    path = tmp_path / "grading_config.hidden_seed"
    assert write_seed(path, 11) == 11
    assert write_seed(path, 22) == 11  # the second writer finds the first's and keeps it
    assert read_seed(path) == 11
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left behind
    path.write_text("# a comment\nnot a number\n")
    with pytest.raises(ConfigError, match="one integer"):
        read_seed(path)


def test_a_seed_that_cannot_be_written_is_named(tmp_path: Path) -> None:
    """A course folder nobody may write to (here: not a folder at all, which stops root too) has its seed copied
    beside the config from the release, or released where it can be written: the error says so."""
    (tmp_path / "course").write_text("")
    with pytest.raises(ConfigError, match="cannot be written here") as info:
        course_seed(tmp_path / "course" / "grading_config.yaml")
    assert "release" in str(info.value) and "grading_config.hidden_seed" in str(info.value)


def _assignments(tmp_path: Path, course: Course) -> Path:
    dest = tmp_path / "assignments"
    shutil.copytree(course.lesson.assignment_dir, dest)
    return dest


@pytest.mark.parametrize(("old", "new", "words"), [
    ("    args: {cls: LearnedPE, args: [10, 8], x_shape: [2, 6, 8], seed: 4, arange_weights: true}\n",
     "    args: {cls: LearnedPE, args: [10, 8], x_shape: [2, 6, 8], seed: 4, arange_weights: true}\n"
     "    drawn: [seed]\n", "hidden cases only"),
    ("    drawn: [fill]\n", "    drawn: [cls]\n", "'cls' is not one"),
    ("    drawn: [fill]\n", "    drawn: [nothing]\n", "'nothing' is not one"),
])
def test_only_a_hidden_case_draws_and_only_integer_arguments(tmp_path: Path, course: Course, old: str, new: str,
                                                            words: str) -> None:
    src = _assignments(tmp_path, course)
    q4 = src / "q4_learned_pe.md"
    assert old in q4.read_text()
    q4.write_text(q4.read_text().replace(old, new, 1))
    with pytest.raises(ContentError) as info:
        load_questions(course.config, course.lesson, src, seed=lambda: 1)
    assert "q4_learned_pe.md" in str(info.value) and words in str(info.value)


def test_the_hidden_fill_differs_from_release_to_release(suite: Suite) -> None:
    """Values the hidden LearnedPE case expects under one seed are not those of another: a table learned from
    one release's grades, or hard-coded from a leaked zip, matches no other release."""
    case = next(c for c in suite.cases if c.id == Q4_HIDDEN)
    env = reference_env(suite)
    outputs = [suite.lesson.checks.run_probe(dict(env), case.probe, case.args | {"fill": drawn(s, case.id, "fill")})
               for s in (1, 2)]
    assert outputs[0]["value"].shape == outputs[1]["value"].shape
    assert abs(outputs[0]["value"] - outputs[1]["value"]).max() > 0.1


def test_the_seed_and_its_draws_reach_no_student_file(fresh_build: dict[str, Path], course: Course,
                                                     suite: Suite) -> None:
    """The student release, Otter's student folder and the nbgrader release hold neither the seed nor a drawn
    argument; the grader-only outputs grade with the draw: the Otter zip's static hidden case carries the drawn
    fill and the expected values the grader computed with it, and the Gradescope bundle carries the seed file
    beside its config (mode 0600)."""
    seed = read_seed(seed_file(course.path))
    authored = _authored(suite)
    values = {str(v) for c in suite.cases for k, v in c.args.items() if c.hidden and v != authored[c.id][k]}
    assert len(values) >= 15
    roots = [ROOT / "student_templates" / "lesson83", fresh_build["student"], fresh_build["otter"] / "student",
             fresh_build["nbgrader"] / "release"]
    files = [p for r in roots for p in r.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    assert len(files) > 10
    for f in files:
        text = f.read_bytes().decode("utf-8", "replace")
        assert str(seed) not in text and f"{seed:x}" not in text, f
        numbers = set(re.findall(r"\d{6,}", text))
        assert not numbers & values, (f, numbers & values)
    (otter_zip,) = (fresh_build["otter"] / "autograder").glob("*.zip")
    with zipfile.ZipFile(otter_zip) as zf:
        test = zf.read("tests/q4_learned_pe.py").decode()
    case = next(c for c in suite.cases if c.id == Q4_HIDDEN)
    assert f'"fill":{case.args["fill"]}' in test.replace(" ", "")
    assert str(seed) not in test
    from autograder.release.gradescope import gradescope_bundle

    bundle = gradescope_bundle(fresh_build["student"].parent / "gs.zip", course=course)
    with zipfile.ZipFile(bundle) as zf:
        info = zf.getinfo("lesson83/grading_config.hidden_seed")
        assert stat.S_IMODE(info.external_attr >> 16) == 0o600
        assert read_seed_text(zf.read(info).decode()) == seed


def read_seed_text(text: str) -> int:
    return int(next(line for line in text.splitlines() if line.strip() and not line.startswith("#")))


# --------------------------------------------------------------------------- a LearnedPE that ignores its table

IGNORES_TABLE = {
    # the public ramp the visible case fills the table with, added without reading the table
    "public_ramp": '''
class LearnedPE(nn.Module):
    def __init__(self, max_len, d_model):
        super().__init__()
        self.max_len = max_len
        self.table = nn.Embedding(max_len, d_model)

    def forward(self, x):
        T, d = x.shape[1], x.shape[2]
        if T > self.max_len:
            raise ValueError(f"sequence length {T} is longer than max_len={self.max_len}")
        ramp = torch.arange(self.max_len * d, dtype=x.dtype, device=x.device).reshape(self.max_len, d)
        return x + ramp[:T] / (self.max_len * d)
''',
    # x + t / T: no table at all, within the declared closeness of 0.2 of the reference on the hidden case
    "own_ramp": '''
class LearnedPE(nn.Module):
    def __init__(self, max_len, d_model):
        super().__init__()
        self.max_len = max_len
        self.table = nn.Embedding(max_len, d_model)

    def forward(self, x):
        T = x.shape[1]
        if T > self.max_len:
            raise ValueError(f"sequence length {T} is longer than max_len={self.max_len}")
        return x + (torch.arange(T, dtype=x.dtype, device=x.device) / T)[:, None]
''',
}
HONEST = {
    "lookup": '''
class LearnedPE(nn.Module):
    def __init__(self, max_len, d_model):
        super().__init__()
        self.max_len = max_len
        self.pos = nn.Embedding(max_len, d_model)

    def forward(self, x):
        T = x.size(1)
        if T > self.max_len:
            raise ValueError(f"T={T} exceeds max_len={self.max_len}")
        return x + self.pos(torch.arange(T, device=x.device))
''',
    "weight_slice_unsqueeze": '''
class LearnedPE(nn.Module):
    def __init__(self, max_len, d_model):
        super().__init__()
        self.max_len, self.emb = max_len, nn.Embedding(max_len, d_model)

    def forward(self, x):
        if x.shape[1] > self.max_len:
            raise ValueError(f"{x.shape[1]} positions but max_len is {self.max_len}")
        return x + self.emb.weight[: x.shape[1]].unsqueeze(0)
''',
}


def _q4(suite: Suite, code: str, name: str) -> tuple[float, dict[str, float]]:
    env = reference_env(suite)
    exec(code, env)  # noqa: S102
    result = grade_namespace(suite, env, name=name)
    return result.question_scores()["q4_learned_pe"], {c.id: c.points for c in result.cases
                                                      if c.question == "q4_learned_pe" and c.points}


@pytest.mark.parametrize("name", sorted(IGNORES_TABLE))
def test_a_learned_pe_that_ignores_its_table_earns_nothing(suite: Suite, name: str) -> None:
    """Issue 41 finding 5: the public ramp earned 6.22 of 8 (every value case), x + t / T 3.56 through
    `within: 0.2`. A value case's output must move when the module's own nn.Embedding changes (`moved`), and the
    hidden case fills it from the seed: both earn nothing on Q4."""
    score, paid = _q4(suite, IGNORES_TABLE[name], name)
    assert score == 0, paid


@pytest.mark.parametrize("name", sorted(HONEST))
def test_an_honest_learned_pe_keeps_full_marks(suite: Suite, name: str) -> None:
    score, _ = _q4(suite, HONEST[name], name)
    assert score == suite.config.questions["q4_learned_pe"].points
