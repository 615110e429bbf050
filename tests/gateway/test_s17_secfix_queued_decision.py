"""Session 17, helper secfix (S17-6): a request leaving the flow queue after a policy change is decided again
(gateway/pep_recheck.py) and the new decision is enforced: a lower token cap is sent upstream and recorded;
a request queued with no change between is dispatched on its first decision (the generation did not move)."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from gateway.pep_recheck import with_max_tokens
from tests.support import flow
from tests.support.flow import HOLD_UNTIL_CANCELLED, HOLDING_TOKENS, one_running_one_queued, post, queued, running
from tests.support.policy_store import policy_store_section
from tests.support.waiting import wait_for

TIERS = "/admin/data/prefixgate/config/tiers"

replica_cfg, n_replicas = flow.replica_cfg, flow.n_replicas  # one slow replica


@pytest.fixture
def config_overrides(tmp_path: Path) -> dict[str, Any]:
    return {**HOLD_UNTIL_CANCELLED, "flow": {"replica_max_running_requests": 1},
            "policy": {**policy_store_section(tmp_path), **HOLD_UNTIL_CANCELLED["policy"]}}


async def test_a_queued_request_takes_a_lowered_token_cap(stack: Any) -> None:
    # the first request holds the replica's only running slot until cancelled (however slow the machine):
    # the second is still queued when the upload is acknowledged
    first = post(stack, HOLDING_TOKENS, timeout=None)
    await wait_for(lambda: running(stack) == 1 or first.done(), 60, what="first request running")
    assert not first.done()
    second = post(stack, 20, timeout=None)
    try:
        await wait_for(lambda: queued(stack) == 1 or second.done(), 60, what="second request queued")
        assert not second.done()
        gen = stack.components.pdp.generation
        r = await stack.client.put(f"{stack.admin_url}{TIERS}",
                                   content=json.dumps({"standard": {"max_tokens": 3}, "premium": {"max_tokens": 3}}),
                                   headers={**stack.operator_auth(), "Content-Type": "application/json"})
        assert r.status_code == 200, r.text
        assert stack.components.pdp.generation > gen and queued(stack) == 1
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        r = await second
        assert r.status_code == 200, r.text[:200]
        assert r.json()["usage"]["completion_tokens"] <= 3  # asked 20: the new cap was sent upstream
    finally:
        first.cancel()
        second.cancel()


async def test_a_queued_request_without_a_change_keeps_its_decision(stack: Any) -> None:
    first, second = await one_running_one_queued(stack, 30)
    try:
        gen = stack.components.pdp.generation
        r = await second
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 20
        assert stack.components.pdp.generation == gen
    finally:
        first.cancel()
        second.cancel()


def test_the_cap_is_rewritten_in_the_queued_bytes_and_in_a_dict() -> None:
    assert with_max_tokens(b'{"model":"m","max_tokens":20,"stream":false}', 3) == \
        b'{"model":"m","max_tokens":3,"stream":false}'
    assert with_max_tokens({"model": "m", "max_tokens": 20}, 3) == {"model": "m", "max_tokens": 3}
