"""Audit event schema (schema_version "6") and the defensive scrubber.

One :class:`AuditEvent` is written per gateway decision (inference call,
token check, operator action, alert, flood summary, chain checkpoint). The
record is flat-ish JSON with a few nested groups; its field names are the
stable contract for SIEM parsers. Renaming or removing a field bumps
``SCHEMA_VERSION``; so does adding one that a strict reader of the previous
version refuses (``from_dict`` refuses unknown fields). Version "6" (session 25, S24-newcomer-4) adds one
optional field, ``policy.version``: the policy store's version number of the set that decided (the admin
API's ``version``; omitted when unknown: a remote OPA, or no ``policy.versions_dir``). Version "5" (session 24, S23-fields-4) adds one
optional field, ``dropped_fields``: how many top-level body fields outside the request schema the gateway
dropped (``limits.unknown_fields: drop``), the count only, never a name. Version "4" (session 2:
issues 16, 17) adds three optional fields: ``instance`` (the emitting gateway
process, ``audit.instance``), ``latency.queue_wait_ms`` (milliseconds queued by
flow control) and ``route.virtual_tokens`` (the tenant's fair-release counter,
weighted tokens); nothing is renamed or removed. Version "3" (issue 11)
names each prefix figure once, in ``route``: ``available_prefix_tokens``,
``predicted_prefix_tokens`` (was ``prefix_tokens_available`` /
``prefix_tokens_matched``) and ``delivered_prefix_tokens`` (was the top-level
``cached_tokens``); ``latency.ttft_ms`` is ``first_byte_ms`` (a first byte,
not a token) and ``latency`` gains ``parse_ms`` and ``keys_ms``, so
``policy_ms`` is the decision alone. Version "2" added ``error_code`` and the
``ledger`` group (issue 12, finding 4). Version "1" and "2" events (an older
spill file, say) are still read: :func:`upgrade_event_dict` renames their
fields to version "3" names; a version "3" event is read as it is (version "4"
only adds fields).

Never in an event: prompt text, token ids, bearer tokens, keys, raw prefix
hashes. The gateway passes ``prefix_fingerprint`` already keyed per tenant
(HMAC under the tenant's key, truncated to at most 16 bytes / 32 hex chars),
so two tenants sending the same prompt get unrelated fingerprints and the
audit log cannot be used to confirm a guessed prompt or join tenants.
:func:`audit.scrub.scrub_event` is a second line of defence: it drops (and
reports) any string longer than a bound or looking like a JWT / PEM key /
bearer header. :mod:`audit.request_event` is the flat form of a request's
event the gateway hands to the audit worker.
"""
from __future__ import annotations

import dataclasses
import enum
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import orjson

from audit.event_upgrade import upgrade_event_dict
from audit.ids import uuid4_str

SCHEMA_VERSION = "6"
#: Versions :meth:`AuditEvent.from_dict` reads ("1" and "2" through :func:`upgrade_event_dict`).
READABLE_VERSIONS = frozenset({"1", "2", "3", "4", "5", "6"})
#: Versions whose field names :func:`upgrade_event_dict` renames (see ``audit.event_upgrade._RENAMED_V3``).
_RENAMED_VERSIONS = frozenset({"1", "2"})


class Kind(str, enum.Enum):
    """What the event is about."""

    INFERENCE = "inference"
    AUTH = "auth"
    OPERATOR = "operator"
    ALERT = "alert"
    SUMMARY = "summary"
    CHECKPOINT = "checkpoint"


class Outcome(str, enum.Enum):
    """Result of the decision the event records.

    Request outcomes: allowed, denied, failed, rate_limited, unauthenticated,
    rejected, cancelled. Operator actions: succeeded / failed. Alerts: raised
    / cleared. Summaries: summarized. Checkpoints: sealed.
    """

    ALLOWED = "allowed"
    DENIED = "denied"
    FAILED = "failed"
    RATE_LIMITED = "rate_limited"
    UNAUTHENTICATED = "unauthenticated"
    REJECTED = "rejected"
    CANCELLED = "cancelled"
    SUCCEEDED = "succeeded"
    RAISED = "raised"
    CLEARED = "cleared"
    SUMMARIZED = "summarized"
    SEALED = "sealed"


class EventSchemaError(ValueError):
    """An event dict does not match a readable schema version."""


@dataclass(frozen=True, slots=True)
class Identity:
    """Authenticated workload identity: SPIFFE ID and its trust domain."""

    spiffe_id: str | None = None
    trust_domain: str | None = None


@dataclass(frozen=True, slots=True)
class PolicyInfo:
    """PDP result: OPA decision id, machine reason code, short human reason; ``version`` (schema "6"):
    the policy store's version number of the set that decided (None: unknown, omitted)."""

    decision_id: str | None = None
    reason_code: str | None = None
    reason: str | None = None
    version: int | None = None


@dataclass(frozen=True, slots=True)
class RouteInfo:
    """Routing outcome. Token counts are tokens: ``available_prefix_tokens``
    (the longest cached prefix on any allowed replica), ``predicted_prefix_tokens``
    (the router's expectation on the chosen replica), ``delivered_prefix_tokens``
    (the replica's own ``usage.prompt_tokens_details.cached_tokens``); ``load``
    is the replica's load in tokens at decision time."""

    replica: str | None = None
    pool: str | None = None
    policy: str | None = None
    available_prefix_tokens: int | None = None
    predicted_prefix_tokens: int | None = None
    delivered_prefix_tokens: int | None = None
    load: float | None = None
    #: schema "4" (issue 17): the tenant's fair-release counter (weighted tokens) when released
    virtual_tokens: float | None = None


@dataclass(frozen=True, slots=True)
class Latencies:
    """Per-stage latencies in milliseconds, each from the end of the previous stage:
    ``auth_ms`` (arrival → authenticated), ``parse_ms`` (tenant, limits, body
    read and parse), ``keys_ms`` (tokenize, token reservation, prefix keys,
    candidates), ``policy_ms`` (the policy decision alone), ``route_ms``
    (enforcement and routing); ``first_byte_ms`` (arrival → the replica's
    first response byte, not a token) and ``total_ms`` (arrival → end)."""

    auth_ms: float | None = None
    parse_ms: float | None = None
    keys_ms: float | None = None
    policy_ms: float | None = None
    route_ms: float | None = None
    first_byte_ms: float | None = None
    total_ms: float | None = None
    #: schema "4" (issue 17): milliseconds queued by flow control before routing
    queue_wait_ms: float | None = None


@dataclass(frozen=True, slots=True)
class LedgerInfo:
    """The token ledger of one request (tenancy/ledger.py), in tokens.

    ``reserved_tokens``: prompt + output (``max_tokens`` x sequences) held at
    admission; ``charged_tokens`` = ``prompt_charged`` + ``output_charged``:
    what the request was charged when it ended; ``output_relayed``: output
    tokens relayed to the client in a stream (estimate: one per content
    delta per choice); ``basis``: usage, relayed, refused, reservation or
    not_dispatched.
    """

    reserved_tokens: int | None = None
    charged_tokens: int | None = None
    prompt_charged: int | None = None
    output_charged: int | None = None
    output_relayed: int | None = None
    basis: str | None = None


def now_ms() -> int:
    """Current UTC time in integer epoch milliseconds (floor of ``time.time_ns()``)."""
    return time.time_ns() // 1_000_000


#: Epoch seconds of 1000-01-01T00:00:00Z and 10000-01-01T00:00:00Z: inside this
#: range ``strftime("%Y")`` gives exactly four digits, so :func:`iso_ms` can use
#: ``time.gmtime`` arithmetic; outside it falls back to ``datetime`` (glibc does
#: not zero-pad years below 1000; years above 9999 raise).
ISO_FAST_MIN_S = -30_610_224_000
ISO_FAST_MAX_S = 253_402_300_800
# one-entry cache: (epoch second, "YYYY-MM-DDTHH:MM:SS.") of the last call
_iso_last: tuple[int, str] = (0, "1970-01-01T00:00:00.")


def _iso_ms_datetime(epoch_ms: int) -> str:
    dt = datetime.fromtimestamp(epoch_ms / 1000, tz=timezone.utc)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{epoch_ms % 1000:03d}Z"


def iso_ms(epoch_ms: int) -> str:
    """Epoch ms -> ISO 8601 UTC with millisecond precision, e.g.
    ``2025-01-02T03:04:05.678Z``.

    Same string as ``datetime.fromtimestamp(ms / 1000, UTC).strftime(...)``
    (proved against it in tests/audit/test_fast_paths.py); the second part is
    cached per epoch second, so events of the same second cost one divmod.
    Raises what ``datetime`` raises for out-of-range values.
    """
    global _iso_last
    if type(epoch_ms) is not int:
        return _iso_ms_datetime(epoch_ms)
    sec, ms = divmod(epoch_ms, 1000)
    last = _iso_last
    if last[0] == sec:
        return f"{last[1]}{ms:03d}Z"
    if not ISO_FAST_MIN_S <= sec < ISO_FAST_MAX_S:
        return _iso_ms_datetime(epoch_ms)
    t = time.gmtime(sec)
    prefix = f"{t.tm_year:04d}-{t.tm_mon:02d}-{t.tm_mday:02d}T{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}."
    _iso_last = (sec, prefix)
    return f"{prefix}{ms:03d}Z"


#: ``new_event_id()``: a random UUID (v4) string; receivers de-duplicate on it (batched ``os.urandom``:
#: :mod:`audit.ids`). :func:`audit.ids.uuid4_str` itself: one call per event (session 17).
new_event_id: Callable[[], str] = uuid4_str


@dataclass(frozen=True, slots=True)
class AuditEvent:
    """One audit record, schema version "6".

    ``instance`` (optional, added with issue 16, schema "4"): which gateway process
    emitted the event, stamped by :class:`audit.log.AuditLog` when
    configured. ``time_ms`` is UTC epoch milliseconds; ``time`` (ISO 8601) is derived
    from it in :meth:`to_dict`. ``operator``, ``alert``, ``summary`` and
    ``checkpoint`` carry kind-specific scalar details (str/int/float/bool).
    """

    kind: Kind
    outcome: Outcome
    time_ms: int = field(default_factory=now_ms)
    event_id: str = field(default_factory=new_event_id)
    request_id: str | None = None
    identity: Identity = field(default_factory=Identity)
    tenant: str | None = None
    policy: PolicyInfo = field(default_factory=PolicyInfo)
    endpoint: str | None = None
    model: str | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    sequences: int | None = None
    ledger: LedgerInfo = field(default_factory=LedgerInfo)
    error_code: str | None = None
    route: RouteInfo = field(default_factory=RouteInfo)
    latency: Latencies = field(default_factory=Latencies)
    status_code: int | None = None
    client_address: str | None = None
    trace_id: str | None = None
    prefix_fingerprint: str | None = None
    operator: Mapping[str, Any] | None = None
    alert: Mapping[str, Any] | None = None
    summary: Mapping[str, Any] | None = None
    checkpoint: Mapping[str, Any] | None = None
    #: the gateway process that emitted it (``audit.instance``, e.g. ``host/w1`` under
    #: ``serve --workers N``); omitted for a single process
    instance: str | None = None
    #: schema "5" (session 24): top-level body fields dropped outside the request schema (``limits.unknown_fields:
    #: drop``), a count; omitted when none (names are client text: never here)
    dropped_fields: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; ``None`` values (and empty groups) are omitted,
        enums are their string values. Field order is the dataclass order."""
        out: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "time": iso_ms(self.time_ms)}
        # json_field inlined for the common types (issue 14: ~40 % of to_dict's CPU was
        # json_field's calls and abstract isinstance checks); anything else takes json_field
        for name in _EVENT_FIELDS:
            value = getattr(self, name)
            if value is None:
                continue
            sub = _GROUP_FIELDS.get(name)
            if sub is not None:
                value = {k: v for k in sub if (v := getattr(value, k)) is not None} or None
            elif type(value) in _PLAIN_TYPES:
                pass
            elif type(value) in _ENUM_TYPES:
                value = value.value
            else:
                value = json_field(self, name)
            if value is not None:
                out[name] = value
        return out

    def to_json(self) -> bytes:
        """:meth:`to_dict` as canonical JSON bytes (sorted keys, compact,
        UTF-8, no trailing newline): the encoding the audit worker pipe and
        the OTLP log body use. Not cached: each event is encoded once per
        process, and a cache kept thousands of events alive for the GC to scan."""
        return orjson.dumps(self.to_dict(), option=orjson.OPT_SORT_KEYS)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AuditEvent:
        """Inverse of :meth:`to_dict`.

        Raises:
            EventSchemaError: wrong schema version, unknown kind/outcome or
                unknown field.
        """
        version = data.get("schema_version")
        if version not in READABLE_VERSIONS:
            raise EventSchemaError(f"unsupported schema_version {version!r}")
        if version in _RENAMED_VERSIONS:
            data = upgrade_event_dict(data)
        kwargs: dict[str, Any] = {}
        try:
            for key, value in data.items():
                if key in _SKIP_KEYS:
                    continue
                if key not in _KNOWN_FIELDS:
                    raise EventSchemaError(f"unknown field {key!r}")
                group = _NESTED.get(key)
                if group is not None:
                    value = group(**value)
                elif key == "kind":
                    value = (_KIND_BY_VALUE.get(value) if type(value) is str else None) or Kind(value)
                elif key == "outcome":
                    value = (_OUTCOME_BY_VALUE.get(value) if type(value) is str else None) or Outcome(value)
                kwargs[key] = value
            return cls(**kwargs)
        except (TypeError, ValueError) as exc:
            if isinstance(exc, EventSchemaError):
                raise
            raise EventSchemaError(str(exc)) from exc

_EVENT_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(AuditEvent))
_GROUP_FIELDS: dict[str, tuple[str, ...]] = {
    name: tuple(f.name for f in dataclasses.fields(cls))
    for name, cls in (("identity", Identity), ("policy", PolicyInfo), ("ledger", LedgerInfo), ("route", RouteInfo),
                      ("latency", Latencies))
}

#: exact types json_field returns unchanged without the abstract isinstance checks
_PLAIN_TYPES: frozenset[type] = frozenset((str, int, float, bool))
_ENUM_TYPES: frozenset[type] = frozenset((Kind, Outcome))


def is_ip_text(address: object) -> bool:
    """Whether a ``client_address`` can be an IP address literal (only hex digits, ``.`` and ``:``, with a dot
    or a colon): the gateway's other values (``unknown`` without a peer, ``unattested@<proxy>``, a Unix socket
    peer) are not. OCSF ``src_endpoint.ip`` and CEF ``src`` take an address only; the rest is a name
    (``src_endpoint.name``, CEF ``shost``; session 24, S23-fixreg-2). A character test, no parse (request path)."""
    return (isinstance(address, str) and not address.strip("0123456789abcdefABCDEF.:")
            and ("." in address or ":" in address))


def json_field(event: AuditEvent, name: str) -> Any:
    """The JSON-ready value of field ``name`` as :meth:`AuditEvent.to_dict`
    writes it: None for a missing value or an all-None group (the key is then
    omitted), a group as a dict of its non-None members, an enum as its
    value, a mapping copied; plain values as they are."""
    value = getattr(event, name)
    if value is None:
        return None
    sub = _GROUP_FIELDS.get(name)
    if sub is not None:
        return {k: v for k in sub if (v := getattr(value, k)) is not None} or None
    if type(value) in _PLAIN_TYPES:  # exact str/int/float/bool: neither an enum nor a mapping
        return value
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return dict(value)
    return value


# from_dict tables (precomputed once instead of per call)
_KNOWN_FIELDS: frozenset[str] = frozenset(_EVENT_FIELDS)
_SKIP_KEYS: frozenset[str] = frozenset(("schema_version", "time"))
_NESTED: dict[str, type] = {"identity": Identity, "policy": PolicyInfo, "ledger": LedgerInfo, "route": RouteInfo,
                            "latency": Latencies}
_KIND_BY_VALUE: dict[str, Kind] = {k.value: k for k in Kind}
_OUTCOME_BY_VALUE: dict[str, Outcome] = {o.value: o for o in Outcome}
