"""R5-4 end to end: a burst of successful ``GET /v1/models`` from one tenant is in the signed JSONL
chain as ``first_n`` individual events plus one summary of the rest (tenant, identity, counts per
outcome and status, ``top_endpoint``), as the authenticated 404s are (R4-4)."""

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


@pytest.fixture
def n_replicas() -> int:
    return 1


@pytest.fixture
def audit_hub(tmp_path: Path) -> AuditHub:
    return AuditHub.from_config(audit_section(tmp_path, summary={"window_s": 1, "first_n": 5}))


async def test_listing_flood_is_summarised(stack: Any, tmp_path: Path) -> None:
    rids = []
    for _ in range(8):
        r = await stack.client.get("/v1/models", headers=stack.auth("tenant-a/app"))
        assert r.status_code == 200
        rids.append(r.headers["x-request-id"])

    def summaries() -> list[dict[str, Any]]:
        return [e for e in jsonl_events(tmp_path) if e["kind"] == "summary"]

    await wait_for(lambda: any(s["summary"].get("top_endpoint") == "/v1/models" for s in summaries()),
                   timeout_s=15)
    listed = [e for e in jsonl_events(tmp_path) if e.get("request_id") in set(rids)]
    assert len(listed) == 5
    assert all(e["outcome"] == "allowed" and e["status_code"] == 200 and e["tenant"] == "tenant-a"
               for e in listed)
    (s,) = [s for s in summaries() if s["summary"].get("top_endpoint") == "/v1/models"]
    assert s["tenant"] == "tenant-a"
    assert s["identity"]["spiffe_id"] == f"spiffe://{TD}/tenant-a/app"
    assert s["summary"]["suppressed"] == 3
    assert s["summary"]["count_allowed"] == 3
    assert s["summary"]["count_status_200"] == 3
