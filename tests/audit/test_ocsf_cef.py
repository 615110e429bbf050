from __future__ import annotations

import copy

import pytest
from hypothesis import given
from hypothesis import strategies as st

from audit.cef import escape_extension, escape_header, format_cef, parse_cef
from audit.event import AuditEvent, Identity, Kind, Outcome, PolicyInfo, RouteInfo
from audit.ocsf import OcsfValidationError, to_ocsf, validate_ocsf
from audit.summary import SummaryAggregator

EVENTS = [
    AuditEvent(kind=Kind.INFERENCE, outcome=Outcome.ALLOWED, tenant="t", endpoint="/v1/chat/completions",
               identity=Identity("spiffe://e.org/a", "e.org"), policy=PolicyInfo("d1", "ok", "fine"),
               client_address="127.0.0.1", route=RouteInfo(replica="r1"), status_code=200),
    AuditEvent(kind=Kind.INFERENCE, outcome=Outcome.DENIED, policy=PolicyInfo("d2", "pool_forbidden")),
    AuditEvent(kind=Kind.AUTH, outcome=Outcome.UNAUTHENTICATED, client_address="10.0.0.1", status_code=401),
    AuditEvent(kind=Kind.OPERATOR, outcome=Outcome.SUCCEEDED, operator={"action": "key_rotation", "target": "keyring"}),
    AuditEvent(kind=Kind.ALERT, outcome=Outcome.RAISED, alert={"alert_id": "c1", "alert_kind": "replica_concentration"}),
    AuditEvent(kind=Kind.ALERT, outcome=Outcome.CLEARED, alert={"alert_id": "c1", "alert_kind": "replica_concentration"}),
    AuditEvent(kind=Kind.CHECKPOINT, outcome=Outcome.SEALED, checkpoint={"head": "ab", "head_seq": 3}),
]


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: f"{e.kind.value}-{e.outcome.value}")
def test_ocsf_events_validate(event):
    data = to_ocsf(event)
    validate_ocsf(data)
    assert data["type_uid"] == data["class_uid"] * 100 + data["activity_id"]
    assert data["metadata"]["version"] == "1.5.0" and data["metadata"]["uid"] == event.event_id


def test_ocsf_class_mapping_and_authorization():
    assert [to_ocsf(e)["class_uid"] for e in EVENTS] == [6003, 6003, 3002, 3004, 2004, 2004, 6003]
    auth = to_ocsf(EVENTS[1])["actor"]["authorizations"][0]
    assert auth == {"decision": "denied", "policy": {"uid": "d2", "name": "pool_forbidden"}}


def test_ocsf_summary_counts():
    agg = SummaryAggregator(window_s=1, first_n=1)
    for i in range(5):
        agg.offer(AuditEvent(kind=Kind.AUTH, outcome=Outcome.UNAUTHENTICATED, time_ms=i, client_address="10.1.1.1"))
    (summary,) = agg.flush(10_000)
    data = to_ocsf(summary)
    validate_ocsf(data)
    assert data["class_uid"] == 3002 and data["count"] == 4


def test_ocsf_validation_catches_broken_event():
    data = to_ocsf(EVENTS[0])
    bad = copy.deepcopy(data)
    bad["type_uid"] = 600302  # valid enum, inconsistent with activity_id 1
    with pytest.raises(OcsfValidationError):
        validate_ocsf(bad)
    bad = copy.deepcopy(data)
    del bad["metadata"]
    with pytest.raises(OcsfValidationError):
        validate_ocsf(bad)


def test_cef_escaping_examples():
    assert escape_header("a|b\\c") == "a\\|b\\\\c"
    assert escape_extension("x=y\\z\nw") == "x\\=y\\\\z\\nw"
    ev = AuditEvent(kind=Kind.OPERATOR, outcome=Outcome.SUCCEEDED, tenant="a|b=c\\d\ne f",
                    operator={"action": "policy|update"})
    line = format_cef(ev)
    assert "\n" not in line
    header, ext = parse_cef(line)
    assert header[5] == "operator succeeded policy|update"
    assert ext["cs1"] == "a|b=c\\d\ne f" and ext["cs1Label"] == "tenant"
    assert ext["externalId"] == ev.event_id


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\r"), max_size=60))
def test_cef_extension_roundtrip(value):
    ev = AuditEvent(kind=Kind.INFERENCE, outcome=Outcome.ALLOWED, model=value or None, tenant="t")
    _, ext = parse_cef(format_cef(ev))
    assert ext.get("cs4") == (value or None) and ext["cs1"] == "t"
