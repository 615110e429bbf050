"""The OTLP log records of audit events, built as ``opentelemetry-proto`` messages: the field
mapping of :mod:`audit.otlp` (severity, body, attributes, trace id), shared by its sink and by
:mod:`audit.otlp_log_request`, which writes the same bytes directly (session 9)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache

from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.logs.v1 import logs_pb2
from opentelemetry.proto.resource.v1 import resource_pb2

from audit.encoded import shared_json
from audit.event import AuditEvent, Outcome

__all__ = ["HAS_EVENT_NAME_FIELD", "WARN_OUTCOMES", "build_request", "build_resource", "severity_of",
           "severity_of_outcome", "trace_id_bytes"]

#: Outcomes exported with severity WARN (13); all others INFO (9).
WARN_OUTCOMES = frozenset({Outcome.DENIED, Outcome.UNAUTHENTICATED, Outcome.RAISED, Outcome.FAILED})
_SEVERITY_WARN = (logs_pb2.SEVERITY_NUMBER_WARN, "WARN")
_SEVERITY_INFO = (logs_pb2.SEVERITY_NUMBER_INFO, "INFO")
HAS_EVENT_NAME_FIELD = "event_name" in logs_pb2.LogRecord.DESCRIPTOR.fields_by_name



def severity_of(event: AuditEvent) -> tuple[int, str]:
    """OTLP severity ``(number, text)`` of an event: WARN (13) for denied,
    unauthenticated, raised and failed outcomes, INFO (9) otherwise."""
    return _SEVERITY_WARN if event.outcome in WARN_OUTCOMES else _SEVERITY_INFO


def severity_of_outcome(outcome: Outcome) -> tuple[int, str]:
    """:func:`severity_of` of an event with this ``outcome`` (an :class:`audit.event.Outcome` member)."""
    return _SEVERITY_WARN if outcome in WARN_OUTCOMES else _SEVERITY_INFO


def trace_id_bytes(trace_id: str | None) -> bytes | None:
    """The 16-byte OTLP ``trace_id`` of a W3C trace id (32 lowercase/uppercase
    hex chars, not all zero), or None when absent or malformed."""
    if trace_id is None or len(trace_id) != 32:
        return None
    try:
        raw = bytes.fromhex(trace_id)
    except ValueError:
        return None
    return raw if any(raw) else None


def _str_kv(key: str, value: str) -> common_pb2.KeyValue:
    return common_pb2.KeyValue(key=key, value=common_pb2.AnyValue(string_value=value))


#: ``KeyValue`` messages of the attribute values that repeat (event name and outcome: closed sets; tenant:
#: the tenant registry's), built once: the repeated field copies a given message, which costs about half of
#: constructing it (issue 14). A least-recently-used cache (S29-caches29-3; it was emptied whole when full);
#: ~0.3 KiB an entry. The returned message is shared: never mutate it.
_KV_CACHE_MAX = 1024
_cached_kv = lru_cache(maxsize=_KV_CACHE_MAX)(_str_kv)


def build_resource(service_name: str, attributes: Mapping[str, str] | None = None) -> resource_pb2.Resource:
    """OTLP Resource with ``service.name`` and extra string attributes
    (``service.name`` in ``attributes`` is ignored; the argument wins)."""
    kvs = [_str_kv("service.name", service_name)]
    kvs.extend(_str_kv(k, str(v)) for k, v in (attributes or {}).items() if k != "service.name")
    return resource_pb2.Resource(attributes=kvs)


def build_request(
    events: Sequence[AuditEvent],
    resource: resource_pb2.Resource,
    scope: common_pb2.InstrumentationScope,
    observed_ns: int,
) -> logs_service_pb2.ExportLogsServiceRequest:
    """One ``ExportLogsServiceRequest`` holding one LogRecord per event, in order.

    Args:
        events: audit events (any number; the caller splits large batches).
        resource: from :func:`build_resource`.
        scope: instrumentation scope (name ``prefixgate.audit``).
        observed_ns: ``observed_time_unix_nano`` of every record (epoch ns).

    Field mapping: see the module docstring.
    """
    req = logs_service_pb2.ExportLogsServiceRequest()
    rl = req.resource_logs.add()
    rl.resource.CopyFrom(resource)
    sl = rl.scope_logs.add()
    sl.scope.CopyFrom(scope)
    records = sl.log_records
    for ev in events:
        number, text = severity_of(ev)
        kind = ev.kind.value
        # fields set in place (no intermediate AnyValue/KeyValue objects; same message)
        rec = records.add(time_unix_nano=ev.time_ms * 1_000_000, observed_time_unix_nano=observed_ns,
                          severity_number=number, severity_text=text)
        rec.body.string_value = shared_json(ev).decode()
        attrs = rec.attributes
        attrs.append(_cached_kv("event.name", f"prefixgate.audit.{kind}"))
        kv = attrs.add()
        kv.key = "prefixgate.event_id"
        kv.value.string_value = ev.event_id
        attrs.append(_cached_kv("prefixgate.outcome", ev.outcome.value))
        if ev.tenant:
            attrs.append(_cached_kv("prefixgate.tenant", ev.tenant))
        if HAS_EVENT_NAME_FIELD:
            rec.event_name = f"prefixgate.audit.{kind}"
        tid = trace_id_bytes(ev.trace_id)
        if tid is not None:
            rec.trace_id = tid
    return req
