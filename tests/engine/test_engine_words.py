"""No knowledge of Lesson 83 in autograder/: its question ids, scheme and model names, titles, cell names and file
names come from the lesson (assignments/, the grading config), never from the engine's code, comments or templates.

Broader than test_lesson.py's token check (the word `lesson83` outside comments): every text file under autograder/
is searched for the words below. Files that other work of issue 22 is still cleaning are listed in
STILL_BEING_CLEANED; each entry must still hold a word, so the list only shrinks.
"""

from __future__ import annotations

import re
from pathlib import Path

from autograder.config import ROOT
from autograder.lesson import Lesson

ENGINE = ROOT / "autograder"
LESSON = "lesson83"

# Path under the repository (a file, or a folder ending in /) -> the work that removes its Lesson-83 words. The
# coordinator removes an entry when that work is merged; an entry whose files hold no word any more fails below.
STILL_BEING_CLEANED = {
}


def lesson_words() -> re.Pattern[str]:
    """One pattern for every word that belongs to Lesson 83: its question ids (read from its question files), the
    milestone's ids (m1_...), its positional-encoding schemes, its model, its title, its course and cell prefixes,
    its checkpoint and corpus file names. `learned` only as a quoted name or an identifier's first part (an
    English verb otherwise)."""
    ids = sorted(Lesson.load(LESSON).kinds, key=len, reverse=True)
    words = [*(rf"\b{re.escape(i)}\b" for i in ids if not i[0].isdigit()), r"\bm1_\w*",
             r"(?i:\b(?:sinusoidal|rope|alibi)\b)", r"""(?i:['"`]learned\b|\blearned_)""", r"(?i:tinycharlm)",
             r"(?i:\blesson[ -]83\b)", r"(?i:usaaio)", r"_l83_", r"milestone\.pt",
             r"(?i:timemachine)"]
    return re.compile("|".join(words))


def found_words(root: Path) -> list[str]:
    """`path:line: word` for every Lesson-83 word in the text files under `root` (paths relative to ROOT)."""
    pattern, out = lesson_words(), []
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            for m in pattern.finditer(line):
                out.append(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{n}: {m.group()}")
    return out


def _cleaned_later(hit: str) -> bool:
    path = hit.split(":", 1)[0]
    return any(path == entry or entry.endswith("/") and path.startswith(entry) for entry in STILL_BEING_CLEANED)


def test_the_engine_holds_no_lesson83_words() -> None:
    found = [hit for hit in found_words(ENGINE) if not _cleaned_later(hit)]
    assert found == [], "Lesson-83 words in autograder/ (take them from the lesson or its config):\n" + \
        "\n".join(found)


def test_every_entry_still_being_cleaned_still_holds_a_word() -> None:
    """An entry whose words are gone (or whose files moved) is removed from STILL_BEING_CLEANED."""
    hits = found_words(ENGINE)
    done = [entry for entry in STILL_BEING_CLEANED
            if not any(h.split(":", 1)[0] == entry or entry.endswith("/") and h.startswith(entry) for h in hits)]
    assert done == [], f"no Lesson-83 word left in {', '.join(done)}: remove them from STILL_BEING_CLEANED"


def test_a_planted_word_is_found_with_its_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "stage.py").write_text('"""A stage."""\n\nEXAMPLE = \'grader.check("q2_sinusoidal_pe")\'\n')
    (tmp_path / "page.html.j2").write_text("<h1>{{ title }}</h1>\n<p>Lesson 83 · failure report</p>\n")
    (tmp_path / "fine.py").write_text('"""The grader learned what the child sent; properties of a lesson; '
                                      'lesson83_checks is the checks module\'s name, LESSON83_SANDBOX a setting."""\n')
    found = found_words(tmp_path)
    assert found == [f"{tmp_path}/page.html.j2:2: Lesson 83", f"{tmp_path}/stage.py:3: q2_sinusoidal_pe"]
    (tmp_path / "fine.py").write_text("SCHEMES = ('learned', 'RoPE')  # milestone.pt\n")
    assert [h.rsplit(": ", 1)[1] for h in found_words(tmp_path) if "fine.py" in h] == ["'learned", "RoPE",
                                                                                        "milestone.pt"]
