"""Review R10-4 (session 10): one tenant's ``top_logprobs`` answers cost the gateway's event loop
~84-175 ms each to check, charged to no budget. A fake replica (aiohttp) answers a
completion with ``ALTERNATIVES`` log-probabilities per token when the request asks for them
(tests/support/logprobs_replica.py).

Before the fix a large answer was parsed unmetered (and with :mod:`json`, the bracket guard of
:func:`gateway.json_fast.loads` refusing orjson): the tenant's next requests were served. After it,
the parse's CPU above the free allowance is charged to the tenant's CPU budget, so its next request
answers 429 ``cpu_budget_exhausted`` while another tenant is served.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from gateway import json_fast
from tests.support.audit_log import audit_hub, audit_log  # noqa: F401 - fixtures: the stack's audit on a ListLog
from tests.support.fake_replicas import (  # noqa: F401 - n_replicas: this module's stack fixture
    base_app, completion, n_replicas, serving)
from tests.support.logprobs_replica import (
    ALTERNATIVES, BigAnswerFake, big_answer_body, logprobs_answer, plain_or_big)
from tests.support.waiting import wait_for


@dataclass
class Fake(BigAnswerFake):
    #: requests whose prompt holds "HOLD" wait for this before answering (R10b-2's burst)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    held: int = 0


def _app(fake: Fake) -> web.Application:
    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if "HOLD" in str(body.get("prompt")):
            fake.held += 1
            await fake.release.wait()
        return plain_or_big(fake, body)
    return base_app(fake, completions)


@pytest.fixture
async def fakes() -> AsyncIterator[list[Fake]]:
    async with serving([Fake(big=big_answer_body())], _app) as out:
        yield out


@pytest.fixture
def config_overrides(fakes: list[Fake]) -> dict[str, Any]:
    # no free allowance per token and a small bucket: one large answer puts the tenant in debt
    return {"replicas": [{"id": "f0", "url": fakes[0].url, "pool": "default"}],
            "limits": {"answer_cpu_free_us_per_token": 0.0, "prep_cpu_free_ms": 0.0,
                       "refused_cpu_ms_per_s": 0.001, "refused_cpu_burst_ms": 1.0}}


async def _post(stack: Any, tenant: str, body: dict[str, Any]) -> Any:
    return await stack.client.post("/v1/completions", json=body, headers=stack.auth(f"{tenant}/app"))


async def test_a_large_answer_is_charged_to_its_tenant(stack: Any, fakes: list[Fake]) -> None:
    first = await _post(stack, "tenant-a", completion("hello", logprobs=ALTERNATIVES))
    assert first.status_code == 200, first.text
    assert first.content == fakes[0].big  # forwarded unchanged
    metrics = await stack.admin_metrics()
    charged = [line for line in metrics.splitlines()
               if line.startswith('prefixgate_tenant_refused_cpu_seconds_total{tenant="tenant-a"}')]
    assert charged and float(charged[0].split()[-1]) > 0.0005  # the parse's CPU, beyond the 0 allowance
    again = await _post(stack, "tenant-a", completion("hello"))
    assert again.status_code == 429, again.text
    assert again.json()["error"]["code"] == "cpu_budget_exhausted"
    other = await _post(stack, "tenant-b", completion("hello"))
    assert other.status_code == 200, other.text


def _charged(metrics: str) -> float:
    lines = [line for line in metrics.splitlines()
             if line.startswith('prefixgate_tenant_refused_cpu_seconds_total{tenant="tenant-a"}')]
    return float(lines[0].split()[-1]) if lines else 0.0


async def test_a_burst_admitted_before_the_first_charge_is_refused_unparsed(stack: Any, fakes: list[Fake],
                                                                         audit_log: Any) -> None:
    """R10b-2: a second large answer that arrives once its tenant is in debt is refused (429)
    without being parsed, and the refusal is audited with its reason; the first one was served and charged."""
    held = asyncio.create_task(_post(stack, "tenant-a", completion("HOLD", logprobs=ALTERNATIVES)))
    await wait_for(lambda: fakes[0].held == 1, what="the second request at the replica")
    first = await _post(stack, "tenant-a", completion("hello", logprobs=ALTERNATIVES))
    assert first.status_code == 200, first.text
    charged = _charged(await stack.admin_metrics())
    assert charged > 0
    fakes[0].release.set()
    second = await held
    assert second.status_code == 429, second.text
    assert second.json()["error"]["code"] == "cpu_budget_exhausted"
    rid = second.headers.get("X-Request-Id")
    assert rid
    # audited: the request's one event carries the refusal's status and reason (session 11)
    events = await wait_for(lambda: [e for e in audit_log.events if e.request_id == rid],
                            what="the refused request's audit event")
    (event,) = events
    assert event.tenant == "tenant-a"
    assert (event.status_code, event.error_code) == (429, "cpu_budget_exhausted")
    assert event.outcome.value == "rate_limited"
    # not parsed: only its preparation (the test gives no free allowance) is charged, far below a parse
    assert _charged(await stack.admin_metrics()) - charged < charged / 4
    other = await _post(stack, "tenant-b", completion("hello"))
    assert other.status_code == 200, other.text


async def test_small_answers_are_not_metered(stack: Any) -> None:
    for _ in range(5):
        r = await _post(stack, "tenant-a", completion("hello"))
        assert r.status_code == 200, r.text


def test_loads_answer_takes_orjson_whatever_the_bracket_count_and_json_for_what_orjson_refuses() -> None:
    big = json.dumps(logprobs_answer(512, 20)).encode()
    assert big.count(b"{") + big.count(b"[") > json_fast.MAX_FAST_NESTING
    assert json_fast.loads_answer(big) == json.loads(big)
    nan = b'{"usage": {"completion_tokens": 1}, "lp": [-Infinity, NaN]}'
    out = json_fast.loads_answer(nan)
    assert out["lp"][0] == -math.inf and math.isnan(out["lp"][1])
    for bad in (b"[1, 2]", b"not json", b'{"a": '):
        with pytest.raises(ValueError):
            json_fast.loads_answer(bad)
    # nested beyond orjson's 1,024 levels: json's answer (a value or RecursionError, which the caller
    # answers 502) stands; which one depends on the interpreter's recursion limit
    deep = b'{"a": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    try:
        got = json_fast.loads_answer(deep)
    except (ValueError, RecursionError):
        with pytest.raises((ValueError, RecursionError)):
            json.loads(deep)
    else:
        assert got == json.loads(deep)
