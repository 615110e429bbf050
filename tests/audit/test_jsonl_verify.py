from __future__ import annotations

import json
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit.event import AuditEvent, Kind, Outcome
from audit.jsonl import JsonlChainSink, list_log_files
from audit.verify import verify_files


def _events(n: int, start: int = 0) -> list[AuditEvent]:
    return [AuditEvent(kind=Kind.INFERENCE, outcome=Outcome.ALLOWED, request_id=f"r{start + i}") for i in range(n)]


async def _write(tmp_path: Path, key, batches: int = 6, per_batch: int = 10, rotate_bytes: int = 4000):
    checkpoints: list[AuditEvent] = []
    sink = JsonlChainSink(tmp_path / "log", key, rotate_bytes=rotate_bytes, checkpoint_s=3600, fsync=False)
    sink.on_checkpoint = checkpoints.append
    await sink.open()
    for b in range(batches):
        await sink.send(_events(per_batch, b * per_batch))
    await sink.close()
    return list_log_files(tmp_path / "log"), checkpoints


def _lines(p: Path) -> list[str]:
    return p.read_text().splitlines(keepends=True)


async def test_chain_rotation_checkpoints_verify_ok(tmp_path):
    key = Ed25519PrivateKey.generate()
    files, cps = await _write(tmp_path, key)
    assert len(files) >= 3  # rotated by size
    report = verify_files([tmp_path / "log"], key.public_key())
    assert report.ok, report.problems
    assert report.unsealed_records == 0
    assert report.checkpoints == len(files) == len(cps)  # one per rotation + final
    # each file names its predecessor and chains to its last hash
    for prev, cur in zip(files, files[1:]):
        header = json.loads(_lines(cur)[0])
        last = json.loads(_lines(prev)[-1])
        assert header["body"]["predecessor"] == prev.name and header["prev"] == last["hash"]
    # off-host copies match
    assert verify_files(files, key.public_key(), off_host_checkpoints=[c.checkpoint for c in cps]).ok
    events = [json.loads(l) for f in files for l in _lines(f)]
    assert [e["body"]["request_id"] for e in events if e["type"] == "event"] == [f"r{i}" for i in range(60)]


async def test_reopen_continues_chain(tmp_path):
    key = Ed25519PrivateKey.generate()
    await _write(tmp_path, key, batches=2, rotate_bytes=10**9)
    await _write(tmp_path, key, batches=2, rotate_bytes=10**9)
    report = verify_files([tmp_path / "log"], key.public_key())
    assert report.ok and report.files == 2


async def test_verify_detects_edit_delete_reorder(tmp_path):
    key = Ed25519PrivateKey.generate()
    files, _ = await _write(tmp_path, key, rotate_bytes=10**9)
    target = files[0]
    original = _lines(target)

    lines = list(original)
    lines[5] = lines[5].replace('"outcome":"allowed"', '"outcome":"denied"')
    target.write_text("".join(lines))
    r = verify_files(files, key.public_key())
    assert not r.ok and r.first_problem.kind == "modified" and r.first_problem.line == 6

    lines = list(original)
    del lines[5]
    target.write_text("".join(lines))
    r = verify_files(files, key.public_key())
    assert r.first_problem.kind == "missing_record" and r.first_problem.line == 6

    lines = list(original)
    lines[5], lines[6] = lines[6], lines[5]
    target.write_text("".join(lines))
    r = verify_files(files, key.public_key())
    assert r.first_problem.kind == "reordered" and r.first_problem.line == 6

    target.write_text("".join(original))
    assert verify_files(files, key.public_key()).ok


async def test_verify_detects_missing_file_and_bad_signature(tmp_path):
    key = Ed25519PrivateKey.generate()
    files, cps = await _write(tmp_path, key)
    r = verify_files([files[0]] + files[2:], key.public_key())
    assert r.first_problem.kind == "missing_file" and r.first_problem.file == files[2].name
    r = verify_files(files[1:], key.public_key())
    assert r.first_problem.kind == "missing_file"

    lines = _lines(files[0])
    cp_idx = max(i for i, l in enumerate(lines) if '"type":"checkpoint"' in l)
    rec = json.loads(lines[cp_idx])
    sig = rec["body"]["sig"]
    rec["body"]["sig"] = ("A" if sig[0] != "A" else "B") + sig[1:]
    # keep the chain hash valid so only the signature is wrong
    from audit.chain import record_hash

    rec["hash"] = record_hash(rec["seq"], rec["type"], rec["prev"], rec["body"])
    lines[cp_idx] = json.dumps(rec, sort_keys=True, separators=(",", ":")) + "\n"
    files[0].write_text("".join(lines))
    r = verify_files(files, key.public_key())
    assert r.first_problem.kind == "bad_signature"
    # wrong key: the checkpoints name a key id the given key does not have (S23-newcomer-4: unknown_key,
    # naming the id, instead of bad_signature, the wording of tampering); still a problem, never OK
    r = verify_files(files[1:2], Ed25519PrivateKey.generate().public_key(), require_genesis=False)
    assert r.problems and all(p.kind == "unknown_key" and rec["body"]["key_id"] in p.detail for p in r.problems)


async def test_tail_truncation_needs_off_host_copy(tmp_path):
    key = Ed25519PrivateKey.generate()
    files, cps = await _write(tmp_path, key, rotate_bytes=10**9)
    last = files[-1]
    lines = _lines(last)
    last.write_text("".join(lines[:-3]))  # drop the final checkpoint and two records
    r = verify_files(files, key.public_key())
    assert r.ok and r.unsealed_records > 0  # the files alone look fine, only unsealed
    r = verify_files(files, key.public_key(), off_host_checkpoints=[cps[-1].checkpoint])
    assert r.first_problem.kind == "truncated"  # the copy seals records the files no longer reach


async def test_one_writer_per_directory(tmp_path):
    import pytest

    from audit.dirlock import AuditDirectoryInUse

    key = Ed25519PrivateKey.generate()
    first = JsonlChainSink(tmp_path / "log", key, checkpoint_s=3600, fsync=False)
    await first.open()
    second = JsonlChainSink(tmp_path / "log", key, checkpoint_s=3600, fsync=False)
    with pytest.raises(AuditDirectoryInUse):
        await second.open()
    assert len(list_log_files(tmp_path / "log")) == 1  # the refused writer wrote nothing
    await first.send(_events(3))
    await first.close()
    await second.open()  # the lock is released on close
    await second.send(_events(2, start=3))
    await second.close()
    pub = key.public_key()
    assert verify_files([tmp_path / "log"], pub).ok
