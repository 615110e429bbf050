"""Session 17, helper attack (S17-6): a policy upload acknowledged while a request it denies waits in
the flow-control queue.

The pipeline (gateway/pipeline.py) asks the policy once, before the request waits for its fair turn
and a replica with room (``flow.release``, up to ``flow.tenant_max_queue_wait_s``, 60 s by default).
An operator who puts a workload on the deny-list gets 200 and every *new* request of that workload is
refused at once (the decision cache is cleared: that holds), but the requests it already queued are
dispatched to a replica afterwards, on the old decision (its replicas, pools and token cap too).
A tenant that expects to be cut off can queue up to ``flow.tenant_max_queued_requests`` (128) first.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support import flow
from tests.support.flow import one_running_one_queued, post, queued
from tests.support.policy_store import policy_store_section

WORKLOADS = "/admin/data/prefixgate/config/workloads"
DENIED = "spiffe://demo.prefixgate.test/tenant-a/app"


replica_cfg, n_replicas = flow.replica_cfg, flow.n_replicas  # this module's stack: one slow replica


@pytest.fixture
def config_overrides(tmp_path: Path) -> dict[str, Any]:
    return {"flow": {"replica_max_running_requests": 1}, "policy": policy_store_section(tmp_path)}


async def _deny(stack: Any) -> None:
    r = await stack.client.put(f"{stack.admin_url}{WORKLOADS}", content=json.dumps({"denied": [DENIED]}),
                               headers={**stack.operator_auth(), "Content-Type": "application/json"})
    assert r.status_code == 200, r.text


async def test_a_new_request_after_the_upload_is_denied(stack: Any) -> None:
    """What holds: a decision cached before the upload is not used for a request that arrives after."""
    r = await post(stack, 1)
    assert r.status_code == 200  # allowed and cached
    await _deny(stack)
    r = await post(stack, 1)
    assert r.status_code == 403 and r.json()["error"]["code"] == "workload_denied"


async def test_a_queued_request_is_not_dispatched_after_a_deny_upload(stack: Any) -> None:
    first, second = await one_running_one_queued(stack, 40)  # the first holds the replica ~2 s
    try:
        await _deny(stack)
        assert queued(stack) == 1  # still waiting when the upload was acknowledged
        r = await second
        assert r.status_code == 403, (r.status_code, r.text[:200])
    finally:
        first.cancel()
        second.cancel()
