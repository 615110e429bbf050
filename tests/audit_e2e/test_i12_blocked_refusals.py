"""Issue 12, finding 1, end to end: blocked refusals reach the audit trail in aggregate.

The gateway (real audit log: JSONL chain + OCSF file, summaries on with a 1 s
window) has a budget of 40 failed signature checks per source. 60
bad-signature tokens and then 40 fresh valid tokens are sent from one source
behind a trusted proxy (``X-Forwarded-For``): every 429
``too_many_unauthenticated`` is counted in a summary event of the attested
client address, and none is written individually.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from e2e_helpers import audit_section, jsonl_events, wait_for  # noqa: E402

from gateway.auditing import AuditHub  # noqa: E402
from sim.spiffe_issuer import DemoIssuer  # noqa: E402

TD = "demo.prefixgate.test"
TENANT = f"spiffe://{TD}/tenant-a/app"
CLIENT = "198.51.100.77"


@pytest.fixture
def n_replicas() -> int:
    return 1


@pytest.fixture
def audit_hub(tmp_path: Path) -> AuditHub:
    return AuditHub.from_config(audit_section(tmp_path, summary={"window_s": 1, "first_n": 5}))


@pytest.fixture
def config_overrides() -> dict[str, Any]:
    return {"identity": {"trusted_proxies": ["127.0.0.1/32"], "unauthenticated_rps": 0.01,
                         "unauthenticated_burst": 40}}


async def test_blocked_refusals_are_summarised_per_attested_source(stack: Any, tmp_path: Path) -> None:
    forger = DemoIssuer(TD)
    statuses = []
    for i in range(60):
        tok = forger.mint(TENANT, "prefixgate", headers={"kid": stack.issuer.kid}, jti=f"bad-{i}")
        r = await stack.client.get("/v1/models", headers={"Authorization": f"Bearer {tok}",
                                                          "X-Forwarded-For": CLIENT})
        statuses.append(r.status_code)
    for i in range(40):
        r = await stack.client.get("/v1/models", headers={"Authorization": f"Bearer {stack.token(jti=f'f{i}')}",
                                                          "X-Forwarded-For": CLIENT})
        statuses.append(r.status_code)
    n_blocked = statuses.count(429)
    assert n_blocked >= 60, statuses  # 20 bad + 40 fresh, at least

    def counted() -> int:
        return sum(e["summary"].get("count_too_many_unauthenticated", 0)
                   for e in jsonl_events(tmp_path) if e["kind"] == "summary")

    await wait_for(lambda: counted() == n_blocked, timeout_s=10)
    events = jsonl_events(tmp_path)
    individual = [e for e in events if e.get("policy", {}).get("reason_code") == "too_many_unauthenticated"
                  and e["kind"] != "summary"]
    assert individual == []
    summaries = [e for e in events if e["kind"] == "summary" and "count_too_many_unauthenticated" in e["summary"]]
    assert {e["client_address"] for e in summaries} == {CLIENT}
    # one summary per source per window
    assert len(summaries) == len({e["summary"]["window_start"] for e in summaries})
