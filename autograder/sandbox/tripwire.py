"""The child's run-time tripwire: a CPython audit hook (PEP 578) that refuses the reach events raised from student code
(frames, gc, ctypes, code objects, a second hook) and reports each one to the grader at once."""

from __future__ import annotations

import os
import sys
import sysconfig
from _thread import get_ident
from collections.abc import Callable, Iterable
from types import FunctionType
from typing import Any

MAX_TRIPS = 50  # records a run reports (and the grader keeps); every event past them is refused all the same
REFUSED = "refused by the grader"
CELL_PREFIX = "<ipython-input-"  # how IPython names the code of a cell it compiles (its CachingCompiler)

# event -> how it is judged (`_judge`'s verdict); every other event returns at the first dict lookup
_EVENTS = {
    "sys._getframe": "frame", "sys._current_frames": "frame", "sys._current_exceptions": "frame",
    "object.__getattr__": "attr", "object.__setattr__": "setattr", "object.__delattr__": "setattr",
    "gc.get_referrers": "direct", "gc.get_referents": "direct", "gc.get_objects": "direct",
    "code.__new__": "direct", "function.__new__": "direct", "marshal.loads": "direct", "marshal.load": "direct",
    "sys.monitoring.register_callback": "direct",
    "ctypes.dlopen": "ctypes", "ctypes.dlsym": "ctypes", "ctypes.dlsym/handle": "ctypes",
    "ctypes.addressof": "ctypes", "ctypes.cdata": "ctypes", "ctypes.cdata/buffer": "ctypes",
    "ctypes.string_at": "ctypes", "ctypes.wstring_at": "ctypes", "ctypes.call_function": "ctypes",
    "ctypes.PyObj_FromPtr": "ctypes",
    "compile": "compile", "exec": "exec",
    "sys.addaudithook": "always",
    "sys.settrace": "trace", "sys.setprofile": "trace", "sys._settraceallthreads": "trace",
    "sys._setprofileallthreads": "trace",
}
# attribute reads that give (or need) a frame. Reads of code objects (`__code__`, `gi_code`) are not judged: torch's
# compiler reads library functions' code from C while a student frame is the current one, and a code object shows
# nothing its file does not; each use of one (run, written into a function, rebuilt) is an event of its own.
_FRAME_ATTRS = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_code"})
# library functions that hand their caller a frame (or a frame's namespaces): called directly from student code, the
# frame event they raise is the student's
_FRAME_GIVERS = ("inspect.currentframe", "inspect.stack", "inspect.trace", "inspect.getinnerframes",
                 "inspect.getouterframes", "traceback.walk_stack", "traceback.walk_tb", "logging.currentframe",
                 "IPython.utils.frame.extract_vars", "IPython.utils.frame.extract_vars_above",
                 "IPython.utils.frame.extract_module_locals", "IPython.utils.frame.debugx",
                 "torch._jit_internal.createResolutionCallbackFromFrame")
_STDLIB_NEEDED = ("inspect", "traceback", "logging", "codeop", "code", "pickle", "copyreg", "runpy", "ctypes",
                  "threading")
# the standard library's modules that do a job on their caller's behalf: an event they raise is their caller's
_ON_BEHALF = {"compile": ("codeop", "code", "<frozen importlib._bootstrap"), "direct": ("pickle", "copyreg"),
              "exec": ("runpy",), "ctypes": ("ctypes",), "trace": ("threading",)}


def trusted_roots(*, exclude: Iterable[str]) -> tuple[str, ...]:
    """The folders whose files are the grader's or a library's (the import path and the installation's library
    folders), less any that holds a folder student code can write (its scratch folder, its cwd): each ends in "/"."""
    paths = sysconfig.get_paths()
    found = [p for p in sys.path if p and os.path.isabs(p)]
    found += [paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths]
    writable = [os.path.join(os.path.realpath(w), "") for w in exclude if w]
    roots = []
    for p in found:
        for root in {os.path.join(os.path.abspath(p), ""), os.path.join(os.path.realpath(p), "")}:
            if os.path.isdir(root) and root != "/" and not any(w.startswith(root) for w in writable):
                roots.append(root)
    return tuple(sorted(set(roots)))


def _codes(dotted: Iterable[str]) -> set[int]:
    """The ids of the code objects of the named functions that are loaded (read before the hook is installed)."""
    found = set()
    for name in dotted:
        module, _, attr = name.rpartition(".")
        fn = getattr(sys.modules.get(module), attr, None)
        if type(fn) is FunctionType:
            found.add(id(fn.__code__))
    return found


def _files(modules: Iterable[str]) -> tuple[str, ...]:
    """Where the named loaded modules' code lives: a package's folder ("/"-ended) or a module's file."""
    out = []
    for name in modules:
        module = sys.modules.get(name)
        path = getattr(module, "__file__", None)
        if type(path) is str:
            out.append(os.path.join(os.path.dirname(path), "") if path.endswith("__init__.py") else path)
    return tuple(out)


def _same_file(source: Any, filename: str) -> bool:
    """Whether source (what compile was given) is the text of the file it is named after: a library file compiled
    as it is (an import without a cached bytecode file), not other code given a library's name."""
    if type(source) not in (bytes, str) or not os.path.isfile(filename):
        return False
    try:
        with open(filename, "rb") as f:
            data = f.read()
    except OSError:
        return False
    return data == (source.encode("utf-8") if type(source) is str else source)


def _judge(roots: tuple[str, ...], names: dict[str, int], state: list[int]) -> tuple[Callable[..., Any], ...]:
    """(verdict, place): whether student code raised an event, and where in the notebook that code is. Closures over
    what they need, taken now: nothing they use at an event is a module global or a class attribute, which student
    code could rebind (unaudited) for the length of a cell before the guard puts it back."""
    for name in _STDLIB_NEEDED:  # loaded already in the child (IPython imports them); in a bare interpreter, now
        __import__(name)
    givers = frozenset(_codes(_FRAME_GIVERS))
    behalf = {kind: _files(m for m in mods if not m.startswith("<")) + tuple(m for m in mods if m[0] == "<")
              for kind, mods in _ON_BEHALF.items()}
    on_compile, on_exec, prefix = behalf["compile"], behalf["exec"], CELL_PREFIX
    same_file, type_, getattr_, id_, str_, len_ = _same_file, type, getattr, id, str, len
    trusted: dict[str, bool] = {}

    def is_trusted(filename: str) -> bool:
        """Whether code of this file name is the grader's or a library's (not the student's)."""
        known = trusted.get(filename)
        if known is None:
            known = filename.startswith("<frozen ") or (filename.startswith(roots) and ".." not in filename)
            if len_(trusted) < 100_000:
                trusted[filename] = known
        return known

    def student(frame: Any) -> bool:
        return frame is not None and not is_trusted(frame.f_code.co_filename)

    def past(frame: Any, files: tuple[str, ...], codes: frozenset[int] = frozenset()) -> tuple[Any, bool]:
        """The first frame from `frame` outward that is not on the library's behalf (its file in `files`, or its code
        in `codes`); and whether any frame was skipped."""
        skipped = False
        while frame is not None:
            code = frame.f_code
            if not ((files and code.co_filename.startswith(files)) or id_(code) in codes):
                return frame, skipped
            frame, skipped = frame.f_back, True
        return None, skipped

    def beyond_student(f0: Any, asked: Any) -> bool:
        """Whether the frame a library asked sys._getframe for lies outside the outermost student frame on the stack
        (in the harness or IPython, which run the notebook)."""
        frame, outermost, at, i = f0, -1, -1, 0
        while frame is not None:
            if frame is asked:
                at = i
            if student(frame):
                outermost = i
            frame, i = frame.f_back, i + 1
        return 0 <= outermost < at

    def verdict(kind: str, event: str, args: tuple[Any, ...], f0: Any) -> str | None:
        """Why the event is refused ("" for no detail), or None when it is not the student's reach."""
        if kind == "attr":
            who, _ = past(f0, (), givers)
            return f"read of {type_(args[0]).__name__}.{args[1]}" if student(who) else None
        if kind == "setattr":
            return f"write of {args[1]}" if args[1] == "__code__" and student(f0) else None
        if kind == "frame":
            who, via = past(f0, (), givers)
            if student(who):
                return f"called through {f0.f_code.co_name}" if via else ""
            if event == "sys._getframe" and args and beyond_student(f0, args[0]):
                return f"a frame outside the notebook's code, asked for by {f0.f_code.co_name}"
            return None
        if kind == "compile":
            who, _ = past(f0, on_compile)
            if not student(who):
                return None
            filename = args[1] if len_(args) > 1 else None
            if type_(filename) is not str_:  # a syntax tree compiled: the event does not say under which name
                return "code compiled from a syntax tree"
            if filename.startswith(prefix) or (is_trusted(filename) and not same_file(args[0], filename)):
                return f"code compiled under the name {filename[:120]!r}"
            return None
        if kind == "exec":
            where = getattr_(args[0], "co_filename", "") if args else ""
            if type_(where) is not str_ or not where:
                return None
            who, _ = past(f0, on_exec)
            if not student(who):
                if where.startswith(prefix) and state[0] >= 0 and len_(names) < 100_000:  # IPython runs a cell
                    names.setdefault(where, state[0])
                return None
            return f"run of code named {where[:120]!r}" if is_trusted(where) else None
        if kind == "always":
            return ""
        who, via = past(f0, behalf.get(kind, ()))
        if kind == "trace" and who is None and via:
            return "set from a thread's start"
        if not student(who):
            return None
        return f"symbol {str_(args[1])[:80]!r}" if event == "ctypes.dlsym" and len_(args) > 1 else ""

    def place(f0: Any) -> tuple[int, int]:
        """(cell, line) of the innermost cell frame from f0 outward; (the running cell, 0) when there is none."""
        frame = f0
        while frame is not None:
            cell = names.get(frame.f_code.co_filename)
            if cell is not None:
                return cell, frame.f_lineno or 0
            frame = frame.f_back
        return state[0], 0

    return verdict, place


def install(*, report: Callable[[dict[str, Any]], None], roots: tuple[str, ...]) -> Callable[[int], None]:
    """Install the tripwire (once per process, in the child, after it is confined and before any cell runs). An event
    raised from student code is refused (RuntimeError in that code; a second audit hook is silently not added) and
    reported as {"event", "cell", "line", "detail"} through `report` (at most MAX_TRIPS per run). Returns
    `enter(cell)`: the child says which cell runs now (-1 once the probes run), for events with no cell frame.

    Its state lives in this closure, never in a module global: student code reaches it only through a frame or gc,
    which the hook refuses."""
    names: dict[str, int] = {}
    state = [-1]  # the cell running now (-1: none, the probes)
    verdict, place = _judge(roots, names, state)
    events, attrs, getframe, ident = dict(_EVENTS).get, _FRAME_ATTRS, sys._getframe, get_ident
    limit, error, refused, value_error, failure = MAX_TRIPS, RuntimeError, REFUSED, ValueError, Exception
    busy: set[int] = set()  # the threads inside the hook: the events it raises itself are not judged
    sent = [0]

    def hook(event: str, args: tuple[Any, ...]) -> None:
        kind = events(event)
        if kind is None or (kind == "attr" and args[1] not in attrs):
            return
        me = ident()
        if me in busy:
            return
        busy.add(me)
        try:
            try:
                f0 = getframe(1)
            except value_error:
                f0 = None
            why = verdict(kind, event, args, f0)
            if why is None:
                return
            if sent[0] < limit:
                sent[0] += 1
                cell, line = place(f0)
                report({"event": event, "cell": cell, "line": line, "detail": why[:200]})
        except failure:  # a hook that fails must not break the program it watches
            return
        finally:
            busy.discard(me)
        raise error(f"{refused}: {event}")

    def enter(cell: int) -> None:
        state[0] = cell

    sys.addaudithook(hook)
    return enter
