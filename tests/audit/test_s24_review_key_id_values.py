"""S24-review-1: a checkpoint whose ``key_id`` is not a string (a tampered file may hold any JSON value there)
is reported as ``unknown_key`` at its line, like any key id no given key has, never a crash of ``audit verify``
(before: ``TypeError: unhashable type`` for a list or an object, and no report at all)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from audit.chain import make_record
from audit.jsonl import list_log_files
from audit.verify import verify_files
from tests.audit.test_s23_verify_key_rotation import _cli, rotated  # noqa: F401 - the fixture


@pytest.mark.parametrize("value", [["x"], {"a": 1}, None, 5, 1.5, True])
async def test_non_string_key_id_is_unknown_key_not_a_crash(rotated, value) -> None:  # noqa: F811
    target = list_log_files(rotated["dir"])[1]
    lines = target.read_text().splitlines(keepends=True)
    last = json.loads(lines[-1])
    assert last["type"] == "checkpoint"
    rec = make_record(last["seq"], "checkpoint", last["prev"], dict(last["body"], key_id=value))
    target.write_text("".join(lines[:-1]) + json.dumps(rec) + "\n")
    report = verify_files([rotated["dir"]], [rotated["a"].public_key(), rotated["b"].public_key()])
    assert [(p.kind, p.line) for p in report.problems] == [("unknown_key", len(lines))], report.problems
    assert report.status == "FAILED"
    code, out = _cli(str(rotated["dir"]), "--public-key", str(rotated["a_pub"]), "--public-key", str(rotated["b_pub"]))
    assert code == 1 and "unknown_key" in out and "Traceback" not in out
