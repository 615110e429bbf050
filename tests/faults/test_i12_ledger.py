"""Issue 12, finding 4: token limits reserve what a request may use, and every ending settles.

Public report: concurrent requests bypass a tokens-per-minute limit because
usage is counted after completion. Before the fix a tenant at 100 prompt
tokens per minute sending 5 concurrent requests of 50 prompt + 100
``max_tokens`` got 2 admitted and used 300 tokens: output tokens were not
limited at all. Now ``output_tokens_per_s`` limits them beside
``prompt_tokens_per_s`` and admission reserves prompt + ``max_tokens`` x
sequences in the buckets before dispatch (tenancy/ledger.py).

Bound asserted (docs/tenancy.md, "Token ledger"): per bucket, tokens charged
over ``T`` seconds <= ``burst + rate x T + max(0, n_max - burst)``, where
``n_max`` is one request's reservation (a request larger than the burst is
admitted from a full bucket into debt: the one-request overshoot).

Then each way a request can end is settled in the pipeline's one exit path,
and the charged amount is asserted from the audit event and the ledger:
replica usage when it arrives; else the output relayed (one token per content
delta chunk); else the whole reservation; nothing only when no replica was
reached.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.auditing import AuditHub

sys.path.insert(0, os.path.dirname(__file__))
from i12_scripted import CapturingLog, Scripted, scripted

TD = "demo.prefixgate.test"
WORDS = " ".join(f"w{i}" for i in range(49))  # the script word + 49 words: 50 prompt tokens (word tokenizer)
P = 50
RATE_PER_MIN = 100


def _tenant(tid: str, **limits: Any) -> dict[str, Any]:
    return {"id": tid, "spiffe_ids": [f"spiffe://{TD}/{tid}/"], "models": ["sim-model"], "pools": ["default"],
            "max_output_tokens": 256, **limits}


def _limited(tid: str, out_burst: int) -> dict[str, Any]:
    return _tenant(tid, prompt_tokens_per_s=RATE_PER_MIN / 60, prompt_tokens_burst=100,
                   output_tokens_per_s=out_burst / 60, output_tokens_burst=out_burst)


@pytest.fixture
async def scr() -> AsyncIterator[Scripted]:
    async with scripted(2) as s:
        yield s


@pytest.fixture
def n_replicas() -> int:
    return 1  # the stack's simulated replica is unused: the gateway talks to ``scr``


@pytest.fixture
def capture_log() -> CapturingLog:
    return CapturingLog()


@pytest.fixture
def audit_hub(capture_log: CapturingLog) -> AuditHub:
    return AuditHub(capture_log)


@pytest.fixture
def config_overrides(scr: Scripted, stable_secret: str, tmp_path: Path) -> dict[str, Any]:
    return {
        "replicas": [{"id": f"r{i}", "url": u, "pool": "default"} for i, u in enumerate(scr.urls)],
        "upstream": {"connect_timeout_s": 0.5, "first_byte_timeout_s": 0.5, "read_timeout_s": 0.5,
                     "total_timeout_s": 3.0, "max_attempts": 2},
        # probe timeout: tests/faults/conftest.py (a short one marked replicas down under load)
        "health": {"interval_s": 0.2, "timeout_s": 2.0, "unhealthy_after": 1, "healthy_after": 1,
                   "breaker_failures": 100},
        "tenancy": {
            "master_secret_file": stable_secret, "master_secret_env": None,
            "state_file": str(tmp_path / "keystate.json"), "operators": [f"spiffe://{TD}/ops/admin"],
            "tenants": [_tenant("tenant-a"), _limited("tenant-b", 100), _limited("tenant-c", 1000),
                        _limited("tenant-d", 60)],
        },
    }


def body(script: str, **kw: Any) -> dict[str, Any]:
    return {"model": "sim-model", "prompt": f"{script} {WORDS}", "max_tokens": 16, **kw}


async def post(stack: Any, payload: dict[str, Any], tenant: str = "tenant-a") -> httpx.Response:
    return await stack.client.post("/v1/completions", json=payload, headers=stack.auth(f"{tenant}/app"))


async def last_event(log: CapturingLog, before: int, until: Any) -> Any:
    assert await until(lambda: len(log.events) > before), "no audit event"
    assert len(log.events) == before + 1, [e.request_id for e in log.events[before:]]
    return log.events[-1]


# ---------------------------------------------------------------- admission


@pytest.mark.parametrize(("tenant", "out_burst", "admitted"), [
    ("tenant-b", 100, 1),   # the output bucket binds: 100 / 100
    ("tenant-c", 1000, 2),  # the prompt bucket binds: 100 / 50
    ("tenant-d", 60, 1),    # max_tokens above the output burst: one request from a full bucket, into debt
])
async def test_concurrent_requests_are_admitted_only_as_far_as_the_reservation_allows(
        stack: Any, scr: Scripted, until: Any, tenant: str, out_burst: int, admitted: int) -> None:
    c = stack.components
    t0 = time.monotonic()
    tasks = [asyncio.ensure_future(post(stack, body("hold", max_tokens=100), tenant)) for _ in range(5)]
    # every request is either refused or held at a replica before any of them may finish
    assert await until(lambda: sum(t.done() for t in tasks) + scr.in_flight == 5)
    held = scr.in_flight
    scr.release.set()
    rs = await asyncio.gather(*tasks)
    elapsed = time.monotonic() - t0
    codes = [r.status_code for r in rs]
    assert held == admitted and codes.count(200) == admitted, codes
    assert codes.count(429) == 5 - admitted
    assert all(r.json()["error"]["code"] == "token_rate_limited" for r in rs if r.status_code == 429)
    assert await until(lambda: c.ledger.totals()[tenant].open_reservations == 0)
    totals = c.ledger.totals()[tenant]
    # the replica used everything it was allowed: 50 prompt + 100 output per admitted request
    assert totals.charged == {"prompt": P * admitted, "output": 100 * admitted}
    # the bound: burst + rate x T + one request's overshoot, per bucket
    assert totals.charged["prompt"] <= 100 + RATE_PER_MIN / 60 * elapsed
    assert totals.charged["output"] <= out_burst + out_burst / 60 * elapsed + max(0, 100 - out_burst)


async def test_unused_reservation_is_refunded_and_visible_in_metrics_and_audit(
        stack: Any, scr: Scripted, until: Any, capture_log: CapturingLog) -> None:
    c = stack.components
    scr.release.set()
    # tenant-b: output burst 100; each request reserves 50 + 100, the replica reports 50 + 7
    r1 = await post(stack, body("small", max_tokens=100), "tenant-b")
    assert r1.status_code == 200
    ev = await last_event(capture_log, 0, until)
    assert ev.ledger.reserved_tokens == 150 and ev.ledger.charged_tokens == 57
    assert (ev.ledger.prompt_charged, ev.ledger.output_charged, ev.ledger.basis) == (50, 7, "usage")
    # without the refund the output bucket would be empty (100 - 100): the next request fits only thanks to it
    r2 = await post(stack, body("small", max_tokens=90), "tenant-b")
    assert r2.status_code == 200, r2.text
    await last_event(capture_log, 1, until)
    totals = c.ledger.totals()["tenant-b"]
    assert totals.reserved == {"prompt": 100, "output": 190}
    assert totals.charged == {"prompt": 100, "output": 14}
    assert totals.refunded == {"prompt": 0, "output": 176}
    op = {"Authorization": f"Bearer {stack.issuer.mint(f'spiffe://{TD}/ops/admin', 'prefixgate-admin')}"}
    text = (await stack.client.get(f"{stack.admin_url}/admin/metrics", headers=op)).text
    for line in ('prefixgate_tenant_tokens_reserved_total{kind="output",tenant="tenant-b"} 190.0',
                 'prefixgate_tenant_tokens_charged_total{kind="output",tenant="tenant-b"} 14.0',
                 'prefixgate_tenant_tokens_refunded_total{kind="output",tenant="tenant-b"} 176.0',
                 'prefixgate_tenant_tokens_charged_total{kind="prompt",tenant="tenant-b"} 100.0',
                 'prefixgate_tenant_charges_total{basis="usage",tenant="tenant-b"} 2.0'):
        assert line in text, line
    public = (await stack.client.get("/metrics")).text
    assert "tenant-b" not in public  # per-tenant ledger series only on the admin listener


async def test_policy_cap_lowers_the_reservation_before_dispatch(stack: Any, scr: Scripted, until: Any,
                                                                  capture_log: CapturingLog) -> None:
    # no max_tokens: the tenant cap (256) is reserved first, then the clamp to the request applies
    payload = body("usage")
    payload.pop("max_tokens")
    r = await post(stack, payload)
    assert r.status_code == 200
    ev = await last_event(capture_log, 0, until)
    assert ev.ledger.reserved_tokens == P + 256 and ev.ledger.charged_tokens == 27


# ---------------------------------------------------------------- every ending settles

M = 16  # max_tokens of the ending requests

ENDINGS = [
    # id, script, stream, how the client reads, expected status, (prompt, output) charged, basis
    ("completed_with_usage", "usage", False, "read", 200, (20, 7), "usage"),
    ("completed_with_usage_stream", "usage", True, "read", 200, (20, 7), "usage"),
    ("completed_without_usage", "nousage", False, "read", 200, (P, M), "reservation"),
    ("completed_without_usage_stream", "nousage", True, "read", 200, (P, 3), "relayed"),
    ("client_cancelled_mid_stream", "twothenhold", True, "leave_after_2", 200, (P, 2), "relayed"),
    ("replica_500", "fail500", False, "read", 500, (P, 0), "refused"),  # R7-2: passed on, not retried
    ("stream_reset_after_2_chunks", "reset2", True, "cut_after_2", 200, (P, 2), "relayed"),
    ("timeout_before_first_byte", "stallfirst", False, "read", 504, (P, M), "reservation"),
    ("timeout_mid_stream", "twothenhold", True, "read", 200, (P, 2), "relayed"),
    ("replica_gone", "usage", False, "kill_replicas", None, (0, 0), "not_dispatched"),
]


def _content_chunks(data: bytes) -> int:
    return data.count(b'"text":" ')


@pytest.mark.parametrize(("name", "script", "stream", "how", "status", "charged", "basis"), ENDINGS,
                         ids=[e[0] for e in ENDINGS])
async def test_every_ending_is_settled(stack: Any, scr: Scripted, until: Any, capture_log: CapturingLog,
                                       name: str, script: str, stream: bool, how: str, status: int | None,
                                       charged: tuple[int, int], basis: str) -> None:
    c = stack.components
    payload = body(script, stream=stream)
    if how == "kill_replicas":
        for rep in scr.replicas:  # the replicas are gone: refused connections, then unhealthy
            assert rep.runner is not None
            await rep.runner.cleanup()
            rep.runner = None
        r = await post(stack, payload)
        assert r.status_code in (502, 503), r.text
    elif not stream:
        r = await post(stack, payload)
        assert r.status_code == status, r.text
    else:
        got = b""
        async with httpx.AsyncClient(base_url=stack.url, timeout=10) as client:
            async with client.stream("POST", "/v1/completions", json=payload, headers=stack.auth()) as resp:
                assert resp.status_code == status
                async for piece in resp.aiter_raw():
                    got += piece
                    if _content_chunks(got) >= 2 and how == "leave_after_2":
                        break  # the client leaves mid-stream
                    if _content_chunks(got) >= 2 and how == "cut_after_2":
                        scr.cut.set()  # the replica resets its connection now
        if how == "read" and script != "twothenhold":
            assert got.endswith(b"data: [DONE]\n\n")
        elif how != "leave_after_2":
            assert b"[DONE]" not in got and b'"error"' in got
    ev = await last_event(capture_log, 0, until)
    assert (ev.ledger.prompt_charged, ev.ledger.output_charged, ev.ledger.basis) == (*charged, basis), ev.ledger
    assert ev.ledger.charged_tokens == sum(charged)
    assert ev.ledger.reserved_tokens == P + M
    totals = c.ledger.totals()["tenant-a"]
    assert totals.open_reservations == 0
    assert totals.charged == {"prompt": charged[0], "output": charged[1]}
    assert totals.charged["prompt"] + totals.refunded["prompt"] == P
    assert totals.charged["output"] + totals.refunded["output"] == M
    if basis != "not_dispatched":
        assert sum(charged) > 0  # a request that reached a replica is never free
