"""The audit e2e readers see only complete lines: a JSONL line the writer has half written
(no newline yet) is not parsed; it is read on a later poll, once its newline is there. A
test polling the chain while the gateway writes must never fail on a half-written line."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from e2e_helpers import jsonl_events, ocsf_events  # noqa: E402


def _event(n: int) -> str:
    return json.dumps({"type": "event", "body": {"kind": "request", "n": n}}) + "\n"


def test_a_half_written_chain_line_is_left_for_the_next_poll(tmp_path: Path) -> None:
    d = tmp_path / "audit"
    d.mkdir()
    f = d / "0001.jsonl"
    whole = _event(2)
    f.write_text(_event(1) + whole[: len(whole) // 2])
    assert [e["n"] for e in jsonl_events(tmp_path)] == [1]
    with f.open("a") as fh:
        fh.write(whole[len(whole) // 2:])
    assert [e["n"] for e in jsonl_events(tmp_path)] == [1, 2]


def test_a_half_written_ocsf_line_is_left_for_the_next_poll(tmp_path: Path) -> None:
    f = tmp_path / "ocsf.jsonl"
    f.write_text('{"a": 1}\n{"a": ')
    assert ocsf_events(tmp_path) == [{"a": 1}]


def test_a_corrupt_complete_line_still_fails(tmp_path: Path) -> None:
    """Only the unterminated tail is skipped: a complete line that is not JSON is still an error."""
    d = tmp_path / "audit"
    d.mkdir()
    (d / "0001.jsonl").write_text('{"type": "event", \n' + _event(1))
    try:
        jsonl_events(tmp_path)
    except json.JSONDecodeError:
        return
    raise AssertionError("a corrupt complete line was accepted")
