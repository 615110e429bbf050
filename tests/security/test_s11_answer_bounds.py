"""Session 11: what one answer may cost the event loop (R10b-2 residual, R10b-4).

* ``limits.max_answer_bytes``: a plain answer larger than it is not read further and answers 502
  ``answer_too_large`` (audited, with its request id), not counted against the replica;
* large answer parses take turns, one per loop step (:class:`gateway.answer_cost.ParseTurns`);
* a streamed ``logprobs`` answer's parse CPU is sampled and charged to its tenant's CPU budget
  (:class:`gateway.answer_cost.StreamCharge`): its next request answers 429 ``cpu_budget_exhausted``.

A fake replica (aiohttp) answers a completion with 20 log-probabilities per token when asked.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from gateway.answer_cost import STREAM_METER_BYTES, ParseTurns, StreamCharge
from gateway.config_http import LimitsConfig
from gateway.cpu_budget import CpuBudget
from tenancy.registry import Tenant
from tests.support.audit_log import ListLog, audit_hub, audit_log  # noqa: F401 - fixtures
from tests.support.logprobs_replica import ALTERNATIVES, BigAnswerFake, big_answer_fake, plain_or_big
from tests.support.fake_replicas import (  # noqa: F401 - n_replicas: this module's stack fixture
    PLAIN_ANSWER, base_app, completion, n_replicas, serving)
from tests.support.waiting import wait_for

STREAM_TOKENS = 2048


Fake = BigAnswerFake


def _event(t: int) -> bytes:
    top = {f"tok{t}_{a}": -1.5 - a / 7 for a in range(ALTERNATIVES)}
    chunk = {"id": "c", "object": "text_completion", "created": 0, "model": "sim-model",
             "choices": [{"index": 0, "text": " x", "finish_reason": None,
                          "logprobs": {"tokens": [f"tok{t}"], "token_logprobs": [-0.5], "text_offset": [t],
                                       "top_logprobs": [top]}}]}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def _app(fake: Fake) -> web.Application:
    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body.get("stream") and body.get("logprobs"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for t in range(0, STREAM_TOKENS, 4):
                await resp.write(b"".join(_event(t + i) for i in range(4)))
            usage = {"id": "c", "object": "text_completion", "created": 0, "model": "sim-model", "choices": [],
                     "usage": {"prompt_tokens": 3, "completion_tokens": STREAM_TOKENS,
                               "total_tokens": STREAM_TOKENS + 3}}
            await resp.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
            await resp.write_eof()
            return resp
        return plain_or_big(fake, body)
    return base_app(fake, completions)


@pytest.fixture
async def fakes() -> AsyncIterator[list[Fake]]:
    async with serving([big_answer_fake()], _app) as out:
        yield out


async def _post(stack: Any, tenant: str, body: dict[str, Any]) -> Any:
    return await stack.client.post("/v1/completions", json=body, headers=stack.auth(f"{tenant}/app"))


def _charged(metrics: str, tenant: str = "tenant-a") -> float:
    lines = [line for line in metrics.splitlines()
             if line.startswith(f'prefixgate_tenant_refused_cpu_seconds_total{{tenant="{tenant}"}}')]
    return float(lines[0].split()[-1]) if lines else 0.0


class TestAnswerCap:
    @pytest.fixture
    def config_overrides(self, fakes: list[Fake]) -> dict[str, Any]:
        return {"replicas": [{"id": "f0", "url": fakes[0].url, "pool": "default"}],
                "limits": {"max_answer_bytes": 256 * 1024}}

    async def test_a_plain_answer_above_max_answer_bytes_is_refused_unparsed_and_audited(
            self, stack: Any, fakes: list[Fake], audit_log: ListLog) -> None:  # noqa: F811
        assert len(fakes[0].big) > 256 * 1024
        for _ in range(6):  # more than health.breaker_failures: the replica is not blamed
            r = await _post(stack, "tenant-a", completion("hello", logprobs=ALTERNATIVES))
            assert r.status_code == 502, r.text  # before: 200, the whole answer parsed on the loop
            assert r.json()["error"]["code"] == "answer_too_large"
            assert "max_answer_bytes" in r.json()["error"]["message"]
            rid = r.headers["X-Request-Id"]
        events = await wait_for(lambda: [e for e in audit_log.events if getattr(e, "request_id", None) == rid],
                                what="the refusal's audit event")
        assert events[0].status_code == 502 and events[0].error_code == "answer_too_large"
        for tenant in ("tenant-a", "tenant-b"):  # the replica's circuit and the tenant's pair stay closed
            ok = await _post(stack, tenant, completion("hello"))
            assert ok.status_code == 200, ok.text
            assert ok.json() == PLAIN_ANSWER


class TestStreamCharge:
    @pytest.fixture
    def config_overrides(self, fakes: list[Fake]) -> dict[str, Any]:
        # no free allowance and a small bucket: one metered stream puts the tenant in debt
        return {"replicas": [{"id": "f0", "url": fakes[0].url, "pool": "default"}],
                "limits": {"answer_cpu_free_us_per_token": 0.0, "prep_cpu_free_ms": 0.0,
                           "refused_cpu_ms_per_s": 0.001, "refused_cpu_burst_ms": 1.0}}

    async def test_a_streamed_logprobs_answer_is_charged_to_its_tenant(self, stack: Any, fakes: list[Fake]) -> None:
        body = completion("hello", logprobs=ALTERNATIVES, stream=True)
        async with stack.client.stream("POST", "/v1/completions", json=body,
                                       headers=stack.auth("tenant-a/app")) as r:
            assert r.status_code == 200
            got = b"".join([part async for part in r.aiter_bytes()])
        assert got.count(b"top_logprobs") == STREAM_TOKENS and got.endswith(b"data: [DONE]\n\n")
        assert _charged(await stack.admin_metrics()) > 0.002  # before: the preparation only (~0.1 ms)
        again = await _post(stack, "tenant-a", completion("hello"))
        assert again.status_code == 429, again.text
        assert again.json()["error"]["code"] == "cpu_budget_exhausted"
        other = await _post(stack, "tenant-b", completion("hello"))
        assert other.status_code == 200, other.text


def test_stream_charge_samples_large_reads_and_charges_beyond_the_allowance() -> None:
    cpu = [0.0]

    def clock() -> float:
        return cpu[0]

    budget = CpuBudget(LimitsConfig(refused_cpu_ms_per_s=100, refused_cpu_burst_ms=1000, prep_cpu_free_ms=1.0,
                                    answer_cpu_free_us_per_token=5.0), clock=lambda: 10.0, cpu_clock=clock)
    meter = budget.meter(Tenant(id="t"))
    charge = StreamCharge(meter)
    measured = []

    def feed(chunk: bytes) -> bytes:
        cpu[0] += 20e-6 * len(chunk) / STREAM_METER_BYTES  # 20 us per KiB read
        measured.append(len(chunk))
        return chunk

    chunk = b"x" * STREAM_METER_BYTES
    for i in range(1000):
        assert charge.feed(feed, chunk, i) is chunk
    charge.settle(1000)
    assert len(measured) == 1000
    assert charge.estimate_s() == pytest.approx(0.020)  # 1000 reads x 20 us, from 125 samples
    # 20 ms - 1 ms - 5 us x 1000 tokens = 14 ms charged
    assert charge.charged_s == pytest.approx(0.014)
    assert budget.buckets["t"].level == pytest.approx(1.0 - 0.014, abs=2e-4)  # plus the meter's own reads
    cheap = StreamCharge(budget.meter(Tenant(id="u")))
    for i in range(1000):
        cheap.feed(lambda c: c, chunk, i)
    cheap.settle(1000)
    assert cheap.charged_s == 0.0 and "u" not in budget.buckets


async def test_large_parses_take_turns_with_a_loop_step_between() -> None:
    turns = ParseTurns()
    order: list[str] = []
    await turns.take()  # free: no wait

    async def second() -> None:
        await turns.take()
        order.append("second parse")
        turns.give_back()

    task = asyncio.create_task(second())
    await asyncio.sleep(0)
    assert turns.busy and order == []  # waits while the first parse has the turn
    turns.give_back()
    asyncio.get_running_loop().call_soon(order.append, "other work")  # ready in the same loop step
    await task
    assert order == ["other work", "second parse"]
    assert ParseTurns.STEPS >= 2  # and what that work woke (one step later) runs before it too
    for _ in range(ParseTurns.STEPS + 1):
        await asyncio.sleep(0)
    assert not turns.busy
    # a waiter cancelled after being handed the turn passes it on
    await turns.take()
    waiting = asyncio.create_task(turns.take())
    third = asyncio.create_task(turns.take())
    await asyncio.sleep(0)
    handed = turns._waiters[0]  # waiting's
    turns.give_back()
    while not handed.done():  # the turn is handed to `waiting`, which has not resumed yet
        await asyncio.sleep(0)
    assert not waiting.done()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await asyncio.wait_for(third, 1)
    turns.give_back()
