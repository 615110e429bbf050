"""R4-3 end to end: tenant A's refusals from a shared address (here: loopback, as behind a NAT)
do not use up tenant B's per-window budget of individual events; the summary of A's suppressed
refusals names A, its SPIFFE ID and counts per status and reason code, in the JSONL chain and
(its tenant) in the OCSF file. Also R4-4: an authenticated request to an unknown path is audited."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from e2e_helpers import audit_section, jsonl_events, wait_for  # noqa: E402

from gateway.auditing import AuditHub  # noqa: E402

TD = "demo.prefixgate.test"
BAD = {"model": "sim-model", "temperature": "hot", "messages": [{"role": "user", "content": "x"}]}


@pytest.fixture
def n_replicas() -> int:
    return 1


@pytest.fixture
def audit_hub(tmp_path: Path) -> AuditHub:
    return AuditHub.from_config(audit_section(tmp_path, summary={"window_s": 1, "first_n": 5}))


async def test_one_tenants_refusals_do_not_silence_another(stack: Any, tmp_path: Path) -> None:
    acme, globex = stack.auth("tenant-a/app"), stack.auth("tenant-b/app")
    for _ in range(7):
        r = await stack.client.post("/v1/chat/completions", headers=acme, json=BAD)
        assert r.status_code == 400
    victim = await stack.client.post("/v1/chat/completions", headers=globex,
                                     json={"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]})
    assert victim.status_code == 404
    unrouted = await stack.client.post("/v1/nothing", headers=globex)
    assert unrouted.status_code == 404

    def summaries() -> list[dict[str, Any]]:
        return [e for e in jsonl_events(tmp_path) if e["kind"] == "summary"]

    await wait_for(lambda: any(s["summary"].get("tenant") == "tenant-a" for s in summaries()), timeout_s=15)
    events = jsonl_events(tmp_path)
    by_rid = {e.get("request_id"): e for e in events}
    assert by_rid[victim.headers["x-request-id"]]["tenant"] == "tenant-b"
    assert by_rid[victim.headers["x-request-id"]]["status_code"] == 404
    assert by_rid[unrouted.headers["x-request-id"]]["endpoint"] == "unrouted"
    (acme_summary,) = [s for s in summaries() if s["summary"].get("tenant") == "tenant-a"]
    assert acme_summary["tenant"] == "tenant-a"
    assert acme_summary["identity"]["spiffe_id"] == f"spiffe://{TD}/tenant-a/app"
    assert acme_summary["summary"]["suppressed"] == 2
    assert acme_summary["summary"]["count_status_400"] == 2
    assert acme_summary["summary"]["emitted_individually"] == 5
    assert any(k.startswith("count_code_") for k in acme_summary["summary"])
