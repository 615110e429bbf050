"""Issues 14 and 16: a plain answer's end (lease, load ticket, breaker attempt, reservation) and
its audit event run just before the answer's last body part (issue 16: an answered request's
event must be in the audit worker's pipe before the client has the answer), its metrics after;
all of it exactly once, however the call ended, before the next request on that event loop."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.app import build_public_app
from tests.conftest import TD, Stack
from tests.gateway.test_s2_record_after_send import _scope

BODY = json.dumps({"model": "sim-model", "prompt": "one two three", "max_tokens": 2}).encode()


def _spy(obj: Any, name: str, log: list[str], label: str, monkeypatch: pytest.MonkeyPatch) -> None:
    real = getattr(obj, name)

    def spy(*a: Any, **kw: Any) -> Any:
        log.append(label)
        return real(*a, **kw)

    monkeypatch.setattr(obj, name, spy)


async def _serve(stack: Stack, log: list[str], headers: dict[str, str], fail_send: bool = False) -> None:
    app = build_public_app(stack.components, manage_lifecycle=False)
    messages = [{"type": "http.request", "body": BODY, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    async def send(message: dict[str, Any]) -> None:
        if fail_send:
            log.append("send failed")
            raise OSError("client gone")
        log.append(f"{message['type']} in flight {stack.components.overload.in_flight}")

    try:
        await app(_scope("/v1/completions", headers), receive, send)
    except OSError:
        assert fail_send


@pytest.fixture
def spied(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    gw = stack.components
    log: list[str] = []
    _spy(gw.admission, "settle", log, "settled", monkeypatch)
    _spy(gw.audit, "emit_request", log, "recorded", monkeypatch)
    return log


async def test_answer_is_sent_before_the_request_ends(stack: Stack, spied: list[str]) -> None:
    await _serve(stack, spied, stack.auth())
    assert spied == ["http.response.start in flight 1", "settled", "recorded", "http.response.body in flight 0"]
    assert stack.components.overload.in_flight == 0


async def test_refusal_is_sent_before_the_request_ends(stack: Stack, spied: list[str]) -> None:
    await _serve(stack, spied, {})
    # a refusal gives its in-flight count back at once, before its answer (which may wait for an
    # unread body to drain) is sent (review R3-1); its record still follows the answer's start
    assert spied[:2] == ["http.response.start in flight 0", "recorded"]
    assert spied[2].startswith("http.response.body")
    assert stack.components.overload.in_flight == 0


async def test_request_ends_once_when_the_answer_cannot_be_sent(stack: Stack, spied: list[str]) -> None:
    await _serve(stack, spied, stack.auth(), fail_send=True)
    assert spied == ["send failed", "settled", "recorded"]
    assert stack.components.overload.in_flight == 0


def _one_slot_tenant() -> list[dict[str, Any]]:
    return [{"id": "tenant-a", "spiffe_ids": [f"spiffe://{TD}/tenant-a/"], "models": ["sim-model"],
             "pools": ["default"], "max_output_tokens": 400, "max_concurrency": 1}]


@pytest.mark.parametrize("config_overrides", [
    {"tenancy": {"tenants": _one_slot_tenant()}},
    {"tenancy": {"tenants": _one_slot_tenant()}, "flow": {"enabled": False}},
])
async def test_one_slot_tenant_sequential(stack: Stack) -> None:
    for _ in range(20):
        r = await stack.client.post("/v1/completions", content=BODY,
                                    headers={**stack.auth(), "content-type": "application/json"})
        assert r.status_code == 200, r.text
    assert stack.components.limiter.in_flight("tenant-a") == 0


async def test_calibration_fit_is_updated_after_the_answer(stack: Stack) -> None:
    cal = stack.components.calibration
    assert cal is not None  # cache_aware calibrates by default
    seen: list[int] = []
    app = build_public_app(stack.components, manage_lifecycle=False)
    messages = [{"type": "http.request", "body": BODY, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    async def send(message: dict[str, Any]) -> None:
        seen.append(cal.pending)

    before = sum(cal._estimator(r.id).samples for r in stack.components.replica_set.all())
    await app(_scope("/v1/completions", stack.auth()), receive, send)
    assert seen == [1, 1]  # the first byte's observation waits while the answer goes out
    assert cal.pending == 0
    assert sum(cal.estimator(r.id).samples for r in stack.components.replica_set.all()) == before + 1
