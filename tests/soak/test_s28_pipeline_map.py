"""Session 28 (wait28): bench.pipeline_map's stamp anchors and step arithmetic (bench code, no server).

The map inserts stamp calls into a copy of the tree at anchors of the product code; when that code
moves, the map must say so (AnchorError), never stamp the wrong place silently."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

from bench.pipeline_map import ANCHORS, ORDER, AnchorError, patch_tree, step_medians

REPO = Path(__file__).resolve().parents[2]


def _copy(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    for rel in ANCHORS:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, root / rel)
    return root


def test_every_anchor_is_in_the_tree_once_and_the_patched_files_parse(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    n = patch_tree(root)
    assert n == sum(len(v) for v in ANCHORS.values())
    names = {name for spec in ANCHORS.values() for _, name, _ in spec}
    assert names <= set(ORDER)  # every stamp has its place in the path order
    for rel in ANCHORS:
        text = (root / rel).read_text()
        ast.parse(text)  # the inserted lines keep each file valid Python
        for _, name, _ in ANCHORS[rel]:
            assert text.count(f"_S({name!r})") == 1


def test_stamp_lands_before_or_after_its_anchor_line(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text('"""m"""\n\nfrom __future__ import annotations\n\n\ndef g(x):\n    if x:\n        y = 1\n'
                 '        return y\n    return 0\n')
    patch_tree(tmp_path, {"m.py": [("y = 1", "a", True), ("return y", "b", False), ("    return 0", "c", False)]})
    lines = f.read_text().splitlines()
    body = lines[lines.index("def g(x):") + 1:]
    assert body == ["    if x:", "        y = 1", "        _S('a')", "        _S('b')", "        return y", "    _S('c')",
                    "    return 0"]


def test_a_moved_anchor_is_refused_not_guessed(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    src = "\"\"\"m\"\"\"\nfrom __future__ import annotations\nx = 1\nx = 1\n"
    f.write_text(src)
    with pytest.raises(AnchorError, match="found 2 times"):
        patch_tree(tmp_path, {"m.py": [("x = 1", "a", True)]})
    with pytest.raises(AnchorError, match="found 0 times"):
        patch_tree(tmp_path, {"m.py": [("y = 2", "a", True)]})
    assert f.read_text() == src  # nothing written for a refused file


def test_step_medians_pairs_present_stamps_only() -> None:
    reqs = [{"a": 0, "b": 2_000, "c": 7_000}, {"a": 0, "b": 4_000}, {"a": 1_000, "b": 2_000, "c": 3_000}]
    out = step_medians(reqs, ("a", "b", "c", "d"))
    assert out == {"F a -> b": 2.0, "F b -> c": 3.0}  # b->c: median of 5 and 1 µs; no request holds d
