"""Routing state over a Redis Stream (issue 16, ``state.backend: redis``).

Every instance appends what its router did (:mod:`routing.shared` events:
chains recorded, load deltas at dispatch / first byte / end, a load snapshot
every lease tick) to one stream and applies the other instances' entries to
its own prefix index and load view. The router stays synchronous and never waits
on Redis: a plain callback queues events, one task writes them, another reads.

**Stream** ``P routing:events`` (``P`` = ``state.key_prefix``): one entry per
batch of events (up to ``batch_events``), fields ``i`` (instance id), ``n`` (stamp
``"<seq>:<ms>"``), ``b`` (JSON body, :mod:`gateway.shared_events`) and ``m`` (hex
HMAC-SHA256, subkey ``pg-shared-routing-mac-v1``, over the prefix, id, stamp and
body). Entries with a bad MAC or shape, replayed or older than the stream's
retention window (session 13, R13-2: :mod:`gateway.shared_replay`) are ignored
and counted; an instance's own are skipped. Trimmed with ``XADD MAXLEN ~``
(``state.stream_max_entries``, at most ``stream_max_bytes // stream_entry_max_bytes``).

**Bounds** (session 13, R13-1; :mod:`gateway.shared_bounds`): entries of at most
``state.stream_entry_max_bytes``, about ``state.stream_max_bytes`` in the stream,
about 1 MiB per ``XREAD``; the reader yields to the loop between two entries. A
failed rebuild at start (a reply timeout included) does not stop the instance:
the reader task catches up in the background (:meth:`RoutingStream.start`).

**Cadence** (session 6): at most one ``XADD`` per ``write_interval_s``, and
``read_interval_s`` between two ``XREAD`` s that found entries: under load each
carries many requests' events (a round trip costs ~60-100 µs of CPU); an idle
instance sends its first event at once and its ``XREAD BLOCK`` (``read_block_ms``,
under the reply timeout) returns at the first entry. An entry naming this
instance is skipped before its MAC is computed. Session 7: an entry's load
deltas leave summed per replica between snapshots
(:func:`gateway.shared_events.coalesce_deltas`, which also holds the body codec).

**Rebuild**: a starting instance reads the stream from its first entry (oldest
first: every chain still there, the latest snapshots); a reconnecting one goes
on after the last entry it applied.

**Lease**: every ``lease_ttl_s / 4`` an instance sets ``P routing:alive:<id>``
(expiring after ``lease_ttl_s / 2``) and publishes its load snapshot; the others
drop the load of instances whose key expired (gone from every view within ``lease_ttl_s``).

**Lag**: ``prefixgate_shared_routing_lag_seconds``, the age of the last applied
entry on the Redis server's clock (offset to ``TIME`` re-measured every tick).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from gateway.shared_alerts import Observed
from gateway.shared_bounds import ReadSizer, split_bodies, stream_max_len
from gateway.shared_events import coalesce_deltas, decode_events, encode_events
from gateway.shared_replay import ReplayGuard, entry_mac, parse_stamp, stamp

from routing.index import PrefixIndex
from routing.shared import RemoteLoadView, RoutingEvent, SharedLoadTracker, apply_event
from tenancy.shared_conn import HeldConnection
from tenancy.shared_store import cancel_task, mac_matches, record_text

__all__ = ["ROUTING_MAC_INFO", "RoutingStream", "decode_events", "encode_events", "new_instance_id"]

log = logging.getLogger("prefixgate.state")

#: entries one batched ``XREAD`` takes (session 8: it rides a script batch; see RoutingStream.read_once)
_BATCHED_READ_ENTRIES = 16

#: HKDF ``info`` label of the subkey that MACs routing stream entries.
ROUTING_MAC_INFO = b"pg-shared-routing-mac-v1"


def new_instance_id() -> str:
    """A fresh random instance id (16 hex characters), one per gateway process start."""
    return secrets.token_hex(8)


class _Metrics:
    def __init__(self, registry: CollectorRegistry | None) -> None:
        reg = registry if registry is not None else CollectorRegistry()
        self.events = Counter("prefixgate_shared_routing_events",
                              "Routing events: published, applied (others'), dropped (queue full or write failed)",
                              ["result"], registry=reg)
        self.rejected = Counter("prefixgate_shared_routing_rejected_entries",
                                "Routing stream entries ignored: bad MAC/shape, replayed, too old", registry=reg)
        self.lag = Gauge("prefixgate_shared_routing_lag_seconds",
                         "Age of the last applied routing stream entry (Redis server clock)", registry=reg)
        self.instances = Gauge("prefixgate_shared_routing_instances",
                               "Other instances whose load is in this instance's view", registry=reg)


class RoutingStream:
    """Publish this instance's routing events and apply the others' (see module doc).

    ``client``: :class:`redis.asyncio.Redis`; ``key_prefix``: ``state.key_prefix``;
    ``instance_id``: this process's id; ``mac_key``: 32-byte subkey
    (HKDF of the master secret, :data:`ROUTING_MAC_INFO`), or a callable giving
    the subkeys accepted now, the one to MAC with first (they follow a master
    rotation: :meth:`tenancy.keys.KeyRing.mac_subkeys`); ``index``: the
    inner (non-emitting) prefix index; ``loads``: the router's
    :class:`SharedLoadTracker` (its ``remote`` view is fed here);
    ``replica_ids``: replicas whose local load is published;
    ``lease_ttl_s``: ``state.lease_ttl_s``; ``max_entries``: stream trim
    length, at most ``max_bytes // entry_max_bytes`` (``max_bytes``: the
    stream's byte budget; ``entry_max_bytes``: the largest entry body, module
    doc "Bounds"); ``queue_max``: events queued before new ones are dropped
    (counted); ``registry``: where the metrics are registered;
    ``write_interval_s`` / ``read_interval_s``: the least time between two
    ``XADD`` / two ``XREAD`` that found entries (seconds, >= 0; module doc,
    "Cadence"); ``read_block_ms``: how long an idle ``XREAD`` blocks (keep it
    under the client's reply timeout; default ``lease_ttl_s / 4``); ``replay_max_age_s``: entries
    older than this are refused (default: the retention window, :mod:`gateway.shared_replay`).
    :meth:`emit` is the callback to give the routing wrappers.
    """

    def __init__(self, client: Any, key_prefix: str, instance_id: str,
                 mac_key: bytes | Callable[[], Sequence[bytes]], index: PrefixIndex,
                 loads: SharedLoadTracker, replica_ids: Iterable[str], *, lease_ttl_s: float,
                 max_entries: int = 10_000, batch_events: int = 256, queue_max: int = 100_000,
                 max_bytes: int = 64 << 20, entry_max_bytes: int = 65_536,
                 registry: CollectorRegistry | None = None, write_interval_s: float = 0.01,
                 read_interval_s: float = 0.01, read_block_ms: int | None = None, batcher: Any = None,
                 replay_max_age_s: float | None = None) -> None:
        if write_interval_s < 0 or read_interval_s < 0:
            raise ValueError("write_interval_s and read_interval_s must be >= 0")
        self._client = client
        # XADD and XREAD (the hot ones) each on a connection of their own, packed without redis-py's
        # per-call machinery (tenancy/shared_conn.py); the lease's commands go through the client
        self._wconn, self._rconn = HeldConnection(client), HeldConnection(client)
        # session 8: with the limits' script batcher, XADD and the XREADs of a busy reader ride its
        # batches (no round trip of their own under load); the idle XREAD BLOCK stays on _rconn
        self._batcher = batcher
        self._prefix = key_prefix
        self.instance_id = instance_id
        self._mac_keys: Callable[[], Sequence[bytes]] = mac_key if callable(mac_key) else (lambda: (mac_key,))
        self._index = index
        self._loads = loads
        self.remote: RemoteLoadView = loads.remote
        self._replicas = list(replica_ids)
        self._ttl = float(lease_ttl_s)
        self._entry_max = int(entry_max_bytes)
        self._max_entries = stream_max_len(max_entries, int(max_bytes), self._entry_max)
        self._batch = batch_events
        self._sizer = ReadSizer(self._entry_max, batch_events)  # entries one XREAD takes (R13-1)
        self._seq = 0  # R13-2: this writer's last entry number; the others' highest applied, and an age bound
        self._guard = ReplayGuard(replay_max_age_s or (self._max_entries + 128) * self._ttl / 4)
        self._write_interval = float(write_interval_s)
        self._read_interval = float(read_interval_s)
        self._block_ms = max(1, int(read_block_ms)) if read_block_ms is not None else max(100, int(lease_ttl_s * 250))
        self._queue: deque[RoutingEvent | Observed] = deque()
        #: receives other instances' concentration observations (None: they are ignored)
        self.on_observed: Callable[[Observed], None] | None = None
        self._queue_max = queue_max
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.last_id = b"0-0"
        self._last_count = self._sizer.count
        self._clock_offset_s = 0.0
        self.metrics = _Metrics(registry)
        self.rejected = 0
        self.applied = 0
        #: ``XADD`` calls made and ``XREAD`` calls that returned entries (entries per call = batching)
        self.writes = 0
        self.reads = 0

    @property
    def stream(self) -> str:
        """The stream key."""
        return f"{self._prefix}routing:events"

    def _alive_key(self, instance_id: str) -> str:
        return f"{self._prefix}routing:alive:{instance_id}"

    def _mac(self, instance_id: str, entry_stamp: str, body: bytes, key: bytes | None = None) -> str:
        return entry_mac(key if key is not None else self._mac_keys()[0], self._prefix, instance_id, entry_stamp, body)

    # -- publishing --------------------------------------------------------
    def emit(self, event: RoutingEvent | Observed) -> None:
        """Queue one event of this instance (synchronous, never blocks; dropped and counted when full)."""
        if len(self._queue) >= self._queue_max:
            self.metrics.events.labels("dropped").inc()
            return
        self._queue.append(event)
        self._wake.set()

    async def flush(self) -> None:
        """Write every queued event now (tests and shutdown)."""
        while self._queue:
            await self._write_batch()

    async def _write_batch(self) -> None:
        batch = [self._queue.popleft() for _ in range(min(self._batch, len(self._queue)))]
        if not batch:
            return
        try:
            for body in split_bodies(coalesce_deltas(batch), self._entry_max):  # R13-1: bounded entries
                self._seq += 1  # R13-2: one number per entry, pieces of a split batch in their order
                st = stamp(self._seq, int(time.time() * 1000))
                cmd = ("XADD", self.stream, "MAXLEN", "~", self._max_entries, "*", "i", self.instance_id,
                       "n", st, "b", body, "m", self._mac(self.instance_id, st, body))
                await (self._wconn.command(*cmd) if self._batcher is None else self._batcher.command(*cmd))
                self.writes += 1
            self.metrics.events.labels("published").inc(len(batch))
        except Exception as exc:  # noqa: BLE001 - Redis down: the next snapshot heals the others' view
            self.metrics.events.labels("dropped").inc(len(batch))
            log.warning("routing stream write failed (%s); %d events dropped", exc.__class__.__name__, len(batch))
            await asyncio.sleep(min(1.0, self._ttl / 4))

    async def _writer(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            full = len(self._queue) >= self._batch
            await self._write_batch()
            if self._queue:  # emitted while that entry was written, or more than one entry's worth
                self._wake.set()
            if self._write_interval and not full:  # what is emitted meanwhile leaves together, in one entry
                await asyncio.sleep(self._write_interval)

    # -- reading -----------------------------------------------------------
    def apply_entry(self, fields: dict[Any, Any]) -> int:
        """Apply one stream entry's events (skipping this instance's own); returns events applied.
        An entry with a bad MAC or shape, replayed or too old is ignored, counted and logged."""
        def text(k: str) -> Any:
            v = fields.get(k.encode(), fields.get(k))
            return record_text(v) if isinstance(v, bytes) and k != "b" else v  # not UTF-8: fails (S21-fixutf8-1)
        inst, st, body, mac = text("i"), text("n"), text("b"), text("m")
        if isinstance(body, str):
            body = body.encode()
        if inst == self.instance_id:  # ours (or claims to be): nothing of it is applied, MAC'd or not
            return 0
        try:
            if not (isinstance(inst, str) and isinstance(st, str) and isinstance(body, bytes)
                    and isinstance(mac, str)):
                raise ValueError("fields")
            if not any(mac_matches(mac, self._mac(inst, st, body, k)) for k in self._mac_keys()):  # S21-fixutf8-2
                raise ValueError("mac")
            seq, sent_ms = parse_stamp(st)
            refusal = self._guard.refusal(inst, seq, sent_ms, time.time())
            if refusal is not None:
                raise ValueError(refusal)
            events = decode_events(body)
            self._guard.applied(inst, seq, sent_ms)
        except ValueError as exc:
            self.rejected += 1
            self.metrics.rejected.inc()
            log.warning("shared state: ignored an unauthenticated or malformed routing entry (%s)", exc)
            return 0
        for e in events:
            if isinstance(e, Observed):
                if self.on_observed is not None:
                    self.on_observed(e)
            else:
                apply_event(self._index, self.remote, inst, e)
        self.applied += len(events)
        self.metrics.events.labels("applied").inc(len(events))
        return len(events)

    async def read_once(self, block_ms: int | None = None, *, batched: bool = False) -> int:
        """Read and apply one batch after :attr:`last_id`; returns entries read. ``batched`` (no
        ``block_ms``): the ``XREAD`` rides the script batcher's next batch, when there is one."""
        block = () if block_ms is None else ("BLOCK", block_ms)
        batched = batched and block_ms is None and self._batcher is not None
        # a batched read takes few entries: its reply comes before the script replies batched after
        # it, and all of them must arrive within one reply timeout (a full read is followed by another)
        count = min(self._sizer.count, _BATCHED_READ_ENTRIES) if batched else self._sizer.count
        self._last_count = count
        cmd = ("XREAD", "COUNT", count, *block, "STREAMS", self.stream, self.last_id)
        if batched:
            resp = await self._batcher.command(*cmd)
        else:
            resp = await self._rconn.command(*cmd)
        n = size = 0
        for _stream, entries in (resp.items() if isinstance(resp, dict) else resp or []):
            for entry_id, raw in entries:
                if n:  # R13-1: one entry's apply per loop turn (a long read does not hold the loop)
                    await asyncio.sleep(0)
                fields = raw if isinstance(raw, dict) else dict(zip(raw[::2], raw[1::2], strict=True))
                body = fields.get(b"b", fields.get("b"))
                size += len(body) if isinstance(body, (bytes, str)) else 0
                self.apply_entry(fields)
                self.last_id = entry_id
                n += 1
        self._sizer.observed(count, n, size)
        if n:
            self.reads += 1
            ms = int(self.last_id.split(b"-")[0] if isinstance(self.last_id, bytes) else self.last_id.split("-")[0])
            self.metrics.lag.set(max(0.0, time.time() + self._clock_offset_s - ms / 1000))
        return n

    async def rebuild(self) -> int:
        """Apply every entry still in the stream (start-up); returns entries read; Redis errors raised."""
        total = 0
        while True:
            n = await self.read_once(None)
            total += n
            if n < self._last_count:
                return total

    async def _reader(self) -> None:
        busy = False  # the last read found entries: the next one (no BLOCK) can ride a script batch
        while True:
            try:
                if busy and self._batcher is not None:
                    n = await self.read_once(None, batched=True)
                else:
                    n = await self.read_once(block_ms=self._block_ms)
                full = n >= self._last_count  # as many as asked: more are waiting
                busy = n > 0
                if n and not full and self._read_interval:  # let entries gather (module doc)
                    await asyncio.sleep(self._read_interval)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - Redis down: keep the local view, retry
                busy = False
                self._sizer.failed()
                log.warning("routing stream read failed (%s)", exc.__class__.__name__)
                await asyncio.sleep(min(1.0, self._ttl / 4))

    # -- lease ---------------------------------------------------------------
    async def tick(self) -> None:
        """Renew this instance's lease, publish its load snapshot, drop expired instances' load."""
        await self._client.set(self._alive_key(self.instance_id), "1", px=max(1, int(self._ttl * 500)))
        self.emit(self._loads.local_snapshot(self._replicas))
        sec, usec = await self._client.time()
        self._clock_offset_s = sec + usec / 1e6 - time.time()
        known = sorted(self.remote.instances())
        if known:
            alive = await self._client.mget([self._alive_key(i) for i in known])
            gone = self.remote.retain(i for i, v in zip(known, alive) if v is not None)
            if gone:
                log.info("shared routing: dropped the load of %d expired instance(s)", len(gone))
        self.metrics.instances.set(len(self.remote.instances()))
        self._guard.prune(time.time())

    async def _leaser(self) -> None:
        last_ok = time.monotonic()
        while True:
            try:
                await self.tick()
                last_ok = time.monotonic()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001
                log.warning("routing lease renewal failed (%s)", exc.__class__.__name__)
                if time.monotonic() - last_ok > self._ttl and self.remote.instances():
                    # nobody's lease can be checked: keep no load that may belong to a dead instance
                    self.remote.retain(())
                    log.warning("shared routing: Redis unreachable for over lease_ttl_s; routing on local load")
            await asyncio.sleep(self._ttl / 4)

    # -- lifecycle -----------------------------------------------------------
    async def start(self) -> None:
        """Rebuild from the stream, renew the lease once, then run the writer, reader and lease tasks.

        A rebuild or renewal that fails for want of an answer from Redis (a reply timeout included)
        is logged and left to the tasks, which go on after the last entry applied (R13-1)."""
        from tenancy.shared_failover import unavailable_errors

        try:
            await self.rebuild()
        except unavailable_errors() as exc:
            self._sizer.failed()
            log.warning("routing stream rebuild at start failed (%s); catching up in the background",
                        exc.__class__.__name__)
        try:
            await self.tick()
        except unavailable_errors() as exc:
            log.warning("routing lease renewal at start failed (%s); retried by the lease task",
                        exc.__class__.__name__)
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._writer(), name="prefixgate-routing-writer"),
                       loop.create_task(self._reader(), name="prefixgate-routing-reader"),
                       loop.create_task(self._leaser(), name="prefixgate-routing-lease")]

    async def halt(self) -> None:
        """Stop the tasks without flushing or giving up the lease: what a crash (SIGKILL) leaves behind."""
        await self._cancel()

    async def _cancel(self) -> None:
        for t in self._tasks:
            await cancel_task(t)
        self._tasks = []

    async def stop(self) -> None:
        """Flush queued events (best effort), stop the tasks and give up the lease."""
        await self._cancel()
        self._batcher = None  # the last entries on our own connection: the limits may be closed first
        with contextlib.suppress(Exception):
            await self.flush()
            await self._client.delete(self._alive_key(self.instance_id))
        for c in (self._wconn, self._rconn):
            await c.aclose()
