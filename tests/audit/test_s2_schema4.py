"""Audit schema "4" (session 2): the optional fields ``instance``, ``latency.queue_wait_ms`` and
``route.virtual_tokens`` that a strict schema-"3" reader refuses bump the version; "3" events
are still read, a chain holding both versions verifies, and the SIEM mappings carry the fields."""
from __future__ import annotations

import json

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import audit.event as event_mod
from audit.cef import format_cef, parse_cef
from audit.event import SCHEMA_VERSION, AuditEvent, EventSchemaError, Kind, Latencies, Outcome, RouteInfo
from audit.jsonl import JsonlChainSink, list_log_files
from audit.ocsf import to_ocsf, validate_ocsf
from audit.verify import verify_files


def _event(**kw: object) -> AuditEvent:
    return AuditEvent(Kind.INFERENCE, Outcome.ALLOWED, time_ms=1, event_id="e", request_id="r1",
                      endpoint="/v1/completions", route=RouteInfo(replica="r0", virtual_tokens=123.5),
                      latency=Latencies(total_ms=20.0, queue_wait_ms=4.25), instance="host/w1", **kw)


def test_version_4_carries_the_added_fields() -> None:
    d = _event().to_dict()
    assert SCHEMA_VERSION == d["schema_version"] == "6"  # "5" (24) and "6" (25) only added dropped_fields, policy.version
    assert d["instance"] == "host/w1"
    assert d["latency"]["queue_wait_ms"] == 4.25 and d["route"]["virtual_tokens"] == 123.5
    assert AuditEvent.from_dict(d) == _event()


def test_a_version_3_event_is_read_as_it_is() -> None:
    ev = AuditEvent.from_dict({"schema_version": "3", "kind": "inference", "outcome": "allowed", "time_ms": 1,
                               "event_id": "e", "route": {"replica": "r0", "delivered_prefix_tokens": 32}})
    assert ev.route == RouteInfo(replica="r0", delivered_prefix_tokens=32)


def test_unknown_versions_and_fields_are_still_refused() -> None:
    with pytest.raises(EventSchemaError):
        AuditEvent.from_dict({"schema_version": "7", "kind": "inference", "outcome": "allowed"})
    with pytest.raises(EventSchemaError):
        AuditEvent.from_dict({"schema_version": "4", "kind": "inference", "outcome": "allowed",
                              "cached_tokens": 3})


async def test_a_chain_with_version_3_and_4_events_verifies(tmp_path, monkeypatch) -> None:
    key = Ed25519PrivateKey.generate()

    async def write(request_id: str) -> None:
        sink = JsonlChainSink(tmp_path / "log", key, rotate_bytes=10**9, checkpoint_s=3600, fsync=False)
        await sink.open()
        await sink.send([AuditEvent(Kind.INFERENCE, Outcome.ALLOWED, request_id=request_id)])
        await sink.close()

    with monkeypatch.context() as m:  # an older gateway wrote the start of the chain
        m.setattr(event_mod, "SCHEMA_VERSION", "3")
        await write("old")
    await write("new")
    bodies = [json.loads(line)["body"] for f in list_log_files(tmp_path / "log") for line in f.read_text().splitlines()]
    versions = {b["request_id"]: b["schema_version"] for b in bodies if "request_id" in b}
    assert versions == {"old": "3", "new": "6"}
    report = verify_files([tmp_path / "log"], key.public_key())
    assert report.ok, report.problems


def test_cef_maps_the_added_fields() -> None:
    _, ext = parse_cef(format_cef(_event()))
    assert ext["cfp1Label"] == "queueWaitMs" and float(ext["cfp1"]) == 4.25
    assert ext["cfp2Label"] == "virtualTokens" and float(ext["cfp2"]) == 123.5
    assert ext["deviceExternalId"] == "host/w1"
    _, bare = parse_cef(format_cef(AuditEvent(Kind.INFERENCE, Outcome.ALLOWED)))
    assert not {"cfp1", "cfp1Label", "cfp2", "cfp2Label", "deviceExternalId"} & bare.keys()


def test_ocsf_carries_the_added_fields_unmapped() -> None:
    out = to_ocsf(_event())
    pg = out["unmapped"]["prefixgate"]
    assert pg["instance"] == "host/w1"
    assert pg["latency"]["queue_wait_ms"] == 4.25 and pg["route"]["virtual_tokens"] == 123.5
    validate_ocsf(out)
