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

Session 11: a request's event (no kind-specific details, plain values) is encoded by :func:`_plain_json`,
its dict written field by field in sorted key order (~2x cheaper than ``to_dict`` + a sorting dump).
"""
from __future__ import annotations

from typing import Any

import orjson

from audit import event as _event_module
from audit.event import _PLAIN_TYPES, AuditEvent, Kind, Outcome, iso_ms

__all__ = ["KIND_VALUE", "OUTCOME_VALUE", "SHARED_JSON_MAX", "shared_json"]

#: ``member.value`` of each kind and outcome (session 12: an enum's ``.value`` is a property, ~0.24 µs;
#: a dict lookup ~0.03, and the sinks read these several times per event); only for exact enum members
KIND_VALUE: dict[Kind, str] = {k: k.value for k in Kind}
OUTCOME_VALUE: dict[Outcome, str] = {o: o.value for o in Outcome}

#: Most events whose encoding is kept for a second sink.
SHARED_JSON_MAX = 8192

_SHARED: dict[int, tuple[AuditEvent, bytes]] = {}


def shared_json(event: AuditEvent, keep: bool = True) -> bytes:
    """``event.to_json()`` (canonical JSON bytes, no newline), encoded at most once
    for two consecutive callers asking for the same object. ``keep=False``: the caller
    knows no second caller will ask (the JSONL sink without an OTLP log sink beside it,
    session 13): an entry already there is still taken, but a new encoding is not kept
    (a kept entry holds its event alive until 8192 newer ones push it out: ~60k objects
    the cyclic GC walks again and again). Never raises beyond what ``to_json`` raises."""
    hit = _SHARED.pop(id(event), None)
    if hit is not None and hit[0] is event:
        return hit[1]
    data = _plain_json(event) or event.to_json()
    if not keep:
        return data
    if len(_SHARED) >= SHARED_JSON_MAX:
        del _SHARED[next(iter(_SHARED))]
    _SHARED[id(event)] = (event, data)
    return data


def _plain_json(ev: AuditEvent) -> bytes | None:
    """``ev.to_json()`` built straight (keys inserted in sorted order, so no sort pass) for an event
    without kind-specific details whose top-level values are None or exact str/int/float/bool and whose
    kind and outcome are the enums; None for any other event (the caller takes ``to_json``). Same bytes
    (tests/audit/test_s11_worker_cpu.py)."""
    if (ev.operator is not None or ev.alert is not None or ev.summary is not None or ev.checkpoint is not None
            or type(ev.kind) is not Kind or type(ev.outcome) is not Outcome):
        return None
    plain = _PLAIN_TYPES
    out: dict[str, Any] = {}
    if (v := ev.client_address) is not None:
        if type(v) not in plain:
            return None
        out["client_address"] = v
    if (v := ev.dropped_fields) is not None:
        if type(v) not in plain:
            return None
        out["dropped_fields"] = v
    if (v := ev.endpoint) is not None:
        if type(v) not in plain:
            return None
        out["endpoint"] = v
    if (v := ev.error_code) is not None:
        if type(v) not in plain:
            return None
        out["error_code"] = v
    if (v := ev.event_id) is not None:
        if type(v) not in plain:
            return None
        out["event_id"] = v
    g = ev.identity
    if g is not None:
        d = {}
        if (v := g.spiffe_id) is not None:
            d["spiffe_id"] = v
        if (v := g.trust_domain) is not None:
            d["trust_domain"] = v
        if d:
            out["identity"] = d
    if (v := ev.instance) is not None:
        if type(v) not in plain:
            return None
        out["instance"] = v
    out["kind"] = KIND_VALUE[ev.kind]  # an exact Kind (checked above)
    g = ev.latency
    if g is not None:
        d = {}
        if (v := g.auth_ms) is not None:
            d["auth_ms"] = v
        if (v := g.first_byte_ms) is not None:
            d["first_byte_ms"] = v
        if (v := g.keys_ms) is not None:
            d["keys_ms"] = v
        if (v := g.parse_ms) is not None:
            d["parse_ms"] = v
        if (v := g.policy_ms) is not None:
            d["policy_ms"] = v
        if (v := g.queue_wait_ms) is not None:
            d["queue_wait_ms"] = v
        if (v := g.route_ms) is not None:
            d["route_ms"] = v
        if (v := g.total_ms) is not None:
            d["total_ms"] = v
        if d:
            out["latency"] = d
    g = ev.ledger
    if g is not None:
        d = {}
        if (v := g.basis) is not None:
            d["basis"] = v
        if (v := g.charged_tokens) is not None:
            d["charged_tokens"] = v
        if (v := g.output_charged) is not None:
            d["output_charged"] = v
        if (v := g.output_relayed) is not None:
            d["output_relayed"] = v
        if (v := g.prompt_charged) is not None:
            d["prompt_charged"] = v
        if (v := g.reserved_tokens) is not None:
            d["reserved_tokens"] = v
        if d:
            out["ledger"] = d
    if (v := ev.model) is not None:
        if type(v) not in plain:
            return None
        out["model"] = v
    out["outcome"] = OUTCOME_VALUE[ev.outcome]
    if (v := ev.output_tokens) is not None:
        if type(v) not in plain:
            return None
        out["output_tokens"] = v
    g = ev.policy
    if g is not None:
        d = {}
        if (v := g.decision_id) is not None:
            d["decision_id"] = v
        if (v := g.reason) is not None:
            d["reason"] = v
        if (v := g.reason_code) is not None:
            d["reason_code"] = v
        if (v := g.version) is not None:  # schema "6" (session 25)
            d["version"] = v
        if d:
            out["policy"] = d
    if (v := ev.prefix_fingerprint) is not None:
        if type(v) not in plain:
            return None
        out["prefix_fingerprint"] = v
    if (v := ev.prompt_tokens) is not None:
        if type(v) not in plain:
            return None
        out["prompt_tokens"] = v
    if (v := ev.request_id) is not None:
        if type(v) not in plain:
            return None
        out["request_id"] = v
    g = ev.route
    if g is not None:
        d = {}
        if (v := g.available_prefix_tokens) is not None:
            d["available_prefix_tokens"] = v
        if (v := g.delivered_prefix_tokens) is not None:
            d["delivered_prefix_tokens"] = v
        if (v := g.load) is not None:
            d["load"] = v
        if (v := g.policy) is not None:
            d["policy"] = v
        if (v := g.pool) is not None:
            d["pool"] = v
        if (v := g.predicted_prefix_tokens) is not None:
            d["predicted_prefix_tokens"] = v
        if (v := g.replica) is not None:
            d["replica"] = v
        if (v := g.virtual_tokens) is not None:
            d["virtual_tokens"] = v
        if d:
            out["route"] = d
    out["schema_version"] = _event_module.SCHEMA_VERSION  # read per call, as to_dict does
    if (v := ev.sequences) is not None:
        if type(v) not in plain:
            return None
        out["sequences"] = v
    if (v := ev.status_code) is not None:
        if type(v) not in plain:
            return None
        out["status_code"] = v
    if (v := ev.tenant) is not None:
        if type(v) not in plain:
            return None
        out["tenant"] = v
    out["time"] = iso_ms(ev.time_ms)
    if (v := ev.time_ms) is not None:
        if type(v) not in plain:
            return None
        out["time_ms"] = v
    if (v := ev.trace_id) is not None:
        if type(v) not in plain:
            return None
        out["trace_id"] = v
    # sorted again by orjson: a mapping inside a group value keeps insertion order otherwise, and the
    # chain hashes these bytes as canonical JSON (R11b-4; ~0.3 µs on keys already in order)
    return orjson.dumps(out, option=orjson.OPT_SORT_KEYS)
