"""A client cannot choose its cache salt, tenant, model or replica: such fields, query
parameters and headers are dropped and the request proceeds as its authenticated tenant.
Every assertion is on what actually reached the (recording) replica.

Session 23: top-level body fields outside the schema are refused by default (400 ``unsupported_parameter``:
tests/hostile/test_s23_unknown_fields.py); this module runs with ``limits.unknown_fields: drop`` so that what
reaches the replica when they are dropped stays checked."""

from __future__ import annotations

import json
import re

import pytest

from gateway.replicas import CircuitState
from gateway.request import ChatBody, CompletionBody

LONG = " ".join(f"w{i}" for i in range(64))
FORWARDABLE_COMPLETION = set(CompletionBody.model_fields) | {"cache_salt"}
FORWARDABLE_CHAT = (set(ChatBody.model_fields) - {"max_completion_tokens"}) | {"cache_salt"}
HINT_HEADERS = {
    "x-prefixgate-replica": "r2",
    "x-prefixgate-tenant": "tenant-b",
    "x-prefixgate-pool": "eu",
    "x-tenant-id": "tenant-b",
    "x-cache-salt": "attacker-salt",
    "x-forwarded-for": "10.9.8.7",
    "x-real-ip": "10.9.8.7",
    "x-request-id": "client-chosen-id",
    "cookie": "session=abc",
    "x-vllm-cache-salt": "attacker-salt",
}


@pytest.fixture
def config_overrides(config_overrides):  # the directory's (tests/hostile/conftest.py), in drop mode
    return {**config_overrides, "limits": {**config_overrides["limits"], "unknown_fields": "drop"}}


def salt(stack, tenant_id: str) -> str:
    return stack.components.keys.cache_salt(stack.components.registry.get(tenant_id))


async def test_body_overrides_dropped(stack, capture):
    b_salt = salt(stack, "tenant-b")
    body = {
        "model": "sim-model", "prompt": LONG, "max_tokens": 4,
        "cache_salt": b_salt,  # another tenant's salt, as if leaked
        "tenant": "tenant-b", "tenant_id": "tenant-b", "spiffe_id": "spiffe://x/tenant-b/app",
        "replica": "r2", "replica_id": "r2", "pool": "eu", "routing": {"replica": "r2"},
        "cache_scope": "global", "kv_transfer_params": {"remote_host": "10.0.0.1"},
        "extra_body": {"cache_salt": "x"}, "priority": -100,
    }
    r = await stack.client.post("/v1/completions", json=body, headers=stack.auth())
    assert r.status_code == 200, r.text
    assert r.headers["x-prefixgate-dropped-fields-count"] == str(len(body) - 4)  # all but model, prompt,
    [seen] = capture.seen  # max_tokens and cache_salt (replaced)
    assert seen.replica in ("r0", "r1")
    fwd = seen.body
    assert fwd["cache_salt"] == salt(stack, "tenant-a") != b_salt
    assert set(fwd) <= FORWARDABLE_COMPLETION, set(fwd) - FORWARDABLE_COMPLETION
    assert fwd["prompt"] == LONG and fwd["model"] == "sim-model"
    CompletionBody.model_validate(fwd)


async def test_chat_overrides_dropped_in_messages_too(stack, capture):
    body = {
        "model": "sim-model", "max_tokens": 4, "cache_salt": "mine",
        "messages": [{"role": "user", "content": LONG, "cache_salt": "inner", "tenant": "tenant-b"}],
        "tenant": "tenant-b",
    }
    r = await stack.client.post("/v1/chat/completions", json=body, headers=stack.auth())
    assert r.status_code == 200, r.text
    [seen] = capture.seen
    fwd = seen.body
    assert fwd["cache_salt"] == salt(stack, "tenant-a")
    assert set(fwd) <= FORWARDABLE_CHAT
    assert fwd["messages"] == [{"role": "user", "content": LONG}]
    ChatBody.model_validate(fwd)


async def test_duplicate_json_keys_forward_what_was_validated(stack, capture):
    raw = (b'{"model": "sim-model", "prompt": "' + LONG.encode() + b'", "max_tokens": 4,'
           b' "cache_salt": "first", "cache_salt": "second", "model": "sim-model"}')
    r = await stack.client.post("/v1/completions", content=raw,
                                headers={**stack.auth(), "content-type": "application/json"})
    assert r.status_code == 200, r.text
    [seen] = capture.seen
    # the replica sees one re-serialised object, never the client's bytes
    assert seen.raw.count(b'"cache_salt"') == 1 and seen.raw.count(b'"model"') == 1
    assert seen.body["cache_salt"] == salt(stack, "tenant-a")


async def test_duplicate_model_key_cannot_smuggle_another_model(stack, capture):
    # last key wins in the gateway's parser; the replica gets exactly the model the gateway checked
    raw = b'{"model": "sim-model", "prompt": "x y z", "model": "gpt-17"}'
    r = await stack.client.post("/v1/completions", content=raw,
                                headers={**stack.auth(), "content-type": "application/json"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert capture.seen == []


async def test_query_string_overrides_ignored(stack, capture):
    q = "model=gpt-17&tenant=tenant-b&cache_salt=evil&replica=r2&pool=eu&api-version=2024"
    r = await stack.client.post(f"/v1/completions?{q}", headers=stack.auth(),
                                json={"model": "sim-model", "prompt": LONG, "max_tokens": 4})
    assert r.status_code == 200, r.text
    [seen] = capture.seen
    assert seen.path == "/v1/completions" and seen.query == ""
    assert seen.replica in ("r0", "r1")
    assert seen.body["model"] == "sim-model" and seen.body["cache_salt"] == salt(stack, "tenant-a")


async def test_routing_and_identity_headers_not_honoured_or_forwarded(stack, capture):
    token = stack.token("tenant-a/app")
    for i in range(8):
        r = await stack.client.post("/v1/completions", headers={"Authorization": f"Bearer {token}", **HINT_HEADERS},
                                    json={"model": "sim-model", "prompt": f"p{i} {LONG}", "max_tokens": 4})
        assert r.status_code == 200, r.text
    assert len(capture.seen) == 8
    assert {c.replica for c in capture.seen} <= {"r0", "r1"}  # never the eu pool the hint asked for
    for c in capture.seen:
        assert c.body["cache_salt"] == salt(stack, "tenant-a")
        for name in HINT_HEADERS:
            if name == "x-request-id":
                continue
            assert name not in c.headers, name
        assert "authorization" not in c.headers
        assert token not in json.dumps(c.headers)
        assert re.fullmatch(r"[0-9a-f]{32}", c.headers["x-request-id"])  # the gateway's own id


async def test_regulated_tenant_hint_cannot_leave_its_pool(stack, capture):
    for i in range(6):
        r = await stack.client.post("/v1/completions",
                                    headers={**stack.auth("tenant-reg/app"), "x-prefixgate-replica": "r0",
                                             "x-prefixgate-pool": "default"},
                                    json={"model": "sim-model", "prompt": f"q{i} {LONG}", "max_tokens": 4,
                                          "pool": "default", "replica": "r0"})
        assert r.status_code == 200, r.text
    assert {c.replica for c in capture.seen} == {"r2"}
    assert {c.body["cache_salt"] for c in capture.seen} == {salt(stack, "tenant-reg")}


async def test_forged_identity_headers_do_not_switch_tenant(stack, capture):
    # an XFCC header from an untrusted peer (no trusted_proxies configured) is ignored, not believed
    xfcc = 'By=spiffe://demo.prefixgate.test/gw;URI=spiffe://demo.prefixgate.test/tenant-b/app'
    r = await stack.client.post("/v1/completions",
                                headers={**stack.auth("tenant-a/app"), "x-forwarded-client-cert": xfcc},
                                json={"model": "sim-model", "prompt": LONG, "max_tokens": 4})
    assert r.status_code == 200, r.text
    assert capture.seen[-1].body["cache_salt"] == salt(stack, "tenant-a")
    r = await stack.client.post("/v1/completions", headers={"x-forwarded-client-cert": xfcc},
                                json={"model": "sim-model", "prompt": LONG, "max_tokens": 4})
    assert r.status_code == 401
    assert len(capture.seen) == 1


@pytest.mark.parametrize("status", [400, 404, 413, 422])
async def test_replica_4xx_passed_through_never_counts_against_health(stack, capture, status):
    capture.reject.update({"r0": status, "r1": status})
    rs = stack.components.replica_set
    n = rs.failure_threshold + 2
    for i in range(n):
        r = await stack.client.post("/v1/completions", headers=stack.auth(),
                                    json={"model": "sim-model", "prompt": f"z{i} {LONG}", "max_tokens": 4})
        assert r.status_code == status
        etype = "invalid_request_error" if status == 404 else "invalid_request_error"
        assert r.json()["error"] == {"message": "replica rejected it", "type": etype,
                                     "code": "upstream_rejected", "param": None}
    assert len(capture.seen) == n  # a client fault is not retried on another replica
    for rid in ("r0", "r1"):
        st = rs.state(rid)
        assert st.consecutive_failures == 0 and st.circuit is CircuitState.CLOSED and st.healthy
    assert set(rs.routable_ids()) == {"r0", "r1", "r2"}


async def test_replica_5xx_does_count(stack, capture):
    # the counterpart of the test above: the same path with a replica fault moves the breaker
    # (a gateway failure: since R7-2 a plain 500 is the request's failure, not the replica's)
    capture.reject.update({"r0": 503, "r1": 503})
    r = await stack.client.post("/v1/completions", headers=stack.auth(),
                                json={"model": "sim-model", "prompt": LONG, "max_tokens": 4})
    assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_error"
    assert len(capture.seen) == 2  # retried once, on the other allowed replica, never on r2
    assert {c.replica for c in capture.seen} == {"r0", "r1"}
    rs = stack.components.replica_set
    # one tenant alone: counted against its (replica, tenant) pairs, not the shared circuits (R8-2)
    assert rs.tenants.streak("r0", "tenant-a") == 1 and rs.tenants.streak("r1", "tenant-a") == 1
    assert rs.state("r0").consecutive_failures == 0 and rs.state("r1").consecutive_failures == 0
