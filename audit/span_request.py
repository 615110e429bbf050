"""Compact request record: one wire record per request instead of its encoded spans (issue 14).

The gateway hands the span exporter child one record per request
(:func:`encode_request_record`, field order :data:`REQUEST_FIELDS`): the
server span's ids, times, attributes and links plus its children as
``(name, kind, start_ns, end_ns)``. The child expands it
(:func:`expand_request_record`) into exactly the records
:func:`audit.span_frames.encode_request_spans` would have sent
(:data:`audit.span_frames.SPAN_FIELDS` order: the children first, each with
a fresh random span id made in the child, then the server span), so the OTLP
request keeps its structure. The gateway no longer makes a span id per child
(they are never propagated: only the server span's context is) nor encodes
seven records per request.

A request record is told from a span record by its first field: the int
:data:`REQUEST_MARK` (a span record starts with its name, a str).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.trace import SpanKind, StatusCode

from audit.span_frames import _attr_dict, _trace_state

__all__ = ["BYTES_MARK", "REQUEST_FIELDS", "REQUEST_MARK", "encode_links", "encode_request_record", "expand_request_record",
           "random_span_id", "span_count"]

_M64 = (1 << 64) - 1
#: first field of a request record
REQUEST_MARK = 0
#: first field of a bytes record ``[BYTES_MARK, n_spans, scope_name, scope_version, scope_schema_url, base64]``:
#: ``n_spans`` spans already encoded as ``ScopeSpans.spans`` fields (session 9: the audit worker's request
#: spans, :func:`audit.row_spans.row_span_bytes`), base64 (standard alphabet) so that the frame stays JSON
BYTES_MARK = 1
#: field order of one request record (documentation; positions are fixed)
REQUEST_FIELDS = (
    "mark", "name", "trace_id_hi", "trace_id_lo", "span_id", "trace_flags", "trace_state", "start_ns", "end_ns",
    "attributes", "error", "links", "children", "scope_name", "scope_version", "scope_schema_url",
    "dropped_attributes", "dropped_links",
)
_N = len(REQUEST_FIELDS)
_UNSET = StatusCode.UNSET.value
_ERROR = StatusCode.ERROR.value
_SERVER = SpanKind.SERVER.value
_KINDS = {k.value for k in SpanKind}


def encode_request_record(name: str, context: Any, links: Sequence[Any], attributes: dict[str, Any],
                          start_ns: int, end_ns: int, error: bool,
                          children: Sequence[tuple[str, SpanKind, int, int]], scope: Any) -> tuple:
    """One request as a compact record (:data:`REQUEST_FIELDS` order): the arguments of
    :func:`audit.span_frames.encode_request_spans` without its ``new_span_id``. ``children`` is
    kept as given (``SpanKind`` members serialise as their values with orjson); ``attributes``
    is kept, not copied. Never raises on well-formed SDK objects."""
    tid = context.trace_id
    plain = type(attributes) is dict  # the caller's own dict (end_request_trace's merge): kept as is
    return (
        REQUEST_MARK, name, tid >> 64, tid & _M64, context.span_id, context.trace_flags,
        _trace_state(context.trace_state) if context.trace_state else None, start_ns, end_ns,
        (attributes or None) if plain else _attr_dict(attributes), bool(error),
        encode_links(links),
        children, *((scope.name, scope.version, scope.schema_url) if scope else (None, None, None)),
        0 if plain else getattr(attributes, "dropped", 0), getattr(links, "dropped", 0) if links else 0,
    )


def encode_links(links: Sequence[Any]) -> list[tuple] | None:
    """A span's links as request-record values, ``(trace_id_hi, trace_id_lo, span_id, trace_flags,
    is_remote, attributes)`` each (None: no link)."""
    if not links:
        return None
    return [(lc.trace_id >> 64, lc.trace_id & _M64, lc.span_id, lc.trace_flags, lc.is_remote, _attr_dict(lk.attributes))
            for lk in links for lc in (lk.context,)]


def span_count(record: Sequence[Any]) -> int:
    """Spans a queued record stands for: 1 for a span record, 1 + its children for a request record,
    ``n_spans`` for a bytes record."""
    first = record[0]
    if type(first) is int:
        if first == REQUEST_MARK and len(record) == _N:
            return len(record[12]) + 1
        if first == BYTES_MARK and len(record) == 6 and type(record[1]) is int and record[1] > 0:
            return record[1]
    return 1


def random_span_id() -> int:
    """A random non-zero 64-bit span id (the SDK's ``RandomIdGenerator`` rule)."""
    sid = random.getrandbits(64)
    while not sid:  # pragma: no cover - 2**-64
        sid = random.getrandbits(64)
    return sid


def expand_request_record(r: Sequence[Any], new_span_id: Callable[[], int] = random_span_id) -> list[list[Any]]:
    """The span records (:data:`audit.span_frames.SPAN_FIELDS` order, as lists) of one decoded
    request record: its children under the server span, each with an id from ``new_span_id()``
    in order, then the server span (status ERROR when ``error``).

    Raises:
        ValueError: not a request record of the right shape, or a child of the wrong shape or kind.
    """
    if len(r) != _N or r[0] != REQUEST_MARK:
        raise ValueError("not a request record")
    (_, name, hi, lo, psid, flags, state, start_ns, end_ns, attrs, error, links, children, sname, sversion, surl,
     d_attrs, d_links) = r
    out: list[list[Any]] = []
    for child in children or ():
        if len(child) != 4:
            raise ValueError("request record child has the wrong shape")
        cname, kind, start, end = child
        kind = getattr(kind, "value", kind)  # a SpanKind before the JSON round trip, its int after
        if kind not in _KINDS:
            raise ValueError("request record child has an unknown kind")
        out.append([cname, hi, lo, new_span_id(), flags, state, psid, False, kind, start, end, None,
                    _UNSET, None, None, None, sname, sversion, surl, 0, 0, 0])
    out.append([name, hi, lo, psid, flags, state, None, False, _SERVER, start_ns, end_ns, attrs,
                _ERROR if error else _UNSET, None, links, None, sname, sversion, surl, d_attrs, 0, d_links])
    return out
