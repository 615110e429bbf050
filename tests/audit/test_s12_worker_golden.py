"""Session 12 (issue 14): every sink's bytes for a fixed set of request rows and other events stay
exactly what they were before the audit worker's one-pass formatting (golden digests captured from
the session-start tree, 7df198b, before any change): the JSONL chain's record lines (hash chain),
the OCSF file line, the syslog sink's RFC 5424 frame (CEF message, octet-counted), the OTLP
logs request body; each asked in several orders (a sink may run before or after another), and
through the sinks' own ``send`` for the OCSF file and the JSONL chain (verified with
:func:`audit.verify.verify_chain`)."""
from __future__ import annotations

import asyncio
import hashlib
import itertools
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.common.v1 import common_pb2

import audit.event as event_mod
from audit import encoded
from audit.cef import cef_line
from audit.chain import GENESIS, encode_record
from audit.encoded import shared_json
from audit.event import AuditEvent, Identity, Kind, Outcome, PolicyInfo
from audit.ocsf import OcsfFileSink, ocsf_line
from audit.otlp import SCOPE_NAME, build_resource
from audit.otlp_log_request import encode_logs_request
from audit.request_event import request_event
from audit.syslog import _rfc5424, frame_octet_counted

_HOSTILE = ["a=b", "x|y", "back\\slash", "l1\nl2", "cr\r\nlf", "ü€😀", "", " lead", "=", "\\"]


def golden_rows() -> list[list[Any]]:
    """Deterministic request rows (no clock, no random): allowed, denied, unauthenticated, unknown
    outcome, missing stamps and groups, hostile strings in every string slot, odd numbers."""
    rows = []
    for i in range(120):
        tenant = f"tenant-{'abcdefgh'[i % 8]}"
        denied = i % 20 == 19
        outcome = ("denied" if denied else "allowed", "unauthenticated", "rate_limited", "succeeded", "weird",
                   "allowed")[i % 6] if i % 5 == 0 else ("denied" if denied else "allowed")
        h = _HOSTILE[i % len(_HOSTILE)] if i % 3 == 0 else None
        t = 1000.0 + i * 0.25
        row = [
            f"00000000-0000-4000-8000-{i:012d}", 1_764_000_000_000 + i * 7, outcome, f"{i:032x}",
            f"spiffe://demo.prefixgate.test/{tenant}/bench", "demo.prefixgate.test", h or tenant,
            f"{i * 31:032x}", "model_not_allowed" if denied else (h or "allow"),
            "model not in tenant allow-list" if denied else (h or "tenant may use pool"),
            "/v1/completions" if i % 4 else "/v1/chat/completions", h or "sim-model", 100 + i,
            None if denied else i % 9, 1, 104, 100 if denied else 104, 100, 0 if denied else 4, 0 if denied else 4,
            "refused" if denied else "usage", "upstream_timeout" if i % 7 == 3 else None,
            None if denied else (h or f"r{i % 2}"), "default", "cache_aware", 64, None if denied else 64,
            None if denied else i * 3, None if denied else (1200.0 + i / 8),
            t, t + 1e-4, t + 2e-4, t + 3e-4, t + 4e-4, None if denied else t + 5e-4,
            None if denied or i % 11 == 1 else t + 2e-3, t + 3e-3,
            403 if denied else (200 if i % 13 else 502), "127.0.0.1" if i % 9 else "::1",
            f"{i * 7919:032x}" if i % 4 else None, f"{(i * 7919) % (1 << 64):016x}" * 2 if i % 6 else None,
            None if denied else 1234.5 + i, None if denied else (0.0 if i % 2 else 0.125 * i),
            None, None]  # dropped_fields (schema "5"), policy_version ("6"): none, so the golden bytes stand
        if i % 17 == 4:
            row[4], row[5] = None, None
        if i % 10 == 7:
            row[12] = True  # a bool where a count goes
        rows.append(row)
    return rows


def golden_events() -> list[AuditEvent]:
    """The rows' events (instance stamped as the worker does) plus a few that are not request
    events (details, other kinds): the sinks' slow paths."""
    evs = [request_event(r, "pg-inst-1" if k % 2 else "inst|=\\2") for k, r in enumerate(golden_rows())]
    evs.append(AuditEvent(kind=Kind.ALERT, outcome=Outcome.RAISED, time_ms=1_764_000_100_000, event_id="alert-1",
                          tenant="tenant-a", alert={"alert_kind": "concentration", "alert_id": "a1", "x": "y=z"}))
    evs.append(AuditEvent(kind=Kind.OPERATOR, outcome=Outcome.SUCCEEDED, time_ms=1_764_000_100_001,
                          event_id="op-1", identity=Identity("spiffe://d/admin", "d"),
                          operator={"action": "reload", "target": "policy"}))
    evs.append(AuditEvent(kind=Kind.SUMMARY, outcome=Outcome.SUMMARIZED, time_ms=1_764_000_100_002,
                          event_id="sum-1", policy=PolicyInfo(None, "audit_unavailable", None),
                          summary={"suppressed": 12, "source": "10.0.0.1", "reason": "audit_unavailable"}))
    return evs


_MIDDLE = " host.example prefixgate - "
_SCOPE = common_pb2.InstrumentationScope(name=SCOPE_NAME, version="0")


def _chain_lines(evs: list[AuditEvent]) -> bytes:
    head, out = GENESIS, []
    for seq, ev in enumerate(evs, 1):
        line, head = encode_record(seq, "event", head, shared_json(ev))
        out.append(line)
    return b"".join(out)


def _syslog(evs: list[AuditEvent]) -> bytes:
    return b"".join(frame_octet_counted(_rfc5424(ev, cef_line(ev), _MIDDLE)) for ev in evs)


def _ocsf(evs: list[AuditEvent]) -> bytes:
    return b"".join(ocsf_line(ev) + b"\n" for ev in evs)


def _otlp(evs: list[AuditEvent]) -> bytes:
    resource = build_resource("prefixgate", {"deployment.environment": "test"})
    scope = _SCOPE
    return b"".join(encode_logs_request(evs[k:k + 40], resource, scope, 1_764_000_200_000_000_000)
                    for k in range(0, len(evs), 40))


_SINKS = {"jsonl": _chain_lines, "syslog": _syslog, "ocsf": _ocsf, "otlp": _otlp}

#: sha256 of each sink's bytes for golden_events(), captured from the session-start tree (7df198b);
#: "ocsf" re-captured in session 23 (S23-newcomer-8): OCSF ``status`` is now the caption of ``status_id``.
#: Checked then: the 123 OCSF events parsed from before and after are equal but for ``status``
#: (allowed/succeeded -> Success, denied/failed/rate_limited/unauthenticated -> Failure, raised -> New,
#: summarized (99 Other) unchanged)
GOLDEN = {
    "jsonl": "b0bda3d2700db0b783fbd2e2a8ca6e4264d5b8195f0a66fe7cd3e6fff4e41231",
    "syslog": "0169091726f53abb8eb184fc8b087109ce0f82900d10ab0859bf2e9e6bae1cbb",
    "ocsf": "c84e90d4dd3a48ebc50726a93af19a5f1a5b1c2d1dad420d5fe7f435b0d68485",
    "otlp": "d6424250f42ce77cbe647ff7a4e869327c7df1ef760cc88b7f6a1f5aa7888964",
}


@pytest.fixture(autouse=True)
def _schema_4(monkeypatch: pytest.MonkeyPatch) -> None:
    """The digests were captured under schema "4"; schema "5" (session 24) only adds ``dropped_fields`` and "6"
    (session 25) ``policy.version``, None in every golden event: written as "4", each sink's bytes are the golden
    ones (what changed is the version alone)."""
    monkeypatch.setattr(event_mod, "SCHEMA_VERSION", "4")


def _digests(order: tuple[str, ...]) -> dict[str, str]:
    evs = golden_events()
    return {name: hashlib.sha256(_SINKS[name](evs)).hexdigest() for name in order}


def test_every_sink_gives_the_golden_bytes_in_every_order() -> None:
    for order in itertools.permutations(_SINKS):
        encoded._SHARED.clear()
        assert _digests(order) == GOLDEN, order


def test_sinks_interleaved_per_batch_give_the_golden_bytes() -> None:
    """As the worker runs them: each sink takes the same events in its own batches, in turns."""
    evs = golden_events()
    # the chain and OTLP bodies of one batch at a time, in the turn order above
    out = {name: b"" for name in _SINKS}
    head, seq = GENESIS, 0
    for k in range(0, len(evs), 16):
        for name in list(_SINKS)[k // 16 % 4:] + list(_SINKS)[:k // 16 % 4]:
            batch = evs[k:k + 16]
            if name == "jsonl":
                for ev in batch:
                    seq += 1
                    line, head = encode_record(seq, "event", head, shared_json(ev))
                    out[name] += line
            elif name == "otlp":
                encode_logs_request(batch, build_resource("prefixgate", {}), _SCOPE, 1)  # takes shared bodies
            else:
                out[name] += _SINKS[name](batch)
    assert hashlib.sha256(out["jsonl"]).hexdigest() == GOLDEN["jsonl"]
    assert hashlib.sha256(out["syslog"]).hexdigest() == GOLDEN["syslog"]
    assert hashlib.sha256(out["ocsf"]).hexdigest() == GOLDEN["ocsf"]
    assert hashlib.sha256(_otlp(evs)).hexdigest() == GOLDEN["otlp"]


def test_ocsf_sink_file_and_jsonl_chain_verify(tmp_path: Path) -> None:
    """Through the sinks' own ``send``: the OCSF file holds the golden bytes, the chain's event
    records are the golden records' bodies and the chain verifies."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from audit.jsonl import JsonlChainSink, list_log_files
    from audit.verify import verify_files

    evs = golden_events()
    encoded._SHARED.clear()
    key = Ed25519PrivateKey.generate()

    async def go() -> None:
        ocsf = OcsfFileSink(str(tmp_path / "ocsf.jsonl"))
        await ocsf.open()
        jsonl = JsonlChainSink(tmp_path / "log", key, checkpoint_s=3600, fsync=False)
        await jsonl.open()
        for k in range(0, len(evs), 25):
            await (ocsf.send if k % 50 else jsonl.send)(evs[k:k + 25])
            await (jsonl.send if k % 50 else ocsf.send)(evs[k:k + 25])
        await ocsf.close()
        await jsonl.close()

    asyncio.run(go())
    assert hashlib.sha256((tmp_path / "ocsf.jsonl").read_bytes()).hexdigest() == GOLDEN["ocsf"]
    report = verify_files([tmp_path / "log"], key.public_key())
    assert report.ok, report.problems
    import orjson

    bodies = [orjson.loads(line)["body"] for f in list_log_files(tmp_path / "log")
              for line in f.read_bytes().splitlines() if b'"type":"event"' in line]
    assert bodies == [orjson.loads(shared_json(ev)) for ev in evs]
