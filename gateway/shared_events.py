"""The body codec of routing stream entries (gateway/shared_routing.py) and the coalescing of
one entry's load deltas (issue 16).

:func:`encode_events` / :func:`decode_events`: the JSON body of one entry
(``["b", replica, [hex key, ...]]``, ``["d", replica, prefill, decode,
running]``, ``["o", pool, replica, prefill, prompt, cached, tenant]``,
``["s", {replica: [prefill, decode, running]}]``); decoding checks every
shape and raises ``ValueError`` for anything else.

:func:`coalesce_deltas` (session 7): a request emits three load deltas
(dispatch, first byte, end), and under load the writer's 10 ms entry holds
many requests whose three deltas cancel out. A reader applies an entry as a
whole, in one go, so what it does with the deltas between two snapshots of
the entry is only their sum per replica: the writer sends that sum (one
delta per replica, none when it is zero) instead of each delta. Snapshots
stay where they were (they replace the sender's load: a delta before one is
not moved after it); chains and concentration observations are untouched.
The one difference a reader can see is the floor at zero of
:class:`routing.shared.RemoteLoadView`, applied to the sum rather than to
each delta: it matters only for a view that missed the sender's earlier
deltas (trimmed from the stream), which its next snapshot corrects anyway.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from gateway.shared_alerts import Observed
from routing.shared import BlocksRecorded, LoadDelta, LoadSnapshot, RoutingEvent

__all__ = ["coalesce_deltas", "decode_events", "encode_events"]

_MAX_ID = 128
_MAX_KEYS = 100_000


def coalesce_deltas(events: Iterable[RoutingEvent | Observed]) -> list[RoutingEvent | Observed]:
    """``events`` (in emission order) with the :class:`LoadDelta` s between two snapshots summed per
    replica: each sum where that replica's first delta of the run was, dropped when all three
    counts are zero; every other event kept, in order (see module doc)."""
    out: list[Any] = []
    sums: dict[str, int] = {}  # replica -> index in out of its summed delta (this run)
    for e in events:
        if e.__class__ is LoadDelta:
            i = sums.get(e.replica_id)
            if i is None:
                sums[e.replica_id] = len(out)
                out.append([e.replica_id, e.prefill_tokens, e.decode_tokens, e.running_requests])
            else:
                d = out[i]
                d[1] += e.prefill_tokens
                d[2] += e.decode_tokens
                d[3] += e.running_requests
            continue
        if e.__class__ is LoadSnapshot:
            sums = {}
        out.append(e)
    return [LoadDelta(*x) if x.__class__ is list else x for x in out
            if x.__class__ is not list or x[1] or x[2] or x[3]]


def encode_events(events: Iterable[RoutingEvent | Observed]) -> bytes:
    """The JSON body of one stream entry (see module doc)."""
    out: list[Any] = []
    for e in events:
        if isinstance(e, BlocksRecorded):
            out.append(["b", e.replica_id, [k.hex() for k in e.keys]])
        elif isinstance(e, LoadDelta):
            out.append(["d", e.replica_id, e.prefill_tokens, e.decode_tokens, e.running_requests])
        elif isinstance(e, Observed):
            out.append(["o", e.pool, e.replica_id, e.prefill_tokens, e.prompt_tokens, e.cached_tokens, e.tenant_id])
        else:
            out.append(["s", {rid: list(v) for rid, v in e.loads.items()}])
    return orjson.dumps(out)


def _rid(v: Any) -> str:
    if not isinstance(v, str) or not 0 < len(v) <= _MAX_ID:
        raise ValueError("replica id")
    return v


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or abs(v) > 2**53:
        raise ValueError("count")
    return v


def decode_events(body: bytes) -> list[RoutingEvent | Observed]:
    """Parse a body of :func:`encode_events`; raises ``ValueError`` for any other shape."""
    try:
        raw = orjson.loads(body)
    except orjson.JSONDecodeError as exc:  # a ValueError subclass; named for the reader
        raise ValueError("body") from exc
    if not isinstance(raw, list):
        raise ValueError("body")
    out: list[RoutingEvent | Observed] = []
    for item in raw:
        if not isinstance(item, list) or not item:
            raise ValueError("event")
        kind = item[0]
        if kind == "b" and len(item) == 3 and isinstance(item[2], list) and len(item[2]) <= _MAX_KEYS:
            try:
                keys = tuple(bytes.fromhex(k) for k in item[2])
            except TypeError:  # a key that is not a string (R9-S1): a bad shape, not a crash of the reader
                raise ValueError("chain") from None
            out.append(BlocksRecorded(_rid(item[1]), keys))
        elif kind == "d" and len(item) == 5:
            out.append(LoadDelta(_rid(item[1]), _int(item[2]), _int(item[3]), _int(item[4])))
        elif kind == "o" and len(item) in (6, 7):  # 6: before R3-14 (no tenant id)
            tenant = _rid(item[6]) if len(item) == 7 and item[6] is not None else None
            out.append(Observed(_rid(item[1]), _rid(item[2]), _int(item[3]), _int(item[4]), _int(item[5]), tenant))
        elif kind == "s" and len(item) == 2 and isinstance(item[1], dict):
            loads = {}
            for rid, v in item[1].items():
                if not isinstance(v, list) or len(v) != 3:
                    raise ValueError("snapshot")
                loads[_rid(rid)] = (_int(v[0]), _int(v[1]), _int(v[2]))
            out.append(LoadSnapshot(loads))
        else:
            raise ValueError("event kind")
    return out
