"""Issue 11 item 2: audit schema "3" names each prefix figure once (available /
predicted / delivered, in ``route``) and the first byte ``first_byte_ms``; events of
schema "1" and "2" (a spill file written before the upgrade) are read and renamed."""
from __future__ import annotations

import pytest

from audit.event import SCHEMA_VERSION, AuditEvent, EventSchemaError, Kind, Latencies, Outcome, RouteInfo


def test_schema_3_fields() -> None:
    ev = AuditEvent(Kind.INFERENCE, Outcome.ALLOWED, time_ms=1, event_id="e",
                    route=RouteInfo(replica="r0", available_prefix_tokens=64, predicted_prefix_tokens=48,
                                    delivered_prefix_tokens=32),
                    latency=Latencies(auth_ms=1.0, parse_ms=0.5, keys_ms=0.25, policy_ms=0.125, route_ms=0.1,
                                      first_byte_ms=9.0, total_ms=20.0))
    d = ev.to_dict()
    assert SCHEMA_VERSION == d["schema_version"] == "6"  # "4" (session 2), "5" (24) and "6" (25) only added fields
    assert d["route"] == {"replica": "r0", "available_prefix_tokens": 64, "predicted_prefix_tokens": 48,
                          "delivered_prefix_tokens": 32}
    assert d["latency"]["first_byte_ms"] == 9.0 and "ttft_ms" not in d["latency"]
    assert "cached_tokens" not in d
    assert AuditEvent.from_dict(d) == ev


@pytest.mark.parametrize("version", ["1", "2"])
def test_older_events_are_read_with_the_new_names(version: str) -> None:
    old = {"schema_version": version, "time": "1970-01-01T00:00:00.001Z", "kind": "inference",
           "outcome": "allowed", "time_ms": 1, "event_id": "e", "cached_tokens": 32,
           "route": {"replica": "r0", "prefix_tokens_matched": 48, "prefix_tokens_available": 64},
           "latency": {"auth_ms": 1.0, "policy_ms": 2.0, "ttft_ms": 9.0}}
    ev = AuditEvent.from_dict(old)
    assert ev.route == RouteInfo(replica="r0", available_prefix_tokens=64, predicted_prefix_tokens=48,
                                 delivered_prefix_tokens=32)
    assert ev.latency == Latencies(auth_ms=1.0, policy_ms=2.0, first_byte_ms=9.0)
    assert old["cached_tokens"] == 32 and "prefix_tokens_matched" in old["route"]  # the input is not changed


def test_old_names_are_refused_in_a_schema_3_event() -> None:
    with pytest.raises(EventSchemaError):
        AuditEvent.from_dict({"schema_version": "3", "kind": "inference", "outcome": "allowed", "time_ms": 1,
                              "cached_tokens": 3})


@pytest.mark.parametrize("version", ["1", "2"])
def test_an_old_value_whose_new_group_is_not_an_object_is_kept_not_dropped(version: str) -> None:
    """S26-review26-10 (session 27): ``cached_tokens`` with ``"route": null`` (crafted) stays under its old
    name in the upgraded dict (before: popped and lost), so the record is refused by name, not read short."""
    from audit.event_upgrade import upgrade_event_dict
    old = {"schema_version": version, "kind": "inference", "outcome": "allowed", "time_ms": 1, "event_id": "e",
           "cached_tokens": 32, "route": None, "latency": {"ttft_ms": 9.0}}
    up = upgrade_event_dict(old)
    assert up["cached_tokens"] == 32 and up["route"] is None
    assert up["latency"] == {"first_byte_ms": 9.0}
    with pytest.raises(EventSchemaError, match="cached_tokens"):
        AuditEvent.from_dict(old)


def test_a_renamed_field_inside_its_own_group_keeps_the_group() -> None:
    """The one field of ``route`` renamed in place: the group stays (its only key is replaced)."""
    from audit.event_upgrade import upgrade_event_dict
    up = upgrade_event_dict({"schema_version": "2", "route": {"prefix_tokens_matched": 5}})
    assert up["route"] == {"predicted_prefix_tokens": 5}
