"""Issue 17: flow control's 429s are audited with their reason code and queue figures, and a flood
of them is aggregated by the audit summary (audit/summary.py) like every other 429.

Refusals: ``in_flight_limited`` (the tenant's requests in flight reached
``flow.tenant_max_in_flight_requests``), ``queue_full`` (its queue at
``flow.tenant_max_queued_requests``, refused at the door) and ``queue_timeout`` (waited
``flow.tenant_max_queue_wait_s``). Each is one event, outcome ``rate_limited``, with
``policy.reason_code``, ``policy.reason`` naming the figures against their bounds,
``latency.queue_wait_ms`` (0 when refused at the door) and ``route.virtual_tokens``. A 429 flood
from one source is written individually only for the summary's ``first_n`` per window; the rest
are counted in that source's summary event.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from e2e_helpers import audit_section, jsonl_events, wait_for  # noqa: E402

from gateway.auditing import AuditHub  # noqa: E402
from tests.support.flow import PROMPT, n_replicas, replica_cfg  # noqa: E402,F401 - fixtures: one slow replica
CODES = {"in_flight_limited", "queue_full", "queue_timeout"}
FLOW = {"replica_max_running_requests": 1, "tenant_max_queued_requests": 1, "tenant_max_queue_wait_s": 0.5,
        "tenant_max_in_flight_requests": 2, "shed_max_in_flight_requests": 16}


@pytest.fixture
def first_n() -> int:
    return 1000


@pytest.fixture
def audit_hub(tmp_path: Path, first_n: int) -> AuditHub:
    return AuditHub.from_config(audit_section(tmp_path, summary={"window_s": 1, "first_n": first_n}))


@pytest.fixture
def queue_wait_s() -> float:
    return FLOW["tenant_max_queue_wait_s"]


@pytest.fixture
def config_overrides(queue_wait_s: float) -> dict[str, Any]:
    return {"flow": {**FLOW, "tenant_max_queue_wait_s": queue_wait_s}}


def _post(stack: Any, token: str, max_tokens: int) -> asyncio.Future[Any]:
    return asyncio.ensure_future(stack.client.post(
        "/v1/completions", json={"model": "sim-model", "prompt": PROMPT, "max_tokens": max_tokens},
        headers={"Authorization": f"Bearer {token}"}))


def _refusals(tmp: Path) -> list[dict[str, Any]]:
    return [e for e in jsonl_events(tmp) if e["kind"] != "summary" and e.get("error_code") in CODES]


async def test_each_flow_refusal_is_audited_with_its_code_and_queue_figures(stack: Any, tmp_path: Path) -> None:
    flow, a, b = stack.components.flow, stack.token("tenant-a/app"), stack.token("tenant-b/app")
    b1 = _post(stack, b, 400)  # fills the one replica's room for ~20 s
    await wait_for(lambda: stack.components.router.loads.snapshot("r0").running_requests == 1, timeout_s=10)
    b2 = _post(stack, b, 4)  # queued: b has 2 requests in flight, its cap
    await wait_for(lambda: flow.tenant_queued("tenant-b") == 1, timeout_s=10)
    r = await _post(stack, b, 4)
    assert r.status_code == 429 and r.json()["error"]["code"] == "in_flight_limited"
    a1 = _post(stack, a, 4)
    await wait_for(lambda: flow.tenant_queued("tenant-a") == 1, timeout_s=10)
    r = await _post(stack, a, 4)
    assert r.status_code == 429 and r.json()["error"]["code"] == "queue_full"
    r1, r2 = await asyncio.gather(a1, b2)
    assert {x.json()["error"]["code"] for x in (r1, r2)} == {"queue_timeout"}
    b1.cancel()
    await asyncio.gather(b1, return_exceptions=True)
    await wait_for(lambda: len(_refusals(tmp_path)) == 4, timeout_s=10, what="4 refusals audited")
    by = {}
    for e in _refusals(tmp_path):
        assert e["outcome"] == "rate_limited" and e["status_code"] == 429, e
        by.setdefault((e["tenant"], e["error_code"]), []).append(e)
    assert sorted(by) == [("tenant-a", "queue_full"), ("tenant-a", "queue_timeout"),
                          ("tenant-b", "in_flight_limited"), ("tenant-b", "queue_timeout")], sorted(by)
    cap = by[("tenant-b", "in_flight_limited")][0]  # refused before the policy: its code is the reason code
    assert cap["policy"] == {"reason_code": "in_flight_limited", "reason": "2 in flight (bound 2)"}
    full = by[("tenant-a", "queue_full")][0]
    assert full["policy"] == {"reason_code": "queue_full", "reason": "1 queued (bound 1), wait bound 0.5 s"}
    assert full["latency"]["queue_wait_ms"] == 0.0 and isinstance(full["route"]["virtual_tokens"], float)
    for tid in ("tenant-a", "tenant-b"):
        waited = by[(tid, "queue_timeout")][0]
        assert waited["latency"]["queue_wait_ms"] >= 450.0, waited["latency"]
        assert waited["policy"]["reason_code"] == "allowed"  # the policy had allowed it; the wait refused it
        assert isinstance(waited["route"]["virtual_tokens"], float)


# the queued long request must not time out (a 429 queue_timeout, counted by the summary too)
# while a loaded machine sends the flood: only the flood's 429s are accounted below
@pytest.mark.parametrize(("first_n", "queue_wait_s"), [(2, 60.0)])
async def test_a_flood_of_429s_is_aggregated_by_the_summary(stack: Any, tmp_path: Path) -> None:
    b = stack.token("tenant-b/app")
    long_b = [_post(stack, b, 400) for _ in range(2)]  # running + queued: b at its cap of 2
    await wait_for(lambda: stack.components.overload.tenant_in_flight.get("tenant-b") == 2, timeout_s=10)
    n = 30
    answers = await asyncio.gather(*[_post(stack, b, 4) for _ in range(n)])
    assert [x.json()["error"]["code"] for x in answers] == ["in_flight_limited"] * n
    for t in long_b:
        t.cancel()
    await asyncio.gather(*long_b, return_exceptions=True)

    def summaries() -> list[dict[str, Any]]:
        return [e for e in jsonl_events(tmp_path) if e["kind"] == "summary"]

    def accounted() -> int:
        flood = [e for e in _refusals(tmp_path) if e["error_code"] == "in_flight_limited"]
        return len(flood) + sum(e["summary"].get("count_rate_limited", 0) for e in summaries())

    try:
        await wait_for(lambda: accounted() == n, timeout_s=10)  # every refusal: an event or a count
    except AssertionError:
        rl = [(e["tenant"], e.get("error_code")) for e in jsonl_events(tmp_path) if e["outcome"] == "rate_limited"]
        raise AssertionError(f"accounted {accounted()} of {n}; summaries {[e['summary'] for e in summaries()]}; "
                             f"individual 429s {rl}") from None
    individual = [e for e in _refusals(tmp_path) if e["error_code"] == "in_flight_limited"]
    windows = {e["summary"]["window_start"] for e in summaries()}
    assert windows and len(individual) <= 2 * len(windows) < n  # first_n per source and window, the rest counted
    assert {e["client_address"] for e in summaries()} == {"127.0.0.1"}
