"""Protocol Buffers wire encoding of the OTLP messages the audit worker sends most (issue 14, session 9).

Building ``opentelemetry-proto`` messages field by field from Python (``Span``,
``LogRecord``: a dozen attribute sets and ``add`` calls each) and serialising
them cost the span exporter child ~20 µs per request of seven spans and the
OTLP log sink ~15 µs per event. These functions write the same bytes directly
(the Protocol Buffers encoding, https://protobuf.dev/programming-guides/encoding/:
fields in field-number order as ``SerializeToString`` writes them, proto3
defaults left out, ``oneof`` members always written), with the parts that repeat
(attribute keys and common values, span names, constant tails) cached.

Only the plain shapes take this path: str / bool / int (int64) / float attribute
values (of spans and links), no span events. Anything else raises
:class:`NotPlain` and the caller builds that one message with the generated
classes as before, so every record is encoded exactly as before
(tests/audit/test_s9_otlp_pb.py compares the bytes with the generated messages'
on random records).
"""

from __future__ import annotations

import struct
from functools import lru_cache

__all__ = ["CLIENT_KEYS", "NotPlain", "PER_REQUEST_KEYS", "any_value", "key_field", "key_value", "len_field",
           "span_message", "str_key_value", "varint"]


class NotPlain(Exception):
    """A value or record outside the shapes encoded here: build it with the generated messages."""


_pack_q = struct.Struct("<Q").pack
_pack_d = struct.Struct("<d").pack
_pack_i = struct.Struct("<I").pack
_SMALL = [bytes((i,)) for i in range(128)]
_I64 = 1 << 63


def varint(n: int) -> bytes:
    """Base-128 varint of a non-negative int below 2**64 (a negative int64 as its 10-byte two's complement)."""
    if 0 <= n < 128:
        return _SMALL[n]
    if n < 0:
        n += 1 << 64
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def len_field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: ``tag`` (its key byte(s)), the payload's length, the payload."""
    n = len(payload)
    return tag + (_SMALL[n] if n < 128 else varint(n)) + payload


def any_value(v: object) -> bytes:
    """The ``AnyValue`` message bytes of a str / bool / int (int64) / float.

    Raises:
        NotPlain: any other type, or an int outside int64.
    """
    t = type(v)
    if t is str:
        return len_field(b"\x0a", v.encode())  # type: ignore[union-attr]
    if t is bool:
        return b"\x10\x01" if v else b"\x10\x00"
    if t is int:
        if not -_I64 <= v < _I64:  # type: ignore[operator]
            raise NotPlain("int beyond int64")
        return b"\x18" + varint(v)  # type: ignore[arg-type]
    if t is float:
        return b"\x21" + _pack_d(v)  # type: ignore[arg-type]
    raise NotPlain(t.__name__)


#: attribute keys whose values are per request (unique): formatted each time, never cached (S29-caches29-1:
#: ``prefixgate.decision_id`` of every server span taking this path used to churn the value cache)
PER_REQUEST_KEYS = frozenset({"prefixgate.decision_id", "prefixgate.event_id"})
#: attribute keys whose values the client chooses (a bounded length, an unbounded set): cached apart, so a
#: spread of them evicts only their own entries (``gen_ai.request.model``: 1-256 characters, any of them)
CLIENT_KEYS = frozenset({"gen_ai.request.model"})
_CACHE_MAX = 4096
_KEY_MAX = 256  # attribute keys: names written in code (a dozen in use)
_VALUE_MAX = 4096  # (key, value) of repeating values: ~0.27 KiB an entry, 32-character tenants (1.1 MiB full)
_CLIENT_MAX = 256  # model names: ~0.73 KiB an entry with 256 characters (0.2 MiB full)


@lru_cache(maxsize=_KEY_MAX)
def key_field(key: str) -> bytes:
    """The ``KeyValue.key`` field (tag 1) of an exact ``str`` attribute key, b"" for "" (proto3 leaves the
    default out); cached, least recently used out.

    Raises:
        NotPlain: ``key`` is not a ``str`` (an equal ``str`` subclass may get the cached bytes: the same)."""
    if type(key) is not str:
        raise NotPlain("attribute key")
    return len_field(b"\x0a", key.encode()) if key else b""


def str_key_value(key: str, value: str) -> bytes:
    """The ``KeyValue`` message bytes of an exact ``str`` key and ``str`` value (not cached: the pure function
    the caches below wrap)."""
    return key_field(key) + len_field(b"\x12", len_field(b"\x0a", value.encode()))


_str_kv = lru_cache(maxsize=_VALUE_MAX)(str_key_value)
_client_kv = lru_cache(maxsize=_CLIENT_MAX)(str_key_value)
_BOOL_VALUES = (b"\x12\x02\x10\x00", b"\x12\x02\x10\x01")  # the value field of False, True


#: the cache of a ``str`` value by its key (:data:`PER_REQUEST_KEYS`: none; :data:`CLIENT_KEYS`: their own;
#: any other key: ``_str_kv``)
_VALUE_CACHE_OF = dict.fromkeys(PER_REQUEST_KEYS, str_key_value) | dict.fromkeys(CLIENT_KEYS, _client_kv)


def key_value(key: str, v: object) -> bytes:
    """The ``KeyValue`` message bytes of one attribute (``value`` as :func:`any_value`). The key's field is
    cached per key; a ``str`` value per (key, value) in a least-recently-used cache, those of
    :data:`CLIENT_KEYS` in one of their own, those of :data:`PER_REQUEST_KEYS` never (S29-caches29-1).

    Raises:
        NotPlain: a key that is not an exact ``str``, a value :func:`any_value` refuses.
    """
    t = type(v)
    if t is str:
        return _VALUE_CACHE_OF.get(key, _str_kv)(key, v)  # type: ignore[arg-type]
    if t is bool:
        return key_field(key) + _BOOL_VALUES[v]  # type: ignore[index]
    return key_field(key) + len_field(b"\x12", any_value(v))


def attributes_field(tag: bytes, attrs: dict) -> bytes:
    """The repeated ``KeyValue`` field ``tag`` of an attribute dict, None values left out."""
    return b"".join([len_field(tag, key_value(k, v)) for k, v in attrs.items() if v is not None])


_U32 = 1 << 32


@lru_cache(maxsize=_CACHE_MAX)
def name_field(name: str) -> bytes:
    """The ``Span.name`` field (tag 5) of an exact ``str`` span name, b"" for "" (proto3 leaves the default
    out); cached, least recently used out (one cache for :func:`span_message` and audit/row_spans.py's
    server span, S29-tidy29-3)."""
    return len_field(b"\x2a", name.encode()) if name else b""


def _count(tag: bytes, n: object) -> bytes:
    if n is None or n == 0 and type(n) is int:
        return b""
    if type(n) is not int or not 0 <= n < _U32:  # type: ignore[operator]
        raise NotPlain("count")
    return tag + varint(n)  # type: ignore[arg-type]


def _fixed64(tag: bytes, n: object) -> bytes:
    if n is None or n == 0 and type(n) is int:
        return b""
    if type(n) is not int or not 0 <= n < 1 << 64:  # type: ignore[operator]
        raise NotPlain("time")
    return tag + _pack_q(n)  # type: ignore[arg-type]


def _id(n: object, size: int) -> bytes:
    if type(n) is not int or not 0 <= n < 1 << (8 * size):  # type: ignore[operator]
        raise NotPlain("id")
    return n.to_bytes(size, "big")  # type: ignore[union-attr]


def span_message(trace_id: bytes, span_id: object, tstate: object, parent_id: object, name: object, kind1: int,
                 start: object, end: object, attrs: object, code: int, message: object, links: object,
                 d_attrs: object, d_links: object, flags: int) -> bytes:
    """The ``Span`` message bytes (opentelemetry-proto trace.v1) of one span without events.

    ``trace_id``: 16 bytes; ``span_id`` / ``parent_id``: ints (``parent_id`` None: a root span);
    ``kind1``: the proto ``SpanKind`` (``SpanKind.value + 1``); ``code``: the proto status code,
    ``message`` its text (written only when not None); ``links``: wire links
    ``(trace_id_hi, trace_id_lo, span_id, trace_flags, is_remote, attributes)`` or None;
    ``flags``: the ``flags`` field (context is-remote bits). Times in epoch ns (0 or None: unset).

    Raises:
        NotPlain: a value of another type or range (the caller falls back).
    """
    parts = [b"\x0a\x10", trace_id, b"\x12\x08", _id(span_id, 8)]
    if tstate:
        if type(tstate) is not str:
            raise NotPlain("trace_state")
        parts.append(len_field(b"\x1a", tstate.encode()))
    if parent_id is not None:
        parts.append(b"\x22\x08")
        parts.append(_id(parent_id, 8))
    if name is not None:
        if type(name) is not str:
            raise NotPlain("name")
        parts.append(name_field(name))
    parts.append(b"\x30" + varint(kind1))
    parts.append(_fixed64(b"\x39", start))
    parts.append(_fixed64(b"\x41", end))
    if attrs:
        if type(attrs) is not dict:
            raise NotPlain("attributes")
        parts.append(attributes_field(b"\x4a", attrs))
    parts.append(_count(b"\x50", d_attrs))
    if links:
        for link in links:
            lh, ll, lsid, _lf, lrem, la = link
            if type(lrem) is not bool or la and type(la) is not dict:
                raise NotPlain("link")
            if type(lh) is not int or type(ll) is not int:
                raise NotPlain("link id")
            body = (b"\x0a\x10" + ((lh << 64) | ll).to_bytes(16, "big") + b"\x12\x08" + _id(lsid, 8)
                    + (attributes_field(b"\x22", la) if la else b"") + b"\x35" + _pack_i(0x300 if lrem else 0x100))
            parts.append(len_field(b"\x6a", body))
    parts.append(_count(b"\x70", d_links))
    if message is not None:
        status = len_field(b"\x12", message.encode()) if message else b""  # type: ignore[union-attr]
        parts.append(len_field(b"\x7a", status + (b"\x18" + varint(code) if code else b"")))
    elif code:
        parts.append(b"\x7a\x02\x18" + varint(code))
    else:
        parts.append(b"\x7a\x00")
    parts.append(b"\x85\x01" + _pack_i(flags))
    return b"".join(parts)
