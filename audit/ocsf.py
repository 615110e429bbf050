"""OCSF 1.5.0 mapping of audit events, validated with ``ocsf-emitter``.

Class choice (OCSF schema 1.5.0, https://schema.ocsf.io/1.5.0/):

* inference calls, rejected/rate-limited/cancelled requests, checkpoints →
  **API Activity** (class_uid 6003, category 6 Application Activity),
  activity Create (1) for an inference call, Other (99) for checkpoints.
* token checks (JWT-SVID), incl. unauthenticated → **Authentication** (3002, category 3 IAM), activity Other (99).
* policy decisions: OCSF 1.5 has no per-request authorization-decision
  class; Authorize Session (3003) records privileges given to a new *session*
  and does not fit a PDP verdict per request. The PDP decision is therefore
  carried in the **Authorization Result** object ``actor.authorizations[]``
  (``decision`` plus ``policy{uid=decision_id, name=reason_code,
  desc=reason, version}``: schema "6"'s ``policy.version`` as OCSF's own ``policy.version``, a string)
  of the API Activity event, which is where OCSF places it.
* operator actions (policy/data change, key rotation, config reload) → **Entity Management** (3004, IAM), activity
  Update (3); the request's source in ``src_endpoint.ip`` (a 3004 attribute; no port is known; S22-fixsec-1).
* alerts (concentration, cache-miss spike, audit spill full) → **Detection
  Finding** (2004, category 2 Findings), activity Create (1) when raised,
  Close (3) when cleared.
* flood summaries → the class of the summarised outcome with ``count``.

``type_uid = class_uid * 100 + activity_id``. PrefixGate-specific fields (tenant, route, tokens, the token ledger,
latencies, fingerprint, the emitting ``instance``, schema "5"'s ``dropped_fields``) go to ``unmapped.prefixgate``
(schema "4"'s ``route.virtual_tokens`` and ``latency.queue_wait_ms`` inside their groups); the gateway's
``error_code`` is also ``status_detail`` when the event has no policy reason code.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any

import orjson

from audit.encoded import OUTCOME_VALUE
from audit.event import AuditEvent, Kind, Outcome, is_ip_text
from audit.files import open_append
from audit.ocsf_unmapped import _request_pg, _unmapped

OCSF_VERSION = "1.5.0"
PRODUCT = {"name": "PrefixGate", "vendor_name": "PrefixGate", "version": "0.1.0"}

API_ACTIVITY, AUTHENTICATION, ENTITY_MANAGEMENT, DETECTION_FINDING = 6003, 3002, 3004, 2004
_CATEGORY = {API_ACTIVITY: 6, AUTHENTICATION: 3, ENTITY_MANAGEMENT: 3, DETECTION_FINDING: 2}
_CLASS_NAME = {API_ACTIVITY: "API Activity", AUTHENTICATION: "Authentication",
               ENTITY_MANAGEMENT: "Entity Management", DETECTION_FINDING: "Detection Finding"}
_CATEGORY_NAME = {6: "Application Activity", 3: "Identity & Access Management", 2: "Findings"}
_SUCCESS = {Outcome.ALLOWED, Outcome.SUCCEEDED, Outcome.SEALED}
_STATUS_CAPTION = {0: "Unknown", 1: "Success", 2: "Failure"}  # OCSF base event `status`; 99 Other: our own word
_SEVERITY = {  # OCSF severity_id: 1 Informational, 2 Low, 3 Medium, 4 High
    Outcome.ALLOWED: 1, Outcome.SUCCEEDED: 1, Outcome.SEALED: 1, Outcome.CLEARED: 1, Outcome.CANCELLED: 1,
    Outcome.RATE_LIMITED: 2, Outcome.REJECTED: 2, Outcome.FAILED: 2, Outcome.SUMMARIZED: 3,
    Outcome.DENIED: 3, Outcome.UNAUTHENTICATED: 3, Outcome.RAISED: 4}


class OcsfValidationError(ValueError):
    """An OCSF event failed validation against the 1.5.0 models."""


def _class_and_activity(event: AuditEvent) -> tuple[int, int, str]:
    if event.kind is Kind.ALERT:
        return DETECTION_FINDING, (3 if event.outcome is Outcome.CLEARED else 1), (
            "Close" if event.outcome is Outcome.CLEARED else "Create")
    if event.kind is Kind.OPERATOR:
        return ENTITY_MANAGEMENT, 3, "Update"
    if event.kind is Kind.AUTH or event.outcome is Outcome.UNAUTHENTICATED:
        return AUTHENTICATION, 99, "JWT-SVID validation"
    if event.kind is Kind.SUMMARY and ({"count_unauthenticated", "count_too_many_unauthenticated"}
                                       & set(event.summary or {})):
        return AUTHENTICATION, 99, "JWT-SVID validation"
    if event.kind is Kind.CHECKPOINT:
        return API_ACTIVITY, 99, "Audit checkpoint"
    return API_ACTIVITY, 1, "Create"


def _version(version: object) -> str | None:
    """OCSF ``policy.version`` (``string_t``, "The policy version number") of the event's ``policy.version``."""
    return None if version is None else str(version)


def to_ocsf(event: AuditEvent) -> dict[str, Any]:
    """Map an audit event to an OCSF 1.5.0 event dict (see module docstring)."""
    class_uid, activity_id, activity_name = _class_and_activity(event)
    status_id = 1 if event.outcome in _SUCCESS else (99 if event.kind in (Kind.ALERT, Kind.SUMMARY) else 2)
    out: dict[str, Any] = {
        "class_uid": class_uid,
        "category_uid": _CATEGORY[class_uid],
        "activity_id": activity_id,
        "activity_name": activity_name,
        "class_name": _CLASS_NAME[class_uid],
        "category_name": _CATEGORY_NAME[_CATEGORY[class_uid]],
        "type_name": f"{_CLASS_NAME[class_uid]}: {activity_name}",
        "type_uid": class_uid * 100 + activity_id,
        "severity_id": _SEVERITY.get(event.outcome, 1),
        "time": event.time_ms,
        "status_id": status_id,
        "status": _STATUS_CAPTION.get(status_id, event.outcome.value),  # 99 Other: our own word (S23-newcomer-8)
        "metadata": {
            "version": OCSF_VERSION,
            "product": dict(PRODUCT),
            "uid": event.event_id,
            "correlation_uid": event.request_id,
            "tenant_uid": event.tenant,
        },
        "unmapped": _unmapped(event),
    }
    if event.status_code is not None:
        out["status_code"] = str(event.status_code)
    if event.policy.reason_code:
        out["status_detail"] = event.policy.reason_code
    elif event.error_code:
        out["status_detail"] = event.error_code
    if event.summary and isinstance(event.summary.get("suppressed"), int):
        out["count"] = event.summary["suppressed"]
    actor: dict[str, Any] = {}
    if event.identity.spiffe_id:
        actor["user"] = {"uid": event.identity.spiffe_id, "type_id": 99, "type": "Workload",
                         "domain": event.identity.trust_domain}
    if event.policy.decision_id or event.policy.reason_code:
        decision = "allowed" if event.outcome is Outcome.ALLOWED else event.outcome.value
        actor["authorizations"] = [{
            "decision": decision,
            "policy": {k: v for k, v in {"uid": event.policy.decision_id, "name": event.policy.reason_code,
                                          "desc": event.policy.reason, "version": _version(event.policy.version)
                                          }.items() if v},
        }]
    src = {"ip" if is_ip_text(a) else "name": a} if (a := event.client_address) else {}  # S23-fixreg-2
    if event.summary and event.summary.get("source"):
        src.setdefault("name", str(event.summary["source"]))
    if class_uid == API_ACTIVITY:
        out["api"] = {"operation": event.endpoint or activity_name, "service": {"name": "prefixgate"}}
        out["actor"] = actor or {"app_name": "prefixgate"}
        out["src_endpoint"] = src or {"name": "unknown"}
        if event.route.replica:
            out["dst_endpoint"] = {"name": event.route.replica}
        if event.latency.total_ms is not None:
            out["duration"] = int(event.latency.total_ms)
    elif class_uid == AUTHENTICATION:
        out["src_endpoint"] = src or {"name": "unknown"}
        out["actor"] = actor or {"app_name": "prefixgate"}
        out["user"] = actor.get("user") or {"name": "unauthenticated", "type_id": 0, "type": "Unknown"}
        out["auth_protocol_id"] = 99
        out["auth_protocol"] = "JWT-SVID"
    elif class_uid == ENTITY_MANAGEMENT:
        op = dict(event.operator or {})
        out["entity"] = {"name": str(op.get("target", op.get("action", "config"))), "type": str(op.get("action", "config")),
                         "uid": str(op.get("target_id", event.event_id))}
        out["actor"] = actor or {"app_name": "prefixgate-admin"}
        if src:  # S22-fixsec-1: where the operator's request came from (JSONL, CEF and OTLP carry it too)
            out["src_endpoint"] = src
    else:  # detection finding
        al = dict(event.alert or {})
        out["finding_info"] = {"uid": str(al.get("alert_id", event.event_id)),
                               "title": str(al.get("alert_kind", "alert")), "types": [str(al.get("alert_kind", "alert"))]}
        out["status_id"], out["status"] = (4, "Resolved") if event.outcome is Outcome.CLEARED else (1, "New")  # finding
    return {k: v for k, v in out.items() if v is not None}


#: per (kind, outcome) of a request event: the constant top-level fields of :func:`to_ocsf`
_REQUEST_CONST: dict[tuple[Kind, Outcome], tuple[dict[str, Any], int, str]] = {}
_PRODUCT_CONST = dict(PRODUCT)
_SERVICE = {"name": "prefixgate"}


def _request_const(kind: Kind, outcome: Outcome) -> tuple[dict[str, Any], int, str]:
    hit = _REQUEST_CONST.get((kind, outcome))
    if hit is None:
        probe = AuditEvent(kind=kind, outcome=outcome, time_ms=0, event_id="")
        class_uid, activity_id, activity_name = _class_and_activity(probe)
        full = to_ocsf(probe)
        const = {k: full[k] for k in ("class_uid", "category_uid", "activity_id", "activity_name", "class_name",
                                      "category_name", "type_name", "type_uid", "severity_id", "status_id", "status")}
        hit = _REQUEST_CONST[(kind, outcome)] = (const, class_uid, activity_name)
    return hit


#: session 28: the sub-objects of a request's OCSF record that repeat from event to event, made once per
#: value and shared by the records (never changed after they are made: each record is encoded at once):
#: ``actor.user`` per (spiffe_id, trust_domain), ``src_endpoint`` per client address, ``api`` per operation,
#: ``dst_endpoint`` per replica. Session 29 (S29-tidy29-1): ``functools.lru_cache`` on the functions that
#: make them (a full cache drops its least recently used entry, not all of them), called with exact ``str``
#: values only (1, 1.0 and True are equal keys); the bounds as audit/cef.py's (an identity's entry holds its
#: SPIFFE ID, up to 2 KiB; docs/security.md "Session 29: tidy29").
_IDENTITY_MAX = 1024
_SOURCE_MAX = 1024
_UNKNOWN_SRC = {"name": "unknown"}


def user_object(spiffe_id: Any, trust_domain: Any) -> dict[str, Any]:
    """OCSF ``actor.user`` of a workload identity: ``{"uid", "type_id": 99, "type": "Workload", "domain"}``."""
    return {"uid": spiffe_id, "type_id": 99, "type": "Workload", "domain": trust_domain}


def source_object(address: Any) -> dict[str, Any]:
    """OCSF ``src_endpoint`` of a truthy client address: ``{"ip": a}`` for an IP literal
    (:func:`audit.event.is_ip_text`), else ``{"name": a}``."""
    return {"ip" if is_ip_text(address) else "name": address}


def api_object(operation: Any) -> dict[str, Any]:
    """OCSF ``api`` of an operation (the endpoint): ``{"operation", "service": {"name": "prefixgate"}}``."""
    return {"operation": operation, "service": _SERVICE}


def dst_object(replica: Any) -> dict[str, Any]:
    """OCSF ``dst_endpoint`` of a replica: ``{"name": replica}``."""
    return {"name": replica}


_user = lru_cache(maxsize=_IDENTITY_MAX)(user_object)
_src = lru_cache(maxsize=_SOURCE_MAX)(source_object)
_api = lru_cache(maxsize=_IDENTITY_MAX)(api_object)
_dst = lru_cache(maxsize=_IDENTITY_MAX)(dst_object)


def ocsf_line(event: AuditEvent) -> bytes:
    """``orjson.dumps(to_ocsf(event), option=OPT_SORT_KEYS)`` (the OCSF file sink's line, no newline),
    built faster for a request's event (issue 14, session 10): the constant fields per (kind,
    outcome) made once, ``unmapped.prefixgate`` written inline instead of a :func:`json_field` call
    per key; session 28: the sub-objects that repeat (user, source, api, destination) made once per
    value (session 29: least recently used first out of their caches). Events with kind-specific
    details (alerts, operator actions, summaries, checkpoints), other kinds and values of unexpected types take :func:`to_ocsf`. Same bytes always
    (tests/audit/test_s10_fast_formats.py)."""
    kind, outcome = event.kind, event.outcome
    if (event.alert is not None or event.operator is not None or event.summary is not None
            or event.checkpoint is not None or type(kind) is not Kind or type(outcome) is not Outcome
            or kind not in (Kind.INFERENCE, Kind.AUTH)):
        return orjson.dumps(to_ocsf(event), option=orjson.OPT_SORT_KEYS)
    const, class_uid, activity_name = _request_const(kind, outcome)
    pg = _request_pg(event, kind, outcome)
    out = dict(const)
    if event.time_ms is not None:
        out["time"] = event.time_ms
    out["metadata"] = {"version": OCSF_VERSION, "product": _PRODUCT_CONST, "uid": event.event_id,
                       "correlation_uid": event.request_id, "tenant_uid": event.tenant}
    out["unmapped"] = {"prefixgate": pg}
    identity, policy = event.identity, event.policy
    if event.status_code is not None:
        out["status_code"] = str(event.status_code)
    if policy.reason_code:
        out["status_detail"] = policy.reason_code
    elif event.error_code:
        out["status_detail"] = event.error_code
    actor: dict[str, Any] = {}
    if sid := identity.spiffe_id:
        dom = identity.trust_domain
        actor["user"] = (_user(sid, dom) if type(sid) is str and (dom is None or type(dom) is str)
                         else user_object(sid, dom))
    if policy.decision_id or policy.reason_code:
        pol: dict[str, Any] = {}  # the keys whose value is truthy, in this order (as to_ocsf writes them)
        if v := policy.decision_id:
            pol["uid"] = v
        if v := policy.reason_code:
            pol["name"] = v
        if v := policy.reason:
            pol["desc"] = v
        if v := _version(policy.version):
            pol["version"] = v
        actor["authorizations"] = [{"decision": OUTCOME_VALUE[outcome], "policy": pol}]
    if a := event.client_address:
        src = _src(a) if type(a) is str else source_object(a)
    else:
        src = _UNKNOWN_SRC
    if class_uid == API_ACTIVITY:
        op = event.endpoint or activity_name
        out["api"] = _api(op) if type(op) is str else api_object(op)
        out["actor"] = actor or {"app_name": "prefixgate"}
        out["src_endpoint"] = src
        if replica := event.route.replica:
            out["dst_endpoint"] = _dst(replica) if type(replica) is str else dst_object(replica)
        if event.latency.total_ms is not None:
            out["duration"] = int(event.latency.total_ms)
    else:  # AUTHENTICATION
        out["src_endpoint"] = src
        out["actor"] = actor or {"app_name": "prefixgate"}
        out["user"] = actor.get("user") or {"name": "unauthenticated", "type_id": 0, "type": "Unknown"}
        out["auth_protocol_id"] = 99
        out["auth_protocol"] = "JWT-SVID"
    return orjson.dumps(out, option=orjson.OPT_SORT_KEYS)


def validate_ocsf(data: dict[str, Any]) -> None:
    """Validate an OCSF dict with the ``ocsf-emitter`` 1.5.0 Pydantic models
    plus its invariants (class/category/type_uid identity, schema version).

    Raises:
        OcsfValidationError: with the library's field errors.
    """
    import ocsf_emitter
    from ocsf_emitter import _models as models
    from pydantic import ValidationError

    cls = {API_ACTIVITY: models.ApiActivity, AUTHENTICATION: models.Authentication,
           ENTITY_MANAGEMENT: models.EntityManagement, DETECTION_FINDING: models.DetectionFinding}.get(data.get("class_uid"))
    if cls is None:
        raise OcsfValidationError(f"unsupported class_uid {data.get('class_uid')}")
    try:
        ocsf_emitter.validate(cls.model_validate(data))
    except (ValidationError, ocsf_emitter.InvalidFindingError) as exc:
        raise OcsfValidationError(str(exc)) from exc


class OcsfFileSink:
    """Append OCSF JSON (one event per line) to a local file (SIEM file shipper input)."""

    def __init__(self, path: str, name: str = "ocsf", validate: bool = False, linger_s: float = 0.02) -> None:
        self.name = name
        self.linger_s = linger_s  # seconds AuditLog lets events accumulate before a send (one write per batch)
        self.path = path
        self._validate = validate
        self._fh: Any = None

    async def open(self) -> None:
        """Open the file for appending."""
        from audit.sink import SinkUnavailable

        try:
            self._fh = open_append(self.path)  # binary: orjson's UTF-8 bytes as they are
        except OSError as exc:
            raise SinkUnavailable(str(exc)) from exc

    async def send(self, events: list[AuditEvent]) -> None:
        """Write events as OCSF JSON lines."""
        from audit.sink import SinkUnavailable

        if self._fh is None:
            await self.open()
        try:
            lines = []
            for ev in events:
                if self._validate:
                    data = to_ocsf(ev)
                    validate_ocsf(data)
                    lines.append(orjson.dumps(data, option=orjson.OPT_SORT_KEYS))
                else:
                    lines.append(ocsf_line(ev))  # the same bytes, built faster
            lines.append(b"")
            self._fh.write(b"\n".join(lines))  # one write per batch, same bytes as a line per event
            self._fh.flush()
        except OSError as exc:
            raise SinkUnavailable(str(exc)) from exc

    async def close(self) -> None:
        """Close the file."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None
