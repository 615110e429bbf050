"""ArcSight Common Event Format (CEF) rendering of audit events.

Format (CEF rev 25 "Implementing ArcSight CEF"):
``CEF:Version|Device Vendor|Device Product|Device Version|Signature ID|Name|Severity|Extension``.
Header fields escape ``\\`` and ``|`` with a backslash; extension values
escape ``\\`` and ``=`` with a backslash and encode newlines as ``\\n`` /
``\\r``. Extension keys are the standard CEF dictionary names (``rt``,
``src``, ``suser``, ``request``, ``outcome``, ``cs1``..``cs6`` with labels,
``cn1``..``cn3``).
"""
from __future__ import annotations

import re

from audit.event import AuditEvent, Kind, Outcome

VENDOR = "PrefixGate"
PRODUCT = "gateway"
VERSION = "0.1.0"


class CefParseError(ValueError):
    """A line is not a CEF record."""


def escape_header(value: str) -> str:
    """Escape a CEF header field: ``\\`` → ``\\\\``, ``|`` → ``\\|``; newlines become spaces."""
    return value.replace("\\", "\\\\").replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def escape_extension(value: str) -> str:
    """Escape a CEF extension value: ``\\``, ``=``, newline and CR."""
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


def format_cef(event: AuditEvent) -> str:
    """One CEF line (no trailing newline) for ``event``."""
    details = event.alert or event.operator or event.summary or event.checkpoint or {}
    name = f"{event.kind.value} {event.outcome.value}"
    if event.kind is Kind.ALERT and "alert_kind" in details:
        name += f" {details['alert_kind']}"
    if event.kind is Kind.OPERATOR and "action" in details:
        name += f" {details['action']}"
    ext: list[tuple[str, object]] = [
        ("rt", event.time_ms),
        ("externalId", event.event_id),
        ("outcome", event.outcome.value),
        ("src", event.client_address),
        ("suser", event.identity.spiffe_id),
        ("sntdom", event.identity.trust_domain),
        ("request", event.endpoint),
        ("cs1Label", "tenant"), ("cs1", event.tenant),
        ("cs2Label", "decisionId"), ("cs2", event.policy.decision_id),
        ("cs3Label", "replica"), ("cs3", event.route.replica),
        ("cs4Label", "model"), ("cs4", event.model),
        ("cs5Label", "prefixFingerprint"), ("cs5", event.prefix_fingerprint),
        ("cs6Label", "requestId"), ("cs6", event.request_id),
        ("reason", event.policy.reason_code),
        ("cn1Label", "promptTokens"), ("cn1", event.prompt_tokens),
        ("cn2Label", "outputTokens"), ("cn2", event.output_tokens),
        ("cn3Label", "statusCode"), ("cn3", event.status_code),
        ("msg", "; ".join(f"{k}={v}" for k, v in sorted(details.items())) or None),
    ]
    pairs = []
    for i, (k, v) in enumerate(ext):
        if k.endswith("Label"):
            if ext[i + 1][1] is None:
                continue
        if v is None:
            continue
        pairs.append(f"{k}={escape_extension(str(v))}")
    header = [
        "CEF:0", escape_header(VENDOR), escape_header(PRODUCT), escape_header(VERSION),
        escape_header(f"{event.kind.value}:{event.outcome.value}"), escape_header(name), str(cef_severity(event)),
    ]
    return "|".join(header) + "|" + " ".join(pairs)


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
