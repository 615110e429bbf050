"""A request's spans built by the audit worker from its request row (issue 14, session 8).

The request row (:mod:`audit.request_event`) already holds everything the request's seven
spans are made of: the stage stamps, status, model, token counts, tenant, replica, decision
id, outcome and trace id. So when the audit worker process exports the spans
(:class:`audit.span_export.OffloadSpanProcessor` in the worker, ``spans`` in its config), the
gateway adds only the server span's own values to the row's frame, the *span extra*
``[span_id, trace_flags, start_ns, links, trace_state]`` (:func:`span_extra`), and the worker
makes the compact request record (:func:`row_span_record`, :mod:`audit.span_request`) the
gateway used to make: no span attributes, children or record are built, and no span writer
thread runs, in the gateway process.

:func:`stage_children` and :func:`span_attributes` are the one definition of a request's
children and attributes, used by both paths (``gateway.auditing.AuditHub`` builds them
in-process when no worker exports spans), so the exported spans are the same either way
(tests/audit/test_s8_row_spans.py).
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

from opentelemetry.trace import SpanKind

from audit.request_event import REQUEST_ROW_FIELDS
from audit.otlp_pb import NotPlain, key_value, len_field, name_field, span_message, str_key_value, varint
from audit.span_request import REQUEST_MARK, encode_links, random_span_id

__all__ = ["STAGES", "int_field", "row_span_bytes", "row_span_record", "span_attributes", "span_extra", "stage_children",
           "str_field"]

_M64 = (1 << 64) - 1
_FLAGS_LOCAL = 0x100  # Span.flags: SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK (a local parent, or none)
#: a request's stage spans in order: stage i runs from mark i to mark i + 1 (RequestRecord t0, t_auth,
#: t_parsed, t_keys, t_decided, t_route, t_end)
STAGES = (("authenticate", SpanKind.INTERNAL), ("parse", SpanKind.INTERNAL), ("prefix_keys", SpanKind.INTERNAL),
          ("policy", SpanKind.INTERNAL), ("route", SpanKind.INTERNAL), ("upstream", SpanKind.CLIENT))
#: the instrumentation scope of the request spans (audit.tracing._SCOPE): name, version, schema url
SCOPE = ("prefixgate", None, "")

_I = {name: i for i, name in enumerate(REQUEST_ROW_FIELDS)}
_MARKS = tuple(_I[n] for n in ("t0", "t_auth", "t_parsed", "t_keys", "t_decided", "t_route", "t_end"))
_ATTRS = tuple(_I[n] for n in ("status_code", "model", "prompt_tokens", "output_tokens", "tenant", "replica",
                                "predicted_prefix_tokens", "decision_id", "outcome"))
_TRACE, _ENDPOINT, _TIME_MS = _I["trace_id"], _I["endpoint"], _I["time_ms"]


def stage_children(wall0_ns: int, stamps: Sequence[float | None]
                   ) -> tuple[list[tuple[str, SpanKind, int, int]], int | None]:
    """The children ``(name, kind, start_ns, end_ns)`` of a request's server span and its end (epoch ns;
    None when ``t_end`` is missing). ``stamps``: the seven ``time.perf_counter()`` marks (t0 first, t_end
    last, None where a stage did not run); ``wall0_ns``: the server span's start, the epoch ns of t0. A
    stage is a child when both its marks exist."""
    t0 = stamps[0]
    marks = [None if t is None else wall0_ns + int((t - t0) * 1e9) for t in stamps]
    children = [(name, kind, a, b) for (name, kind), a, b in zip(STAGES, marks, marks[1:])
                if a is not None and b is not None]
    return children, marks[6]


def span_attributes(status: int | None, model: str | None, prompt_tokens: int | None, output_tokens: int | None,
                    tenant: str | None, replica: str | None, predicted: int | None, decision_id: str | None,
                    outcome: str) -> dict[str, Any]:
    """The server span's attributes set at its end (HTTP and gen_ai semantic conventions, PrefixGate's own)."""
    return {
        "http.response.status_code": status or 0,
        "gen_ai.request.model": model or "",
        "gen_ai.usage.input_tokens": prompt_tokens or 0,
        "gen_ai.usage.output_tokens": output_tokens or 0,
        "prefixgate.tenant": tenant or "",
        "prefixgate.replica": replica or "",
        "prefixgate.predicted_prefix_tokens": predicted or 0,
        "prefixgate.decision_id": decision_id or "",
        "prefixgate.outcome": outcome,
    }


def span_extra(context: Any, start_ns: int, links: Sequence[Any]) -> tuple:
    """The span extra of a sampled request trace (module doc): ``context`` its server span's
    SpanContext, ``start_ns`` its start (epoch ns), ``links`` its ``opentelemetry.trace.Link`` s."""
    state = context.trace_state
    return (context.span_id, int(context.trace_flags), start_ns, encode_links(links),
            ",".join(f"{k}={v}" for k, v in state.items()) if state else None)


def row_span_record(row: Sequence[Any], extra: Sequence[Any]) -> tuple:
    """The compact request record (:data:`audit.span_request.REQUEST_FIELDS`) of a request row
    (:data:`audit.request_event.REQUEST_ROW_FIELDS`, as decoded from its frame) and its span extra:
    what ``audit.tracing.end_request_trace`` hands the offload processor for the same request. A
    missing ``t_end`` ends the server span at the row's ``time_ms``.

    Raises:
        ValueError, TypeError: a row without a trace id, or an extra of the wrong shape.
    """
    span_id, flags, start_ns, links, state = extra
    if type(span_id) is not int or type(flags) is not int or type(start_ns) is not int:
        raise ValueError("span extra: span_id, trace_flags and start_ns must be ints")
    tid = int(row[_TRACE], 16)
    endpoint = row[_ENDPOINT]
    children, end = stage_children(start_ns, [row[i] for i in _MARKS])
    status = row[_ATTRS[0]]
    attributes = {"http.request.method": "POST", "http.route": endpoint,
                  **span_attributes(*(row[i] for i in _ATTRS))}
    return (REQUEST_MARK, "POST " + endpoint, tid >> 64, tid & _M64, span_id, flags, state, start_ns,
            end if end is not None else row[_TIME_MS] * 1_000_000, attributes, bool(status and status >= 500),
            [tuple(x) for x in links] if links else None, children, *SCOPE, 0, 0)


_SERVER_KIND1 = SpanKind.SERVER.value + 1
_ERROR_CODE = 2  # opentelemetry-proto Status.StatusCode STATUS_CODE_ERROR
_pack_times = struct.Struct("<BQBQ").pack  # Span fields 7 and 8 (start, end: fixed64)
#: a child span's last fields: an empty status (15) and flags (16, fixed32) of a local parent
_CHILD_TAIL = b"\x7a\x00\x85\x01" + struct.pack("<I", _FLAGS_LOCAL)
#: each stage's name (5) and kind (6) fields
_STAGE_HEADS = {name: len_field(b"\x2a", name.encode()) + b"\x30" + bytes((kind.value + 1,)) for name, kind in STAGES}
_STAGE_HEAD_LIST = [_STAGE_HEADS[name] for name, _kind in STAGES]


_ZERO_ID = bytes(8)
#: per length of the parent part (``trace_state`` field + ``parent_span_id`` field): each stage's
#: (``struct`` pack of a whole ``ScopeSpans.spans`` field of a child, its constant head up to the trace
#: id, the stage's name and kind fields); the same bytes as ``len_field(b"\x12", head + id + parent +
#: stage + times + tail)``
_CHILD_PACKS: dict[int, list[tuple[Callable[..., bytes], bytes, bytes]]] = {}


def _child_packs(parent_len: int) -> list[tuple[Callable[..., bytes], bytes, bytes]]:
    packs = []
    for stage in _STAGE_HEAD_LIST:
        body = 2 + 16 + 2 + 8 + parent_len + len(stage) + 18 + len(_CHILD_TAIL)
        pre = b"\x12" + varint(body) + b"\x0a\x10"
        # pre, trace id, span_id tag, span id, parent, stage, start (tag, fixed64), end (tag, fixed64), tail
        fmt = f"<{len(pre)}s16s2s8s{parent_len}s{len(stage)}sBQBQ{len(_CHILD_TAIL)}s"
        packs.append((struct.Struct(fmt).pack, pre, stage))
    if len(_CHILD_PACKS) >= 64:  # pragma: no cover - one entry per distinct trace_state length
        _CHILD_PACKS.clear()
    _CHILD_PACKS[parent_len] = packs
    return packs


def _six_ids() -> list[bytes]:
    """Six :func:`audit.span_request.random_span_id` values (random, non-zero 64-bit) as 8 big-endian
    bytes each, from one draw of 48 random bytes."""
    raw = random.randbytes(48)
    ids = [raw[0:8], raw[8:16], raw[16:24], raw[24:32], raw[32:40], raw[40:48]]
    if _ZERO_ID in ids:  # pragma: no cover - 6 * 2**-64
        return [random_span_id().to_bytes(8, "big") for _ in range(6)]
    return ids


def row_span_bytes(row: Sequence[Any], extra: Sequence[Any],
                   new_span_id: Callable[[], int] = random_span_id) -> tuple[bytes, int]:
    """``(bytes, number of spans)``: a request's spans as OTLP ``Span`` bytes (session 9), each as a
    ``ScopeSpans.spans`` field (``0x12``, length, the message), children first (ids from ``new_span_id()``
    in order), then the server span: exactly the spans the span exporter child used to encode from
    :func:`row_span_record` (:func:`audit.span_request.expand_request_record`,
    :class:`audit.otlp_trace_request.OtlpRequestEncoder`; tests/audit/test_s9_row_span_bytes.py), without
    the record, its JSON trip or its expansion. The scope is :data:`SCOPE`. A child is its ids, times and
    its stage's name and kind around constant bytes; the server span is :func:`audit.otlp_pb.span_message`'s
    bytes, written by :func:`_server_span` from cached attribute parts when it has no links and plain values
    (session 11). With the default ``new_span_id`` and every stage run, the six child ids come from one
    random draw (:func:`_six_ids`).

    Raises:
        audit.otlp_pb.NotPlain, ValueError, TypeError, OverflowError, struct.error: a row, extra or
            attribute outside the plain shape (the caller takes :func:`row_span_record`'s path, which decides).
    """
    span_id, flags, start_ns, links, state = extra
    if type(span_id) is not int or type(flags) is not int or type(start_ns) is not int:
        raise ValueError("span extra: span_id, trace_flags and start_ns must be ints")
    tid = int(row[_TRACE], 16).to_bytes(16, "big")
    endpoint = row[_ENDPOINT]
    name = "POST " + endpoint
    stamps = [row[i] for i in _MARKS]
    status = row[_ATTRS[0]]
    out = []
    if all(type(t) is float for t in stamps):  # every stage ran (session 11: no child tuples, ids drawn at once)
        t0 = stamps[0]
        marks = [start_ns + int((t - t0) * 1e9) for t in stamps]
        end = marks[6]
        parent = _parent_fields(span_id, state)
        ids = _six_ids() if new_span_id is random_span_id else [new_span_id().to_bytes(8, "big") for _ in range(6)]
        packs = _CHILD_PACKS.get(len(parent)) or _child_packs(len(parent))
        for k in range(6):  # each child: one pack of its field tag and length, ids, name, kind, times (session 14)
            a, b = marks[k], marks[k + 1]
            if not a or not b:  # a zero time is left out of the message: the general encoder
                raise NotPlain("time")
            pack, pre, stage = packs[k]
            out.append(pack(pre, tid, b"\x12\x08", ids[k], parent, stage, 0x39, a, 0x41, b, _CHILD_TAIL))
        children = None
    else:
        children, end = stage_children(start_ns, stamps)
    if children:
        parent = _parent_fields(span_id, state)
        head = b"\x0a\x10" + tid + b"\x12\x08"
        for cname, _kind, a, b in children:
            if not a or not b:  # a zero time is left out of the message: the general encoder
                raise NotPlain("time")
            body = b"".join((head, new_span_id().to_bytes(8, "big"), parent, _STAGE_HEADS[cname],
                             _pack_times(0x39, a, 0x41, b), _CHILD_TAIL))
            out.append(len_field(b"\x12", body))
    end_ns = end if end is not None else row[_TIME_MS] * 1_000_000
    error = bool(status and status >= 500)
    server = None
    if not links:  # the plain server span written straight (session 11); anything else: span_message
        server = _server_span(tid, span_id, state, name, start_ns, end_ns, endpoint, status,
                              [row[i] for i in _ATTRS[1:]], error)
    if server is None:
        attributes = {"http.request.method": "POST", "http.route": endpoint,
                      **span_attributes(*(row[i] for i in _ATTRS))}
        server = span_message(tid, span_id, state, None, name, _SERVER_KIND1, start_ns, end_ns, attributes,
                              _ERROR_CODE if error else 0, None, links, 0, 0, _FLAGS_LOCAL)
    out.append(len_field(b"\x12", server))
    return b"".join(out), len(out)


#: the server span's attribute keys after method and route, in :func:`span_attributes` order, and what
#: each takes for None (their value types: int, str, int, int, str, str, int, str, str)
_ATTR_KEYS = ("http.response.status_code", "gen_ai.request.model", "gen_ai.usage.input_tokens",
              "gen_ai.usage.output_tokens", "prefixgate.tenant", "prefixgate.replica",
              "prefixgate.predicted_prefix_tokens", "prefixgate.decision_id", "prefixgate.outcome")
_INT_ATTRS = frozenset((0, 2, 3, 6))
_STR_MAX = 4096  # (key, value) of route, tenant, replica, outcome: ~0.27 KiB an entry (1.1 MiB full; caches29)
_MODEL_MAX = 256  # the client's model names (1-256 characters, any), apart: ~0.73 KiB an entry at 256
#: each int attribute's key part (``0x0a len key``) and the field's fixed overhead
_INT_KEYS = {i: len_field(b"\x0a", _ATTR_KEYS[i].encode()) for i in _INT_ATTRS}
_DECISION_KEY = len_field(b"\x0a", b"prefixgate.decision_id")
_METHOD_FIELD = len_field(b"\x4a", key_value("http.request.method", "POST"))
_I63 = 1 << 63
_pack_q = struct.Struct("<Q").pack
_pack_i = struct.Struct("<I").pack
_SERVER_TAIL = b"\x85\x01" + _pack_i(_FLAGS_LOCAL)


def str_field(key: str, value: str) -> bytes:
    """``b"\\x4a" len KeyValue``: the ``Span.attributes`` field of an exact ``str`` key and value (the pure
    function :func:`_str_field` and :func:`_model_field` cache)."""
    return len_field(b"\x4a", str_key_value(key, value))


#: the attributes field of a (key, value) of a bounded set (route, tenant, replica, outcome) and of the model
#: (the client's): least-recently-used caches (S29-caches29-2); the decision id is never cached
_str_field = lru_cache(maxsize=_STR_MAX)(str_field)
_model_field = lru_cache(maxsize=_MODEL_MAX)(str_field)


def _server_span(tid: bytes, span_id: int, state: Any, name: str, start: Any, end: Any, endpoint: Any,
                 status: Any, values: list[Any], error: bool) -> bytes | None:
    """:func:`audit.otlp_pb.span_message` of a request's server span without links (the same bytes), with
    the attributes written from cached parts; None when a value is outside this path's shape (exact
    ``str`` / ``int`` attributes, times and ids in range): the caller takes ``span_message``."""
    if (type(start) is not int or type(end) is not int or not 0 < start < 1 << 64 or not 0 < end < 1 << 64
            or not 0 <= span_id < 1 << 64 or type(endpoint) is not str or (state and type(state) is not str)):
        return None
    parts = [b"\x0a\x10", tid, b"\x12\x08", span_id.to_bytes(8, "big")]
    if state:
        parts.append(len_field(b"\x1a", state.encode()))
    parts.append(name_field(name))
    parts.append(b"\x30\x02\x39" + _pack_q(start) + b"\x41" + _pack_q(end))
    model, prompt, output, tenant, replica, predicted, decision, outcome = values
    if (type(model) is not str and model is not None or type(tenant) is not str and tenant is not None
            or type(replica) is not str and replica is not None or type(decision) is not str and decision is not None
            or type(outcome) is not str and outcome is not None):
        return None
    f_status, f_prompt, f_output, f_pred = (_int_field(0, status), _int_field(2, prompt), _int_field(3, output),
                                            _int_field(6, predicted))
    if f_status is None or f_prompt is None or f_output is None or f_pred is None:
        return None
    parts += (_METHOD_FIELD, _str_field("http.route", endpoint), f_status, _model_field(_ATTR_KEYS[1], model or ""),
              f_prompt, f_output, _str_field(_ATTR_KEYS[4], tenant or ""), _str_field(_ATTR_KEYS[5], replica or ""),
              f_pred)
    # the decision id: unique, not cached
    parts.append(len_field(b"\x4a", _DECISION_KEY + len_field(b"\x12", len_field(b"\x0a", (decision or "").encode()))))
    if outcome is not None:  # left out when None
        parts.append(_str_field(_ATTR_KEYS[8], outcome))
    parts.append(b"\x7a\x02\x18\x02" if error else b"\x7a\x00")
    parts.append(_SERVER_TAIL)
    return b"".join(parts)


_INT_MAX = 4096  # (attribute index, value): status codes and token counts, ~0.19 KiB an entry (0.8 MiB full)


@lru_cache(maxsize=_INT_MAX)
def int_field(i: int, v: int) -> bytes:
    """The ``Span.attributes`` field of int attribute ``i`` (an index into :data:`_ATTR_KEYS` of
    :data:`_INT_ATTRS`) with an exact int value in [0, 2**63); cached, least recently used out."""
    return len_field(b"\x4a", _INT_KEYS[i] + b"\x12" + _any_int(v))


def _int_field(i: int, v: Any) -> bytes | None:
    """The attributes field of int attribute ``i`` (None counts as 0, as :func:`span_attributes` writes
    it), or None for a value outside [0, 2**63) or not an exact int (the caller falls back)."""
    if v is None:
        v = 0
    elif type(v) is not int or not 0 <= v < _I63:
        return None
    return int_field(i, v)


def _any_int(v: int) -> bytes:
    """``len AnyValue{int_value: v}`` (the KeyValue's value field after its tag) of an int in [0, 2**63)."""
    body = b"\x18" + varint(v)
    return bytes((len(body),)) + body


def _parent_fields(span_id: int, state: Any) -> bytes:
    """A child span's ``trace_state`` field (when ``state`` is truthy) and its ``parent_span_id`` field (the
    server span ``span_id``, an int in [0, 2**64)).

    Raises:
        NotPlain: ``state`` is truthy and not an exact ``str``. OverflowError: ``span_id`` out of range."""
    if state:
        if type(state) is not str:
            raise NotPlain("trace_state")
        return len_field(b"\x1a", state.encode()) + b"\x22\x08" + span_id.to_bytes(8, "big")
    return b"\x22\x08" + span_id.to_bytes(8, "big")
