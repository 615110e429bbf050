"""The audit event scrubber: a second line of defence before any sink sees an event.

:func:`scrub_event` drops (and reports) every string field longer than a
bound or looking like a JWT / PEM key / bearer header, a ``prefix_fingerprint``
that is not short lower-case hex, and any list, bytes or other object (they
could hold token ids). The audit log (:mod:`audit.log`) runs it on every
event before any sink or spill file sees it.
"""
from __future__ import annotations

import dataclasses
import functools
import operator
import re
from collections.abc import Mapping
from typing import Any

from audit.event import (
    _EVENT_FIELDS,
    _GROUP_FIELDS,
    AuditEvent,
    Identity,
    Latencies,
    LedgerInfo,
    PolicyInfo,
    RouteInfo,
    new_event_id,
)
from audit.request_event import REQUEST_ROW_FIELDS

__all__ = ["MAX_STRING_CHARS", "MAX_FINGERPRINT_HEX", "row_is_clean", "scrub_event"]

#: Longest string value (characters) accepted in any event field.
MAX_STRING_CHARS = 256
#: Longest accepted ``prefix_fingerprint`` (hex chars; 16 bytes).
MAX_FINGERPRINT_HEX = 32

_JWT_RE = re.compile(r"eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.?")
_SECRET_RE = re.compile(r"-----BEGIN [A-Z ]*KEY-----|\bBearer\s+\S{8,}", re.IGNORECASE)
_HEX_RE = re.compile(r"^[0-9a-f]+$")
# matches somewhere iff _JWT_RE or _SECRET_RE does (alternation of both, each
# with its own flags): the scrubber's one-scan pre-check
_ANY_SECRET_RE = re.compile(
    r"eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.?|(?i:-----BEGIN [A-Z ]*KEY-----|\bBearer\s+\S{8,})"
)


def _bad_string(path: str, value: str, max_chars: int) -> str | None:
    """Reason a string must not be logged, or None if it is fine."""
    if len(value) > max_chars:
        return "too_long"
    if _ANY_SECRET_RE.search(value) is not None:  # one scan; which one only when either matches
        if _JWT_RE.search(value):
            return "jwt_like"
        if _SECRET_RE.search(value):
            return "secret_like"
    if path == "prefix_fingerprint":
        if len(value) > MAX_FINGERPRINT_HEX or not _HEX_RE.match(value):
            return "fingerprint_shape"
    return None


def _scrub_value(path: str, value: Any, max_chars: int, dropped: list[tuple[str, str]]) -> Any:
    if isinstance(value, str):
        reason = _bad_string(path, value, max_chars)
        if reason:
            dropped.append((path, reason))
            return None
        return value
    if isinstance(value, bool) or value is None or isinstance(value, (int, float)):
        return value
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            sv = _scrub_value(f"{path}.{k}", v, max_chars, dropped)
            if sv is not None:
                out[str(k)] = sv
        return out
    # lists, bytes, arbitrary objects: never logged (could hold token ids)
    dropped.append((path, "unsupported_type"))
    return None


def scrub_event(event: AuditEvent, max_chars: int = MAX_STRING_CHARS) -> tuple[AuditEvent, list[tuple[str, str]]]:
    """Drop every field that could carry a secret or prompt text.

    A string field is dropped when longer than ``max_chars`` characters, when
    it matches a JWT (``eyJ…​.…``), PEM key or ``Bearer`` pattern, or (for
    ``prefix_fingerprint``) when it is not lower-case hex of at most 32
    chars (a full 64-hex raw prefix hash is refused). Lists/bytes are
    dropped too (token ids). Returns the cleaned event and a list of
    ``(field_path, reason)`` for the drop counter; never raises.
    """
    if event.event_id is not None and _is_clean(event, max_chars):
        return event, []
    return _scrub_event_general(event, max_chars)


_SCRUB_TOP: tuple[str, ...] = tuple(n for n in _EVENT_FIELDS if n not in ("kind", "outcome", "time_ms"))
_SCRUB_GROUPS: dict[type, tuple[tuple[str, str], ...]] = {
    cls: tuple((sf.name, f"{name}.{sf.name}") for sf in dataclasses.fields(cls))
    for name, cls in (("identity", Identity), ("policy", PolicyInfo), ("ledger", LedgerInfo), ("route", RouteInfo),
                      ("latency", Latencies))
}
_PLAIN_NUMBERS = (int, float, bool)


def scan_clean(value: str) -> bool:
    """True iff ``_ANY_SECRET_RE`` finds no JWT, PEM key header or bearer token in ``value``
    (pure: the same answer for the same string; any length)."""
    return _ANY_SECRET_RE.search(value) is None


class SecretFound(Exception):
    """Raised by :func:`require_clean`: the value holds a secret pattern (never cached: ``lru_cache``
    keeps no call that raised, so no cache holds a string with a secret, as the session-6 set did not)."""


def require_clean(value: str) -> bool:
    """True when :func:`scan_clean` is; raises :class:`SecretFound` otherwise (the cached form)."""
    if _ANY_SECRET_RE.search(value) is not None:
        raise SecretFound
    return True


#: :func:`require_clean` cached (session 29, S29-caches29b-2: was a set of clean strings emptied whole at 4,096,
#: which one tenant's distinct models or client addresses emptied for every tenant): least recently used out,
#: clean strings only. Keys are the values of a bounded set (tenant, endpoint, replica, pool, identity,
#: reason, outcome, ...); per-request values (:data:`PER_REQUEST_PATHS`) are checked each time, the client's
#: model apart (256 entries), so a spread of models evicts only models.
_SCANNED_MAX = 4096
_scanned_clean = functools.lru_cache(maxsize=_SCANNED_MAX)(require_clean)
_model_scanned_clean = functools.lru_cache(maxsize=256)(require_clean)
#: strings of hex digits, dashes, dots, colons and brackets (ids, UUIDs, trace ids, IP addresses with a port):
#: none can hold a match of ``_ANY_SECRET_RE`` (the y/J of ``eyJ``, the r of ``Bearer``, the G of ``BEGIN``:
#: each needs a letter past f, in either case); session 11 skipped hex-and-dash row values the same way
_NO_SECRET_CHARS = re.compile(r"[0-9A-Fa-f.:\[\]-]*").fullmatch


def scan_per_request(value: str) -> bool:
    """:func:`require_clean` for a per-request value, uncached: ids and addresses answer without the scan."""
    if _NO_SECRET_CHARS(value) is None and _ANY_SECRET_RE.search(value) is not None:
        raise SecretFound
    return True


#: event paths whose values are new for every request (ids, the client's address, the prefix fingerprint)
PER_REQUEST_PATHS: frozenset[str] = frozenset({
    "event_id", "request_id", "policy.decision_id", "client_address", "trace_id", "prefix_fingerprint"})
_SCANNER: dict[str, Any] = {**{p: scan_per_request for p in PER_REQUEST_PATHS}, "model": _model_scanned_clean}
_ROW_PATH = {"decision_id": "policy.decision_id"}
#: a request row's values (REQUEST_ROW_FIELDS order) by cache: the shared one, none (per request), the model's
_N_ROW = len(REQUEST_ROW_FIELDS)
_ROW_KIND = [_SCANNER.get(_ROW_PATH.get(n, n), _scanned_clean) for n in REQUEST_ROW_FIELDS]
_ROW_CACHED = operator.itemgetter(*(i for i, k in enumerate(_ROW_KIND) if k is _scanned_clean))
_ROW_PER_REQUEST = operator.itemgetter(*(i for i, k in enumerate(_ROW_KIND) if k is scan_per_request))
_ROW_MODEL = REQUEST_ROW_FIELDS.index("model")


def _clean_str(path: str, value: str, max_chars: int) -> bool:
    """True iff :func:`_bad_string` would accept ``value`` at ``path``."""
    if len(value) > max_chars:
        return False
    try:
        _SCANNER.get(path, _scanned_clean)(value)
    except SecretFound:
        return False
    if path == "prefix_fingerprint":
        return len(value) <= MAX_FINGERPRINT_HEX and _HEX_RE.match(value) is not None
    return True


def _clean_scalar(path: str, value: Any, max_chars: int) -> bool:
    """True for None, a plain int/float/bool, or a str :func:`_bad_string` accepts;
    False for anything else (mappings, subclasses, other types)."""
    if value is None:
        return True
    t = type(value)
    if t is str:
        return _clean_str(path, value, max_chars)
    return t in _PLAIN_NUMBERS


def _is_clean(event: AuditEvent, max_chars: int) -> bool:
    """True when :func:`_scrub_event_general` would return ``event`` unchanged
    with nothing dropped, decided without building anything. Anything it is
    not sure about (mappings, str/number subclasses, other types, a group of
    an unexpected class) answers False and takes the general path.
    (:func:`_clean_scalar` inlined: one loop, no generator per group.)"""
    for name in _SCRUB_TOP:
        value = getattr(event, name)
        if value is None:
            continue
        t = type(value)
        if t is str:
            if not _clean_str(name, value, max_chars):
                return False
            continue
        if t in _NUMBER_TYPES:
            continue
        sub = _SCRUB_GROUPS.get(t)
        if sub is None or name not in _GROUP_FIELDS:
            return False
        for attr, path in sub:
            v = getattr(value, attr)
            if v is None:
                continue
            vt = type(v)
            if vt is str:
                if not _clean_str(path, v, max_chars):
                    return False
            elif vt not in _NUMBER_TYPES:
                return False
    return True


_NUMBER_TYPES: frozenset[type] = frozenset(_PLAIN_NUMBERS)


def _scrub_event_general(event: AuditEvent, max_chars: int) -> tuple[AuditEvent, list[tuple[str, str]]]:
    """The scrubber for any event (any field types); see :func:`scrub_event`."""
    dropped: list[tuple[str, str]] = []
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(event):
        value = getattr(event, f.name)
        if f.name in ("kind", "outcome", "time_ms"):
            continue
        if dataclasses.is_dataclass(value):
            sub = {}
            for sf in dataclasses.fields(value):
                sv = getattr(value, sf.name)
                clean = _scrub_value(f"{f.name}.{sf.name}", sv, max_chars, dropped)
                if clean is not sv:
                    sub[sf.name] = clean
            if sub:
                changes[f.name] = dataclasses.replace(value, **sub)
            continue
        clean = _scrub_value(f.name, value, max_chars, dropped)
        if clean is not value and clean != value:
            changes[f.name] = clean
        elif clean is None and value is not None:
            changes[f.name] = None
    if changes.get("event_id", event.event_id) is None:
        changes["event_id"] = new_event_id()
    return (dataclasses.replace(event, **changes) if changes else event), dropped


def row_is_clean(row: Any, fingerprint_index: int) -> bool:
    """True only if every value of a request row (:mod:`audit.request_event`) is None, a plain
    ``int``/``float``/``bool`` or a ``str`` the scrubber accepts, and the value at
    ``fingerprint_index`` (``prefix_fingerprint``) is None or short lower-case hex: then
    :func:`scrub_event` of the row's event returns it unchanged with nothing dropped (every string
    and number of the event is one of the row's values; stricter than needed for the outcome and
    the stage stamps). The audit worker checks the flat row (one loop, issue 14, session 10:
    ~2 µs instead of ~8 for the event's groups) and emits the event without the scrubber when it
    answers True; False (anything else) takes the scrubber as before. Never raises for a list or
    tuple ``row``."""
    max_chars = MAX_STRING_CHARS
    if len(row) == _N_ROW:  # a request row: per-request values apart (no cache), the model apart (its cache)
        cached, per_request, model = _ROW_CACHED(row), _ROW_PER_REQUEST(row), row[_ROW_MODEL]
    else:
        cached, per_request, model = row, (), None
    scan = _scanned_clean
    for v in cached:
        if v is None:
            continue
        t = type(v)
        if t is str:
            if len(v) > max_chars:
                return False
            try:
                scan(v)
            except SecretFound:
                return False
        elif t not in _NUMBER_TYPES:
            return False
    for v in per_request:  # scan_per_request inlined, nothing cached
        if v is None:
            continue
        t = type(v)
        if t is str:
            if len(v) > max_chars or (_NO_SECRET_CHARS(v) is None and _ANY_SECRET_RE.search(v) is not None):
                return False
        elif t not in _NUMBER_TYPES:
            return False
    if model is not None:
        if type(model) is str:
            if len(model) > max_chars:
                return False
            try:
                _model_scanned_clean(model)
            except SecretFound:
                return False
        elif type(model) not in _NUMBER_TYPES:
            return False
    fp = row[fingerprint_index]
    return fp is None or (len(fp) <= MAX_FINGERPRINT_HEX and _HEX_RE.match(fp) is not None)
