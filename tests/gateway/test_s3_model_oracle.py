"""R3-7: a model served for another tenant and a model nobody serves get the same answer
(404 ``model_not_found``, same body, refused at the same step), so the answer confirms no
other tenant's private model names; the audit event keeps the true reason."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.errors import GatewayError
from tests.support.audit_log import ListLog, audit_hub, audit_log  # noqa: F401 - fixtures

TD = "demo.prefixgate.test"
PRIVATE = "globex-merger-ft-2027"


@pytest.fixture
def config_overrides() -> dict[str, Any]:
    """tenant-b (globex) is also entitled to a private fine-tune; tenant-a (acme) is not."""
    return {"models": ["sim-model", PRIVATE], "tenancy": {"tenants": [
        {"id": "tenant-a", "spiffe_ids": [f"spiffe://{TD}/tenant-a/"], "models": ["sim-model"], "pools": ["default"]},
        {"id": "tenant-b", "spiffe_ids": [f"spiffe://{TD}/tenant-b/"], "models": ["sim-model", PRIVATE],
         "pools": ["default"]},
    ]}}


def request_events(log: ListLog) -> list[Any]:
    return [e for e in log.events if e.request_id]


@pytest.mark.parametrize("endpoint", ["/v1/chat/completions", "/v1/completions"])
async def test_other_tenants_model_answers_as_unknown(stack: Any, audit_log: ListLog, endpoint: str) -> None:
    def body(model: str) -> dict[str, Any]:
        if endpoint == "/v1/chat/completions":
            return {"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "hello"}]}
        return {"model": model, "max_tokens": 4, "prompt": "hello"}

    acme = stack.auth("tenant-a/app")
    private = await stack.client.post(endpoint, headers=acme, json=body(PRIVATE))
    unknown = await stack.client.post(endpoint, headers=acme, json=body("nonexistent-model"))
    assert private.status_code == unknown.status_code == 404
    assert private.content == unknown.content
    assert private.json()["error"]["code"] == "model_not_found"
    assert {k: v for k, v in private.headers.items() if k not in ("date", "x-request-id")} == \
        {k: v for k, v in unknown.headers.items() if k not in ("date", "x-request-id")}
    # the owner is served
    ok = await stack.client.post(endpoint, headers=stack.auth("tenant-b/app"), json=body(PRIVATE))
    assert ok.status_code == 200, ok.text
    ev_private, ev_unknown, ev_ok = request_events(audit_log)
    # the audit keeps the true reason; both refusals happen before the prompt is read or the policy asked
    assert (ev_private.outcome.value, ev_private.policy.reason_code, ev_private.model) == \
        ("denied", "model_not_entitled", PRIVATE)
    assert ev_unknown.policy.reason_code == "model_not_found" and ev_unknown.model is None
    for ev in (ev_private, ev_unknown):
        assert ev.status_code == 404 and ev.error_code == "model_not_found"
        assert ev.policy.decision_id is None and ev.prompt_tokens is None
    assert ev_ok.outcome.value == "allowed"


def test_policy_deny_for_entitlement_answers_as_unknown() -> None:
    """A policy stricter than the registry (its own ``model_not_entitled`` deny) gets the same body."""
    from gateway.pep import PolicyEnforcementPoint
    from policy.decision import Decision

    deny = Decision(allow=False, reason_code="model_not_entitled", reason="tenant is not entitled",
                    allowed_replicas=None, allowed_pools=None, max_tokens=None, decision_id="d1")
    with pytest.raises(GatewayError) as info:
        PolicyEnforcementPoint.enforce(deny)
    err = info.value
    assert (err.status, err.code, err.body()) == (404, "model_not_found", {"error": {
        "message": "the requested model does not exist", "type": "invalid_request_error", "code": "model_not_found",
        "param": "model"}})
    assert err.outcome == "denied"
