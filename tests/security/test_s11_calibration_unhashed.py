"""R10-3 through the gateway: a chat request with parts the router counts but does not hash (``tools``,
``response_format``: their prefill is not what the router predicted) does not feed the replica's
prefill-rate calibration; a plain one feeds its own tenant's fit, not a shared one."""

from __future__ import annotations

import json
from typing import Any

from tests.conftest import Stack

TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "x" * 200,
                                           "parameters": {"type": "object", "properties": {}}}}]


def _chat(**extra: Any) -> bytes:
    return json.dumps({"model": "sim-model", "messages": [{"role": "user", "content": "one two three"}],
                       "max_tokens": 2, **extra}).encode()


async def _observations(stack: Stack) -> int:
    cal = stack.components.calibration
    assert cal is not None  # cache_aware calibrates by default
    return sum(cal.observations(r.id) for r in stack.components.replica_set.all())


async def _post(stack: Stack, body: bytes) -> None:
    r = await stack.client.post("/v1/chat/completions", content=body,
                                headers={**stack.auth(), "content-type": "application/json"})
    assert r.status_code == 200, r.text


async def test_unhashed_parts_leave_the_calibration_alone(stack: Stack) -> None:
    before = await _observations(stack)
    await _post(stack, _chat(tools=TOOLS))
    await _post(stack, _chat(response_format={"type": "json_object"}))
    assert await _observations(stack) == before  # before session 11: before + 2
    await _post(stack, _chat())
    assert await _observations(stack) == before + 1


async def test_a_plain_request_feeds_its_tenants_own_fit(stack: Stack) -> None:
    cal = stack.components.calibration
    assert cal is not None
    await _post(stack, _chat())
    ids = [r.id for r in stack.components.replica_set.all()]
    assert sum(cal.estimator(rid, "tenant-a").samples for rid in ids) == 1
    assert sum(cal.estimator(rid, "").samples for rid in ids) == 0
