"""Issues 14 and 16: a plain answer's settlement and audit event run just before the answer's last
body part (issue 16: an answered request's event must be in the audit worker's pipe before the
client has the answer); what it holds (in-flight count, lease, load ticket, breaker attempt) is given
back, and its metrics counted, right after that part's send returns, in the same step (session 10:
off the critical path); all of it exactly once, however the call ended, before the next request
on that event loop."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from gateway.app import build_public_app
from tests.conftest import TD, Stack
from tests.gateway.test_s2_record_after_send import _scope
from tests.support.spies import log_calls

BODY = json.dumps({"model": "sim-model", "prompt": "one two three", "max_tokens": 2}).encode()


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
        if message["type"] == "http.response.body" and not message.get("more_body"):  # next: any other task
            asyncio.get_running_loop().call_soon(
                lambda: log.append(f"next turn in flight {stack.components.overload.in_flight}"))

    try:
        await app(_scope("/v1/completions", headers), receive, send)
    except OSError:
        assert fail_send


@pytest.fixture
def spied(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    gw = stack.components
    log: list[str] = []
    log_calls(gw.admission, "settle", log, "settled", monkeypatch)
    log_calls(gw.audit, "emit_request", log, "recorded", monkeypatch)
    log_calls(gw.audit, "hand_off", log, "handed off", monkeypatch)
    return log


async def test_answer_is_sent_before_the_request_ends(stack: Stack, spied: list[str]) -> None:
    """The user-visible contract, not the order inside one step: the event is settled, recorded
    and handed to the worker before the last body part goes out; the in-flight count (and with it
    the lease, ticket and attempt, given back together) is still held while that part is handed
    to the server and is 0 when its send returns, before the event loop runs anything else
    (``next turn``): a sequential client's next request can never find it taken. Giving it back
    after the send keeps ~10 µs off the answer's critical path (issue 14, session 10)."""
    await _serve(stack, spied, stack.auth())
    assert spied[:5] == ["http.response.start in flight 1", "settled", "recorded", "handed off",
                         "http.response.body in flight 1"]
    assert stack.components.overload.in_flight == 0  # right after the call, in the same step
    await asyncio.sleep(0)
    assert spied[5:] == ["next turn in flight 0"]


async def test_refusal_is_sent_before_the_request_ends(stack: Stack, spied: list[str]) -> None:
    await _serve(stack, spied, {})
    # a refusal gives its in-flight count back at once, before its answer (which may wait for an
    # unread body to drain) is sent (review R3-1); its record still follows the answer's start
    assert spied[:3] == ["http.response.start in flight 0", "recorded", "handed off"]
    assert spied[3].startswith("http.response.body")
    assert stack.components.overload.in_flight == 0


async def test_request_ends_once_when_the_answer_cannot_be_sent(stack: Stack, spied: list[str]) -> None:
    await _serve(stack, spied, stack.auth(), fail_send=True)
    assert spied == ["send failed", "settled", "recorded"]  # no last part: the timer hands it off
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

    before = sum(cal.observations(r.id) for r in stack.components.replica_set.all())
    await app(_scope("/v1/completions", stack.auth()), receive, send)
    assert seen == [0, 0]  # session 16 (A15-2): a plain answer's first byte is observed after it went out
    assert cal.pending == 0
    assert sum(cal.observations(r.id) for r in stack.components.replica_set.all()) == before + 1
