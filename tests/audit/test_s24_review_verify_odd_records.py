"""S24-review-3: ``audit verify`` on a tampered file reports, it never crashes nor runs for days.

(1) A record whose fields have other types than the chain writes (a body that is a list or a string, a seq
that is a string or a bool, a type/prev/hash that is not a string) is ``malformed`` at its line; before it
raised AttributeError/TypeError (no report). (2) A record whose seq is far ahead (its hash recomputed: the
chain's hashes are unkeyed) is reported as before, without walking the gap seq by seq: before, the reorder
check ran ``any(s in seqs for s in range(expected, seq))``, 10 s for a gap of 10**8, days for 10**15.
(3) The new gap test (bisect) answers exactly what the walk answered (property test)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import audit.verify as verify_mod
from audit.chain import make_record
from audit.jsonl import list_log_files
from audit.verify import verify_files
from tests.audit.test_s23_verify_key_rotation import rotated  # noqa: F401 - the fixture


def _replace_last(target: Path, record: object) -> int:
    """Write ``record`` in place of the file's last line; returns that line's number."""
    lines = target.read_text().splitlines(keepends=True)
    target.write_text("".join(lines[:-1]) + json.dumps(record) + "\n")
    return len(lines)


def _keys(rotated: dict) -> list:  # noqa: F811
    return [rotated["a"].public_key(), rotated["b"].public_key()]


ODD = {
    "body a list": lambda r: make_record(r["seq"], "checkpoint", r["prev"], [1]),  # type: ignore[arg-type]
    "body a string": lambda r: make_record(r["seq"], "checkpoint", r["prev"], "x"),  # type: ignore[arg-type]
    "seq a string": lambda r: dict(r, seq=str(r["seq"])),
    "seq a bool": lambda r: dict(r, seq=True),
    "seq a float": lambda r: dict(r, seq=float(r["seq"])),
    "type a list": lambda r: dict(r, type=["checkpoint"]),
    "prev an int": lambda r: dict(r, prev=5),
    "hash null": lambda r: dict(r, hash=None),
}


@pytest.mark.parametrize("name", sorted(ODD))
async def test_a_record_of_odd_types_is_malformed_not_a_crash(rotated, name: str) -> None:  # noqa: F811
    target = list_log_files(rotated["dir"])[1]
    last = json.loads(target.read_text().splitlines()[-1])
    line = _replace_last(target, ODD[name](last))
    report = verify_files([rotated["dir"]], _keys(rotated))
    assert ("malformed", line) in [(p.kind, p.line) for p in report.problems], report.problems
    assert report.status == "FAILED"


async def test_a_seq_far_ahead_is_reported_without_walking_the_gap(rotated, monkeypatch) -> None:  # noqa: F811
    def no_long_walk(*args: int) -> range:  # the module's range: refuses a walk longer than the file
        r = range(*args)
        assert len(r) < 10**6, f"walked a gap of {len(r)} seqs"
        return r

    monkeypatch.setattr(verify_mod, "range", no_long_walk, raising=False)
    target = list_log_files(rotated["dir"])[1]
    last = json.loads(target.read_text().splitlines()[-1])
    far = last["seq"] + 10**18
    line = _replace_last(target, make_record(far, last["type"], last["prev"], last["body"]))
    report = verify_files([rotated["dir"]], _keys(rotated))
    assert ("missing_record", line, far) in [(p.kind, p.line, p.seq) for p in report.problems], report.problems


@given(seqs=st.sets(st.integers(-5, 60)), low=st.integers(-10, 70), span=st.integers(0, 40))
def test_gap_test_matches_the_walk(seqs: set[int], low: int, span: int) -> None:
    high = low + span
    assert verify_mod._holds_seq_in(sorted(seqs), low, high) == any(s in seqs for s in range(low, high))
