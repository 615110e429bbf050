"""What one tenant's answers may cost the gateway beyond the request's preparation (session 11).

Three bounds, each closing a residual of review R10b (docs/security.md):

* :class:`ParseTurns` (R10b-2): a plain answer of ``limits.answer_cpu_meter_bytes`` or more is
  parsed on the event loop (:func:`gateway.json_fast.loads_answer`; orjson holds the GIL for the whole
  parse, so a thread does not free the loop: measured, docs/security.md). Such parses take turns, one
  per two loop steps: the loop polls its sockets and runs the tasks they woke between two of them,
  so a burst of large answers (one tenant's or several) stalls other requests for about one parse at
  a time, and each answer's
  tenant is re-checked for CPU debt once its turn comes (a burst stops at the bucket's end instead of
  being parsed in one loop step). ``limits.max_answer_bytes`` (read in gateway/pipeline_answer.py)
  bounds one parse.
* :class:`StreamCharge` (R10b-4): a streamed answer's events are parsed as they arrive
  (:class:`gateway.sse.SseScanner`); with 20 ``top_logprobs`` per token ~3x the CPU of a plain
  stream, charged to nobody. Reads of :data:`STREAM_METER_BYTES` or more are sampled under the
  thread-CPU clock (the first, then one in :data:`STREAM_SAMPLE_EVERY`), and the estimated CPU of
  all of them (sampled CPU per byte x their bytes) above ``limits.prep_cpu_free_ms`` +
  ``answer_cpu_free_us_per_token`` x the stream's output tokens is charged to the tenant's CPU budget
  while the stream runs: its next requests answer 429 ``cpu_budget_exhausted`` while it is in debt.
* :func:`metered_rewrite` (session 13, R12b-7): a plain answer written again without
  ``cached_tokens`` (:func:`gateway.usage_privacy.plain_without_cached`; when the usage object cannot be
  located, the whole answer, up to ``limits.max_answer_bytes``) is answer work like its parse: for an
  answer of ``limits.answer_cpu_meter_bytes`` or more it runs under the thread-CPU clock and all of its
  CPU is charged to the tenant (the parse's free allowance was already given to the parse).
* :class:`UnsentAnswers` (R10b-5): a plain answer is handed whole to the server, which buffers what
  the client does not read (until R9b-3's no-progress close); the request's concurrency slot was
  given back already. Per tenant, the bytes still buffered for its answers of
  :data:`UNSENT_MIN_BYTES` or more are summed (``get_write_buffer_size`` of their connections); above
  ``limits.max_unsent_answer_bytes_per_tenant`` the tenant's new requests answer 429
  ``unsent_answers_limited`` right after authentication.

Event-loop thread only (no locks).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from gateway.admission import too_many
from gateway.client_io import LOSS_KEY

if TYPE_CHECKING:
    from gateway.cpu_budget import CpuMeter
    from tenancy.registry import Tenant

__all__ = ["ParseTurns", "StreamCharge", "UnsentAnswers", "STREAM_METER_BYTES", "STREAM_SAMPLE_EVERY",
           "UNSENT_MIN_BYTES", "metered_rewrite"]

_T = TypeVar("_T")

#: a stream read of at least this many bytes is metered (an event with 20 ``top_logprobs`` is ~1.4 kB;
#: one token without alternatives ~0.2 kB: such streams cost ~2.7 us per token, within the free allowance)
STREAM_METER_BYTES = 1024
#: of the metered reads, the first and then one in this many are measured (2 clock reads each)
STREAM_SAMPLE_EVERY = 8
#: plain answers smaller than this are not tracked by :class:`UnsentAnswers` (they fit the kernel's buffers)
UNSENT_MIN_BYTES = 64 << 10


def metered_rewrite(meter: CpuMeter, size: int, work: Callable[..., _T], *args: Any) -> _T:
    """``work(*args)``: rewriting a plain answer of ``size`` bytes (R12b-7); raises what ``work`` raises.

    Below ``limits.answer_cpu_meter_bytes`` (or without a budget) it runs unmeasured, as the answer's
    parse does (:meth:`gateway.cpu_budget.CpuMeter.check_answer`); at or above, its thread CPU is
    charged to ``meter``'s tenant in full, whether ``work`` returns or raises."""
    budget = meter.budget
    if budget is None or size < budget.answer_meter_bytes or meter.tenant is None:
        return work(*args)
    c0 = budget.cpu_clock()
    try:
        return work(*args)
    finally:
        budget.charge(meter.tenant, budget.cpu_clock() - c0)


class ParseTurns:
    """Large answer parses take turns, one per :attr:`STEPS` event-loop steps (R10b-2).

    :meth:`take` returns at once when no parse had the turn in this loop step, else waits (FIFO) until
    the turn is handed on; :meth:`give_back` (exactly once after a successful :meth:`take`) hands it on
    :attr:`STEPS` loop steps later, after the loop polled its sockets and ran what that woke. A task cancelled while waiting gives the
    turn on if it had been handed to it. One per gateway (its event loop).
    """

    __slots__ = ("_busy", "_waiters")

    #: loop steps between one large parse's end and the next one's start (at least 1): 2, so that a task
    #: woken by the I/O polled right after a parse (its wakeup runs one step after the I/O callback)
    #: runs before the next parse (measured: the worst loop gap of a burst halves against 1 step)
    STEPS = 2

    def __init__(self) -> None:
        self._busy = False
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def busy(self) -> bool:
        """True while a parse has the turn (or gave it back less than one loop step ago)."""
        return self._busy

    async def take(self) -> None:
        """Wait for the turn (no wait when it is free)."""
        if not self._busy:
            self._busy = True
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        except BaseException:
            if fut.done() and not fut.cancelled():  # handed the turn, then cancelled: pass it on
                self.give_back()
            raise

    def give_back(self) -> None:
        """Hand the turn on :attr:`STEPS` loop steps later."""
        asyncio.get_running_loop().call_soon(self._next, self.STEPS - 1)

    def _next(self, steps: int = 0) -> None:
        if steps > 0:
            asyncio.get_running_loop().call_soon(self._next, steps - 1)
            return
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return
        self._busy = False


class StreamCharge:
    """The sampled parse CPU of one streamed answer, charged to its tenant (R10b-4).

    ``meter``: the request's :class:`gateway.cpu_budget.CpuMeter` (no budget: :meth:`feed` only feeds).
    :meth:`feed` ``(feed, chunk, tokens)`` returns ``feed(chunk)`` (the scanner's output), measuring it
    when sampled, and charges what the estimate owes beyond the allowance for ``tokens`` output tokens
    so far; :meth:`settle` does the last charge when the stream ends. ``charged_s``: CPU seconds charged.
    """

    __slots__ = ("meter", "reads", "bytes", "sampled_bytes", "sampled_cpu", "charged_s")

    def __init__(self, meter: CpuMeter) -> None:
        self.meter = meter
        self.reads = 0
        self.bytes = 0
        self.sampled_bytes = 0
        self.sampled_cpu = 0.0
        self.charged_s = 0.0

    def feed(self, feed: Callable[[bytes], bytes], chunk: bytes, tokens: int) -> bytes:
        """``feed(chunk)`` (a read of :data:`STREAM_METER_BYTES` or more), sampled; raises what it raises."""
        budget = self.meter.budget
        if budget is None:
            return feed(chunk)
        self.reads += 1
        self.bytes += len(chunk)
        if self.reads % STREAM_SAMPLE_EVERY != 1 and STREAM_SAMPLE_EVERY > 1:
            return feed(chunk)
        c0 = budget.cpu_clock()
        try:
            return feed(chunk)
        finally:
            self.sampled_cpu += budget.cpu_clock() - c0
            self.sampled_bytes += len(chunk)
            self.settle(tokens)

    def estimate_s(self) -> float:
        """Estimated CPU seconds of the metered reads so far (sampled CPU per byte x their bytes)."""
        if not self.sampled_bytes:
            return 0.0
        return self.sampled_cpu * self.bytes / self.sampled_bytes

    def settle(self, tokens: int) -> None:
        """Charge the estimate's part above ``prep_cpu_free_ms`` + ``answer_cpu_free_us_per_token`` x
        ``tokens`` not charged yet."""
        meter = self.meter
        budget = meter.budget
        if budget is None or meter.tenant is None:
            return
        owed = self.estimate_s() - budget.free_s - budget.answer_free_s_per_token * max(0, tokens) - self.charged_s
        if owed > 0:
            self.charged_s += owed
            budget.charge(meter.tenant, owed)


class UnsentAnswers:
    """Per tenant, the bytes of its plain answers the server still buffers for clients that do not read (R10b-5).

    ``limit``: ``limits.max_unsent_answer_bytes_per_tenant`` (None: no bound, nothing tracked).
    :meth:`note` (after an answer of :data:`UNSENT_MIN_BYTES` or more was handed to the server) tracks
    its connection when bytes remain unsent; :meth:`check` (after authentication) raises 429
    ``unsent_answers_limited`` while the tenant's tracked connections hold more than ``limit`` unsent
    bytes. A connection's unsent bytes are read from its transport (``get_write_buffer_size``, through
    the guarded listener's :class:`gateway.client_io.ConnectionLoss` ``unsent``); it is forgotten once
    drained or lost. The kernel's socket buffer (``server.client_send_buffer_bytes``) comes on top.
    """

    __slots__ = ("limit", "_held", "_owner")

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        #: tenant id -> {connection's ConnectionLoss: (its unsent-bytes reader, its loss callback)}
        self._held: dict[str, dict[Any, tuple[Callable[[], int], Callable[[], None]]]] = {}
        #: connection's ConnectionLoss -> the tenant whose answer it carries last (review R11b-1: a
        #: connection a front proxy reuses for several tenants counts for the last one only)
        self._owner: dict[Any, str] = {}

    def note(self, tenant_id: str, scope: Any) -> None:
        """The answer of ``tenant_id`` to the request of ``scope`` was handed to the server."""
        if self.limit is None:
            return
        loss = scope.get(LOSS_KEY)
        unsent = getattr(loss, "unsent", None)
        try:
            if unsent is None or loss.lost or unsent() <= 0:
                return
        except (AttributeError, RuntimeError):  # a closed transport: nothing buffered to bound
            return
        prev = self._owner.get(loss)
        if prev is not None and prev != tenant_id:  # HTTP/1.1: the buffer now holds this tenant's answer
            self._release(prev, loss)
        conns = self._held.setdefault(tenant_id, {})
        if loss not in conns:
            def forget() -> None:
                self._forget(tenant_id, loss)
            conns[loss] = (unsent, forget)
            self._owner[loss] = tenant_id
            loss.add(forget)

    def _release(self, tenant_id: str, loss: Any) -> None:
        conns = self._held.get(tenant_id)
        entry = conns.pop(loss, None) if conns is not None else None
        if entry is not None:
            loss.discard(entry[1])
        if conns is not None and not conns:
            del self._held[tenant_id]
        if self._owner.get(loss) == tenant_id:
            del self._owner[loss]

    def _forget(self, tenant_id: str, loss: Any) -> None:
        conns = self._held.get(tenant_id)
        if conns is not None:
            conns.pop(loss, None)
            if not conns:
                del self._held[tenant_id]
        if self._owner.get(loss) == tenant_id:
            del self._owner[loss]

    def unsent(self, tenant_id: str) -> int:
        """Bytes still buffered for ``tenant_id``'s tracked answers (drained connections forgotten)."""
        conns = self._held.get(tenant_id)
        if not conns:
            return 0
        total = 0
        for loss, (unsent, forget) in list(conns.items()):
            try:
                n = 0 if loss.lost else unsent()
            except (AttributeError, RuntimeError):  # a closed transport
                n = 0
            if n > 0:
                total += n
            else:
                del conns[loss]
                loss.discard(forget)
                if self._owner.get(loss) == tenant_id:
                    del self._owner[loss]
        if not conns:
            del self._held[tenant_id]
        return total

    def check(self, tenant: Tenant) -> None:
        """Raise 429 ``unsent_answers_limited`` (``Retry-After: 1``) while ``tenant``'s unsent answer bytes
        are above the limit; else return (one dictionary test when nothing is tracked)."""
        if self._held and self.limit is not None and self.unsent(tenant.id) > self.limit:
            raise too_many(1.0, "unsent_answers_limited",
                           "the tenant's earlier answers are still unread by their clients")
