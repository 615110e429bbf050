"""PrefixGate's own fields of an OCSF event: ``unmapped.prefixgate`` (split out of :mod:`audit.ocsf`, session 25).

OCSF 1.5.0 has no attribute for the tenant, the route, token counts, the token ledger, latencies, the
prefix fingerprint or the emitting ``instance``; :mod:`audit.ocsf` puts them under
``unmapped.prefixgate``: :func:`_unmapped` for any event (the ``_UNMAPPED_KEYS`` entries of
``event.to_dict()``), :func:`_request_pg` for a request's event on the fast path (the same values, built
field by field). Pure functions of the event, no I/O.
"""
from __future__ import annotations

from typing import Any

from audit.encoded import KIND_VALUE, OUTCOME_VALUE
from audit.event import _GROUP_FIELDS, _PLAIN_TYPES, AuditEvent, Kind, Outcome, json_field

__all__ = ["_UNMAPPED_KEYS", "_unmapped", "_request_pg"]

_UNMAPPED_KEYS = ("tenant", "route", "latency", "prompt_tokens", "output_tokens", "sequences", "ledger",
                  "error_code", "prefix_fingerprint", "request_id", "outcome", "kind", "summary", "checkpoint", "operator",
                  "alert", "instance", "dropped_fields")


def _unmapped(event: AuditEvent) -> dict[str, Any]:
    """``{"prefixgate": {...}}``: the ``_UNMAPPED_KEYS`` entries of
    ``event.to_dict()``, built field by field with the same rules (None and
    empty groups omitted, enums as values, mappings copied) without the
    whole-event dict."""
    out: dict[str, Any] = {}
    for name in _UNMAPPED_KEYS:
        value = json_field(event, name)
        if value is not None:
            out[name] = value
    return {"prefixgate": out}


_GROUP_KEYS = {name: _GROUP_FIELDS[name] for name in ("route", "latency", "ledger")}
if _GROUP_KEYS != {  # _request_pg names these fields in its code  # pragma: no cover - a schema change
        "route": ("replica", "pool", "policy", "available_prefix_tokens", "predicted_prefix_tokens",
                  "delivered_prefix_tokens", "load", "virtual_tokens"),
        "latency": ("auth_ms", "parse_ms", "keys_ms", "policy_ms", "route_ms", "first_byte_ms", "total_ms",
                    "queue_wait_ms"),
        "ledger": ("reserved_tokens", "charged_tokens", "prompt_charged", "output_charged", "output_relayed",
                   "basis")}:
    raise ImportError("audit.ocsf: a route/latency/ledger field changed; update _request_pg")
_SCALAR_KEYS = ("tenant", "prompt_tokens", "output_tokens", "sequences", "error_code", "prefix_fingerprint",
                "request_id", "instance", "dropped_fields")
def _request_pg(event: AuditEvent, kind: Kind, outcome: Outcome) -> dict[str, Any]:
    """``unmapped.prefixgate`` of a request's event: kind and outcome, the ``_SCALAR_KEYS`` values and
    the ``_GROUP_KEYS`` groups without their None fields (a group with none left is omitted), each
    attribute read by name in the code, not by ``getattr`` in a loop (session 13: ~30 calls fewer
    per event); ``_GROUP_KEYS`` checks at import that the groups still have exactly these fields."""
    plain = _PLAIN_TYPES
    pg: dict[str, Any] = {"kind": KIND_VALUE[kind], "outcome": OUTCOME_VALUE[outcome]}
    if (v := event.tenant) is not None:
        pg["tenant"] = v if type(v) in plain else json_field(event, "tenant")
    if (v := event.prompt_tokens) is not None:
        pg["prompt_tokens"] = v if type(v) in plain else json_field(event, "prompt_tokens")
    if (v := event.output_tokens) is not None:
        pg["output_tokens"] = v if type(v) in plain else json_field(event, "output_tokens")
    if (v := event.sequences) is not None:
        pg["sequences"] = v if type(v) in plain else json_field(event, "sequences")
    if (v := event.error_code) is not None:
        pg["error_code"] = v if type(v) in plain else json_field(event, "error_code")
    if (v := event.prefix_fingerprint) is not None:
        pg["prefix_fingerprint"] = v if type(v) in plain else json_field(event, "prefix_fingerprint")
    if (v := event.request_id) is not None:
        pg["request_id"] = v if type(v) in plain else json_field(event, "request_id")
    if (v := event.instance) is not None:
        pg["instance"] = v if type(v) in plain else json_field(event, "instance")
    if (v := event.dropped_fields) is not None:  # schema "5" (session 24)
        pg["dropped_fields"] = v if type(v) in plain else json_field(event, "dropped_fields")
    if (g := event.route) is not None:
        d: dict[str, Any] = {}
        if (v := g.replica) is not None:
            d["replica"] = v
        if (v := g.pool) is not None:
            d["pool"] = v
        if (v := g.policy) is not None:
            d["policy"] = v
        if (v := g.available_prefix_tokens) is not None:
            d["available_prefix_tokens"] = v
        if (v := g.predicted_prefix_tokens) is not None:
            d["predicted_prefix_tokens"] = v
        if (v := g.delivered_prefix_tokens) is not None:
            d["delivered_prefix_tokens"] = v
        if (v := g.load) is not None:
            d["load"] = v
        if (v := g.virtual_tokens) is not None:
            d["virtual_tokens"] = v
        if d:
            pg["route"] = d
    if (g := event.latency) is not None:
        d = {}
        if (v := g.auth_ms) is not None:
            d["auth_ms"] = v
        if (v := g.parse_ms) is not None:
            d["parse_ms"] = v
        if (v := g.keys_ms) is not None:
            d["keys_ms"] = v
        if (v := g.policy_ms) is not None:
            d["policy_ms"] = v
        if (v := g.route_ms) is not None:
            d["route_ms"] = v
        if (v := g.first_byte_ms) is not None:
            d["first_byte_ms"] = v
        if (v := g.total_ms) is not None:
            d["total_ms"] = v
        if (v := g.queue_wait_ms) is not None:
            d["queue_wait_ms"] = v
        if d:
            pg["latency"] = d
    if (g := event.ledger) is not None:
        d = {}
        if (v := g.reserved_tokens) is not None:
            d["reserved_tokens"] = v
        if (v := g.charged_tokens) is not None:
            d["charged_tokens"] = v
        if (v := g.prompt_charged) is not None:
            d["prompt_charged"] = v
        if (v := g.output_charged) is not None:
            d["output_charged"] = v
        if (v := g.output_relayed) is not None:
            d["output_relayed"] = v
        if (v := g.basis) is not None:
            d["basis"] = v
        if d:
            pg["ledger"] = d
    return pg
