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

Session 24 (S23-azure-2) re-measured it under overload (the Azure cell at time
scale 8): without the yields, or with them ended 2 ms after the head, the wait
leaves the app (audit ``auth_ms`` p50 55-890 ms -> 0.05 ms) but reappears
before it, because a request's pipeline up to the send is one task step and a
loaded iteration then runs every admitted pipeline back to back before any
first byte is read; the yields stagger that batch. Neither that bound nor a
per-iteration turnstile improved client TTFT (bench/results/fifo-s24-summary.md):
kept as it is.
"""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from typing import Any

__all__ = ["SendOrder", "SEND_ORDER", "SCOPE_KEY", "MAX_YIELDS"]

#: the ASGI scope key holding the send count at the request head's completion
SCOPE_KEY = "prefixgate.sends_at_head"

#: the most yields of one :meth:`SendOrder.wait_turn`
MAX_YIELDS = 4


class SendOrder:
    """Counts upstream sends started; lets a request queued before them yield to their writers.

    ``sends``: the number of sends started (an int that only grows). Use from the event loop's thread.
    """

    __slots__ = ("sends",)

    def __init__(self) -> None:
        self.sends = 0

    def stamp(self, scope: MutableMapping[str, Any]) -> None:
        """Note in ``scope`` (an ASGI scope) the sends started so far (call when its head is complete)."""
        scope[SCOPE_KEY] = self.sends

    def sending(self) -> None:
        """One more upstream send starts now (call just before handing the request to the HTTP client)."""
        self.sends += 1

    async def wait_turn(self, scope: MutableMapping[str, Any]) -> int:
        """Yield to the event loop while sends were started since ``scope`` was stamped
        (at most :data:`MAX_YIELDS` times); return the number of yields (0: none, no wait)."""
        seen = scope.get(SCOPE_KEY)
        if seen is None:
            return 0
        yields = 0
        while seen != self.sends and yields < MAX_YIELDS:
            seen = self.sends
            yields += 1
            await asyncio.sleep(0)
        return yields


#: the process's counter (the listener stamps, the proxy counts, the pipeline waits)
SEND_ORDER = SendOrder()
