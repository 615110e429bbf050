"""The session-4 refusals end to end through the gateway app: status, JSON error body (code,
param) and one audit event with the answer's X-Request-Id and status (R4-1 content parts,
R4-2 long integers, R4-12 echo + logprobs)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.audit_log import ListLog, audit_hub, audit_log  # noqa: F401 - fixtures

TD = "demo.prefixgate.test"
_PARTS = [{"type": "text", "text": ""}] * 5000
CASES = {
    "content_parts": ("/v1/chat/completions",
                      {"model": "sim-model", "messages": [{"role": "user", "content": _PARTS}]},
                      "too_many_content_parts"),
    "long_integer": ("/v1/chat/completions",
                     {"model": "sim-model", "messages": [{"role": "user", "content": "x"}],
                      "tools": [{"type": "function", "function": {"name": "f", "parameters": {"n": 10 ** 30}}}]},
                     "number_too_long"),
    "echo_logprobs": ("/v1/completions",
                      {"model": "sim-model", "prompt": "x", "echo": True, "logprobs": 2, "max_tokens": 1},
                      "prompt_logprobs_not_allowed"),
}


@pytest.mark.parametrize("case", sorted(CASES))
async def test_refusal_has_error_body_and_audit_event(stack: Any, audit_log: ListLog, case: str) -> None:
    path, body, code = CASES[case]
    r = await stack.client.post(path, headers=stack.auth("tenant-a/app"), json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == code
    rid = r.headers.get("x-request-id")
    events = [e for e in audit_log.events if getattr(e, "request_id", None) == rid]
    assert rid and len(events) == 1
    assert events[0].status_code == 400
