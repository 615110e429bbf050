"""S23-newcomer-4: ``audit verify`` across a rotation of the checkpoint signing key.

A chain is written with key A, then the directory is reopened with key B (what a restart after
``jsonl.signing_key_file`` was pointed at a new key does). Before the fix verify took one key
and said ``bad_signature`` ("checkpoint signature invalid", the wording of tampering) with
either key, and ``--public-key`` given twice silently used the last one. Now: both keys -> OK
(hash links checked across the switch); one key -> ``unknown_key`` naming the other key's id;
a checkpoint re-signed with a third key -> still a problem; a record edited -> still
``modified``; a key id given twice -> refused; anchors (OCSF copies) of both keys are checked.
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
from audit.verify_anchors import load_anchors
from audit.verify_keys import DuplicateKeyError, key_ring


def _events(n: int, start: int) -> list[AuditEvent]:
    return [AuditEvent(kind=Kind.INFERENCE, outcome=Outcome.ALLOWED, request_id=f"r{start + i}") for i in range(n)]


async def _write(log_dir: Path, key: Ed25519PrivateKey, start: int, checkpoints: list | None = None) -> None:
    """Two batches of 10 events with a checkpoint after each (and the final one at close)."""
    sink = JsonlChainSink(log_dir, key, rotate_bytes=10**9, checkpoint_s=3600, fsync=False)
    if checkpoints is not None:
        sink.on_checkpoint = checkpoints.append
    await sink.open()
    for b in range(2):
        await sink.send(_events(10, start + b * 10))
        sink.checkpoint()
    await sink.close()


@pytest.fixture
async def rotated(tmp_path: Path) -> dict:
    """A log written with key A, then reopened and continued with key B (files on disk)."""
    keys = tmp_path / "keys"
    keys.mkdir()
    generate_signing_key(keys / "a.key")
    generate_signing_key(keys / "b.key")
    a, b = load_signing_key(keys / "a.key"), load_signing_key(keys / "b.key")
    cps: list = []
    await _write(tmp_path / "log", a, 0, cps)
    await _write(tmp_path / "log", b, 20, cps)
    return {"dir": tmp_path / "log", "a": a, "b": b, "a_pub": keys / "a.key.pub", "b_pub": keys / "b.key.pub",
            "keys": keys, "checkpoints": cps}


def _cli(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(audit_group, ["verify", *args])
    return res.exit_code, res.output


async def test_log_spanning_a_rotation_verifies_with_both_keys(rotated) -> None:
    files = list_log_files(rotated["dir"])
    assert len(files) == 2
    report = verify_files([rotated["dir"]], [rotated["a"].public_key(), rotated["b"].public_key()])
    assert report.ok, report.problems
    kid_a, kid_b = key_id(rotated["a"].public_key()), key_id(rotated["b"].public_key())
    assert list(report.checkpoints_by_key) == [kid_a, kid_b]  # chain order of first use
    assert report.key_switches == 1
    assert report.checkpoints == sum(report.checkpoints_by_key.values()) >= 4
    header = json.loads(files[1].read_text().splitlines()[0])
    assert header["body"]["predecessor"] == files[0].name  # the switch is inside one chain


async def test_one_key_only_names_the_missing_key_id(rotated) -> None:
    kid_a, kid_b = key_id(rotated["a"].public_key()), key_id(rotated["b"].public_key())
    for given, missing in ((rotated["b"], kid_a), (rotated["a"], kid_b)):
        report = verify_files([rotated["dir"]], given.public_key())
        kinds = {p.kind for p in report.problems}
        assert kinds == {"unknown_key"}, report.problems  # not bad_signature: nothing was tampered with
        assert all(missing in p.detail and "give its public key" in p.detail for p in report.problems)


async def test_tampered_record_still_fails_with_both_keys(rotated) -> None:
    target = list_log_files(rotated["dir"])[1]  # the file written with key B
    lines = target.read_text().splitlines(keepends=True)
    lines[3] = lines[3].replace('"outcome":"allowed"', '"outcome":"denied"')
    target.write_text("".join(lines))
    report = verify_files([rotated["dir"]], [rotated["a"].public_key(), rotated["b"].public_key()])
    assert report.first_problem.kind == "modified" and report.first_problem.line == 4


async def test_checkpoint_resigned_with_a_third_key_fails(rotated) -> None:
    """A forger rewrites the last checkpoint with a key of their own: its id is unknown (FAILED);
    one keeping key B's id with a third key's signature is bad_signature."""
    target = list_log_files(rotated["dir"])[1]
    lines = target.read_text().splitlines(keepends=True)
    last = json.loads(lines[-1])
    assert last["type"] == "checkpoint"
    ring = [rotated["a"].public_key(), rotated["b"].public_key()]
    mallory = Ed25519PrivateKey.generate()
    for body, kind in ((sign_checkpoint(mallory, last["body"]), "unknown_key"),
                       (dict(sign_checkpoint(mallory, last["body"]), key_id=last["body"]["key_id"]), "bad_signature")):
        rec = make_record(last["seq"], "checkpoint", last["prev"], body)
        target.write_text("".join(lines[:-1]) + json.dumps(rec) + "\n")
        report = verify_files([rotated["dir"]], ring)
        assert [p.kind for p in report.problems] == [kind], report.problems


async def test_anchors_of_both_keys_are_checked(rotated, tmp_path: Path) -> None:
    copies = tmp_path / "copies.jsonl"  # the checkpoint copies as an OCSF-like file would carry them
    copies.write_text("".join(json.dumps({"kind": "checkpoint", "checkpoint": e.checkpoint}) + "\n"
                              for e in rotated["checkpoints"]))
    anchors, problems = load_anchors([copies])
    assert not problems and len(anchors) == len(rotated["checkpoints"])
    both = verify_files([rotated["dir"]], [rotated["a"].public_key(), rotated["b"].public_key()], anchors=anchors)
    assert both.status == "OK" and both.anchors_matched == len(anchors) and both.anchors_foreign == 0
    only_b = verify_files([rotated["dir"]], rotated["b"].public_key(), anchors=anchors)
    assert only_b.anchors_foreign > 0 and not only_b.ok  # A's checkpoints: unknown_key


def test_key_ring_refuses_a_key_id_given_twice() -> None:
    a = Ed25519PrivateKey.generate().public_key()
    with pytest.raises(DuplicateKeyError, match=f"key id {key_id(a)} is given twice.*the same public key"):
        key_ring([a, a], labels=["a.pub", "copy.pub"])
    with pytest.raises(DuplicateKeyError, match="a.pub and copy.pub"):
        key_ring([a, a], labels=["a.pub", "copy.pub"])
    b = Ed25519PrivateKey.generate().public_key()
    with pytest.raises(ValueError, match="holds the key of id"):
        key_ring({key_id(a): b})  # a ring whose id is not its key's: ambiguous, refused
    assert set(key_ring([a, b])) == {key_id(a), key_id(b)}


async def test_cli_repeatable_public_key(rotated) -> None:
    d, a_pub, b_pub = str(rotated["dir"]), str(rotated["a_pub"]), str(rotated["b_pub"])
    code, out = _cli(d, "--public-key", a_pub, "--public-key", b_pub)
    assert code == 0 and "-> OK" in out and "several keys" in out and "changed 1 time(s)" in out, out
    code, out = _cli(d, "--public-key", b_pub)  # the old key missing: FAILED, naming its id
    kid_a = key_id(rotated["a"].public_key())
    assert code == 1 and "unknown_key" in out and kid_a in out and "bad_signature" not in out, out
    code, out = _cli(d, "--public-key", str(rotated["keys"]))  # a directory of *.pub files
    assert code == 0 and "-> OK" in out, out
    code, out = _cli(d, "--public-key", a_pub, "--public-key", a_pub)  # before: the last one silently won
    assert code == 2 and "given twice" in out, out
    code, out = _cli(d, "--public-key", b_pub, "--public-key", str(rotated["keys"]))  # b twice (file + dir)
    assert code == 2 and key_id(rotated["b"].public_key()) in out, out
