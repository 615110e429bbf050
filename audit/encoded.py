"""One canonical JSON encoding of an event shared by the sinks that need it.

The JSONL chain (record body) and the OTLP log sink (LogRecord body) both need
:meth:`audit.event.AuditEvent.to_json` of the same event object; in the audit
worker that was two ``to_dict`` + ``orjson`` encodings per event (issue 14,
~6 µs of ~100 µs). :func:`shared_json` encodes once and hands the same bytes
to the next caller asking for the same object.

Bounded: at most :data:`SHARED_JSON_MAX` entries (oldest dropped first), an
entry is removed when every sink that takes it has (:func:`register_consumer`; two takes when none
registered), so the cache holds at most a
few thousand recently emitted events (the OTLP sink sends up to 0.5 s after
the JSONL sink: ~1,000 events at 2,000/s; the bound leaves room for a burst; an
evicted entry is only encoded again). Worst case ~8 MB of encodings. Each entry keeps its event alive, so
``id(event)`` cannot be reused while the entry exists.

Session 11: a request's event (no kind-specific details, plain values) is encoded by :func:`_plain_json`,
its dict written field by field in sorted key order (~2x cheaper than ``to_dict`` + a sorting dump).

Session 12 (one pass for the sinks): the entry also keeps that dict (:func:`shared_body`), and the
OCSF file sink takes its ``unmapped.prefixgate`` part from it instead of reading the event's fields
and groups again; the OCSF sink is the third taker of an entry.
"""
from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import orjson

from audit import event as _event_module
from audit.event import _PLAIN_TYPES, AuditEvent, Kind, Outcome, iso_ms

__all__ = ["KIND_VALUE", "OUTCOME_VALUE", "SHARED_JSON_MAX", "peek", "prerender", "register_consumer", "release",
           "shared_body", "shared_json", "take_rendered"]

#: ``member.value`` of each kind and outcome (session 12: an enum's ``.value`` is a property, ~0.24 µs;
#: a dict lookup ~0.03, and the sinks read these several times per event); only for exact enum members
KIND_VALUE: dict[Kind, str] = {k: k.value for k in Kind}
OUTCOME_VALUE: dict[Outcome, str] = {o: o.value for o in Outcome}

#: Most events whose encoding is kept for a second sink.
SHARED_JSON_MAX = 8192

#: id(event) -> [event, canonical JSON bytes, its dict (a plain event) or None, takes left, then the
#: formats :func:`prerender` made, each in its key's slot]
_SHARED: dict[int, list[Any]] = {}
#: the live sinks that take every event's entry once (:func:`register_consumer`); an entry is dropped
#: after that many counted takes (two when none is registered: the JSONL chain and the OTLP log sink)
_CONSUMERS: weakref.WeakSet[Any] = weakref.WeakSet()


#: format key -> (the live sinks that take it, its render function, its slot in an entry): what
#: :func:`prerender` makes
_RENDERERS: dict[str, tuple[weakref.WeakSet[Any], Callable[[AuditEvent], Any], int]] = {}


def register_consumer(sink: object, key: str | None = None,
                      render: Callable[[AuditEvent], Any] | None = None) -> None:
    """Count ``sink`` among the takers of every event's shared entry while it lives (session 12: the
    JSONL chain, the OTLP log sink, the OCSF file sink and the CEF syslog sink each take an event's
    entry once, so an entry is dropped after as many counted takes as there are live such sinks; a
    taker more or less only costs an encoding again or keeps an entry until :data:`SHARED_JSON_MAX`
    evicts it). With ``key`` and ``render``: :func:`prerender` also makes ``render(event)`` (the
    sink's own format of the event, never None, taking nothing from the entry) while such a sink
    lives, and the sink takes it with :func:`take_rendered`."""
    _CONSUMERS.add(sink)
    if key is not None and render is not None:
        live = _RENDERERS.get(key)
        if live is None:
            live = _RENDERERS[key] = (weakref.WeakSet(), render, 4 + len(_RENDERERS))
        live[0].add(sink)


def prerender(events: list[AuditEvent]) -> None:
    """The one pass over fresh events for every sink (session 12, the audit worker after a read's
    events were queued by ``AuditLog.emit``): each event's canonical JSON and dict, and each
    registered sink's format (:func:`register_consumer`), made while the events are fresh in the
    CPU's caches instead of by each sink's task up to 0.5 s later; one format at a time over the
    batch (its code stays hot). A render that raises is left out: that sink formats the event
    itself, as before, and meets the same error. The same bytes either way
    (tests/audit/test_s12_worker_golden.py)."""
    hits = [_entry(ev) for ev in events]
    for live, render, slot in _RENDERERS.values():
        if live:
            for ev, hit in zip(events, hits):
                try:
                    value = render(ev)
                except Exception:  # noqa: BLE001 -- the sink's own path decides, as without a prerender
                    continue
                if len(hit) <= slot:
                    hit.extend([None] * (slot + 1 - len(hit)))
                hit[slot] = value
    # the dicts are not kept (the OCSF lines are made): fewer container objects alive until the sinks
    # take the entries, so the cyclic GC's young collections stay as rare as before (kept, they cost
    # ~4 us/event of GC in the worker bench); a sink that still asks for one reads the event
    for hit in hits:
        hit[2] = None


def take_rendered(event: AuditEvent, key: str) -> Any:
    """The ``key`` format :func:`prerender` made of ``event`` (a counted take of its entry), or None
    when there is none (nothing taken: the sink formats the event itself)."""
    hit = _SHARED.get(id(event))
    if hit is not None and hit[0] is event:
        slot = _RENDERERS[key][2] if key in _RENDERERS else 1 << 30
        if len(hit) > slot:
            value = hit[slot]
            if value is not None:
                _take(hit)
                return value
    return None


def peek(event: AuditEvent) -> list[Any]:
    """``event``'s entry ``[event, canonical JSON, dict or None, takes left, ...]`` (made if missing)
    without taking it: for the render functions of :func:`prerender`. Do not change it."""
    return _entry(event)


def _entry(event: AuditEvent) -> list[Any]:
    hit = _SHARED.get(id(event))
    if hit is not None and hit[0] is event:
        return hit
    body = _plain_dict(event)
    data = orjson.dumps(body, option=orjson.OPT_SORT_KEYS) if body is not None else event.to_json()
    if len(_SHARED) >= SHARED_JSON_MAX:
        del _SHARED[next(iter(_SHARED))]
    hit = _SHARED[id(event)] = [event, data, body, len(_CONSUMERS) or 2]
    return hit


def _take(hit: list[Any]) -> None:
    hit[3] -= 1
    if hit[3] <= 0:
        _SHARED.pop(id(hit[0]), None)


def shared_json(event: AuditEvent) -> bytes:
    """``event.to_json()`` (canonical JSON bytes, no newline), encoded at most once for the sinks
    that take the same event object (see :func:`register_consumer`; a spill line counts as its
    sink's take). Never raises beyond what ``to_json`` raises."""
    hit = _entry(event)
    _take(hit)
    return hit[1]


def release(event: AuditEvent) -> None:
    """Count a take of ``event``'s entry without using it, if it has one (a registered sink that
    formats this event without the shared encoding), so the entry does not wait for eviction."""
    hit = _SHARED.get(id(event))
    if hit is not None and hit[0] is event:
        _take(hit)


def shared_body(event: AuditEvent) -> dict[str, Any] | None:
    """The dict whose canonical JSON is :func:`shared_json`'s bytes (``event.to_dict()``'s content)
    for an event :func:`_plain_json` builds directly, else None; a counted take (the OCSF file sink
    reads ``unmapped.prefixgate`` from it: session 12, the event's fields read once for the sinks).
    The caller must not change the dict or its group dicts."""
    hit = _entry(event)
    _take(hit)
    return hit[2]


def _plain_json(ev: AuditEvent) -> bytes | None:
    """``ev.to_json()`` of :func:`_plain_dict`'s dict, or None (the caller takes ``to_json``)."""
    out = _plain_dict(ev)
    return None if out is None else orjson.dumps(out, option=orjson.OPT_SORT_KEYS)


def _plain_dict(ev: AuditEvent) -> dict[str, Any] | None:
    """The dict of ``ev.to_json()`` built straight (keys inserted in sorted order, so no sort pass) for an event
    without kind-specific details whose top-level values are None or exact str/int/float/bool and whose
    kind and outcome are the enums; None for any other event. Its canonical JSON is ``to_json``'s bytes
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
    # encoded with OPT_SORT_KEYS: a mapping inside a group value keeps insertion order otherwise, and
    # the chain hashes these bytes as canonical JSON (R11b-4; ~0.3 µs on keys already in order)
    return out
