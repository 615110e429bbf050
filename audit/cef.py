"""ArcSight Common Event Format (CEF) rendering of audit events.

Format (CEF rev 25 "Implementing ArcSight CEF"):
``CEF:Version|Device Vendor|Device Product|Device Version|Signature ID|Name|Severity|Extension``.
Header fields escape ``\\`` and ``|`` with a backslash; extension values
escape ``\\`` and ``=`` with a backslash and encode newlines as ``\\n`` /
``\\r``. Extension keys are the standard CEF dictionary names (``rt``,
``src``, ``suser``, ``request``, ``outcome``, ``cs1``..``cs6`` with labels,
``cn1``..``cn3``, ``cfp1``..``cfp3`` and ``flexNumber1`` (a Long) with labels, ``deviceExternalId``).
"""
from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache
from operator import attrgetter

from audit.event import AuditEvent, Kind, Outcome, is_ip_text

VENDOR = "PrefixGate"
PRODUCT = "gateway"
VERSION = "0.1.0"


class CefParseError(ValueError):
    """A line is not a CEF record."""


_HEADER_SPECIAL = re.compile(r"[\\|\r\n]")
_EXT_SPECIAL = re.compile(r"[\\=\r\n]")
_HEADER_TABLE = str.maketrans({"\\": "\\\\", "|": "\\|", "\r": " ", "\n": " "})


def escape_header(value: str) -> str:
    """Escape a CEF header field: ``\\`` → ``\\\\``, ``|`` → ``\\|``; newlines become spaces.

    One regex scan returns ``value`` itself when nothing needs escaping
    (the common case); otherwise one ``str.translate`` pass."""
    if _HEADER_SPECIAL.search(value) is None:
        return value
    return value.translate(_HEADER_TABLE)


def escape_extension(value: str) -> str:
    """Escape a CEF extension value: ``\\``, ``=``, newline and CR (a CRLF pair
    becomes one ``\\n``). One regex scan returns ``value`` itself when
    nothing needs escaping (the common case)."""
    if _EXT_SPECIAL.search(value) is None:
        return value
    return value.replace("\\", "\\\\").replace("=", "\\=").replace("\r\n", "\\n").replace("\n", "\\n").replace("\r", "\\r")


def unescape_extension(value: str) -> str:
    """Inverse of :func:`escape_extension`."""
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "r": "\r"}.get(m.group(1), m.group(1)), value)


_SEVERITY = {
    Outcome.ALLOWED: 1, Outcome.SUCCEEDED: 3, Outcome.SEALED: 1, Outcome.SUMMARIZED: 5, Outcome.CANCELLED: 2,
    Outcome.FAILED: 5, Outcome.RATE_LIMITED: 4, Outcome.REJECTED: 5, Outcome.DENIED: 6, Outcome.UNAUTHENTICATED: 6,
    Outcome.RAISED: 8, Outcome.CLEARED: 3,
}


def cef_severity(event: AuditEvent) -> int:
    """CEF severity 0..10 for an event (alerts 8, denials 6, allowed 1)."""
    return _SEVERITY.get(event.outcome, 5)


_HEADER_PREFIX = "|".join(["CEF:0", escape_header(VENDOR), escape_header(PRODUCT), escape_header(VERSION)]) + "|"


#: exact types whose ``str`` never holds a character :func:`escape_extension` changes
#: (digits, sign, ``.``, ``e``, ``inf``/``nan``, ``True``/``False``): no scan needed
_NUMERIC: frozenset[type] = frozenset((int, float, bool))
#: ``keyLabel=escaped(label)`` per ``(key, label)``, built once (labels are constants)
_LABELS: dict[tuple[str, str], str] = {}


def _value(value: object) -> str:
    """``escape_extension(str(value))`` (skipping the scan for a plain number)."""
    t = type(value)
    if t is str:
        return escape_extension(value)  # type: ignore[arg-type]
    if t in _NUMERIC:
        return str(value)
    return escape_extension(str(value))


def _ext(pairs: list[str], key: str, value: object) -> None:
    """Append ``key=escaped(str(value))`` unless ``value`` is None."""
    if value is not None:
        pairs.append(f"{key}={_value(value)}")


#: The extension of :func:`format_cef` in order: ``(key, label or None, the event's value)``; a labelled
#: key is written after its ``keyLabel=label`` pair. :func:`cef_line` writes the same pairs in the same
#: order, unrolled (tests/audit/test_s10_fast_formats.py proves them equal).
_EXTENSION: tuple[tuple[str, str | None, Callable[[AuditEvent], object]], ...] = (
    ("rt", None, attrgetter("time_ms")),
    ("externalId", None, attrgetter("event_id")),
    ("outcome", None, attrgetter("outcome.value")),
    ("src", None, lambda e: e.client_address if e.client_address and is_ip_text(e.client_address) else None),
    ("shost", None, lambda e: e.client_address if e.client_address and not is_ip_text(e.client_address) else None),
    ("suser", None, attrgetter("identity.spiffe_id")),
    ("sntdom", None, attrgetter("identity.trust_domain")),
    ("request", None, attrgetter("endpoint")),
    ("cs1", "tenant", attrgetter("tenant")),
    ("cs2", "decisionId", attrgetter("policy.decision_id")),
    ("cs3", "replica", attrgetter("route.replica")),
    ("cs4", "model", attrgetter("model")),
    ("cs5", "prefixFingerprint", attrgetter("prefix_fingerprint")),
    ("cs6", "requestId", attrgetter("request_id")),
    ("reason", None, attrgetter("policy.reason_code")),
    ("cn1", "promptTokens", attrgetter("prompt_tokens")),
    ("cn2", "outputTokens", attrgetter("output_tokens")),
    ("cn3", "statusCode", attrgetter("status_code")),
    ("cfp1", "queueWaitMs", attrgetter("latency.queue_wait_ms")),
    ("cfp2", "virtualTokens", attrgetter("route.virtual_tokens")),
    ("cfp3", "droppedFields", attrgetter("dropped_fields")),  # schema "5": a count (CEF has cn1..cn3 only)
    ("flexNumber1", "policyVersion", attrgetter("policy.version")),  # schema "6": CEF's integer (Long) flex field
    ("deviceExternalId", None, attrgetter("instance")),
)


def format_cef(event: AuditEvent) -> str:
    """One CEF line (no trailing newline) for ``event``.

    Extension order: ``rt externalId outcome src suser sntdom request``,
    ``cs1..cs6`` (each after its label), ``reason``, ``cn1..cn3`` (each after
    its label), ``cfp1`` (``queueWaitMs``), ``cfp2`` (``virtualTokens``), ``cfp3`` (``droppedFields``, schema
    "5") and ``flexNumber1`` (``policyVersion``, schema "6"), each after its label, ``deviceExternalId`` (the emitting ``instance``), ``msg`` (``k=v`` of the
    kind-specific details, sorted, ``; `` joined); None values and their labels are left out."""
    details = event.alert or event.operator or event.summary or event.checkpoint or {}
    kind, outcome = event.kind.value, event.outcome.value
    name = f"{kind} {outcome}"
    if event.kind is Kind.ALERT and "alert_kind" in details:
        name += f" {details['alert_kind']}"
    if event.kind is Kind.OPERATOR and "action" in details:
        name += f" {details['action']}"
    pairs: list[str] = []
    for key, label, get in _EXTENSION:  # _ext / _labeled inlined
        value = get(event)
        if value is not None:
            if label is not None:
                pairs.append(_label(key, label))
            pairs.append(f"{key}={_value(value)}")
    if details:
        _ext(pairs, "msg", "; ".join(f"{k}={v}" for k, v in sorted(details.items())) or None)
    return (f"{_HEADER_PREFIX}{escape_header(f'{kind}:{outcome}')}|{escape_header(name)}|"
            f"{cef_severity(event)}|{' '.join(pairs)}")


#: The caches of :func:`cef_line` (S29-tidy29-1, in place of session 28's dicts emptied whole at 4,096
#: entries): ``functools.lru_cache`` on pure formatting functions, so a full cache drops its least recently
#: used entry only. Identity (SPIFFE ID, trust domain, endpoint, tenant) and source (client address) are
#: cached apart: a tenant sending from many addresses neither multiplies the identity entries nor evicts
#: them. Bounds from measured memory (bench/s28_final28_audit_caches.py, docs/security.md "Session 29:
#: tidy29"): an identity (its SPIFFE ID, its CEF pairs, its OCSF ``actor.user``) holds ~4.7 KiB with the
#: 2,048-byte maximum SPIFFE ID, ~0.8 KiB with a 64-byte one; a client address ~0.5 KiB: at most ~5.3 MiB.
_IDENTITY_MAX = 1024
_SOURCE_MAX = 1024
#: entries of :func:`_escaped` (reason codes and the instance: values the operator sets, few)
_VALUE_MAX = 1024
#: per (kind, outcome): the header up to the extension and the ``outcome=`` pair
_FAST_HEADS: dict[tuple[Kind, Outcome], tuple[str, str]] = {}


@lru_cache(maxsize=_VALUE_MAX)
def _escaped(value: str) -> str:
    """:func:`escape_extension` of an exact ``str`` that repeats (reason code, instance), cached."""
    return escape_extension(value)


def _repeated(value: object) -> str:
    """:func:`_value` of a value that repeats from event to event (cached when an exact str)."""
    return _escaped(value) if type(value) is str else _value(value)  # type: ignore[arg-type]


def _label(key: str, label: str) -> str:
    text = _LABELS.get((key, label))
    if text is None:
        text = _LABELS[(key, label)] = f"{key}Label={escape_extension(label)}"
    return text


_L_TENANT, _L_DECISION, _L_REPLICA = _label("cs1", "tenant"), _label("cs2", "decisionId"), _label("cs3", "replica")
_L_MODEL, _L_FP, _L_REQ = _label("cs4", "model"), _label("cs5", "prefixFingerprint"), _label("cs6", "requestId")
_L_PROMPT, _L_OUTPUT, _L_STATUS = _label("cn1", "promptTokens"), _label("cn2", "outputTokens"), _label("cn3", "statusCode")
_L_QUEUE, _L_VT, _L_DROPPED = _label("cfp1", "queueWaitMs"), _label("cfp2", "virtualTokens"), _label("cfp3", "droppedFields")
_L_POLICY_VERSION = _label("flexNumber1", "policyVersion")
_STR_OR_NONE: frozenset[type] = frozenset((str, type(None)))


def source_pair(client: object) -> str:
    """The CEF pair of a truthy ``client_address``: ``src=<escaped>`` for an IP literal
    (:func:`audit.event.is_ip_text`), ``shost=<escaped>`` for another source (``unknown``, ``unattested@...``)."""
    return f"src={_value(client)}" if is_ip_text(client) else f"shost={_value(client)}"


def identity_pairs(spiffe_id: object, trust_domain: object, endpoint: object, tenant: object) -> str:
    """The CEF pairs ``suser sntdom request cs1Label cs1`` of the values that are not None, space-joined
    ("" when all are None), each value as :func:`format_cef` writes it."""
    p: list[str] = []
    if spiffe_id is not None:
        p.append(f"suser={_value(spiffe_id)}")
    if trust_domain is not None:
        p.append(f"sntdom={_value(trust_domain)}")
    if endpoint is not None:
        p.append(f"request={_value(endpoint)}")
    if tenant is not None:
        p.append(_L_TENANT)
        p.append(f"cs1={_value(tenant)}")
    return " ".join(p)


def route_pairs(replica: object, model: object) -> str:
    """The CEF pairs ``cs3Label cs3 cs4Label cs4`` of the values that are not None, space-joined ("" when
    both are None)."""
    p: list[str] = []
    if replica is not None:
        p.append(_L_REPLICA)
        p.append(f"cs3={_value(replica)}")
    if model is not None:
        p.append(_L_MODEL)
        p.append(f"cs4={_value(model)}")
    return " ".join(p)


#: the cached twins, called with exact ``str`` (or None) arguments only: a key equal but of another type
#: (1, 1.0, True; a str subclass) would take another value's text
_source = lru_cache(maxsize=_SOURCE_MAX)(source_pair)
_who = lru_cache(maxsize=_IDENTITY_MAX)(identity_pairs)
_where = lru_cache(maxsize=_IDENTITY_MAX)(route_pairs)


def cef_line(event: AuditEvent) -> str:
    """:func:`format_cef`'s line, built with fewer calls (issue 14, session 10): the header per
    (kind, outcome) and the escaped values that repeat are cached, the extension written in one
    pass; session 28: the pairs of the values that repeat together (client, identity, endpoint,
    tenant; replica, model) cached as one string each, and plain numbers written without a call;
    session 29: the client address's pair cached apart from the identity's, each cache least recently
    used first out (:func:`source_pair`, :func:`identity_pairs`, :func:`route_pairs`). Events with kind-specific details (alerts, operator actions, summaries, checkpoints)
    and enums of an unexpected type take :func:`format_cef`. Same string always
    (tests/audit/test_s10_fast_formats.py)."""
    kind, outcome = event.kind, event.outcome
    if (event.alert or event.operator or event.summary or event.checkpoint
            or type(kind) is not Kind or type(outcome) is not Outcome):
        return format_cef(event)
    head = _FAST_HEADS.get((kind, outcome))
    if head is None:
        k, o = kind.value, outcome.value
        head = _FAST_HEADS[(kind, outcome)] = (
            f"{_HEADER_PREFIX}{escape_header(f'{k}:{o}')}|{escape_header(f'{k} {o}')}|{_SEVERITY.get(outcome, 5)}|",
            f"outcome={escape_extension(o)}")
    identity, policy, route = event.identity, event.policy, event.route
    numeric, str_or_none = _NUMERIC, _STR_OR_NONE
    p: list[str] = []
    a = p.append
    if (v := event.time_ms) is not None:
        a(f"rt={v}" if type(v) in numeric else f"rt={_value(v)}")
    if (v := event.event_id) is not None:
        a(f"externalId={_value(v)}")
    a(head[1])
    if c := event.client_address:
        a(_source(c) if type(c) is str else source_pair(c))
    sid, dom, ep, ten = identity.spiffe_id, identity.trust_domain, event.endpoint, event.tenant
    if type(sid) in str_or_none and type(dom) in str_or_none and type(ep) in str_or_none and type(ten) in str_or_none:
        text = _who(sid, dom, ep, ten)
    else:  # a value of another type: not cached
        text = identity_pairs(sid, dom, ep, ten)
    if text:
        a(text)
    if (v := policy.decision_id) is not None:
        a(_L_DECISION)
        a(f"cs2={_value(v)}")
    replica, model = route.replica, event.model
    text = (_where(replica, model) if type(replica) in str_or_none and type(model) in str_or_none
            else route_pairs(replica, model))
    if text:
        a(text)
    if (v := event.prefix_fingerprint) is not None:
        a(_L_FP)
        a(f"cs5={_value(v)}")
    if (v := event.request_id) is not None:
        a(_L_REQ)
        a(f"cs6={_value(v)}")
    if (v := policy.reason_code) is not None:
        a(f"reason={_repeated(v)}")
    if (v := event.prompt_tokens) is not None:
        a(_L_PROMPT)
        a(f"cn1={v}" if type(v) in numeric else f"cn1={_value(v)}")
    if (v := event.output_tokens) is not None:
        a(_L_OUTPUT)
        a(f"cn2={v}" if type(v) in numeric else f"cn2={_value(v)}")
    if (v := event.status_code) is not None:
        a(_L_STATUS)
        a(f"cn3={v}" if type(v) in numeric else f"cn3={_value(v)}")
    if (v := event.latency.queue_wait_ms) is not None:
        a(_L_QUEUE)
        a(f"cfp1={v}" if type(v) in numeric else f"cfp1={_value(v)}")
    if (v := route.virtual_tokens) is not None:
        a(_L_VT)
        a(f"cfp2={v}" if type(v) in numeric else f"cfp2={_value(v)}")
    if (v := event.dropped_fields) is not None:
        a(_L_DROPPED)
        a(f"cfp3={v}" if type(v) in numeric else f"cfp3={_value(v)}")
    if (v := policy.version) is not None:
        a(_L_POLICY_VERSION)
        a(f"flexNumber1={v}" if type(v) in numeric else f"flexNumber1={_value(v)}")
    if (v := event.instance) is not None:
        a(f"deviceExternalId={_repeated(v)}")
    return head[0] + " ".join(p)


_HEADER_SPLIT = re.compile(r"(?<!\\)((?:\\\\)*)\|")
_EXT_KEY = re.compile(r"(?:^| )([A-Za-z0-9_.\[\]]+)=")


def parse_cef(line: str) -> tuple[list[str], dict[str, str]]:
    """Parse a CEF line into (7 unescaped header fields, extension dict).

    Raises:
        CefParseError: not a CEF line.
    """
    start = line.find("CEF:")
    if start < 0:
        raise CefParseError("no CEF: prefix")
    line = line[start:]
    fields: list[str] = []
    pos = 0
    i = 0
    while len(fields) < 7:
        j = line.find("|", i)
        if j < 0:
            raise CefParseError("fewer than 7 header fields")
        backslashes = len(line[:j]) - len(line[:j].rstrip("\\"))
        if backslashes % 2 == 1:
            i = j + 1
            continue
        fields.append(re.sub(r"\\(.)", r"\1", line[pos:j]))
        pos = i = j + 1
    rest = line[pos:]
    ext: dict[str, str] = {}
    keys = []
    for m in _EXT_KEY.finditer(rest):
        eq = m.end() - 1
        backslashes = len(rest[:eq]) - len(rest[:eq].rstrip("\\"))
        if backslashes % 2 == 0:
            keys.append(m)
    for n, m in enumerate(keys):
        end = keys[n + 1].start() if n + 1 < len(keys) else len(rest)
        ext[m.group(1)] = unescape_extension(rest[m.end():end].rstrip("\n"))
    return fields, ext
