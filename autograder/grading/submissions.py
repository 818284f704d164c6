"""Reading a class folder: one submission per entry (notebook, zip or folder), its id, read under the caps."""

from __future__ import annotations

import hashlib
import os
import re
import stat
import zipfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

from autograder.config import Submissions
from autograder.sandbox import NotebookError, notebook_cells

MAX_FOLDER_ENTRIES = 10_000  # files and folders looked at inside one student's folder
SKIP_DIRS = frozenset((".ipynb_checkpoints", "__MACOSX"))  # skipped in folders and zips alike


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
    """The bytes of a regular file of at most `limit` bytes (see open_regular); never more are read."""
    with open_regular(path, limit=limit, label=label) as f:
        data = f.read(limit + 1)
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


def _zip_link(info: zipfile.ZipInfo) -> bool:
    return stat.S_ISLNK(info.external_attr >> 16)


def _read_zip(sub: Submission, path: Path, limits: Submissions, files: Sequence[str]) -> None:
    """The one .ipynb inside a zip (and the checkpoint's `files` if present), read in memory under the caps; nothing
    else in the zip (a .OTTER_LOG, a link) is ever read."""
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
            if len(notebooks) != 1:
                raise Refused(f"{label} holds {len(notebooks)} notebooks (.ipynb); upload a zip with exactly one")
            nb = notebooks[0]
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


def _read_folder(sub: Submission, limits: Submissions, wanted: Sequence[str]) -> None:
    """A per-student folder: its one notebook (or one zip), and the checkpoint's files (`wanted`) found anywhere in
    it."""
    folder = sub.path
    files, skipped = _walk(folder)

    def label(p: Path) -> str:
        return f"{display_name(folder.name)}/{display_name(str(p.relative_to(folder)))}"

    notebooks = [p for p in files if p.suffix == ".ipynb" and not p.name.startswith(".")]
    zips = [p for p in files if p.suffix == ".zip" and not p.name.startswith(".")]
    if len(notebooks) == 1:
        sub.path = notebooks[0]
        sub.source = read_regular(notebooks[0], limit=limits.cap("notebook"), label=label(notebooks[0]))
    elif not notebooks and len(zips) == 1:
        sub.path = zips[0]
        _read_zip(sub, zips[0], limits, wanted)
        if sub.files or sub.file_problems:
            return  # the zip carried the checkpoint
    else:
        why = f"{display_name(folder.name)}/ holds {len(notebooks)} notebooks (.ipynb); submit exactly one"
        if skipped:
            why += "; not read: " + ", ".join(f"{label(p)} ({kind})" for p, kind in skipped[:5])
        raise Refused(why)
    for name in wanted:
        found = [p for p in files if p.name == name]
        _attach(sub, name, [partial(read_regular, p, label=label(p)) for p in found], "folder",
                limits.cap("checkpoint"))
        odd = [(p, kind) for p, kind in skipped if p.name == name]
        if not found and odd:
            sub.file_problems.append(f"{label(odd[0][0])} is {odd[0][1]}, not a regular file; the grader never "
                                     f"follows links: upload {name} itself")


def read_entry(path: Path, *, limits: Submissions | None = None, files: Sequence[str] = ()) -> Submission:
    """One input of a class folder (a notebook, a zip or a per-student folder), read under the caps, with the
    checkpoint's `files` (Suite.checkpoint_files) beside its notebook.

    Never raises for anything the input is or holds: why it cannot be graded becomes the Submission's `problem`.
    """
    limits = limits or Submissions()
    label = display_name(path.name)
    sub = Submission(label, path, None, name=path.name)
    try:
        mode = os.lstat(path).st_mode
        if stat.S_ISDIR(mode):
            sub.folder = True
            _read_folder(sub, limits, files)
        elif not stat.S_ISREG(mode):
            raise Refused(f"{label} is {_kind(mode)}; the grader reads only regular files and folders and never "
                          "follows links: put the notebook itself in the submissions folder")
        elif path.suffix == ".zip":
            _read_zip(sub, path, limits, files)
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


def find_submissions(folder: Path, *, limits: Submissions | None = None,
                     files: Sequence[str] = ()) -> list[Submission]:
    """Every input under `folder`: notebooks, per-student folders, or zips; each becomes exactly one row (with
    the checkpoint's `files` when uploaded).

    Names starting with a dot are not inputs. Nothing is followed out of `folder` (links are refused).
    """
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such folder of submissions")
    with os.scandir(folder) as it:
        names = sorted((e.name for e in it if not e.name.startswith(".")), key=os.fsencode)
    subs = [read_entry(folder / name, limits=limits, files=files) for name in names]
    for sub, sid in zip(subs, submission_ids([(s.name, s.folder) for s in subs])):
        sub.id = sid
        sub.result_name = result_file_name(sid, sub.raw_name)
    return subs


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
