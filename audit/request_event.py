"""The flat form of a request's audit event: a row of plain values built on the
request path, turned into an :class:`audit.event.AuditEvent` off it.

Building the event (six dataclasses), its JSON-ready dict and its canonical
JSON costs the gateway far more than one ``orjson`` encoding of a flat
tuple. So the gateway (``gateway.auditing.AuditHub.record_request``) sends a
*request row* — the values of :data:`REQUEST_ROW_FIELDS`, in that order,
each a ``str``, ``int``, ``float``, ``bool`` or ``None`` — and the audit
worker (:mod:`audit.worker`) or the in-process audit log calls
:func:`request_event` to build the event there. Stage latencies travel as the
raw ``time.perf_counter()`` stamps (seconds) and are derived here exactly as
the record derived them (``round((end - start) * 1000, 3)``); JSON carries a
float exactly, so the event equals the one built in the gateway.

``event_id`` and ``time_ms`` are fixed in the gateway (a row resent to a
restarted worker names the same event). ``reason_code`` is the decision's
reason code, or the error code when there was no decision.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

from audit.event import (
    AuditEvent,
    EventSchemaError,
    Identity,
    Kind,
    Latencies,
    LedgerInfo,
    Outcome,
    PolicyInfo,
    RouteInfo,
)

__all__ = ["REQUEST_ROW_FIELDS", "request_event"]

#: The values of a request row, in order (see the module doc).
REQUEST_ROW_FIELDS: tuple[str, ...] = (
    "event_id", "time_ms", "outcome", "request_id", "spiffe_id", "trust_domain", "tenant",
    "decision_id", "reason_code", "reason", "endpoint", "model", "prompt_tokens", "output_tokens", "sequences",
    "reserved_tokens", "charged_tokens", "prompt_charged", "output_charged", "output_relayed", "basis",
    "error_code", "replica", "pool", "routing_policy", "available_prefix_tokens", "predicted_prefix_tokens",
    "delivered_prefix_tokens", "load",
    "t0", "t_auth", "t_parsed", "t_keys", "t_decided", "t_route", "t_first_byte", "t_end",
    "status_code", "client_address", "trace_id", "prefix_fingerprint", "virtual_tokens", "queue_wait_ms",
    "dropped_fields", "policy_version",
)
_N = len(REQUEST_ROW_FIELDS)
_OUTCOME_BY_VALUE: dict[str, Outcome] = {o.value: o for o in Outcome}
_NUMBER = (int, float)
#: the Identity of a (spiffe_id, trust_domain) (frozen, so one object serves every event of a workload):
#: ``lru_cache`` on the constructor, least recently used out (session 29, S29-caches29b-1: was a dict emptied
#: whole at 4,096, so one tenant's many workload IDs emptied every tenant's entries). Keys: the SPIFFE ID and
#: trust domain the gateway read from the client certificate (accepted or refused), per workload, not per request
_IDENTITIES_MAX = 4096
_identity = functools.lru_cache(maxsize=_IDENTITIES_MAX)(Identity)


def _ms(start: Any, end: Any) -> float | None:
    """Milliseconds between two perf-counter stamps, rounded to µs (None if either is missing)."""
    if start is None or end is None:
        return None
    if type(start) not in _NUMBER or type(end) not in _NUMBER:
        raise EventSchemaError("request row: a stage stamp is not a number")
    return round((end - start) * 1000.0, 3)


def request_event(row: Sequence[Any], instance: str | None = None) -> AuditEvent:
    """The audit event of a request row (:data:`REQUEST_ROW_FIELDS` order), stamped with
    ``instance`` (``audit.instance``; the audit log stamps an event that has none, by a
    ``dataclasses.replace`` the worker saves by passing it here).

    An unknown ``outcome`` string becomes ``failed``; outcome
    ``unauthenticated`` makes an ``auth`` event, every other an ``inference``
    event. Values are not otherwise checked here: the audit log's scrubber
    (:func:`audit.scrub.scrub_event`) drops anything that must not be logged.

    Raises:
        EventSchemaError: not a sequence of :data:`REQUEST_ROW_FIELDS` values,
            ``event_id``/``outcome`` not strings, ``time_ms`` not an int, or a
            stage stamp not a number.
    """
    if not isinstance(row, (list, tuple)) or len(row) != _N:
        raise EventSchemaError(f"request row: expected {_N} values")
    (event_id, time_ms, outcome, request_id, spiffe_id, trust_domain, tenant,
     decision_id, reason_code, reason, endpoint, model, prompt_tokens, output_tokens, sequences,
     reserved, charged, prompt_charged, output_charged, output_relayed, basis,
     error_code, replica, pool, routing_policy, available, predicted, delivered, load,
     t0, t_auth, t_parsed, t_keys, t_decided, t_route, t_first_byte, t_end,
     status_code, client_address, trace_id, prefix_fingerprint, virtual_tokens, queue_wait_ms, dropped_fields,
     policy_version) = row
    if type(event_id) is not str or type(outcome) is not str or type(time_ms) is not int:
        raise EventSchemaError("request row: event_id, outcome or time_ms of the wrong type")
    if (type(t0) is float and type(t_auth) is float and type(t_parsed) is float and type(t_keys) is float
            and type(t_decided) is float and type(t_route) is float and type(t_first_byte) is float
            and type(t_end) is float):  # every stamp set (an answered request): _ms inlined (session 11)
        latency = _latencies(round((t_auth - t0) * 1000.0, 3), round((t_parsed - t_auth) * 1000.0, 3),
                             round((t_keys - t_parsed) * 1000.0, 3), round((t_decided - t_keys) * 1000.0, 3),
                             round((t_route - t_decided) * 1000.0, 3), round((t_first_byte - t0) * 1000.0, 3),
                             round((t_end - t0) * 1000.0, 3), queue_wait_ms)
    else:
        latency = _latencies(_ms(t0, t_auth), _ms(t_auth, t_parsed), _ms(t_parsed, t_keys), _ms(t_keys, t_decided),
                             _ms(t_decided, t_route), _ms(t0, t_first_byte), _ms(t0, t_end), queue_wait_ms)
    if type(spiffe_id) is str and type(trust_domain) is str:  # frozen: one object for every event of it
        identity = _identity(spiffe_id, trust_domain)
    else:
        identity = Identity(spiffe_id, trust_domain)
    # AuditEvent(kind=..., ..., instance=instance) without its generated __init__ (session 11: a frozen
    # dataclass sets its 26 fields with object.__setattr__ calls, ~2.4 us; the slots' own setters ~1.3;
    # session 13: the setters called one by one, not in a zip loop, and the groups made the same way):
    # the same object (tests/audit/test_s11_worker_cpu.py), every field set, in _EVENT_FIELD_ORDER
    event = _new(AuditEvent)
    _s_kind(event, Kind.AUTH if outcome == "unauthenticated" else Kind.INFERENCE)
    _s_outcome(event, _OUTCOME_BY_VALUE.get(outcome, Outcome.FAILED))
    _s_time_ms(event, time_ms)
    _s_event_id(event, event_id)
    _s_request_id(event, request_id)
    _s_identity(event, identity)
    _s_tenant(event, tenant)
    g = _new(PolicyInfo)
    _p_decision_id(g, decision_id)
    _p_reason_code(g, reason_code)
    _p_reason(g, reason)
    _p_version(g, policy_version)
    _s_policy(event, g)
    _s_endpoint(event, endpoint)
    _s_model(event, model)
    _s_prompt_tokens(event, prompt_tokens)
    _s_output_tokens(event, output_tokens)
    _s_sequences(event, sequences)
    g = _new(LedgerInfo)
    _l_reserved(g, reserved)
    _l_charged(g, charged)
    _l_prompt_charged(g, prompt_charged)
    _l_output_charged(g, output_charged)
    _l_output_relayed(g, output_relayed)
    _l_basis(g, basis)
    _s_ledger(event, g)
    _s_error_code(event, error_code)
    g = _new(RouteInfo)
    _r_replica(g, replica)
    _r_pool(g, pool)
    _r_policy(g, routing_policy)
    _r_available(g, available)
    _r_predicted(g, predicted)
    _r_delivered(g, delivered)
    _r_load(g, load)
    _r_virtual(g, virtual_tokens)
    _s_route(event, g)
    _s_latency(event, latency)
    _s_status_code(event, status_code)
    _s_client_address(event, client_address)
    _s_trace_id(event, trace_id)
    _s_prefix_fingerprint(event, prefix_fingerprint)
    _s_operator(event, None)
    _s_alert(event, None)
    _s_summary(event, None)
    _s_checkpoint(event, None)
    _s_instance(event, instance)
    _s_dropped_fields(event, dropped_fields)
    return event


def _latencies(auth: Any, parse: Any, keys: Any, policy: Any, route: Any, first_byte: Any, total: Any,
               queue_wait: Any) -> Latencies:
    """``Latencies(auth, ..., queue_wait)`` by its slots' setters (same object, ~half the cost)."""
    g = _new(Latencies)
    _t_auth(g, auth)
    _t_parse(g, parse)
    _t_keys(g, keys)
    _t_policy(g, policy)
    _t_route(g, route)
    _t_first_byte(g, first_byte)
    _t_total(g, total)
    _t_queue_wait(g, queue_wait)
    return g


#: AuditEvent's fields in the order :func:`request_event` passes their values (checked at import: a
#: field added to, removed from or moved in the event must be handled there)
_EVENT_FIELD_ORDER = (
    "kind", "outcome", "time_ms", "event_id", "request_id", "identity", "tenant", "policy", "endpoint", "model",
    "prompt_tokens", "output_tokens", "sequences", "ledger", "error_code", "route", "latency", "status_code",
    "client_address", "trace_id", "prefix_fingerprint", "operator", "alert", "summary", "checkpoint", "instance",
    "dropped_fields")
if (tuple(f.name for f in dataclasses.fields(AuditEvent)) != _EVENT_FIELD_ORDER
        or hasattr(AuditEvent, "__post_init__")):  # pragma: no cover - the slots are set without __init__
    raise ImportError("audit.request_event: AuditEvent's fields or __post_init__ changed; update request_event")
#: each field's slot setter (the member descriptor's ``__set__``), in that order
_EVENT_SETTERS = tuple(vars(AuditEvent)[name].__set__ for name in _EVENT_FIELD_ORDER)
(_s_kind, _s_outcome, _s_time_ms, _s_event_id, _s_request_id, _s_identity, _s_tenant, _s_policy, _s_endpoint,
 _s_model, _s_prompt_tokens, _s_output_tokens, _s_sequences, _s_ledger, _s_error_code, _s_route, _s_latency,
 _s_status_code, _s_client_address, _s_trace_id, _s_prefix_fingerprint, _s_operator, _s_alert, _s_summary,
 _s_checkpoint, _s_instance, _s_dropped_fields) = _EVENT_SETTERS
#: the groups' fields in the order request_event sets them (every field, checked at import like the event's)
_GROUP_FIELD_ORDER: dict[type, tuple[str, ...]] = {
    PolicyInfo: ("decision_id", "reason_code", "reason", "version"),
    LedgerInfo: ("reserved_tokens", "charged_tokens", "prompt_charged", "output_charged", "output_relayed", "basis"),
    RouteInfo: ("replica", "pool", "policy", "available_prefix_tokens", "predicted_prefix_tokens",
                "delivered_prefix_tokens", "load", "virtual_tokens"),
    Latencies: ("auth_ms", "parse_ms", "keys_ms", "policy_ms", "route_ms", "first_byte_ms", "total_ms",
                "queue_wait_ms"),
}
for _cls, _order in _GROUP_FIELD_ORDER.items():
    if (tuple(f.name for f in dataclasses.fields(_cls)) != _order
            or hasattr(_cls, "__post_init__")):  # pragma: no cover - the slots are set without __init__
        raise ImportError(f"audit.request_event: {_cls.__name__}'s fields or __post_init__ changed; update request_event")
_p_decision_id, _p_reason_code, _p_reason, _p_version = (vars(PolicyInfo)[n].__set__
                                                       for n in _GROUP_FIELD_ORDER[PolicyInfo])
(_l_reserved, _l_charged, _l_prompt_charged, _l_output_charged, _l_output_relayed,
 _l_basis) = (vars(LedgerInfo)[n].__set__ for n in _GROUP_FIELD_ORDER[LedgerInfo])
(_r_replica, _r_pool, _r_policy, _r_available, _r_predicted, _r_delivered, _r_load,
 _r_virtual) = (vars(RouteInfo)[n].__set__ for n in _GROUP_FIELD_ORDER[RouteInfo])
(_t_auth, _t_parse, _t_keys, _t_policy, _t_route, _t_first_byte, _t_total,
 _t_queue_wait) = (vars(Latencies)[n].__set__ for n in _GROUP_FIELD_ORDER[Latencies])
_new = object.__new__
