"""The OTLP/HTTP logs request body of a batch of audit events, written directly (issue 14, session 9).

:func:`encode_logs_request` returns exactly the bytes of
``audit.otlp_log_build.build_request(events, resource, scope, observed_ns).SerializeToString()`` (the mapping
of each event to its ``LogRecord``: :mod:`audit.otlp`'s module doc) without filling a generated
message per event: each ``LogRecord`` is written with :mod:`audit.otlp_pb` (the repeated
attributes cached, the event's canonical JSON body used as it is), ~4x cheaper in the audit
worker. An event outside the plain shape (a ``time_ms`` that is not a positive int below 2**64 ns)
gets its record from the generated message, serialised on its own: the same bytes either way
(tests/audit/test_s9_otlp_logs_bytes.py).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from functools import lru_cache

from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.resource.v1 import resource_pb2

from audit.encoded import KIND_VALUE, OUTCOME_VALUE, shared_json
from audit.event import AuditEvent, Kind, Outcome
from audit.otlp_log_build import HAS_EVENT_NAME_FIELD, build_request, severity_of_outcome, trace_id_bytes
from audit.otlp_pb import key_value, len_field

__all__ = ["encode_logs_request"]

_pack_q = struct.Struct("<Q").pack
_KEY_EVENT_ID = len_field(b"\x0a", b"prefixgate.event_id")
_HEADS_MAX = 1024  # (kind, outcome, tenant): closed sets but the tenant (the registry's); ~0.7 KiB an entry


@lru_cache(maxsize=_HEADS_MAX)
def _heads(kind: Kind, outcome: Outcome, tenant: str | None) -> tuple[bytes, bytes, bytes, bytes]:
    """``(severity fields, event.name attribute, attributes after the event id, event_name field)`` of an
    event of these exact enum members and tenant; cached, least recently used out (S29-caches29-3: a dict
    emptied whole at 1,024 before)."""
    number, text = severity_of_outcome(outcome)
    kind_value, outcome_value = KIND_VALUE[kind], OUTCOME_VALUE[outcome]
    name = f"prefixgate.audit.{kind_value}"
    severity = b"\x10" + bytes((number,)) + len_field(b"\x1a", text.encode())
    tail = len_field(b"\x32", key_value("prefixgate.outcome", outcome_value))
    if tenant:
        tail += len_field(b"\x32", key_value("prefixgate.tenant", tenant))
    return (severity, len_field(b"\x32", key_value("event.name", name)), tail,
            len_field(b"\x62", name.encode()) if HAS_EVENT_NAME_FIELD else b"")


def _parts(ev: AuditEvent) -> tuple[bytes, bytes, bytes, bytes]:
    """``(severity fields, event.name attribute, attributes after the event id, event_name field)``.

    Raises:
        ValueError: kind or outcome not an exact enum member (the caller takes the generated message).
        TypeError: a tenant that cannot be a cache key (the same)."""
    kind, outcome, tenant = ev.kind, ev.outcome, ev.tenant
    if type(kind) is not Kind or type(outcome) is not Outcome:
        raise ValueError("kind or outcome not an exact enum member")
    return _heads(kind, outcome, tenant)


def _record(ev: AuditEvent, observed: bytes) -> bytes:
    """One ``LogRecord``'s bytes (``observed``: its ``observed_time_unix_nano`` field, written once per batch).

    Raises:
        ValueError: ``time_ms`` not a positive int below 2**64 ns (the caller uses the generated message).
    """
    t = ev.time_ms
    if type(t) is not int or not 0 < t < 18_446_744_073_709:
        raise ValueError("time_ms outside the direct path")
    severity, name_attr, tail, event_name = _parts(ev)
    eid = ev.event_id.encode()
    parts = [b"\x09", _pack_q(t * 1_000_000), severity, len_field(b"\x2a", len_field(b"\x0a", shared_json(ev))),
             name_attr, len_field(b"\x32", _KEY_EVENT_ID + len_field(b"\x12", len_field(b"\x0a", eid))), tail]
    tid = trace_id_bytes(ev.trace_id)
    if tid is not None:
        parts.append(b"\x4a\x10" + tid)
    parts.append(observed)
    parts.append(event_name)
    return b"".join(parts)


def encode_logs_request(events: Sequence[AuditEvent], resource: resource_pb2.Resource,
                        scope: common_pb2.InstrumentationScope, observed_ns: int) -> bytes:
    """The serialised ``ExportLogsServiceRequest`` of ``events`` (see the module doc); arguments as
    :func:`audit.otlp_log_build.build_request`'s. Raises what ``build_request`` raises for an event it refuses."""
    observed = b"\x59" + _pack_q(observed_ns) if observed_ns else b""
    records = []
    for ev in events:
        try:
            records.append(len_field(b"\x12", _record(ev, observed)))
        except (ValueError, AttributeError, TypeError, struct.error):
            one = build_request([ev], resource, scope, observed_ns).resource_logs[0].scope_logs[0].log_records[0]
            records.append(len_field(b"\x12", one.SerializeToString()))
    scope_logs = len_field(b"\x12", len_field(b"\x0a", scope.SerializeToString()) + b"".join(records))
    resource_logs = len_field(b"\x0a", resource.SerializeToString()) + scope_logs
    return len_field(b"\x0a", resource_logs)
