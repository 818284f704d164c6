"""What the source review (review.py) counts as reach: modules whose import is reach, the attributes of a module
that reach (or the only ones that do not), reaching dunders and torch machinery, the harness's names, the builtins
that read or write attributes by name, and the configuration surfaces a notebook may write."""

from __future__ import annotations

# Modules whose import is reach by itself (nothing in them has an ordinary use here): the import is flagged.
REACH_MODULES = frozenset({"ctypes", "cffi", "subprocess", "pty", "signal", "marshal", "pdb", "bdb", "code",
                           "codeop", "objgraph", "pyrasite", "forbiddenfruit", "dill", "torch.overrides",
                           "torch.library", "torch.utils.cpp_extension", "IPython.core.getipython"})
HARNESS_PACKAGE = __name__.split(".")[0]  # the grader's own package: never a student's import
HARNESS_NAMES = frozenset({"run_probe", "TamperGuard", "child_main", "PROBES", "HOOKS", "LOCAL_RESULTS", "UNGUARDED"})
# Per module: the attributes that reach (kind, names); `ONLY` lists the only attributes that do not.
_FRAMES = ("interpreter", "walks frames or the call stack")
REACHING: dict[str, tuple[str, str, frozenset[str]]] = {
    "sys": ("interpreter", "reaches the interpreter's machinery", frozenset({
        "modules", "meta_path", "path_hooks", "path_importer_cache", "settrace", "setprofile", "gettrace",
        "getprofile", "addaudithook", "monitoring", "call_tracing", "last_traceback", "last_exc", "remote_exec"})),
    "inspect": (*_FRAMES, frozenset({"currentframe", "stack", "trace", "getouterframes", "getinnerframes",
                                     "getframeinfo", "getclosurevars", "getgeneratorlocals", "getcoroutinelocals",
                                     "getasyncgenlocals"})),
    "traceback": (*_FRAMES, frozenset({"walk_stack", "walk_tb", "extract_stack", "format_stack", "print_stack"})),
    "threading": ("interpreter", "traces every thread", frozenset({"settrace", "setprofile", "settrace_all_threads",
                                                                   "setprofile_all_threads"})),
    "types": ("interpreter", "makes code, function or frame objects", frozenset({
        "CodeType", "FunctionType", "LambdaType", "FrameType", "TracebackType", "CellType"})),
    "builtins": ("dynamic", "reaches a builtin that runs or finds code by name", frozenset({
        "getattr", "setattr", "delattr", "eval", "exec", "compile", "__import__", "vars", "breakpoint", "globals",
        "locals"})),
    "os": ("interpreter", "runs a process or touches a file descriptor", frozenset({
        "system", "popen", "fork", "forkpty", "kill", "killpg", "posix_spawn", "posix_spawnp", "write", "read",
        "dup", "dup2", "close", "closerange", "fdopen", "pipe", "sendfile", "pwrite", "writev", "openpty",
        "register_at_fork", *(f"exec{s}" for s in ("v", "ve", "l", "le", "lp", "lpe", "vp", "vpe")),
        *(f"spawn{s}" for s in ("l", "le", "lp", "lpe", "v", "ve", "vp", "vpe"))})),
    "IPython": ("dynamic", "reaches IPython's shell", frozenset({"get_ipython", "InteractiveShell", "embed",
                                                                "start_ipython", "start_kernel"})),
    "yaml": ("dynamic", "loads objects that run code", frozenset({"unsafe_load", "unsafe_load_all",
                                                                  "UnsafeLoader"})),
    "torch": ("torch internals", "reaches torch's dispatch machinery", frozenset({"library", "overrides"})),
}
ONLY: dict[str, tuple[str, str, frozenset[str]]] = {
    "gc": ("interpreter", "walks the interpreter's objects", frozenset({
        "collect", "enable", "disable", "isenabled", "get_count", "get_threshold", "set_threshold", "get_stats",
        "freeze", "unfreeze", "get_freeze_count"})),
    "importlib": ("dynamic", "imports by machinery the review cannot read", frozenset({"reload", "import_module"})),
}
# Writes to these are configuration, not reach: the process's environment and libraries' documented settings.
CONFIG_SURFACES = ("os.environ", "torch.backends.", "matplotlib.rcParams", "matplotlib.pyplot.rcParams",
                   "pandas.options.", "numpy.random.seed")
STAR_OK = frozenset({"math", "cmath", "typing", "__future__"})
# Dunders that reach code, globals, other objects or the class machinery when read.
REACH_DUNDERS = frozenset({"__code__", "__globals__", "__closure__", "__defaults__", "__kwdefaults__", "__builtins__",
                           "__import__", "__subclasses__", "__self__", "__loader__", "__spec__", "__getattribute__",
                           "__setattr__", "__delattr__", "__torch_function__", "__torch_dispatch__"})
DUNDER_WRITES_OK = frozenset({"__doc__", "__name__", "__qualname__"})
# Dunder methods that intercept what the harness does with student objects.
REACH_METHODS = frozenset({"__torch_function__", "__torch_dispatch__", "__getattribute__", "__del__",
                           "__instancecheck__", "__subclasscheck__", "__array_function__", "__array_ufunc__"})
TORCH_REACH = frozenset({"TorchFunctionMode", "TorchDispatchMode", "as_strided", "as_strided_", "overrides",
                          "_python_dispatch", "_C", "set_", "untyped_storage", "is_torch_function_mode_enabled",
                          "handle_torch_function", "has_torch_function", "load_library", "cpp_extension",
                          "register_module_forward_hook", "register_module_forward_pre_hook",
                          "register_module_full_backward_hook", "register_module_full_backward_pre_hook",
                          "register_module_buffer_registration_hook", "register_module_parameter_registration_hook",
                          "register_module_module_registration_hook", "_get_current_dispatch_mode",
                          "_len_torch_function_stack"})
# Attributes that reach the interpreter from any object or module (os.sys, np.ctypeslib, a frame's locals).
REACH_ATTRS = frozenset({"sys", "gc", "ctypes", "ctypeslib", "pythonapi", "inspect", "builtins", "importlib",
                          "subprocess", "_getframe", "f_back", "f_locals", "f_globals", "f_code", "f_builtins",
                          "f_trace", "gi_frame", "cr_frame", "ag_frame", "tb_frame", "tb_next", "co_code"})
# Every name the review treats as reach, whatever object it is read from (a computed name must begin none of them).
REACH_NAMES = REACH_DUNDERS | TORCH_REACH | REACH_ATTRS | HARNESS_NAMES | frozenset().union(
    *(names for _, _, names in REACHING.values()))
AS_VALUES = frozenset({"getattr", "setattr", "delattr", "eval", "exec", "compile", "__import__", "vars",
                        "breakpoint", "get_ipython"})
DYNAMIC_CALLS = frozenset({"exec", "eval", "compile", "__import__", "breakpoint"})
# Calls that read or write an attribute by name: function name -> (index of the object, or None: no object given;
# index of the name; writes).
NAMED = {"getattr": (0, 1, False), "setattr": (0, 1, True), "delattr": (0, 1, True), "getattr_static": (0, 1, False),
          "attrgetter": (None, 0, False), "methodcaller": (None, 0, False)}
UNBOUND = {"__getattribute__": False, "__getattr__": False, "__setattr__": True, "__delattr__": True}
MUTATORS = frozenset({"update", "setdefault", "pop", "popitem", "clear", "append", "extend", "insert", "remove",
                       "__setitem__", "__delitem__", "setitem", "delitem", "add", "discard"})


def is_dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def module_rule(module: str, attr: str) -> tuple[str, str] | None:
    """(kind, why) when reading `attr` of `module` is reach."""
    if module in REACHING and attr in REACHING[module][2]:
        return REACHING[module][0], REACHING[module][1]
    if module in ONLY and attr not in ONLY[module][2] and not attr.isupper():
        return ONLY[module][0], ONLY[module][1]
    return None


def reach_module(name: str) -> tuple[str, str] | None:
    """(kind, why) when importing `name` is reach by itself."""
    parts = name.split(".")
    prefixes = {".".join(parts[:n]) for n in range(1, len(parts) + 1)}
    if parts[0] == HARNESS_PACKAGE:
        return "harness", f"imports the grader's own {name}"
    if any(p.startswith("_") and not is_dunder(p) for p in parts):
        return "import", f"imports the private module {name}"
    if prefixes & REACH_MODULES:
        return "import", f"imports {name}"
    for n in range(1, len(parts)):
        rule = module_rule(".".join(parts[:n]), parts[n])
        if rule is not None:
            return "import", f"imports {name}"
    return None
