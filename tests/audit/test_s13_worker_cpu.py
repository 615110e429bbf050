"""Session 13 (issue 14): the audit worker's CPU per event with the sinks ``bench.overhead`` configures
(JSONL hash chain, OCSF file, spill; no OTLP log sink).

* The JSONL chain keeps an event's canonical JSON for a second sink (:func:`audit.encoded.shared_json`)
  only when an OTLP log sink is configured: without one every kept entry held its event alive until
  8192 newer ones pushed it out, and the cyclic GC walked those objects again and again.
* The chain's bytes do not change either way (the golden digests of tests/audit/test_s12_worker_golden.py).
"""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit import encoded
from audit.config import build_audit
from audit.encoded import shared_json
from audit.jsonl import JsonlChainSink, list_log_files
from audit.keys import generate_signing_key
from audit.verify import verify_files
from tests.audit.test_s12_worker_golden import golden_events


def _config(tmp_path: Path, otlp: bool) -> dict[str, Any]:
    generate_signing_key(tmp_path / "audit.key")
    doc: dict[str, Any] = {
        "jsonl": {"dir": str(tmp_path / "log"), "signing_key_file": str(tmp_path / "audit.key")},
        "ocsf": {"file": str(tmp_path / "ocsf.jsonl")}, "spill": {"dir": str(tmp_path / "spill")}}
    if otlp:
        doc["otlp"] = {"endpoint": "http://127.0.0.1:9/v1/logs"}
    return doc


@pytest.mark.parametrize("otlp", [False, True])
def test_build_audit_shares_the_json_only_with_an_otlp_log_sink(tmp_path: Path, otlp: bool) -> None:
    log = build_audit(_config(tmp_path, otlp))
    assert log is not None
    sinks = [w.sink for w in log._workers if isinstance(w.sink, JsonlChainSink)]  # noqa: SLF001 - test
    assert len(sinks) == 1
    assert sinks[0].share_json is otlp


def test_shared_json_without_keep_keeps_nothing_but_takes_a_kept_entry() -> None:
    evs = golden_events()[:10]
    encoded._SHARED.clear()
    plain = [shared_json(ev, keep=False) for ev in evs]
    assert not encoded._SHARED  # nothing kept for nobody
    kept = shared_json(evs[0])  # a spill's encoding (keep) ...
    assert len(encoded._SHARED) == 1
    assert shared_json(evs[0], keep=False) is kept  # ... is taken by the chain, not encoded again
    assert not encoded._SHARED
    assert plain == [ev.to_json() for ev in evs]


@pytest.mark.parametrize("share", [False, True])
def test_chain_bytes_are_the_same_with_and_without_sharing(tmp_path: Path, share: bool) -> None:
    evs = golden_events()
    encoded._SHARED.clear()
    key = Ed25519PrivateKey.generate()

    async def go() -> None:
        sink = JsonlChainSink(tmp_path / "log", key, checkpoint_s=3600, fsync=False, share_json=share)
        await sink.open()
        for k in range(0, len(evs), 25):
            await sink.send(evs[k:k + 25])
        await sink.close()

    asyncio.run(go())
    assert bool(encoded._SHARED) is share  # kept for an OTLP sink that would take them next
    assert verify_files([tmp_path / "log"], key.public_key()).ok
    import orjson

    bodies = [line for f in list_log_files(tmp_path / "log") for line in f.read_bytes().splitlines()
              if b'"type":"event"' in line]
    assert [orjson.loads(b)["body"] for b in bodies] == [orjson.loads(ev.to_json()) for ev in evs]
    # the body bytes inside each record are the event's canonical JSON, byte for byte
    assert all(b'"body":' + ev.to_json() + b',' in line for ev, line in zip(evs, bodies, strict=True))


def _write_syscalls() -> int | None:
    try:
        text = Path("/proc/self/io").read_text()
    except OSError:
        return None
    return next(int(line.split()[1]) for line in text.splitlines() if line.startswith("syscw:"))


def test_chain_send_writes_a_batch_in_one_write(tmp_path: Path) -> None:
    """A batch of ~1 KB records leaves in one ``write`` (was one per 8 KiB buffer, ~8 records), and
    every byte is in the file when ``send`` returns (what the worker's acknowledgement relies on)."""
    if _write_syscalls() is None:
        pytest.skip("no /proc/self/io")
    evs = golden_events()[:60]
    encoded._SHARED.clear()
    key = Ed25519PrivateKey.generate()

    async def go() -> tuple[int, int, int]:
        sink = JsonlChainSink(tmp_path / "log", key, checkpoint_s=3600, fsync=False, share_json=False)
        await sink.open()
        (path,) = list_log_files(tmp_path / "log")
        size0 = path.stat().st_size
        before = _write_syscalls()
        await sink.send(evs)
        after = _write_syscalls()
        assert before is not None and after is not None
        grown = path.stat().st_size - size0
        await sink.close()
        return after - before, grown, size0

    writes, grown, _ = asyncio.run(go())
    assert grown > 60 * 500  # the records are on disk when send returns
    assert writes <= 2  # one for the batch (the thread may write once more elsewhere: a log line)
