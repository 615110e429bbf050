"""Upstream sends before the next request's work, in a burst of requests (issues 14 and 15).

Why: uvicorn starts one task per request; a request's first task step runs the
whole pipeline up to the upstream call (authentication, parsing, prompt
tokens, prefix keys, policy, routing: ~1-3 ms of CPU) without waiting. On
Python < 3.12 aiohttp writes the request body in a new task (its
``write_bytes``), queued behind every task already ready. Under a trace
replay many requests arrive within the same millisecond (the Mooncake rows
come in groups with one timestamp): the tasks of requests 2..N were queued
before request 1's body writer, so request 1 reached its replica only after
all N pipelines ran, and so did every other request of the burst (measured,
time scale 20: ~5 ms mean between aiohttp's "headers sent" and "body sent",
~2.5 ms per request ahead in the burst; notes/s4-latency.md).

:class:`SendOrder` lets a queued request step aside once for the sends
started since it was queued: the listener stamps each request's ASGI scope
with the number of upstream sends started so far when its head is complete
(:meth:`SendOrder.stamp`, gateway/http_guard.py), :func:`gateway.proxy.open_upstream`
counts a send just before it hands the request to aiohttp
(:meth:`SendOrder.sending`), and the pipeline's first step awaits
:meth:`SendOrder.wait_turn`: when sends were started since the stamp, it
yields to the event loop (``asyncio.sleep(0)``) so that their body writers,
queued before it, run first; it repeats while more sends were started
meanwhile, at most :data:`MAX_YIELDS` times (progress is bounded). Without a
stamp (another listener, a test calling the pipeline directly) or with no
send since, it returns at once without yielding. Nothing is skipped or
reordered among requests: each still runs its whole pipeline
(authentication, policy, audit) in arrival order; only the replicas receive
the earlier requests of a burst sooner.

One counter per process (:data:`SEND_ORDER`): the gateway runs one event loop;
two gateways in one process (tests) share it, which at worst costs a few
extra yields.

Since session 6 the upstream client is the gateway's own pool
(gateway/upstream_pool.py), which writes head and body in one
``transport.write`` inside :func:`gateway.proxy.open_upstream` with no writer
task: on a kept-alive connection the body is on the socket before the next
request's pipeline starts, and the yields above matter only for a request
that had to open a new connection first (its write comes after the connect).
The mechanism is kept (notes/s6-upclient.md: to be re-measured under a
trace replay before it is removed).

Session 24 (finding S23-azure-2): the yields can be bounded by time too. Since
session 23 the listener accepts every waiting connection per wake-up
(gateway/accept_batch.py), so an overloaded gateway holds its whole backlog
in the event loop, and each ``sleep(0)`` waits for a full loop iteration
that runs every other admitted request's step and every running stream's
relay: with up to 4 yields per request the backlog was served like processor
sharing (every request's pipeline finished about 5 long iterations late;
audit ``auth_ms`` p50 55-890 ms with one-token answers in the Azure cell at
time scale 8, 0.05 ms without the yields). The listener also stamps the
request head's completion time (:data:`HEAD_AT_KEY`, ``time.perf_counter``
seconds) and, with ``upstream.send_order_max_wait_ms`` set
(:attr:`SendOrder.max_wait_s`), :meth:`SendOrder.wait_turn` yields only while
less than that has passed since then: a request whose task starts later (the
loop is loaded) runs its pre-upstream pipeline in its task's first step, in
the order the tasks were started (the loop's ready queue: arrival order).
Unloaded (a task starts within the bound of its head), a burst yields as before.
**Off by default**: with 2 ms the wait left the app (audit ``auth_ms`` p50
33-560 ms -> 0.05 ms, arrival -> first byte p50 -30-40 %) but moved before it
(client send -> arrival at the app rose 2-5x): without the yields every
admitted pipeline runs back to back in one loop iteration and no first byte
is read until the batch is done, which the yields' staggering had spread.
Client TTFT was not resolved on the shared machine (bench/results/fifo-s24-summary.md).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import MutableMapping
from typing import Any

__all__ = ["SendOrder", "SEND_ORDER", "SCOPE_KEY", "HEAD_AT_KEY", "MAX_YIELDS", "DEFAULT_MAX_WAIT_S"]

#: the ASGI scope key holding the send count at the request head's completion
SCOPE_KEY = "prefixgate.sends_at_head"

#: the ASGI scope key holding the request head's completion time (``time.perf_counter`` seconds; session 24)
HEAD_AT_KEY = "prefixgate.head_at"

#: the most yields of one :meth:`SendOrder.wait_turn`
MAX_YIELDS = 4

#: seconds after the head's completion past which a request no longer yields (``upstream.send_order_max_wait_ms``;
#: None: no time bound, the default: session 24 did not resolve a client-side gain, see the module doc)
DEFAULT_MAX_WAIT_S: float | None = None


class SendOrder:
    """Counts upstream sends started; lets a request queued before them yield to their writers.

    ``sends``: the number of sends started (an int that only grows). ``max_wait_s``: seconds after a request
    head's completion (:data:`HEAD_AT_KEY`) past which :meth:`wait_turn` no longer yields (0: never yields;
    None: no time bound, only :data:`MAX_YIELDS`).
    Use from the event loop's thread.
    """

    __slots__ = ("sends", "max_wait_s")

    def __init__(self, max_wait_s: float | None = DEFAULT_MAX_WAIT_S) -> None:
        self.sends = 0
        self.max_wait_s = max_wait_s

    def stamp(self, scope: MutableMapping[str, Any]) -> None:
        """Note in ``scope`` (an ASGI scope) the sends started so far and the time (``time.perf_counter``
        seconds; call when its head is complete)."""
        scope[SCOPE_KEY] = self.sends
        scope[HEAD_AT_KEY] = time.perf_counter()

    def sending(self) -> None:
        """One more upstream send starts now (call just before handing the request to the HTTP client)."""
        self.sends += 1

    async def wait_turn(self, scope: MutableMapping[str, Any]) -> int:
        """Yield to the event loop while sends were started since ``scope`` was stamped (at most
        :data:`MAX_YIELDS` times) and, when the scope holds the head's time (:data:`HEAD_AT_KEY`) and
        :attr:`max_wait_s` is set, while less than that has passed since it (session 24: a loaded loop does not yield);
        return the number of yields (0: none, no wait)."""
        seen = scope.get(SCOPE_KEY)
        if seen is None:
            return 0
        head_at = scope.get(HEAD_AT_KEY)
        bound = self.max_wait_s
        until = float("inf") if head_at is None or bound is None else head_at + bound
        yields = 0
        while seen != self.sends and yields < MAX_YIELDS and time.perf_counter() < until:
            seen = self.sends
            yields += 1
            await asyncio.sleep(0)
        return yields


#: the process's counter (the listener stamps, the proxy counts, the pipeline waits)
SEND_ORDER = SendOrder()
