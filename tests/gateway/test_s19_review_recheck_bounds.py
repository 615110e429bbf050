"""Session 19 review of the re-decision after a registry reload (gateway/pep_recheck.py ``decide_again``,
after the R18-2/R18-3 fixes).

S19-R6: ``decide_again`` derives again from the tenant now its tenant, entitlement (``check_request``),
pools, policy decision, output cap, ``usage_cached_tokens`` and ``forward_user``, but not the tenant's
per-request bounds (``Admission.request_bounds``: ``max_prompt_tokens``, ``max_prompt_bytes``,
``max_messages``, ``max_batch_prompts``; gateway/pipeline.py computes them once, before the parse). A
reload that lowers a tenant's ``max_prompt_tokens`` holds for a fresh request (400
``context_length_exceeded``) but not for one queued before it: it is sent to the replica with the prompt
the tenant may no longer send (prefill cost the operator just bounded). The docstring of ``decide_again``
promises "the same 404/400 as a fresh request"; R18-2's comment says "what the pipeline derived from the
tenant at arrival, derived again from the tenant now".
"""
from __future__ import annotations

from typing import Any

import pytest

from tests.gateway.test_s18_recheck_registry import queued_through, reload, tenant_a
from tests.support import flow
from tests.support import audit_log as audit_fixtures
from tests.support.flow import HOLD_UNTIL_CANCELLED

audit_log, audit_hub = audit_fixtures.audit_log, audit_fixtures.audit_hub  # the stack on a ListLog

replica_cfg, n_replicas = flow.replica_cfg, flow.n_replicas  # one slow replica


@pytest.fixture
def config_overrides() -> dict[str, Any]:
    return {**HOLD_UNTIL_CANCELLED, "flow": {"replica_max_running_requests": 1}}


async def test_a_prompt_bound_lowered_while_queued_refuses_the_queued_request(stack: Any) -> None:
    async def lower(st: Any) -> None:
        await reload(st, tenant_a(max_prompt_tokens=8))  # flow.PROMPT: 40 words, more than 8 tokens

    _, r = await queued_through(stack, lower, fresh=False)
    fresh = await stack.client.post("/v1/completions", json={"model": "sim-model", "prompt": flow.PROMPT,
                                                             "max_tokens": 20}, headers=stack.auth())
    assert fresh.status_code == 400 and fresh.json()["error"]["code"] == "context_length_exceeded"
    assert r.status_code == 400, f"the queued request was sent with the prompt the tenant may no longer send: " \
                                 f"{r.status_code}"
