"""Session 24 (finding S23-azure-2): with ``upstream.send_order_max_wait_ms`` set, a loaded gateway serves new
requests' pre-upstream pipelines in arrival order, each in one step, not interleaved by the send-order yields
(gateway/send_order.py; off by default: the client-side gain was not resolved).

Since session 23 the listener accepts every waiting connection at once, so an overloaded gateway holds
its whole backlog in the event loop. The send-order yields (up to 4 ``sleep(0)`` per request) then cost a
full loop iteration each, every iteration running every other admitted request's step and every running
stream's relay. Now a request yields only while less than ``SendOrder.max_wait_s``
(``upstream.send_order_max_wait_ms``) has passed since its head was parsed (the listener stamps
``HEAD_AT_KEY``): a request whose task starts later (the loop was held) runs its pipeline in one step, in
the order the tasks were started. The tests hold the loop by stamping heads in the past (no sleeps) and
count loop iterations with a callback that re-queues itself (the way a running stream's relay does).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest

from gateway.send_order import DEFAULT_MAX_WAIT_S, HEAD_AT_KEY, MAX_YIELDS, SCOPE_KEY, SEND_ORDER, SendOrder
from gateway.server import uvicorn_config
from tests.conftest import Stack
from tests.support.listeners import serving


class LoopSteps:
    """Counts loop iterations: a callback re-queued each time it runs (a running stream's relay, one
    event per iteration); ``relayed`` is how many times it ran."""

    def __init__(self) -> None:
        self.relayed = 0
        self.stopped = False
        asyncio.get_running_loop().call_soon(self._step)

    def _step(self) -> None:
        if not self.stopped:
            self.relayed += 1
            asyncio.get_running_loop().call_soon(self._step)


def _stamped(order: SendOrder, head_age_s: float) -> dict[str, Any]:
    """A request's scope as the listener stamps it, its head completed ``head_age_s`` seconds ago."""
    scope: dict[str, Any] = {}
    order.stamp(scope)
    scope[HEAD_AT_KEY] -= head_age_s
    return scope


async def _serve_burst(order: SendOrder, scopes: list[tuple[str, dict[str, Any]]], steps: LoopSteps,
                       done: list[tuple[str, int]]) -> list[asyncio.Task[None]]:
    """Start one task per (name, scope) in that order (arrival order); each waits its turn, then starts
    its upstream send (the pipeline's step) and notes (name, loop iterations so far)."""

    async def request(name: str, scope: dict[str, Any]) -> None:
        await order.wait_turn(scope)
        order.sending()
        done.append((name, steps.relayed))

    return [asyncio.ensure_future(request(n, s)) for n, s in scopes]


@pytest.mark.parametrize("held", [True, False])
async def test_a_held_loop_serves_its_backlog_in_arrival_order_each_in_one_step(held: bool) -> None:
    order = SendOrder(max_wait_s=0.002)
    age = 1.0 if held else 0.0  # held: every head was parsed a second before its task starts
    scopes = [(f"r{i}", _stamped(order, age)) for i in range(20)]
    order.sending()  # an earlier request's send since every stamp: each would yield (the old rule)
    if not held:
        order.max_wait_s = 1000.0  # the unloaded path: within the bound, the yields as before
    steps, done = LoopSteps(), []
    tasks = await _serve_burst(order, scopes, steps, done)
    await asyncio.gather(*tasks)
    steps.stopped = True
    names = [n for n, _ in done]
    if held:  # FIFO: arrival order, every pipeline in its task's first step (no loop iteration between)
        assert names == [n for n, _ in scopes]
        assert {s for _, s in done} == {done[0][1]} and done[0][1] <= 1
    else:  # the old rule: the burst's later requests wait MAX_YIELDS iterations each (processor sharing)
        assert max(s for _, s in done) >= MAX_YIELDS
        assert sorted(names) == sorted(n for n, _ in scopes)


async def test_zero_wait_never_yields_and_a_fresh_head_still_yields_within_the_bound() -> None:
    order = SendOrder(max_wait_s=0.0)
    scope = _stamped(order, 0.0)
    order.sending()
    assert await order.wait_turn(scope) == 0
    order.max_wait_s = 1000.0
    scope = _stamped(order, 0.0)
    order.sending()
    assert await order.wait_turn(scope) == 1  # the send's work runs first (gateway/send_order.py's purpose)
    assert await order.wait_turn({SCOPE_KEY: order.sends - 1}) == 1  # no head time (a test, another front): as before


async def test_running_streams_keep_their_turn_while_a_backlog_is_served() -> None:
    """A relay (one event per loop iteration) is never held back by new requests: it gets a turn every
    iteration while arrivals keep coming, and each iteration serves every request that arrived by then."""
    order = SendOrder(max_wait_s=0.002)
    steps, done = LoopSteps(), []
    tasks: list[asyncio.Task[None]] = []
    for wave in range(10):  # a wave of 5 held requests arrives in each iteration
        scopes = [(f"w{wave}r{i}", _stamped(order, 1.0)) for i in range(5)]
        order.sending()
        tasks += await _serve_burst(order, scopes, steps, done)
        relayed = steps.relayed
        await asyncio.sleep(0)
        assert steps.relayed >= relayed  # the relay ran (not starved) ...
    await asyncio.gather(*tasks)
    steps.stopped = True
    assert steps.relayed >= 10  # ... in every iteration of the arrivals
    assert [n for n, _ in done] == [f"w{w}r{i}" for w in range(10) for i in range(5)]  # FIFO across waves


async def test_one_tenants_burst_holds_no_place_another_tenant_needs() -> None:
    """No FIFO slot exists to hold: a tenant's burst of 50 held requests arriving first does not make
    another tenant's later request wait any loop iteration (per-tenant rules run in each pipeline)."""
    order = SendOrder(max_wait_s=0.002)
    scopes = [(f"a{i}", _stamped(order, 1.0)) for i in range(50)] + [("b0", _stamped(order, 1.0))]
    order.sending()
    steps, done = LoopSteps(), []
    await asyncio.gather(*await _serve_burst(order, scopes, steps, done))
    steps.stopped = True
    assert done[-1][0] == "b0" and done[-1][1] == done[0][1]


async def test_a_cancelled_waiting_request_frees_its_place() -> None:
    """A request cancelled while it yields (unloaded path) holds nothing: the others are served as if it
    had never come, and no send is counted for it."""
    order = SendOrder(max_wait_s=1000.0)
    scopes = [(f"r{i}", _stamped(order, 0.0)) for i in range(3)]
    order.sending()
    steps, done = LoopSteps(), []
    tasks = await _serve_burst(order, scopes, steps, done)
    await asyncio.sleep(0)  # each has yielded once
    sends = order.sends
    tasks[0].cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    steps.stopped = True
    assert isinstance(results[0], asyncio.CancelledError)
    assert [n for n, _ in done] == ["r1", "r2"] and order.sends == sends + 2


@pytest.mark.parametrize("parser", ["h11", "httptools"])
async def test_the_listener_stamps_each_request_head_time(parser: str) -> None:
    seen: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append((scope.get(HEAD_AT_KEY), time.perf_counter()))
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async with serving() as serve:
        host, port = await serve(uvicorn_config(app, "127.0.0.1", 0, http=parser))
        before = time.perf_counter()
        async with aiohttp.ClientSession() as s:
            for _ in range(2):  # the second on the same keep-alive connection
                async with s.get(f"http://{host}:{port}/x") as r:
                    assert r.status == 204
    assert len(seen) == 2 and all(isinstance(h, float) and before <= h <= at for h, at in seen)


@pytest.mark.parametrize("config_overrides", [{"upstream": {"send_order_max_wait_ms": 0}}])
async def test_the_knob_sets_the_process_bound_and_a_request_is_served(stack: Stack) -> None:
    try:
        assert SEND_ORDER.max_wait_s == 0  # the build applied upstream.send_order_max_wait_ms
        r = await stack.client.post("/v1/completions", headers=stack.auth(),
                                    json={"model": "sim-model", "prompt": "one two three", "max_tokens": 2})
        assert r.status_code == 200
    finally:
        SEND_ORDER.max_wait_s = DEFAULT_MAX_WAIT_S  # the process's one counter: as other tests expect it


async def test_the_default_has_no_time_bound() -> None:
    """Off by default (session 24 did not resolve a client-side gain): a request stamped long ago still yields."""
    order = SendOrder()
    assert order.max_wait_s is None and DEFAULT_MAX_WAIT_S is None
    scope = _stamped(order, 1.0)
    order.sending()
    assert await order.wait_turn(scope) == 1
