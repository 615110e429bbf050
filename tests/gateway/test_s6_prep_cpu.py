"""Review R6-1 / R6-2: preparation CPU of requests that are not refused is metered too.

R6-1: unknown (dropped) body fields are never walked by the depth check: a dropped field nested
deeper than ``limits.max_json_depth`` is accepted and not forwarded (before: walked and refused,
after costing a Python step per value: ~28 ms for 62,000 ignored values); forwarded free-form
fields are still bounded. An accepted request's preparation CPU above its free allowance
(``limits.prep_cpu_free_ms`` + ``prep_cpu_free_us_per_token`` x prompt tokens) is charged to the
tenant's CPU budget (before: accepted requests were never charged).

R6-2: a request whose client hangs up while it waits in its tenant's flow queue is charged all
its preparation CPU (before: 499 ``not_dispatched``, nothing charged).

Over real loopback sockets (the ``stack`` fixture's uvicorn listeners); assertions count charges
and answers, never time; waits are on conditions.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
from pathlib import Path
from typing import Any

import pytest

from gateway.config_http import LimitsConfig
from gateway.cpu_budget import CpuBudget
from gateway.errors import GatewayError
from gateway.request import parse_inference_request
from sim.replica import ReplicaConfig
from tenancy.registry import Tenant
from tests.support.waiting import wait_for

TD = "demo.prefixgate.test"
TINY = {"refused_cpu_ms_per_s": 0.000001, "refused_cpu_burst_ms": 0.000001}  # any charge: debt for hours


def _nest(n: int) -> Any:
    v: Any = 0
    for _ in range(n):
        v = [v]
    return v


def _chat(**extra: Any) -> dict[str, Any]:
    return {"model": "sim-model", "max_tokens": 1, "messages": [{"role": "user", "content": "hi there"}], **extra}


# ------------------------------------------------------------------ R6-1: the cause


def test_dropped_fields_are_not_walked_forwarded_ones_are_bounded() -> None:
    raw = json.dumps(_chat(junk=[_nest(100)] * 50, messages=[{"role": "user", "content": "hi", "junk": _nest(60)}],
                           stream=True, stream_options={"junk": _nest(60)})).encode()  # stream: S22-newcomer-4
    req = parse_inference_request(raw, "chat", 32, max_messages=64, max_json_items=65536,
                                  unknown_fields="drop")  # session 23: refused by default (unsupported_parameter)
    assert "junk" not in req.body and "junk" not in req.body["messages"][0]  # dropped, never forwarded
    for field, value in (("response_format", {"a": _nest(40)}), ("tools", [{"f": _nest(40)}]),
                         ("tool_choice", {"a": _nest(40)})):
        with pytest.raises(GatewayError) as exc:
            parse_inference_request(json.dumps(_chat(**{field: value})).encode(), "chat", 32)
        assert exc.value.code == "invalid_json" and "nested deeper than 32" in exc.value.message
    deep_call = [{"role": "assistant", "content": None, "tool_calls": [{"id": "c", "x": _nest(40)}]}]
    with pytest.raises(GatewayError) as exc:
        parse_inference_request(json.dumps(_chat(messages=deep_call)).encode(), "chat", 32)
    assert exc.value.code == "invalid_json"
    ok = parse_inference_request(json.dumps(_chat(response_format={"a": _nest(29)})).encode(), "chat", 32)
    assert ok.body["response_format"] == {"a": _nest(29)}  # depth 32 exactly: forwarded


# ------------------------------------------------------------------ the settle rule (fake clocks)


class _Clocks:
    def __init__(self) -> None:
        self.now = 100.0
        self.cpu = 0.0


def test_settle_charges_undispatched_in_full_and_dispatched_beyond_the_allowance() -> None:
    c = _Clocks()
    b = CpuBudget(LimitsConfig(refused_cpu_ms_per_s=100, refused_cpu_burst_ms=10, prep_cpu_free_ms=1.0,
                               prep_cpu_free_us_per_token=5.0), clock=lambda: c.now, cpu_clock=lambda: c.cpu)
    t = Tenant(id="t")

    def step(ms: float) -> None:
        c.cpu += ms / 1000

    m = b.meter(t)
    m.run(step, 5.0)
    m.settle(True, 1000)  # allowance 1 + 5 = 6 ms > 5 ms: nothing charged, no bucket
    assert b.buckets == {}
    m = b.meter(t)
    m.run(step, 9.0)
    m.settle(True, 200)  # allowance 2 ms: 7 ms charged (10 -> 3 ms)
    m.settle(False, 200)  # once
    assert b.buckets["t"].level == pytest.approx(0.003)
    m = b.meter(t)
    m.run(step, 4.0)
    m.settle(False, 10_000)  # not dispatched: all 4 ms, whatever its tokens -> debt
    with pytest.raises(GatewayError) as exc:
        b.meter(t)
    assert exc.value.code == "cpu_budget_exhausted"
    c.now += 1.0
    m = b.meter(t)
    m.run(step, 3.0)
    m.refused()
    m.settle(False, 0)  # refused() charged it already
    assert b.buckets["t"].level == pytest.approx(0.01 - 0.003)


# ------------------------------------------------------------------ on the wire


def _tenant(tid: str, **kw: Any) -> dict[str, Any]:
    return {"id": tid, "spiffe_ids": [f"spiffe://{TD}/{tid}/"], "models": ["sim-model"], "pools": ["default"],
            "max_output_tokens": 400, **kw}


def _secret(tmp_path: Path) -> str:
    key = tmp_path / "master-s6.key"
    key.write_text(secrets.token_hex(32))
    os.chmod(key, 0o600)
    return str(key)


async def _charged(stack: Any, tenant: str) -> float:
    for line in (await stack.admin_metrics()).splitlines():
        if line.startswith(f'prefixgate_tenant_refused_cpu_seconds_total{{tenant="{tenant}"}}'):
            return float(line.split()[-1])
    return 0.0


@pytest.fixture
def config_overrides(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    limits = getattr(request, "param", {})
    tenants = [_tenant("tenant-a", max_concurrency=1, **TINY), _tenant("tenant-b")]
    # the slot holder must not time out (its refusal would be charged too)
    return {"limits": limits, "upstream": {"total_timeout_s": 120},
            "tenancy": {"master_secret_file": _secret(tmp_path), "tenants": tenants}}


@pytest.mark.parametrize("config_overrides", [{"prep_cpu_free_ms": 0, "prep_cpu_free_us_per_token": 0,
                                               "unknown_fields": "drop"}],  # session 23: junk is accepted, dropped
                         indirect=True)
async def test_accepted_request_pays_preparation_beyond_its_allowance(stack: Any) -> None:
    junk = _chat(junk=[_nest(30)] * 2000)  # R6-1's body: ~62,000 ignored values, accepted
    r = await stack.client.post("/v1/chat/completions", json=junk, headers=stack.auth("tenant-a/app"))
    assert r.status_code == 200, r.text
    await wait_for(lambda: stack.components.cpu_budget.buckets.get("tenant-a") is not None, what="charged")
    assert await _charged(stack, "tenant-a") > 0
    r = await stack.client.post("/v1/chat/completions", json=_chat(), headers=stack.auth("tenant-a/app"))
    assert r.status_code == 429 and r.json()["error"]["code"] == "cpu_budget_exhausted", r.text
    r = await stack.client.post("/v1/chat/completions", json=_chat(), headers=stack.auth("tenant-b/app"))
    assert r.status_code == 200, r.text  # the other tenant's budget is its own


async def test_plain_requests_stay_within_the_default_allowance(stack: Any) -> None:
    plain = _chat(messages=[{"role": "user", "content": " ".join(f"word{i}" for i in range(64))}])
    for _ in range(5):  # tenant-a's budget is so small that any charge would refuse the next one
        r = await stack.client.post("/v1/chat/completions", json=plain, headers=stack.auth("tenant-a/app"))
        assert r.status_code == 200, r.text
    assert await _charged(stack, "tenant-a") == 0


@pytest.fixture
def replica_cfg() -> ReplicaConfig:
    """Slow decode (50 ms per output token, unscaled) so the slot holder keeps running."""
    return ReplicaConfig(time_scale=1.0, decode_s_per_token=0.05, stream_chunk_tokens=4)


@pytest.fixture
def n_replicas() -> int:
    return 1


async def test_request_cancelled_while_queued_is_charged_its_preparation(stack: Any) -> None:
    flow = stack.components.flow
    holder = asyncio.ensure_future(stack.client.post(
        "/v1/chat/completions", json={**_chat(), "max_tokens": 400}, headers=stack.auth("tenant-a/app")))
    await wait_for(lambda: stack.components.limiter.in_flight("tenant-a") == 1, what="a's slot taken")
    host, port = stack.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    body = json.dumps(_chat()).encode()
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Authorization: {stack.auth('tenant-a/app')['Authorization']}\r\n".encode()
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    await writer.drain()
    await wait_for(lambda: flow.tenant_queued("tenant-a") == 1, what="a's second request queued")
    assert await _charged(stack, "tenant-a") == 0
    writer.close()  # the client hangs up while its request waits for a's slot
    ledger = stack.components.ledger
    await wait_for(lambda: flow.tenant_queued("tenant-a") == 0 and ledger.totals()["tenant-a"].open_reservations == 1,
                   what="the cancelled request ended (the holder's reservation alone open)")
    assert not holder.done()  # the holder (whose end could be charged too) still runs
    assert await _charged(stack, "tenant-a") > 0  # before R6-2's fix: 0 (499 not_dispatched, free)
    r = await stack.client.post("/v1/chat/completions", json=_chat(), headers=stack.auth("tenant-a/app"))
    assert r.status_code == 429 and r.json()["error"]["code"] == "cpu_budget_exhausted", r.text
    holder.cancel()
    await asyncio.gather(holder, return_exceptions=True)
    await wait_for(lambda: stack.components.limiter.in_flight("tenant-a") == 0, what="slot given back")
