"""R6-4 end to end: 403 refusals are aggregated like 401/400/429 ones. A burst of ``not_an_operator``
(a tenant workload's admin-audience token on the admin listener) and of ``unknown_workload`` (a
workload of the trusted domain mapped to no tenant, on the public listener) is in the signed JSONL
chain as ``first_n`` individual events per identity plus one summary of the rest (counts per
outcome, status and code). Before session 6: one individual event per request."""

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
N = 12
FIRST_N = 3


@pytest.fixture
def n_replicas() -> int:
    return 1


@pytest.fixture
def audit_hub(tmp_path: Path) -> AuditHub:
    return AuditHub.from_config(audit_section(tmp_path, summary={"window_s": 1, "first_n": FIRST_N}))


@pytest.mark.parametrize("which", ["not_an_operator", "unknown_workload"])
async def test_denied_flood_is_summarised(stack: Any, tmp_path: Path, which: str) -> None:
    if which == "not_an_operator":
        workload = "tenant-a/app"
        url, auth = f"{stack.admin_url}/admin/replicas", {
            "Authorization": f"Bearer {stack.token(workload, 'prefixgate-admin')}"}
    else:
        workload = "nobody/app"
        url, auth = "/v1/chat/completions", stack.auth(workload)
    body = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    for _ in range(N):
        r = await (stack.client.get(url, headers=auth) if which == "not_an_operator"
                   else stack.client.post(url, json=body, headers=auth))
        assert r.status_code == 403, r.text
    spiffe = f"spiffe://{TD}/{workload}"

    def summaries() -> list[dict[str, Any]]:
        return [e for e in jsonl_events(tmp_path)
                if e["kind"] == "summary" and e["summary"].get(f"count_code_{which}")]

    await wait_for(lambda: summaries(), timeout_s=15)
    individual = [e for e in jsonl_events(tmp_path) if e["kind"] != "summary" and e.get("outcome") == "denied"
                  and (e.get("identity") or {}).get("spiffe_id") == spiffe]
    assert len(individual) == FIRST_N  # before R6-4's fix: N
    (s,) = summaries()
    assert s["identity"]["spiffe_id"] == spiffe
    assert s["summary"]["suppressed"] == N - FIRST_N
    assert s["summary"]["count_denied"] == N - FIRST_N
    assert s["summary"]["count_status_403"] == N - FIRST_N
    assert s["summary"][f"count_code_{which}"] == N - FIRST_N
