"""What one routing stream entry, the whole stream and one read may cost (issue 16, R13-1).

The routing stream (:mod:`gateway.shared_routing`) carries tenant-driven
payloads: every routed request adds its prefix chain (32 hex characters per
16-token block, up to ``routing.index_capacity_blocks`` blocks), and one
entry batches up to 256 events. Session 13 bounds what that costs in bytes,
not in entries:

* :func:`split_bodies`: the encoded body of one entry is at most
  ``state.stream_entry_max_bytes``; a batch whose body is larger leaves in
  several entries, and a chain larger than one entry leaves in pieces, its
  deepest piece first, so that applying the pieces in stream order gives the
  same index (same keys, same LRU order: :meth:`routing.index.InProcessPrefixIndex.record`
  touches a chain deepest-first) as applying the whole chain. A load
  snapshot or an observation is never split (a few dozen bytes per replica).
* :func:`stream_max_len`: the ``XADD MAXLEN ~`` length is
  ``min(state.stream_max_entries, state.stream_max_bytes // state.stream_entry_max_bytes)``
  (at least 16), so the stream holds about ``stream_max_bytes`` of bodies at
  most (plus Redis's approximate-trim slack, up to one radix node: 100
  entries by default).
* :func:`read_count`: one ``XREAD`` takes at most ``READ_REPLY_BYTES //
  stream_entry_max_bytes`` entries (at least 1), so one reply carries about
  1 MiB of bodies at most, far within ``state.command_timeout_s`` on any link
  Redis is usable over (a 256-entry read of 280 kB entries was 72 MB).

Pure functions: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.shared_alerts import Observed
from gateway.shared_events import encode_events
from routing.shared import BlocksRecorded, RoutingEvent

__all__ = ["READ_REPLY_BYTES", "ReadSizer", "read_count", "split_bodies", "stream_max_len"]

#: bodies one ``XREAD`` reply may carry, in bytes (entries per read = this // the entry cap)
READ_REPLY_BYTES = 1 << 20

#: the least ``MAXLEN`` the byte budget may leave (a few entries of history for a reader behind)
_MIN_LEN = 16


def stream_max_len(max_entries: int, max_bytes: int, entry_max_bytes: int) -> int:
    """The stream's ``MAXLEN ~`` in entries: ``max_entries`` or what ``max_bytes`` holds of entries
    of ``entry_max_bytes``, whichever is smaller, at least 16. Arguments are positive ints."""
    return max(_MIN_LEN, min(max_entries, max_bytes // max(1, entry_max_bytes)))


def read_count(entry_max_bytes: int, batch_events: int) -> int:
    """Entries one ``XREAD`` takes: ``READ_REPLY_BYTES // entry_max_bytes``, at most ``batch_events``
    (the old fixed count), at least 1."""
    return max(1, min(batch_events, READ_REPLY_BYTES // max(1, entry_max_bytes)))


class ReadSizer:
    """How many entries the next ``XREAD`` takes: :func:`read_count` at most; halved (down to 1) after
    a reply whose bodies exceeded :data:`READ_REPLY_BYTES` (entries over the cap, written by an older
    version) or a failed read (a reply timeout may be a too large reply); doubled back after a full
    reply of under a quarter of it. Not thread-safe (one reader task)."""

    def __init__(self, entry_max_bytes: int, batch_events: int) -> None:
        self.max = self.count = read_count(entry_max_bytes, batch_events)

    def observed(self, asked: int, got: int, body_bytes: int) -> None:
        """A read of ``asked`` entries returned ``got`` entries of ``body_bytes`` bytes of bodies."""
        if body_bytes > READ_REPLY_BYTES:
            self.count = max(1, asked // 2)
        elif got >= asked and body_bytes * 4 < READ_REPLY_BYTES:
            self.count = min(self.max, max(self.count, asked * 2))

    def failed(self) -> None:
        """A read failed (no answer, a reply timeout, a dropped connection)."""
        self.count = max(1, self.count // 2)


def _item(event: RoutingEvent | Observed) -> bytes:
    return encode_events((event,))[1:-1]  # one JSON array element, as it appears in a body


def _chain_bytes(event: RoutingEvent | Observed) -> int:
    """About the encoded size of ``event``'s chain (0 for other events; keys of one length)."""
    if event.__class__ is not BlocksRecorded:
        return 0
    keys = event.keys  # type: ignore[union-attr]
    return len(keys) * (2 * len(keys[0]) + 3) if keys else 0


def _items(event: RoutingEvent | Observed, max_bytes: int) -> list[bytes]:
    """``event`` as body items; a chain over ``max_bytes - 2`` bytes in pieces, deepest first (each
    key encoded once)."""
    if not isinstance(event, BlocksRecorded):  # never split (module doc)
        return [_item(event)]
    if _chain_bytes(event) + 300 <= max_bytes:  # 300: "b", a replica id of <= 128 characters, brackets
        item = _item(event)
        if len(item) + 2 <= max_bytes:
            return [item]
    head = len(_item(BlocksRecorded(event.replica_id, ())))
    per_key = 2 * max((len(k) for k in event.keys), default=16) + 3  # "hex",
    n = max(1, (max_bytes - 2 - head) // per_key)
    keys = event.keys
    return [_item(BlocksRecorded(event.replica_id, keys[s:s + n])) for s in reversed(range(0, len(keys), n))]


def split_bodies(events: Sequence[RoutingEvent | Observed], max_bytes: int) -> list[bytes]:
    """``events`` (one batch, in order) as entry bodies of at most ``max_bytes`` each (see module doc).

    Concatenated in order, the bodies decode to ``events`` except that a chain larger than one body
    is cut into consecutive pieces listed deepest first. An event other than a chain that alone is
    larger than ``max_bytes`` (a snapshot of thousands of replicas) gets a body of its own, over the
    bound. Returns ``[]`` for no events; ``max_bytes`` >= 64."""
    if not events:
        return []
    if sum(_chain_bytes(e) for e in events) < max_bytes:  # the common case: one body, encoded once
        body = encode_events(events)
        if len(body) <= max_bytes:
            return [body]
    out: list[bytes] = []
    cur: list[bytes] = []
    size = 2  # the brackets
    for e in events:
        for it in _items(e, max_bytes):
            if cur and size + 1 + len(it) > max_bytes:
                out.append(b"[" + b",".join(cur) + b"]")
                cur, size = [], 2
            size += len(it) + (1 if cur else 0)
            cur.append(it)
    if cur:
        out.append(b"[" + b",".join(cur) + b"]")
    return out
