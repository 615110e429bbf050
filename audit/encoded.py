"""One canonical JSON encoding of an event shared by the sinks that need it.

The JSONL chain (record body) and the OTLP log sink (LogRecord body) both need
:meth:`audit.event.AuditEvent.to_json` of the same event object; in the audit
worker that was two ``to_dict`` + ``orjson`` encodings per event (issue 14,
~6 µs of ~100 µs). :func:`shared_json` encodes once and hands the same bytes
to the next caller asking for the same object.

Bounded: at most :data:`SHARED_JSON_MAX` entries (oldest dropped first), an
entry is removed when it is taken a second time, so the cache holds at most a
few thousand recently emitted events (the OTLP sink sends up to 0.5 s after
the JSONL sink: ~1,000 events at 2,000/s; the bound leaves room for a burst; an
evicted entry is only encoded again). Worst case ~8 MB of encodings. Each entry keeps its event alive, so
``id(event)`` cannot be reused while the entry exists.
"""
from __future__ import annotations

from audit.event import AuditEvent

__all__ = ["SHARED_JSON_MAX", "shared_json"]

#: Most events whose encoding is kept for a second sink.
SHARED_JSON_MAX = 8192

_SHARED: dict[int, tuple[AuditEvent, bytes]] = {}


def shared_json(event: AuditEvent) -> bytes:
    """``event.to_json()`` (canonical JSON bytes, no newline), encoded at most once
    for two consecutive callers asking for the same object. Never raises beyond
    what ``to_json`` raises."""
    hit = _SHARED.pop(id(event), None)
    if hit is not None and hit[0] is event:
        return hit[1]
    data = event.to_json()
    if len(_SHARED) >= SHARED_JSON_MAX:
        del _SHARED[next(iter(_SHARED))]
    _SHARED[id(event)] = (event, data)
    return data
