"""Session 7, R6-4 (open part): requests with a valid JWT-SVID whose identity the listener does not
serve (no tenant on the public listener, not an operator on the admin one) had no budget: each
answered 403 at ~0.11 ms, unlimited. Now they take from a per-source bucket
(``identity.unmapped_rps`` / ``unmapped_burst``); a source that spent it gets 429
``too_many_unmapped`` with ``Retry-After``, audited (rate_limited, aggregated). Mapped identities
from the same source never touch the bucket."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.audit_log import ListLog, audit_hub, audit_log  # noqa: F401 - fixtures
from tests.support.waiting import wait_for

BURST = 3
CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.fixture
def n_replicas() -> int:
    return 1


@pytest.fixture
def config_overrides() -> dict[str, Any]:
    return {"identity": {"unmapped_rps": 0.001, "unmapped_burst": BURST}}


async def test_unmapped_identities_spend_a_per_source_budget_on_the_public_listener(
        stack: Any, audit_log: ListLog) -> None:  # noqa: F811
    stranger = stack.auth("stranger/app")  # valid token, trust domain known, no tenant
    for _ in range(BURST):
        r = await stack.client.post("/v1/chat/completions", json=CHAT, headers=stranger)
        assert r.status_code == 403 and r.json()["error"]["code"] == "unknown_workload"
    r = await stack.client.post("/v1/chat/completions", json=CHAT, headers=stranger)
    assert r.status_code == 429, r.text  # before: 403 again, without end
    assert r.json()["error"]["code"] == "too_many_unmapped" and int(r.headers["retry-after"]) >= 1
    r = await stack.client.get("/v1/models", headers=stranger)
    assert r.status_code == 429
    # a tenant's workload at the same address is served
    ok = await stack.client.post("/v1/chat/completions", json=CHAT, headers=stack.auth())
    assert ok.status_code == 200, ok.text
    rid = r.headers["x-request-id"]
    await wait_for(lambda: any(getattr(e, "request_id", None) == rid and e.error_code == "too_many_unmapped"
                               for e in audit_log.events), what="the 429 audited")


async def test_non_operators_spend_a_per_source_budget_on_the_admin_listener(stack: Any) -> None:
    not_operator = {"Authorization": f"Bearer {stack.token('tenant-a/app', 'prefixgate-admin')}"}
    url = f"{stack.admin_url}/admin/metrics"
    for _ in range(BURST):
        r = await stack.client.get(url, headers=not_operator)
        assert r.status_code == 403 and r.json()["error"]["code"] == "not_an_operator"
    r = await stack.client.get(url, headers=not_operator)
    assert r.status_code == 429 and r.json()["error"]["code"] == "too_many_unmapped"
    assert (await stack.client.get(url, headers=stack.operator_auth())).status_code == 200
