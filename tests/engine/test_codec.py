"""One codec of plain data: the engine's (autograder/runtime/plain_codec.py) writes the case JSON, the stored results
and the expected-values cache, the sandbox's wire format takes its array layout from it and the shipped checks
runtime imports it, so an array or a non-finite float is spelled one way in every JSON the package writes."""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import numpy as np
import pytest

from autograder import wire
from autograder.config import ROOT
from autograder.course import course_of
from autograder.runtime import CODEC, imported_modules, runtime_files
from autograder.runtime import plain_codec as codec

VALUES = [
    np.arange(6, dtype=np.int32).reshape(2, 3), np.array([True, False]), np.zeros((0, 4)),
    np.array(2.5, dtype=np.float32), np.arange(4.0)[::2], np.arange(3, dtype=">u2"),
    [math.nan, math.inf, -math.inf, np.array([np.nan, -np.inf])],
    {"value": np.eye(2, dtype=np.float16), "again": [1, "x", None, True, -0.0]},
]


@pytest.mark.parametrize("value", VALUES, ids=range(len(VALUES)))
def test_the_wire_and_the_case_json_spell_plain_data_alike(value) -> None:
    """The grader's frames (wire.encode), the child's trusted encoder and the runtime's codec give the same bytes
    (the runtime's with the wire's separators), and each reads the other's back."""
    canonical = json.dumps(codec.to_plain(value), separators=(",", ":")).encode("ascii")
    assert wire.encode(value) == canonical
    assert wire.trusted_encoder()(value) == canonical
    assert codec.dumps(wire.decode(canonical)) == codec.dumps(codec.from_plain(json.loads(canonical)))


def test_the_array_layout_is_defined_once() -> None:
    """Only the codec spells the array tag; the wire imports it (and its layout) from there."""
    assert wire.ARRAY_TAG is codec.ARRAY_TAG
    spelled = [str(p.relative_to(ROOT)) for p in sorted(Path(ROOT / "autograder").rglob("*.py"))
               if codec.ARRAY_TAG in p.read_text(encoding="utf-8")]
    assert spelled == ["autograder/runtime/plain_codec.py"], spelled


def runtime_imports(tree: ast.AST) -> list[str]:
    """The shipped runtime's modules (autograder.runtime.X, the codec aside) that a module's tree imports."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        else:
            continue
        found += [n for n in names if n.startswith("autograder.runtime.") and n.split(".")[2] in runtime_files()
                  and n.split(".")[2] != CODEC]
    return found


def test_the_engine_takes_the_codec_from_its_own_module_never_from_the_student_runtime() -> None:
    """The judge, the suite, the wire, the report and the release import the codec from autograder.runtime.plain_codec:
    no engine module imports the runtime shipped to students (a lesson's own copy of it is Lesson.runtime)."""
    engine = [p for p in sorted((ROOT / "autograder").rglob("*.py")) if "runtime" not in p.relative_to(ROOT).parts]
    assert len(engine) > 40
    trees = {str(p.relative_to(ROOT)): ast.parse(p.read_text(encoding="utf-8"), str(p)) for p in engine}
    assert {rel: found for rel, tree in trees.items() if (found := runtime_imports(tree))} == {}
    for rel in ("wire.py", "grading/judge.py", "authoring/suite.py", "report/compare.py", "release/common.py"):
        modules = {n.module for n in ast.walk(trees[f"autograder/{rel}"]) if isinstance(n, ast.ImportFrom)}
        assert f"autograder.runtime.{CODEC}" in modules, rel
    # what the check finds: the old way, the codec taken from the student runtime
    old = ast.parse("from autograder.runtime.checks_runtime import to_plain\nimport autograder.runtime.torch_kit\n")
    assert runtime_imports(old) == ["autograder.runtime.checks_runtime", "autograder.runtime.checks_runtime.to_plain",
                                    "autograder.runtime.torch_kit"]


def test_the_student_runtime_imports_the_engines_codec_and_defines_none_of_it() -> None:
    """checks_runtime takes the codec from plain_codec (its shipped copy, by its top-level name): each lesson's copy of
    the runtime re-exports the lesson's copy of the codec, and every lesson ships and stages the codec beside it."""
    assert CODEC in imported_modules(runtime_files()["checks_runtime"])
    lesson = course_of(ROOT / "grading_config.yaml").lesson
    codec_copy = lesson.runtime_copies[CODEC]
    for name in ("to_plain", "from_plain", "dumps", "loads", "own_array"):
        assert getattr(lesson.runtime, name) is getattr(codec_copy, name), name
    assert list(lesson.runtime_modules)[:2] == [CODEC, "checks_runtime"]  # each after what it imports
    assert lesson.sandbox_modules[CODEC] == runtime_files()[CODEC]
    assert runtime_files()[CODEC] in lesson.shipped_files
    tree = ast.parse(runtime_files()["checks_runtime"].read_text())
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    assert not defined & {"to_plain", "from_plain", "dumps", "loads", "array_plain", "own_array"}


def _walked(data: bytes):
    """wire.decode's general path: parse, then one walk that checks the depth and reads the arrays."""
    return wire.unpack(json.loads(data.decode(), object_pairs_hook=wire.object_pairs,
                                   parse_constant=wire.json_constant), 0)


def _nested(depth: int, inner: str) -> bytes:
    return ("[" * depth + inner + "]" * depth).encode()


ARRAY = wire.encode(np.arange(3.0)).decode()
FRAMES = [wire.encode(v) for v in VALUES] + [
    _nested(wire.MAX_DEPTH, "1"), _nested(wire.MAX_DEPTH - 1, ARRAY), _nested(30, ARRAY),
    _nested(wire.MAX_DEPTH + 1, "1"), _nested(wire.MAX_DEPTH + 1, ""), _nested(200, ARRAY),
    b'{"a": 1, "a": 2}', b'{"__evil__": 1}', b'{"__ndarray__": "AAAA", "dtype": "<f8", "shape": [9]}',
    b'{"__ndarray__": "AA==", "dtype": "|b1", "shape": [1], "x": 1}', b'{"s": "[[[[{{{{"}',
    ('{"s": "' + "[" * 100 + '", "v": ' + ARRAY + "}").encode(),
]


@pytest.mark.parametrize("data", FRAMES, ids=range(len(FRAMES)))
def test_shallow_frames_read_their_arrays_as_parsed_and_decode_as_the_walk_does(data: bytes) -> None:
    """decode reads the arrays of data with at most MAX_DEPTH brackets while parsing; the result, or the error,
    is the general path's (parse, then walk) for shallow and deep data, hostile or not."""
    try:
        want = ("ok", codec.dumps(_walked(data)))
    except wire.WireError as exc:
        want = ("error", str(exc))
    try:
        got = ("ok", codec.dumps(wire.decode(data)))
    except wire.WireError as exc:
        got = ("error", str(exc))
    assert got == want
    assert ("nested too deeply" in got[1]) == (data in (_nested(wire.MAX_DEPTH + 1, "1"), _nested(200, ARRAY)))
