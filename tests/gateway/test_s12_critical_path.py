"""Issue 14, session 12: less of the gateway's own work between the request's arrival and its answer.

* The router's prefix index record of a routed request (``Router(defer_records=True)``, the gateway's
  setting) is applied in the replica wait (``InferencePipeline._prepare``) instead of before the upstream
  write; every read of the index through the router applies it first, so routing decisions are the
  ones an at-once record gives.
"""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import pytest

from gateway.app import build_public_app
from gateway.upstream_conn import UpstreamConnection
from routing.index import InProcessPrefixIndex
from routing.load import InProcessLoadTracker
from routing.config import policy_from_config
from routing.policies.cache_aware import CacheAwareConfig
from routing.router import Router
from routing.types import RouteRequest
from tests.conftest import Stack
from tests.gateway.test_s2_record_after_send import _scope
from tests.support.spies import log_calls

BODY = json.dumps({"model": "sim-model", "prompt": "alpha beta gamma delta epsilon zeta eta theta iota kappa "
                   "lambda mu nu xi omicron pi rho sigma tau upsilon", "max_tokens": 2}).encode()


def _router(defer: bool) -> Router:
    return Router(policy_from_config(CacheAwareConfig()), InProcessPrefixIndex(64), InProcessLoadTracker(), 4,
                  defer_records=defer)


def _chain(rng: random.Random) -> list[bytes]:
    """A chain sharing a leading part with others (few prefixes), so that routing follows the index."""
    head = [b"p%d-%d" % (rng.randrange(3), i) for i in range(rng.randrange(1, 5))]
    return head + [b"u%d" % rng.randrange(10**9) for _ in range(rng.randrange(0, 3))]


@pytest.mark.parametrize("seed", range(5))
def test_a_deferred_record_routes_as_an_at_once_record(seed: int) -> None:
    rng = random.Random(seed)
    now, later = _router(False), _router(True)
    ids = ["a", "b", "c"]
    tickets: list[Any] = []
    for i in range(200):
        chain = _chain(rng)
        req = RouteRequest(tenant_id="t", block_keys=chain, prompt_tokens=4 * len(chain), max_tokens=4, block_size=4)
        picks = []
        for router in (now, later):
            if i % 3 == 0:  # flow control's fast path: candidates first, then route_among
                choice, ticket = router.route_among(req, router.candidates(req, ids))
            else:
                choice, ticket = router.route(req, ids)
            picks.append((choice.replica_id, choice.predicted_prefix_tokens))
            tickets.append(ticket)
        assert picks[0] == picks[1], i
        if i % 7 == 0:  # the gateway's flush in the replica wait, sometimes
            later.flush_records()
        if i % 11 == 0:
            for ticket in tickets:
                ticket.finish()
            tickets.clear()
    later.flush_records()
    for rid in ids:
        assert later.index.replica_blocks(rid) == now.index.replica_blocks(rid)


def test_the_record_waits_for_the_flush_or_the_next_read() -> None:
    router = _router(True)
    keys = [b"k1", b"k2"]
    req = RouteRequest(tenant_id="t", block_keys=keys, prompt_tokens=8, max_tokens=1, block_size=4)
    choice, _ = router.route(req, ["a"])
    assert router.index.match("a", keys) == 0  # not yet: the upstream request goes first
    router.flush_records()
    assert router.index.match("a", keys) == 2
    router.flush_records()  # idempotent
    assert router.index.replica_blocks("a") == 2
    router.route(RouteRequest(tenant_id="t", block_keys=[b"x"], prompt_tokens=4, max_tokens=1, block_size=4), ["a"])
    assert router.candidates(req, ["a"])[0].matched_blocks == 2  # a read applies the pending record first
    assert router.index.match("a", [b"x"]) == 1


def test_a_replica_forgotten_after_a_deferred_record_keeps_nothing_of_it() -> None:
    router = _router(True)
    req = RouteRequest(tenant_id="t", block_keys=[b"k1", b"k2"], prompt_tokens=8, max_tokens=1, block_size=4)
    router.route(req, ["a"])
    router.forget_replica("a")  # a restart: the record made before it goes with it
    router.flush_records()
    assert router.index.replica_blocks("a") == 0


def test_the_default_router_records_at_once() -> None:
    router = _router(False)
    req = RouteRequest(tenant_id="t", block_keys=[b"k1"], prompt_tokens=4, max_tokens=1, block_size=4)
    router.route(req, ["a"])
    assert router.index.match("a", [b"k1"]) == 1


# -- the served request ---------------------------------------------------------------------------
async def _serve(stack: Stack) -> None:
    app = build_public_app(stack.components, manage_lifecycle=False)
    messages = [{"type": "http.request", "body": BODY, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    async def send(message: dict[str, Any]) -> None:
        pass

    await app(_scope("/v1/completions", stack.auth()), receive, send)


async def test_the_index_record_is_made_while_the_replica_works(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    gw = stack.components
    assert gw.router.defer_records
    log: list[str] = []
    for _ in range(4):  # a kept-alive connection to each replica
        await _serve(stack)
    log_calls(UpstreamConnection, "send", log, "upstream written", monkeypatch)
    log_calls(gw.router.index, "record", log, "index recorded", monkeypatch)
    real_received = UpstreamConnection.data_received

    def received(self: UpstreamConnection, data: bytes) -> None:
        if not log or log[-1] != "answer bytes":
            log.append("answer bytes")
        real_received(self, data)

    monkeypatch.setattr(UpstreamConnection, "data_received", received)
    await _serve(stack)
    await asyncio.sleep(0)
    assert log[:3] == ["upstream written", "index recorded", "answer bytes"], log
    assert log.count("index recorded") == 1
    blocks = sum(gw.router.index.replica_blocks(r.id) for r in gw.replica_set.all())
    assert blocks > 0  # the served requests' chains are in the index


async def test_a_retried_requests_record_is_applied_by_its_end(stack: Stack) -> None:
    import httpx

    gw = stack.components
    async with httpx.AsyncClient() as c:  # r0 answers 503: the request is retried on r1
        await c.post(stack.cluster.urls[0] + "/sim/faults", json={"status": 503})
    recorded: list[str] = []
    real = gw.router.index.record

    def record(replica_id: str, keys: Any) -> None:
        recorded.append(replica_id)
        real(replica_id, keys)

    gw.router.index.record = record  # type: ignore[method-assign]
    try:
        for i in range(6):
            body = json.dumps({"model": "sim-model", "prompt": f"retry {i} " + "word " * 40, "max_tokens": 2})
            r = await stack.client.post("/v1/completions", content=body,
                                        headers={**stack.auth(), "content-type": "application/json"})
            assert r.status_code == 200, r.text
            assert gw.router._pending is None  # every attempt's record applied once the request ended
    finally:
        del gw.router.index.record
    assert "r1" in recorded and recorded.count("r0") + recorded.count("r1") >= 6
