"""Session 24, S23-fixverify-1: a leaked RETIRED signing key cannot sign a forged tail that verifies.

After a rotation (the directory reopened with key B: a restart with a new ``jsonl.signing_key_file``) the
new file's header names the retired key (``retires``: A's key id; ``key_id``: B's), sealed by B's first
checkpoint. ``audit verify`` refuses a checkpoint signed by A after that header (``retired_key``), even
with a valid signature and the hash links intact. Before: verify given A and B trusted A over the whole
chain and a forged tail signed with A after B's checkpoints read OK.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit.chain import key_id, make_record, sign_checkpoint
from audit.cli import audit_group
from audit.event import AuditEvent, Kind, Outcome
from audit.jsonl import JsonlChainSink, list_log_files
from audit.keys import generate_signing_key, load_signing_key
from audit.verify import verify_files


def _events(n: int, start: int) -> list[AuditEvent]:
    return [AuditEvent(kind=Kind.INFERENCE, outcome=Outcome.ALLOWED, request_id=f"r{start + i}") for i in range(n)]


async def _write(log_dir: Path, key: Ed25519PrivateKey, start: int) -> None:
    sink = JsonlChainSink(log_dir, key, rotate_bytes=10**9, checkpoint_s=3600, fsync=False)
    await sink.open()
    await sink.send(_events(5, start))
    sink.checkpoint()
    await sink.close()


@pytest.fixture
async def rotated(tmp_path: Path) -> dict:
    keys = tmp_path / "keys"
    keys.mkdir()
    for name in ("a", "b", "c"):
        generate_signing_key(keys / f"{name}.key")
    a, b, c = (load_signing_key(keys / f"{n}.key") for n in ("a", "b", "c"))
    await _write(tmp_path / "log", a, 0)
    await _write(tmp_path / "log", a, 5)      # a restart with the same key: no rotation
    await _write(tmp_path / "log", b, 10)     # the rotation to B
    return {"dir": tmp_path / "log", "a": a, "b": b, "c": c, "keys": keys}


def _forge_tail(log_dir: Path, key: Ed25519PrivateKey, events: int = 3) -> None:
    """Append events and a checkpoint signed with ``key`` to the last file, links and hashes intact."""
    last_file = list_log_files(log_dir)[-1]
    last = json.loads(last_file.read_text().splitlines()[-1])
    seq, head, lines = last["seq"], last["hash"], []
    for i in range(events):
        seq += 1
        rec = make_record(seq, "event", head, {"kind": "inference", "outcome": "allowed", "request_id": f"forged{i}"})
        lines.append(rec)
        head = rec["hash"]
    body = sign_checkpoint(key, {"file": last_file.name, "head_seq": seq, "head": head, "time": "2026-12-03T00:00:00Z"})
    lines.append(make_record(seq + 1, "checkpoint", head, body))
    with open(last_file, "a") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in lines)


async def test_the_rotation_is_recorded_in_the_new_files_header(rotated) -> None:
    files = list_log_files(rotated["dir"])
    headers = [json.loads(f.read_text().splitlines()[0])["body"] for f in files]
    kid_a, kid_b = key_id(rotated["a"].public_key()), key_id(rotated["b"].public_key())
    assert [h.get("retires") for h in headers] == [None, None, kid_a]
    assert headers[2]["key_id"] == kid_b
    report = verify_files([rotated["dir"]], [rotated["a"].public_key(), rotated["b"].public_key()])
    assert report.ok and report.key_switches == 1 and report.keys_retired == 1, report.problems


async def test_a_tail_signed_with_the_retired_key_is_refused(rotated) -> None:
    _forge_tail(rotated["dir"], rotated["a"])
    report = verify_files([rotated["dir"]], [rotated["a"].public_key(), rotated["b"].public_key()])
    assert [p.kind for p in report.problems] == ["retired_key"]
    assert key_id(rotated["a"].public_key()) in report.problems[0].detail
    code, out = _cli("--public-key", str(rotated["keys"] / "a.key.pub"), "--public-key",
                     str(rotated["keys"] / "b.key.pub"), str(rotated["dir"]))
    assert code == 1 and "retired_key" in out and "FAILED" in out, out


async def test_the_new_key_may_go_on_signing_and_a_third_rotation_retires_it(rotated) -> None:
    _forge_tail(rotated["dir"], rotated["b"])  # the current key: fine
    await _write(rotated["dir"], rotated["c"], 100)
    pubs = [rotated[k].public_key() for k in ("a", "b", "c")]
    assert verify_files([rotated["dir"]], pubs).ok
    _forge_tail(rotated["dir"], rotated["b"])  # B is retired by C's file now
    assert [p.kind for p in verify_files([rotated["dir"]], pubs).problems] == ["retired_key"]


async def test_going_back_to_a_retired_key_is_refused_and_logged(rotated, caplog) -> None:
    await _write(rotated["dir"], rotated["a"], 100)  # A put back in use after B retired it
    assert "was retired earlier in this chain" in caplog.text
    report = verify_files([rotated["dir"]], [rotated["a"].public_key(), rotated["b"].public_key()])
    assert {p.kind for p in report.problems} == {"retired_key"}


def _cli(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(audit_group, ["verify", *args])
    return res.exit_code, res.output
