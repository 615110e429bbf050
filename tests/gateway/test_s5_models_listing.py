"""R5-4: a successful ``GET /v1/models`` is audited (one event, outcome ``allowed``, the caller's
tenant and identity, endpoint ``/v1/models``), carries that event's ``X-Request-Id`` like every
other answer, and costs one request unit of the tenant's rate limit (the inference routes' bucket:
a listing flood is refused 429 like an inference flood, and the two share the budget). It takes no
concurrency slot, and like the inference routes it is refused while the audit trail does not accept."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.audit_log import ListLog, audit_hub, audit_log  # noqa: F401 - fixtures

TD = "demo.prefixgate.test"
CHAT = {"model": "sim-model", "max_tokens": 4, "messages": [{"role": "user", "content": "hello"}]}


@pytest.fixture
def n_replicas() -> int:
    return 1


@pytest.fixture
def config_overrides() -> dict[str, Any]:
    # tenant-c: two requests, then (practically) no refill for the test's duration
    tenants = [
        {"id": "tenant-a", "spiffe_ids": [f"spiffe://{TD}/tenant-a/"], "models": ["sim-model"], "pools": ["default"]},
        {"id": "tenant-c", "spiffe_ids": [f"spiffe://{TD}/tenant-c/"], "models": ["sim-model"],
         "pools": ["default"], "rate_rps": 0.001, "rate_burst": 2, "max_concurrency": 1},
    ]
    return {"tenancy": {"tenants": tenants}}


def events_with(log: ListLog, rid: str | None) -> list[Any]:
    assert rid, "answer without X-Request-Id"
    return [e for e in log.events if getattr(e, "request_id", None) == rid]


async def test_successful_listing_is_audited_and_carries_its_request_id(stack: Any, audit_log: ListLog) -> None:
    r = await stack.client.get("/v1/models", headers=stack.auth("tenant-a/app"))
    assert r.status_code == 200
    assert [m["id"] for m in r.json()["data"]] == ["sim-model"]
    (ev,) = events_with(audit_log, r.headers.get("x-request-id"))
    assert ev.outcome.value == "allowed"
    assert ev.status_code == 200
    assert ev.endpoint == "/v1/models"
    assert ev.tenant == "tenant-a"
    assert ev.identity.spiffe_id == f"spiffe://{TD}/tenant-a/app"


async def test_listing_costs_one_request_unit_and_no_slot(stack: Any, audit_log: ListLog) -> None:
    c = stack.auth("tenant-c/app")
    for _ in range(2):
        ok = await stack.client.get("/v1/models", headers=c)
        assert ok.status_code == 200
    assert stack.components.admission.limiter.in_flight("tenant-c") == 0  # no slot held after the answer
    limited = await stack.client.get("/v1/models", headers=c)
    assert limited.status_code == 429
    assert limited.json()["error"]["code"] == "rate_limited"
    assert "retry-after" in limited.headers
    (ev,) = events_with(audit_log, limited.headers.get("x-request-id"))
    assert ev.outcome.value == "rate_limited" and ev.tenant == "tenant-c" and ev.endpoint == "/v1/models"
    # the same bucket as the inference routes: the listings used it up
    chat = await stack.client.post("/v1/chat/completions", headers=c, json=CHAT)
    assert chat.status_code == 429
    # another tenant is not affected
    other = await stack.client.get("/v1/models", headers=stack.auth("tenant-a/app"))
    assert other.status_code == 200


async def test_inference_uses_the_budget_listing_draws_from(stack: Any) -> None:
    c = stack.auth("tenant-c/app")
    for _ in range(2):
        r = await stack.client.post("/v1/chat/completions", headers=c, json=CHAT)
        assert r.status_code == 200, r.text
    r = await stack.client.get("/v1/models", headers=c)
    assert r.status_code == 429


async def test_listing_fails_closed_without_audit_trail(stack: Any, audit_log: ListLog) -> None:
    audit_log.accepting = False  # type: ignore[misc] - the trail stops accepting events
    r = await stack.client.get("/v1/models", headers=stack.auth("tenant-a/app"))
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "audit_unavailable"
    assert r.headers.get("x-request-id")
    # an inference request is refused the same way (the behaviour the listing follows)
    chat = await stack.client.post("/v1/chat/completions", headers=stack.auth("tenant-a/app"), json=CHAT)
    assert chat.status_code == 503
