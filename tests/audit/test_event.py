from __future__ import annotations

import json
import re

import pytest

from audit.event import AuditEvent, EventSchemaError, Identity, Kind, Outcome, PolicyInfo, RouteInfo
from audit.scrub import scrub_event
from audit.summary import SummaryAggregator

JWT = "eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJzcGlmZmU6Ly9leGFtcGxlLm9yZy93In0.c2lnbmF0dXJl"


def _event(**kw) -> AuditEvent:
    base = dict(
        kind=Kind.INFERENCE,
        outcome=Outcome.ALLOWED,
        time_ms=1_700_000_000_123,
        request_id="req-1",
        identity=Identity("spiffe://example.org/ns/a/sa/b", "example.org"),
        tenant="acme",
        policy=PolicyInfo("dec-1", "ok", "allowed by pool policy"),
        route=RouteInfo(replica="r1", pool="p", policy="prefix", predicted_prefix_tokens=32, available_prefix_tokens=48),
        prompt_tokens=48,
        prefix_fingerprint="a1b2c3d4e5f60718",
    )
    base.update(kw)
    return AuditEvent(**base)


def test_schema_roundtrip_and_time_format():
    ev = _event()
    d = ev.to_dict()
    assert d["schema_version"] == "6"
    assert d["time"] == "2023-11-14T22:13:20.123Z"
    assert d["time_ms"] == 1_700_000_000_123
    assert re.fullmatch(r"[0-9a-f-]{36}", d["event_id"])
    assert d["route"]["predicted_prefix_tokens"] == 32
    assert "output_tokens" not in d  # None omitted
    again = AuditEvent.from_dict(json.loads(json.dumps(d)))
    assert again == ev


def test_from_dict_rejects_unknown_version_and_fields():
    d = _event().to_dict()
    with pytest.raises(EventSchemaError):
        AuditEvent.from_dict(dict(d, schema_version="7"))
    with pytest.raises(EventSchemaError):
        AuditEvent.from_dict(dict(d, prompt="hello"))
    with pytest.raises(EventSchemaError):
        AuditEvent.from_dict(dict(d, outcome="maybe"))


@pytest.mark.parametrize(
    "field,value,reason",
    [
        ("request_id", JWT, "jwt_like"),
        ("endpoint", "Bearer abcdefghijklmnop", "secret_like"),
        ("model", "x" * 300, "too_long"),
        ("prefix_fingerprint", "ab" * 32, "fingerprint_shape"),  # a raw sha256 prefix hash
        ("client_address", "-----BEGIN PRIVATE KEY-----", "secret_like"),
    ],
)
def test_scrubber_drops_secret_fields(field, value, reason):
    ev, dropped = scrub_event(_event(**{field: value}))
    assert (field, reason) in dropped
    assert getattr(ev, field) is None
    assert value not in json.dumps(ev.to_dict())


def test_scrubber_nested_and_lists():
    ev = _event(
        policy=PolicyInfo("d", "c", "the prompt was: " + "tell me a secret " * 20),
        operator={"action": "key_rotation", "token": JWT, "ids": [1, 2, 3]},
    )
    clean, dropped = scrub_event(ev)
    paths = {p for p, _ in dropped}
    assert {"policy.reason", "operator.token", "operator.ids"} <= paths
    text = json.dumps(clean.to_dict())
    assert "tell me a secret" not in text and JWT not in text
    assert clean.operator == {"action": "key_rotation"}
    assert clean.policy.decision_id == "d"


def test_scrubber_keeps_clean_event_identical():
    ev = _event()
    clean, dropped = scrub_event(ev)
    assert dropped == [] and clean == ev


def test_summary_aggregator_first_n_then_counts():
    agg = SummaryAggregator(window_s=10, first_n=3)
    passed = 0
    t0 = 1_000_000
    for i in range(50):
        ev = AuditEvent(kind=Kind.AUTH, outcome=Outcome.UNAUTHENTICATED, time_ms=t0 + i, client_address="10.0.0.9")
        passed += agg.offer(ev) is not None
    other = AuditEvent(kind=Kind.AUTH, outcome=Outcome.UNAUTHENTICATED, time_ms=t0, client_address="10.0.0.10")
    assert agg.offer(other) is other
    allowed = _event(time_ms=t0)
    assert agg.offer(allowed) is allowed  # not aggregated
    assert passed == 3
    assert agg.flush(t0 + 5_000) == []  # window still open
    summaries = agg.flush(t0 + 10_000)
    assert len(summaries) == 1
    s = summaries[0]
    assert s.kind is Kind.SUMMARY and s.client_address == "10.0.0.9"
    assert s.summary["suppressed"] == 47 and s.summary["count_unauthenticated"] == 47
    # new window: individual events again
    ev = AuditEvent(kind=Kind.AUTH, outcome=Outcome.UNAUTHENTICATED, time_ms=t0 + 20_000, client_address="10.0.0.9")
    assert agg.offer(ev) is ev
