"""Issue 14, session 10: a routed request's work that neither the routing decision nor the upstream
request needs (the policy's lower reservation, the record's prefix fingerprint, the audit event's
span part) runs after the upstream request was written and before its answer is read, i.e. while
the replica works; every security decision still comes before the upstream request; a request
refused before it reached a replica still gets all of it in its record."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

import gateway.pipeline as pipeline
from gateway.admission_answers import clamp_output
from gateway.app import build_public_app
from gateway.replica_attempt import Attempt
from gateway.upstream_conn import UpstreamConnection
from tests.conftest import Stack
from tests.gateway.test_s2_record_after_send import _scope
from tests.support.spies import log_answer_bytes, log_calls

BODY = json.dumps({"model": "sim-model", "prompt": "one two three four five six seven eight nine ten eleven "
                   "twelve thirteen fourteen fifteen sixteen seventeen", "max_tokens": 2}).encode()


async def _serve(stack: Stack, log: list[str]) -> None:
    app = build_public_app(stack.components, manage_lifecycle=False)
    messages = [{"type": "http.request", "body": BODY, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    async def send(message: dict[str, Any]) -> None:
        log.append(message["type"])
        if message["type"] == "http.response.body" and not message.get("more_body"):
            asyncio.get_running_loop().call_soon(log.append, "next turn")  # anything else runs from here on

    await app(_scope("/v1/completions", stack.auth()), receive, send)


@pytest.fixture
def spied(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    gw = stack.components
    log: list[str] = []
    log_calls(gw.pep, "decide_now", log, "decided", monkeypatch)  # s16: the pipeline calls decide_now
    log_calls(gw.admission, "lower_reservation", log, "lowered", monkeypatch)
    log_calls(gw.audit, "prepare_request", log, "prepared", monkeypatch)
    log_calls(gw.audit, "emit_request", log, "recorded", monkeypatch)
    log_calls(UpstreamConnection, "send", log, "upstream written", monkeypatch)
    log_answer_bytes(log, monkeypatch)
    return log


async def test_bookkeeping_runs_while_the_replica_works(stack: Stack, spied: list[str]) -> None:
    """On a kept-alive upstream connection (a new one is opened first: the work runs while it
    connects, still after the decision)."""
    for _ in range(4):  # a kept-alive connection to each replica
        await _serve(stack, spied)
    assert spied.index("decided") < spied.index("lowered")
    await asyncio.sleep(0)
    spied.clear()
    await _serve(stack, spied)
    # the decision before the upstream request; the bookkeeping after it, before the answer is read
    assert spied[:6] == ["decided", "upstream written", "lowered", "prepared", "answer bytes",
                         "http.response.start"], spied
    assert spied[-1] == "http.response.body"
    assert spied.count("lowered") == 1 and spied.count("prepared") == 1
    assert spied.index("recorded") < spied.index("http.response.body")


async def test_feedback_from_the_answer_is_given_before_the_loop_runs_anything_else(
        stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    """Flow control's output charge (the tenant's fair share), the router's delivered-prefix
    feedback and the replica's success verdict (circuit breaker) run after the last body part's
    send, but in the same step: before any other task."""
    gw = stack.components
    assert gw.flow is not None  # on by default
    log: list[str] = []
    log_calls(gw.flow, "charge_output", log, "charged", monkeypatch)
    log_calls(gw.router, "observe_delivered", log, "observed", monkeypatch)
    log_calls(gw.audit, "emit_request", log, "recorded", monkeypatch)
    log_calls(Attempt, "succeeded", log, "verdict", monkeypatch)
    await _serve(stack, log)
    await asyncio.sleep(0)
    body = log.index("http.response.body")
    assert log.index("recorded") < body < log.index("charged") < log.index("next turn"), log
    assert body < log.index("verdict") < log.index("next turn") and log.count("verdict") == 1
    if "observed" in log:  # the replica reported cached tokens
        assert body < log.index("observed") < log.index("next turn")


async def test_refused_after_the_keys_keeps_its_fingerprint(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    gw = stack.components
    recs: list[tuple[Any, ...]] = []
    real_emit = gw.audit.emit_request

    def emit(rec: Any) -> None:
        recs.append((rec.status, rec.error_code, rec.prefix_fingerprint))
        real_emit(rec)

    monkeypatch.setattr(gw.audit, "emit_request", emit)
    real_candidates = gw.replica_set.candidates
    monkeypatch.setattr(gw.replica_set, "candidates", lambda pools, tenant_id: [])  # refused before the policy
    headers = {**stack.auth(), "content-type": "application/json"}
    r = await stack.client.post("/v1/completions", content=BODY, headers=headers)
    assert r.status_code == 503
    monkeypatch.setattr(gw.replica_set, "candidates", real_candidates)
    r = await stack.client.post("/v1/completions", content=BODY, headers=headers)
    assert r.status_code == 200
    (_, code, refused_fp), (_, _, served_fp) = sorted(recs, key=lambda x: x[0], reverse=True)
    assert code == "no_replica"
    # the same prompt of the same tenant: the same fingerprint, on the refusal (worked out at its end)
    # and on the served request (worked out while the replica worked)
    assert refused_fp is not None and len(refused_fp) == 16
    assert refused_fp == served_fp


async def test_policy_lowered_hold_is_what_the_request_settles(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    """The policy's lower ``max_tokens``, applied to the ledger while the replica works, is in the
    reservation before the request settles: the settlement's reserved output is the lowered one."""
    gw = stack.components
    seen: list[Any] = []
    real_emit = gw.audit.emit_request

    def emit(rec: Any) -> None:
        seen.append((rec.max_tokens, rec.settlement))
        real_emit(rec)

    monkeypatch.setattr(gw.audit, "emit_request", emit)
    clamps: list[Any] = []

    def clamp(*args: Any) -> int:  # the clamp after the decision (session 19: called directly) lowers to 1
        clamps.append(args)
        return clamp_output(*args) if len(clamps) == 1 else 1

    monkeypatch.setattr(pipeline, "clamp_output", clamp)
    r = await stack.client.post("/v1/completions", content=BODY,
                                headers={**stack.auth(), "content-type": "application/json"})
    assert r.status_code == 200, r.text
    (max_tokens, settlement), = seen
    assert max_tokens == 1
    assert settlement is not None and settlement.reserved_output == 1
