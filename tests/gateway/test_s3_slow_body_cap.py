"""Review finding R3-1: requests still reading their body count against the tenant's in-flight cap.

A tenant opens connections that send a valid head and a few body bytes, then stall. Each one is
authenticated and counted for its tenant (``flow.tenant_max_in_flight_requests``) before the body
is read, and holds that count until it ends, body phase included. Past the cap the tenant's
further requests are refused at once (429 ``in_flight_limited``, decided right after the tenant
is identified) and, while the gateway drains their unread body to make the 429 readable, they no
longer count toward the shedding bound (``flow.shed_max_in_flight_requests``): the flooding
tenant never reaches it and another tenant is served. The same with flow control off, where the
cap (not only ``max_concurrency``) bounds the body phase.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.conftest import TD
from tests.support.waiting import wait_for

SHED = 8
CAP = 3
EXCESS = SHED + 2  # more slow-body requests beyond the cap than the shedding bound
BODY = json.dumps({"model": "sim-model", "prompt": "hello there", "max_tokens": 2}).encode()


def _flow(enabled: bool, max_concurrency: int | None = None) -> dict[str, Any]:
    over: dict[str, Any] = {}
    if max_concurrency is not None:  # a tenant-a whose max_concurrency is above the cap
        over["tenancy"] = {"tenants": [
            {"id": "tenant-a", "spiffe_ids": [f"spiffe://{TD}/tenant-a/"], "models": ["sim-model"],
             "pools": ["default"], "max_concurrency": max_concurrency},
            {"id": "tenant-b", "spiffe_ids": [f"spiffe://{TD}/tenant-b/"], "models": ["sim-model"],
             "pools": ["default"]}]}
    return over | {"flow": {"enabled": enabled, "shed_max_in_flight_requests": SHED, "tenant_max_in_flight_requests": CAP,
                     "tenant_max_queued_requests": 2, "shed_loop_lag_s": None},
            # long enough that neither the held bodies nor the refusals' drains end during the test
            "limits": {"body_read_timeout_s": 60}}


async def _open_slow(stack: Any, token: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection that sent a valid head and the first 10 body bytes, then stalls."""
    u = urlsplit(stack.url)
    reader, writer = await asyncio.open_connection(u.hostname, u.port)
    writer.write((f"POST /v1/completions HTTP/1.1\r\nHost: gateway.test\r\nAuthorization: Bearer {token}\r\n"
                  f"Content-Type: application/json\r\nContent-Length: {len(BODY)}\r\n\r\n").encode() + BODY[:10])
    await writer.drain()
    return reader, writer


def _sample(metrics: str, name: str) -> float:
    """Sum of a metric's samples in a Prometheus text page (0.0 when absent)."""
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in metrics.splitlines()
               if ln.startswith(name + "{") or ln.startswith(name + " "))


@pytest.mark.parametrize("config_overrides", [_flow(True), _flow(False), _flow(False, max_concurrency=16)],
                         ids=["flow-on", "flow-off", "flow-off-max-concurrency-16"])
async def test_slow_bodies_past_the_cap_are_refused_and_never_reach_the_shedding_bound(stack: Any) -> None:
    guard = stack.components.overload
    token_a = stack.token("tenant-a/app")  # no max_concurrency, or one above the cap: the cap bounds it
    conns = []
    try:
        for _ in range(CAP):
            conns.append(await _open_slow(stack, token_a))
        await wait_for(lambda: guard.tenant_in_flight.get("tenant-a") == CAP, what="a's cap held by body-phase requests")
        excess = [await _open_slow(stack, token_a) for _ in range(EXCESS)]
        conns += excess

        async def decided() -> bool:  # every excess request refused (429) or shed (503)
            m = await stack.admin_metrics()
            return _sample(m, 'prefixgate_flow_refused_total{reason="in_flight"}') \
                + _sample(m, "prefixgate_shed_requests_total") >= EXCESS

        await wait_for(decided, what="the excess requests decided")
        metrics = await stack.admin_metrics()
        assert _sample(metrics, "prefixgate_shed_requests_total") == 0, "a tenant's slow bodies made the gateway shed"
        assert _sample(metrics, 'prefixgate_flow_refused_total{reason="in_flight"}') == EXCESS
        # the refused ones hold nothing while their body is drained: only the cap's requests count
        assert guard.in_flight == CAP and guard.tenant_in_flight == {"tenant-a": CAP}
        assert guard.reason() is None
        r_b = await stack.client.post("/v1/completions", headers=stack.auth("tenant-b/app"),
                                      json={"model": "sim-model", "prompt": "hi", "max_tokens": 2})
        assert r_b.status_code == 200, r_b.text  # another tenant is served
        # a refused request's answer is the 429, sent as soon as its body is in (not at a deadline)
        reader, writer = excess[0]
        writer.write(BODY[10:])
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 20)
        assert head.startswith(b"HTTP/1.1 429"), head
        assert b"retry-after:" in head.lower()
        length = int(next(ln.split(b":", 1)[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")))
        body = json.loads(await reader.readexactly(length))
        assert body["error"]["code"] == "in_flight_limited"
        # a held body-phase request, once its body is in, is served like any other
        reader, writer = conns[0]
        writer.write(BODY[10:])
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 20)
        assert head.startswith(b"HTTP/1.1 200"), head
    finally:
        for _, writer in conns:
            writer.close()
    await wait_for(lambda: guard.in_flight == 0 and not guard.tenant_in_flight, what="counts given back")
