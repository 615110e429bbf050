"""One audit event per request outcome, with the documented fields and no secrets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.auditing import AuditHub
from tests.support.audit_log import file_audit_hub

CANARY = "canaryzebra"
PROMPT = " ".join([CANARY] + [f"w{i}" for i in range(100)])


@pytest.fixture
def audit_hub(tmp_path: Path) -> AuditHub:
    return file_audit_hub(tmp_path)


def _events(tmp: Path) -> list[dict]:
    out = []
    for f in sorted((tmp / "audit").glob("*.jsonl")):
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("type") == "event":
                out.append(rec["body"])
    return out


async def test_every_outcome_audited_without_secrets(stack):
    token = stack.token()
    ok = await stack.client.post("/v1/completions", headers={"Authorization": f"Bearer {token}"},
                                 json={"model": "sim-model", "prompt": PROMPT, "max_tokens": 4})
    assert ok.status_code == 200
    bad = await stack.client.post("/v1/completions", headers={"Authorization": f"Bearer {token}"},
                                  content=b"{nope", )
    assert bad.status_code == 400
    unauth = await stack.client.post("/v1/completions", headers={"Authorization": "Bearer eyJhbGciOiJub25lIn0.e30."},
                                     json={"model": "sim-model", "prompt": PROMPT})
    assert unauth.status_code == 401
    denied = await stack.client.post("/v1/completions", headers=stack.auth("stranger/x"),
                                     json={"model": "sim-model", "prompt": PROMPT})
    assert denied.status_code == 403
    await stack.components.audit.log.drain()
    events = [e for e in _events(stack.tmp) if e.get("request_id")]
    by_outcome = {e["outcome"]: e for e in events}
    assert {"allowed", "rejected", "unauthenticated", "denied"} <= set(by_outcome)
    assert len(events) == 4  # exactly one event per request
    allowed = by_outcome["allowed"]
    assert allowed["tenant"] == "tenant-a" and allowed["route"]["replica"] in ("r0", "r1")
    assert allowed["policy"]["decision_id"] and allowed["prompt_tokens"] == 101
    assert allowed["identity"]["spiffe_id"].endswith("/tenant-a/app") and allowed["trace_id"]
    # never prompt text, bearer tokens or keys in any file the run wrote
    blob = "".join(p.read_text(errors="replace") for p in stack.tmp.rglob("*") if p.is_file() and p.suffix != ".key")
    assert CANARY not in blob
    assert token not in blob and token.split(".")[1] not in blob
