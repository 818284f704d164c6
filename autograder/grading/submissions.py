"""Reading a class folder: one submission per entry (notebook, zip or folder), its id, read under the caps."""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import stat
import zipfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, TypeVar

from autograder.config import Submissions
from autograder.model import from_spreadsheet_text
from autograder.sandbox import NotebookError, notebook_cells

MAX_FOLDER_ENTRIES = 10_000  # files and folders looked at inside one student's folder
SKIP_DIRS = frozenset((".ipynb_checkpoints", "__MACOSX"))  # skipped in folders and zips alike
SHOWN_NAMES = 20  # the notebooks a message names, at most (then "and N more")
READ_THREADS = 4  # entries read side by side (a class just copied in is read from the disk, not from memory)
T = TypeVar("T")


class Refused(ValueError):
    """A submission file the grader will not read; the message names the file and says what to do."""


def display_name(name: str) -> str:
    """A file name as readable text: bytes that are not UTF-8 and unprintable characters become escapes."""
    text = os.fsencode(name).decode("utf-8", "backslashreplace")
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def _kind(mode: int) -> str:
    kinds = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
             (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"))
    return next((word for test, word in kinds if test(mode)), "not a regular file")


def _too_big(label: str, size: int, limit: int) -> str:
    return (f"{label} is {size / 2**20:.1f} MiB, over the {limit / 2**20:g} MiB limit (grading_config.yaml, "
            "submissions): remove large outputs or files (Kernel > Restart & Clear Output) and submit again")


@contextmanager
def open_regular(path: Path, *, limit: int, label: str) -> Iterator[BinaryIO]:
    """`path` open for reading when it is a regular file of at most `limit` bytes; anything else is Refused.

    A symbolic link is never followed (O_NOFOLLOW) and a FIFO or device is never waited on (O_NONBLOCK, and the
    type is checked on the open file); the size is checked before a byte is read.
    """
    mode = os.lstat(path).st_mode
    if not stat.S_ISREG(mode):
        raise Refused(f"{label} is {_kind(mode)}, not a regular file; the grader never follows links or opens "
                      "pipes and devices: put the file itself in the submissions folder")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise Refused(f"{label} could not be opened ({exc.strerror}); check that it is a file you can read") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"{label} is {_kind(st.st_mode)}, not a regular file; put the file itself there")
        if st.st_size > limit:
            raise Refused(_too_big(label, st.st_size, limit))
        yield f


def read_regular(path: Path, *, limit: int, label: str) -> bytes:
    """The bytes of a regular file of at most `limit` bytes (see open_regular); never more are read.

    The read asks for the size the file had when it was opened, plus one byte (a file that grew since is read on,
    up to limit + 1): asking for limit + 1 bytes at once would have Python allocate, and give back, a buffer of the
    whole limit for every file (ten times the cost of reading a class's checkpoints)."""
    with open_regular(path, limit=limit, label=label) as f:
        ask = min(os.fstat(f.fileno()).st_size, limit) + 1
        data = f.read(ask)
        if len(data) == ask <= limit:  # it grew since it was opened: read on, as far as the limit allows
            data += f.read(limit + 1 - ask)
    if len(data) > limit:
        raise Refused(_too_big(label, len(data), limit))
    return data


def _read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, *, limit: int, label: str) -> bytes:
    """A zip member of at most `limit` bytes: its declared size is checked, then at most limit + 1 are inflated."""
    if info.file_size > limit:
        raise Refused(_too_big(label, info.file_size, limit))
    with zf.open(info) as member:
        data = member.read(limit + 1)
    if len(data) > limit:
        raise Refused(f"{label} inflates to more than its declared size and over the {limit / 2**20:g} MiB limit; "
                      "zip the files again")
    return data


@dataclass
class Submission:
    """One input: an id, the notebook bytes (or why there are none) and where it came from."""

    id: str
    path: Path  # the notebook or zip the source was read from (the entry itself when there is none)
    source: bytes | None
    problem: str = ""
    files: dict[str, bytes] = field(default_factory=dict)  # the checkpoint's files (Suite.checkpoint_files), if any
    file_problems: list[str] = field(default_factory=list)
    name: str = ""  # the entry's name in the class folder (os.fsdecode: non-UTF-8 bytes are surrogates)
    folder: bool = False
    result_name: str = ""  # its file under results/
    picked: str = ""  # which of several notebooks was graded and which were left (the student is told too)
    notes: list[str] = field(default_factory=list)  # for the TA: what reading the class noticed (a second upload)

    @property
    def raw_name(self) -> bytes:
        return os.fsencode(self.name) + (b"/" if self.folder else b"")


def _attach(sub: Submission, name: str, readers: list[Callable[..., bytes]], where: str, cap: int) -> None:
    """Keep the one file called `name` (read under `cap`), or note why it cannot be used."""
    if len(readers) > 1:
        sub.file_problems.append(f"the {where} holds {len(readers)} files named {name}; keep one")
    elif readers:
        try:
            sub.files[name] = readers[0](limit=cap)
        except Refused as exc:
            sub.file_problems.append(str(exc))


def _names(shown: list[str]) -> str:
    more = len(shown) - SHOWN_NAMES
    return ", ".join(shown[:SHOWN_NAMES]) + (f" and {more} more" if more > 0 else "")


def pick_notebook(notebooks: list[T], *, name: Callable[[T], str], shown: Callable[[T], str], wanted: str,
                  where: str) -> tuple[T, str]:
    """The notebook to grade among those an upload holds (`name`: its path inside the upload, `/`-separated;
    `shown`: how a message names it) and what was chosen, in words ('' when it held one): the only one; else the
    one named `wanted` (the notebook the release hands out), the shallowest when several are; else Refused, naming
    every notebook found."""
    if len(notebooks) == 1:
        return notebooks[0], ""
    if not notebooks:
        raise Refused(f"{where} holds 0 notebooks (.ipynb); submit exactly one")
    named = [n for n in notebooks if wanted and PurePosixPath(name(n)).name == wanted]
    top = min((len(PurePosixPath(name(n)).parts) for n in named), default=0)
    named = [n for n in named if len(PurePosixPath(name(n)).parts) == top]
    if len(named) != 1:
        why = (f"{len(named)} of them are named {wanted} at the same depth" if named else
               f"none is named {wanted}, the notebook the assignment hands out" if wanted else "")
        raise Refused(f"{where} holds {len(notebooks)} notebooks (.ipynb): {_names([shown(n) for n in notebooks])}"
                      f"{'; ' + why if why else ''}: submit exactly one")
    left = [shown(n) for n in notebooks if n is not named[0]]
    return named[0], (f"{where} holds {len(notebooks)} notebooks: graded {shown(named[0])}, the notebook the "
                      f"assignment names; left {_names(left)}")


def _zip_link(info: zipfile.ZipInfo) -> bool:
    return stat.S_ISLNK(info.external_attr >> 16)


def _read_zip(sub: Submission, path: Path, limits: Submissions, files: Sequence[str], notebook: str = "") -> None:
    """The .ipynb inside a zip (its only one, else the one named `notebook`: pick_notebook) and the checkpoint's
    `files` if present, read in memory under the caps; nothing else in the zip (a .OTTER_LOG, a link) is ever
    read."""
    label = display_name(path.name)
    with open_regular(path, limit=limits.cap("zip"), label=label) as f:
        try:
            zf = zipfile.ZipFile(f)
        except zipfile.BadZipFile as exc:
            raise Refused(f"{label} is not a readable zip ({exc}); zip the notebook again") from None
        with zf:
            members = [i for i in zf.infolist() if not i.is_dir() and not _zip_link(i)
                       and not SKIP_DIRS.intersection(PurePosixPath(i.filename).parts[:-1])
                       and not PurePosixPath(i.filename).name.startswith(".")]
            notebooks = [i for i in members if i.filename.endswith(".ipynb")]
            nb, sub.picked = pick_notebook(notebooks, name=lambda i: i.filename, wanted=notebook, where=label,
                                           shown=lambda i: display_name(i.filename))
            sub.source = _read_member(zf, nb, limit=limits.cap("notebook"),
                                      label=f"{label}: {display_name(nb.filename)}")
            for name in files:
                found = [i for i in members if PurePosixPath(i.filename).name == name]
                _attach(sub, name, [partial(_read_member, zf, i, label=f"{label}: {display_name(i.filename)}")
                                    for i in found], "zip", limits.cap("checkpoint"))


def _walk(folder: Path) -> tuple[list[Path], list[tuple[Path, str]]]:
    """Regular files under `folder`, never following a link, and the entries skipped with what they are."""
    files: list[Path] = []
    skipped: list[tuple[Path, str]] = []
    stack, seen = [folder], 0
    while stack:
        with os.scandir(stack.pop()) as it:
            entries = sorted(it, key=lambda e: os.fsencode(e.name))
        for e in entries:
            seen += 1
            if seen > MAX_FOLDER_ENTRIES:
                raise Refused(f"{display_name(folder.name)}/ holds more than {MAX_FOLDER_ENTRIES} files; upload "
                              "the notebook (and the checkpoint files) alone")
            if e.is_dir(follow_symlinks=False):
                if e.name not in SKIP_DIRS:
                    stack.append(Path(e.path))
            elif e.is_file(follow_symlinks=False):
                files.append(Path(e.path))
            else:
                skipped.append((Path(e.path), _kind(e.stat(follow_symlinks=False).st_mode)))
    return sorted(files), skipped


def _read_folder(sub: Submission, limits: Submissions, wanted: Sequence[str], notebook: str = "") -> None:
    """A per-student folder: its notebook (its only one, else the one named `notebook`: pick_notebook), or its one
    zip, and the checkpoint's files (`wanted`) found anywhere in it."""
    folder = sub.path
    files, skipped = _walk(folder)

    def label(p: Path) -> str:
        return f"{display_name(folder.name)}/{display_name(str(p.relative_to(folder)))}"

    notebooks = [p for p in files if p.suffix == ".ipynb" and not p.name.startswith(".")]
    zips = [p for p in files if p.suffix == ".zip" and not p.name.startswith(".")]
    if not notebooks and len(zips) == 1:
        sub.path = zips[0]
        _read_zip(sub, zips[0], limits, wanted, notebook)
        if sub.files or sub.file_problems:
            return  # the zip carried the checkpoint
    else:
        try:
            sub.path, sub.picked = pick_notebook(notebooks, name=lambda p: p.relative_to(folder).as_posix(),
                                                 shown=lambda p: display_name(p.relative_to(folder).as_posix()),
                                                 wanted=notebook, where=f"{display_name(folder.name)}/")
        except Refused as exc:
            why = str(exc)
            if skipped:
                why += "; not read: " + ", ".join(f"{label(p)} ({kind})" for p, kind in skipped[:5])
            raise Refused(why) from None
        sub.source = read_regular(sub.path, limit=limits.cap("notebook"), label=label(sub.path))
    for name in wanted:
        found = [p for p in files if p.name == name]
        _attach(sub, name, [partial(read_regular, p, label=label(p)) for p in found], "folder",
                limits.cap("checkpoint"))
        odd = [(p, kind) for p, kind in skipped if p.name == name]
        if not found and odd:
            sub.file_problems.append(f"{label(odd[0][0])} is {odd[0][1]}, not a regular file; the grader never "
                                     f"follows links: upload {name} itself")


def read_entry(path: Path, *, limits: Submissions | None = None, files: Sequence[str] = (),
               notebook: str = "") -> Submission:
    """One input of a class folder (a notebook, a zip or a per-student folder), read under the caps, with the
    checkpoint's `files` (Suite.checkpoint_files) beside its notebook. A zip or folder holding several notebooks
    is graded on the one named `notebook` (the release's, e.g. NAME.ipynb), and `picked` says so.

    Never raises for anything the input is or holds: why it cannot be graded becomes the Submission's `problem`.
    """
    limits = limits or Submissions()
    label = display_name(path.name)
    sub = Submission(label, path, None, name=path.name)
    try:
        mode = os.lstat(path).st_mode
        if stat.S_ISDIR(mode):
            sub.folder = True
            _read_folder(sub, limits, files, notebook)
        elif not stat.S_ISREG(mode):
            raise Refused(f"{label} is {_kind(mode)}; the grader reads only regular files and folders and never "
                          "follows links: put the notebook itself in the submissions folder")
        elif path.suffix == ".zip":
            _read_zip(sub, path, limits, files, notebook)
        elif path.suffix == ".ipynb":
            sub.source = read_regular(path, limit=limits.cap("notebook"), label=label)
        else:
            raise Refused(f"{label} is not a notebook (.ipynb), a zip or a folder")
    except Refused as exc:
        sub.source, sub.problem = None, str(exc)
    except Exception as exc:  # noqa: BLE001 - whatever goes wrong reading one input is that input's row alone
        sub.source, sub.problem = None, f"{label} could not be read ({type(exc).__name__}: {str(exc)[:300]})"
    return sub


def submission_ids(entries: list[tuple[str, bool]]) -> list[str]:
    """Readable, unique ids for the entries (name, is a folder) of one class folder.

    An entry is known by its stem (`alice` for alice.ipynb or alice.zip, the name of a folder). Entries that
    share one are known by their whole name (`alice.ipynb`, `alice.zip`, `alice/`), and any still shared by
    that name plus `~` and 8 hex digits of the SHA-256 of the raw name. Bytes that are not UTF-8 and
    unprintable characters are written as escapes (`caf\\xe9`). The ids depend only on the names in the folder.
    """
    def form(name: str, folder: bool, level: int) -> str:
        text = display_name(name if folder else PurePosixPath(name).stem) if level == 0 else \
            display_name(name) + ("/" if folder else "")
        return text if level < 2 else f"{text}~{hashlib.sha256(os.fsencode(name)).hexdigest()[:8]}"

    levels = [0] * len(entries)
    while True:
        ids = [form(name, folder, lv) for (name, folder), lv in zip(entries, levels)]
        groups: dict[str, list[int]] = {}
        for i, sid in enumerate(ids):
            groups.setdefault(sid, []).append(i)
        bump = []
        for group in (g for g in groups.values() if len(g) > 1):
            low = min(levels[i] for i in group)  # the entries still known by a shorter form give way first
            bump += [i for i in group if levels[i] == low and low < 2]
        if not bump:
            return ids
        for i in bump:
            levels[i] += 1


_PLAIN_ID = re.compile(r"[a-z0-9_][a-z0-9_.-]{0,99}")


def result_file_name(sid: str, raw_name: bytes) -> str:
    """The file under results/ for a submission: its id when that is a plain lower-case name, else a safe slug
    of the id, `~` and 12 hex digits of the SHA-256 of the raw entry name (never too long, never shared, even on
    a case-insensitive disk)."""
    if _PLAIN_ID.fullmatch(sid) and not sid.endswith("."):
        return f"{sid}.json"
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", sid).strip("._-")[:60] or "submission"
    return f"{slug}~{hashlib.sha256(raw_name).hexdigest()[:12]}.json"


def _entry_names(folder: Path) -> list[str]:
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such folder of submissions")
    with os.scandir(folder) as it:
        return sorted((e.name for e in it if not e.name.startswith(".")), key=os.fsencode)


def class_ids(folder: Path) -> list[tuple[str, str]]:
    """(id, entry name) of every input of the class folder `folder`, as find_submissions names them, from the
    names alone (nothing is read)."""
    names = _entry_names(folder)
    folders = [stat.S_ISDIR(os.lstat(folder / n).st_mode) for n in names]
    return list(zip(submission_ids(list(zip(names, folders))), names))


_BROWSER_COPY = re.compile(r"(.+?) \((\d{1,3})\)")  # "Kim Lee (1)": a browser's name for a second download


def second_uploads(ids: list[str]) -> dict[str, str]:
    """id -> a note for the TA, for each id that reads as a browser's rename of a second download of the same file
    ("Kim Lee (1)" beside "Kim Lee"): is it one student's second upload, graded as another student?"""
    known, notes = set(ids), {}
    for sid in ids:
        m = _BROWSER_COPY.fullmatch(sid)
        if m:
            base = m.group(1)
            notes[sid] = (f"is this a second upload of {base}?" if base in known else
                          f"named like a browser's second download of {base}: rename it if it is {base}'s")
    return notes


def find_submissions(folder: Path, *, limits: Submissions | None = None, files: Sequence[str] = (),
                     notebook: str = "") -> list[Submission]:
    """Every input under `folder`: notebooks, per-student folders, or zips; each becomes exactly one row (with
    the checkpoint's `files` when uploaded; a zip or folder with several notebooks is graded on `notebook`, the
    release's, when it holds one: read_entry).

    Names starting with a dot are not inputs. Nothing is followed out of `folder` (links are refused). A name a
    browser gives a second download ("Kim Lee (1).ipynb") gets a note for the TA (second_uploads).
    """
    names = _entry_names(folder)
    with ThreadPoolExecutor(READ_THREADS) as pool:  # in order, several files at a time (reads wait on the disk)
        subs = list(pool.map(lambda name: read_entry(folder / name, limits=limits, files=files, notebook=notebook),
                             names))
    for sub, sid in zip(subs, submission_ids([(s.name, s.folder) for s in subs])):
        sub.id = sid
        sub.result_name = result_file_name(sid, sub.raw_name)
    seconds = second_uploads([s.id for s in subs])
    for sub in subs:
        if sub.id in seconds:
            sub.notes.append(f"{display_name(sub.name)}{'/' if sub.folder else ''}: {seconds[sub.id]}")
    return subs


def named_ids(values: list[str], entries: list[tuple[str, str]]) -> list[str]:
    """The ids that `--only` values name, among `entries` (id, entry name: class_ids). A value names a student by
    their id as grades.csv writes it (`'=1+1` is the id `=1+1`), else by the id itself, or by the entry's name
    (`bob.ipynb`, `bob/`). A value that names no student whole is split on commas, each part named so
    (`alice,bob`); a value that names a student is never split, so an id holding a comma is named whole, and two
    students whose ids would read as that value are named by giving --only once each. A value or part that names
    no student is kept as it is (the grader then says it is unknown)."""
    by_name = {name: sid for sid, name in entries} | {f"{name}/": sid for sid, name in entries}
    by_name |= {sid: sid for sid, _ in entries}  # an id wins over another entry's name

    def one(text: str) -> str | None:
        return by_name.get(from_spreadsheet_text(text)) or by_name.get(text)

    out: list[str] = []
    for value in values:
        whole = one(value.strip())
        if whole is not None:
            out.append(whole)
            continue
        out += [one(part) or part for part in (p.strip() for p in value.split(",")) if part]
    return list(dict.fromkeys(out))


class OutputInClass(ValueError):
    """An output folder inside the class folder (or the class folder inside it); the message names both."""


def check_out_folder(classes: Path, out: Path, *, what: str = "class folder") -> None:
    """OutputInClass when `out` (where grading writes: results/, feedback/, grades.csv) is `classes` (the students'
    folder, `what`), lies inside it, or holds it: the next run would read the grader's files as students' work,
    and results/ (reference values of hidden cases) would sit among the students' files. Links are resolved
    first; nothing is written."""
    cls, dest = classes.resolve(), out.resolve()
    instead = f"choose another --out, for example --out {shlex.quote(str(cls.parent / (cls.name + '-grades')))}"
    if dest == cls or dest.is_relative_to(cls):
        where = "is" if dest == cls else "is inside"
        raise OutputInClass(f"the output folder {dest} {where} the {what} {cls}: {instead}; nothing was written")
    if cls.is_relative_to(dest):
        raise OutputInClass(f"the {what} {cls} is inside the output folder {dest}: {instead}; nothing was written")


def read_cells(path: Path, *, limits: Submissions | None = None) -> tuple[list[dict[str, Any]], str]:
    """The cells of the notebook an entry holds, read as data only (never run) under the caps, or why there
    are none."""
    sub = read_entry(path, limits=limits)
    if sub.source is None:
        return [], f"the notebook could not be read: {sub.problem}"
    try:
        cells = notebook_cells(sub.source)  # the grader's own decoder: the report reads what grading read
    except NotebookError as exc:
        return [], f"the notebook could not be read: {exc}"
    return [c for c in cells if isinstance(c, dict)], ""
