"""R4-4, R4-5, R4-6: every answer the gateway app produces with an audit event carries its
``X-Request-Id`` (equal to the event's ``request_id``), requests to unknown paths or with a
wrong method are audited with the caller's tenant and identity, and the routes are matched on
the raw path: an encoded slash (``/v1/chat%2Fcompletions``) answers 404 like any other
non-exact path, on the public and the admin listener."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.support.audit_log import ListLog, audit_hub, audit_log  # noqa: F401 - fixtures

TD = "demo.prefixgate.test"
CHAT = {"model": "sim-model", "max_tokens": 4, "messages": [{"role": "user", "content": "hello"}]}


def by_request_id(log: ListLog, rid: str | None) -> Any:
    assert rid, "answer without X-Request-Id"
    found = [e for e in log.events if getattr(e, "request_id", None) == rid]
    assert len(found) == 1, f"{len(found)} events with request_id {rid}"
    return found[0]


@pytest.mark.parametrize("case", ["bad_field", "unknown_model", "no_token", "bad_json"])
async def test_inference_refusals_carry_their_events_request_id(stack: Any, audit_log: ListLog, case: str) -> None:
    headers = {} if case == "no_token" else stack.auth("tenant-a/app")
    if case == "bad_json":
        r = await stack.client.post("/v1/chat/completions", headers=headers, content=b"{not json")
    else:
        body = dict(CHAT, temperature="hot") if case == "bad_field" else dict(
            CHAT, model="no-such-model") if case == "unknown_model" else CHAT
        r = await stack.client.post("/v1/chat/completions", headers=headers, json=body)
    assert 400 <= r.status_code < 500
    ev = by_request_id(audit_log, r.headers.get("x-request-id"))
    assert ev.status_code == r.status_code


async def test_models_refusal_carries_request_id(stack: Any, audit_log: ListLog) -> None:
    r = await stack.client.get("/v1/models")
    assert r.status_code == 401
    assert by_request_id(audit_log, r.headers.get("x-request-id")).status_code == 401


async def test_success_answer_keeps_request_id(stack: Any, audit_log: ListLog) -> None:
    r = await stack.client.post("/v1/chat/completions", headers=stack.auth("tenant-a/app"), json=CHAT)
    assert r.status_code == 200
    assert by_request_id(audit_log, r.headers.get("x-request-id")).outcome.value == "allowed"


@pytest.mark.parametrize("method,path,status", [
    ("GET", "/v1/chat/completions", 405), ("PUT", "/v1/completions", 405), ("DELETE", "/v1/models", 405),
    ("POST", "/v1/nothing", 404), ("POST", "/v1/chat/completions/", 404),
])
async def test_unrouted_requests_are_audited_with_tenant(stack: Any, audit_log: ListLog, method: str, path: str,
                                                         status: int) -> None:
    r = await stack.client.request(method, path, headers=stack.auth("tenant-b/app"))
    assert r.status_code == status
    ev = by_request_id(audit_log, r.headers.get("x-request-id"))
    assert ev.status_code == status
    assert ev.tenant == "tenant-b"
    assert ev.identity.spiffe_id == f"spiffe://{TD}/tenant-b/app"
    assert ev.outcome.value == "rejected"
    assert ev.endpoint == "unrouted"  # the path is client-chosen: never in the log


async def test_unrouted_request_without_token_is_audited_unauthenticated(stack: Any, audit_log: ListLog) -> None:
    r = await stack.client.post("/v1/nothing-here")
    assert r.status_code == 404
    ev = by_request_id(audit_log, r.headers.get("x-request-id"))
    assert ev.tenant is None and ev.identity.spiffe_id is None


@pytest.mark.parametrize("path", ["/v1/chat%2Fcompletions", "/v1/chat%2fcompletions", "/v1%2Fcompletions",
                                  "/v1/%63ompletions", "/v1/models%2F"])
async def test_encoded_paths_answer_404(stack: Any, audit_log: ListLog, path: str) -> None:
    method = "GET" if "models" in path else "POST"
    raw = httpx.URL(stack.url + path)
    assert raw.raw_path.decode() == path  # httpx sends it as written
    r = await stack.client.request(method, raw, headers=stack.auth("tenant-a/app"), json=CHAT)
    assert r.status_code == 404, r.text
    assert by_request_id(audit_log, r.headers.get("x-request-id")).tenant == "tenant-a"


@pytest.mark.parametrize("path", ["/admin%2Fmetrics", "/admin/%6detrics", "/admin/replicas%2F"])
async def test_admin_encoded_paths_answer_404(stack: Any, path: str) -> None:
    ok = await stack.client.get(f"{stack.admin_url}/admin/metrics", headers=stack.operator_auth())
    assert ok.status_code == 200
    r = await stack.client.get(httpx.URL(stack.admin_url + path), headers=stack.operator_auth())
    assert r.status_code == 404, r.text


async def test_admin_refusal_carries_request_id(stack: Any, audit_log: ListLog) -> None:
    r = await stack.client.get(f"{stack.admin_url}/admin/metrics", headers=stack.auth("tenant-a/app"))
    assert r.status_code in (401, 403)
    assert by_request_id(audit_log, r.headers.get("x-request-id")).status_code == r.status_code
