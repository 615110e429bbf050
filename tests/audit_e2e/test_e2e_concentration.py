"""Against the running app: concentration alerts from the gateway's ConcentrationMonitor.

Thresholds are the monitor's defaults relative to the router's bounded-load factor
c (a replica share above c/n), with short windows from the audit config's
``concentration`` sub-section. A hot-prefix workload with the cache-aware router's
load guard turned off concentrates on one replica and raises a
``replica_concentration`` alert; the real Mooncake trace replayed (time-scaled)
with the guard on raises none.
"""
from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from e2e_helpers import TD, audit_section, jsonl_events  # noqa: E402

from gateway.auditing import AuditHub  # noqa: E402
from sim.replay import ReplayConfig, replay  # noqa: E402
from sim.replica import ReplicaConfig  # noqa: E402
from sim.trace import DEFAULT_TRACE_PATH, assign_tenants, load_mooncake  # noqa: E402

TIME_SCALE = float(os.environ.get("PG_CONC_TIME_SCALE", "10"))
ROWS = int(os.environ.get("PG_CONC_ROWS", "300"))
# short windows for a test; the thresholds stay the defaults (share c/n, HHI 0.5)
CONCENTRATION = {"window_s": 3.0, "hold_s": 2.0, "min_requests": 20}
# the hot-prefix test's window holds every request of a run of any speed (session 17): with 3 s, waves
# slowed past ~20 requests per 3 s never reached min_requests (no alert), and the share judged depended
# on how the waves fell against the window. Its 16 waves of 5 are judged from the 20th request on (4
# waves); the 12 waves after it take at least 12 x 0.2 s > hold_s, so the raise comes while requests run
HOT_CONCENTRATION = {**CONCENTRATION, "window_s": 60.0}
TENANTS = [
    {"id": t, "spiffe_ids": [f"spiffe://{TD}/{t}/"], "models": ["sim-model"], "pools": ["default"],
     "max_output_tokens": 256}
    for t in ("tenant-a", "tenant-b")
]
GUARD_ON: dict[str, Any] = {"routing": {"policy": "cache_aware", "block_size": 16}}
GUARD_OFF: dict[str, Any] = {"routing": {"policy": {"name": "cache_aware", "guard_tokens": False,
                                                    "max_request_factor": 1000.0}, "block_size": 16}}


@pytest.fixture
def n_replicas() -> int:
    return 6  # r0..r4 pool default, r5 pool eu


@pytest.fixture
def replica_cfg() -> ReplicaConfig:
    return ReplicaConfig(time_scale=TIME_SCALE, stream_chunk_tokens=16)


@pytest.fixture
def config_overrides(request: pytest.FixtureRequest) -> dict[str, Any]:
    # the PDP's 50 ms default budget fails closed (503) now and then on a loaded 2-core CI box
    return {**request.param, "tenancy": {"tenants": TENANTS}, "policy": {"timeout_s": 1.0}}


@pytest.fixture
def concentration() -> dict[str, Any]:
    """The audit config's ``concentration`` sub-section (a test may parametrize its own)."""
    return CONCENTRATION


@pytest.fixture
def audit_hub(tmp_path: Path, concentration: dict[str, Any]) -> AuditHub:
    hub = AuditHub.from_config(audit_section(tmp_path, concentration=concentration), router_factor=1.25)
    # what the gateway should do from its replica config (reported to the lead: components.py)
    hub.monitor.set_pool_members("default", [f"r{i}" for i in range(5)])
    hub.monitor.set_pool_members("eu", ["r5"])
    return hub


def _alerts(tmp: Path, kind: str | None = None) -> list[dict[str, Any]]:
    return [e for e in jsonl_events(tmp) if e["kind"] == "alert" and e["alert"]["alert_kind"] != "audit_spill_full"
            and (kind is None or e["alert"]["alert_kind"] == kind)]


@pytest.mark.parametrize("concentration", [HOT_CONCENTRATION])
@pytest.mark.parametrize("config_overrides", [GUARD_OFF], indirect=True)
async def test_hot_prefix_without_load_guard_raises_alert(stack, tmp_path: Path) -> None:
    hot = " ".join(f"sys{i}" for i in range(320))  # 20 shared KV blocks
    headers = stack.auth("tenant-a/app")

    async def one(i: int) -> int:
        body = {"model": "sim-model", "prompt": f"{hot} question {i} " + " ".join(f"q{i}x{j}" for j in range(20)),
                "max_tokens": 8}
        return (await stack.client.post("/v1/completions", headers=headers, json=body)).status_code

    for wave in range(16):
        statuses = await asyncio.gather(*(one(wave * 5 + k) for k in range(5)))
        assert set(statuses) == {200}
        await asyncio.sleep(0.2)
    # the policy's input now (its pending checks run first): read before the log, which then holds every
    # raise and clear up to this set (no request comes after it, nothing else evaluates the windows)
    active = {a["id"] for a in stack.components.audit.active_alerts() if a["kind"] == "replica_concentration"}
    await stack.components.audit.log.drain()
    events = _alerts(tmp_path, "replica_concentration")
    raised = [a for a in events if a["outcome"] == "raised"]
    assert raised
    # once per episode: a second raise of the same alert only after it was cleared (a loaded machine can
    # stretch the waves' gaps past the window: two episodes, each raised once)
    state: dict[str, str] = {}
    for a in events:
        assert state.get(a["alert"]["alert_id"]) != a["outcome"], a
        state[a["alert"]["alert_id"]] = a["outcome"]
    # the FIRST raise judges the guard-off routing: every request in its window was routed while no alert
    # was active. Once it is raised, the shipped policy steers the tenant off that replica (rego/authz.rego
    # alerted_replicas), so later raises (the replica the prefix moved to, then both holding it and sharing
    # the load) and clears depend on how the waves fall against the window (session 17: a later raise's
    # 0.877 and an alert cleared before the end failed this test on loaded machines)
    alert = raised[0]["alert"]
    assert alert["pool"] == "default" and alert["replica"] in {f"r{i}" for i in range(5)}
    # c/n = 1.25/5 plus the sampling margin of a window of 20..80 requests; the event rounds to 4 decimals
    # (a raise at exactly 20 requests: 0.540474 written 0.5405)
    bound = round(1.25 / 5 + 3 * (0.25 * 0.75 / 20) ** 0.5, 4)
    assert 1.25 / 5 < alert["threshold"] <= bound and alert["value"] > 0.9
    # the policy's input holds exactly the alerts raised and not cleared since
    assert active == {i for i, outcome in state.items() if outcome == "raised"}, (active, state)


# the per-tenant CPU budget (R5-8/R6-1) is not this test's subject: on a loaded CI machine the
# thread CPU of tokenizing the trace's long prompts grows and a few requests were refused
# 429 cpu_budget_exhausted (session 10 CI), which says nothing about the load guard
@pytest.mark.parametrize("config_overrides", [{**GUARD_ON, "limits": {"refused_cpu_ms_per_s": None}}], indirect=True)
async def test_real_trace_with_load_guard_raises_none(stack, tmp_path: Path) -> None:
    reqs = load_mooncake(DEFAULT_TRACE_PATH, ROWS)
    tenants = assign_tenants(reqs, ["tenant-a", "tenant-b"], seed=0)
    tokens = {t: stack.auth(f"{t}/replay") for t in ("tenant-a", "tenant-b")}
    cfg = ReplayConfig(base_url=stack.url, time_scale=TIME_SCALE, max_tokens_cap=64, total_timeout_s=60)
    result = await replay(reqs, cfg, tenants, headers_for=lambda t: tokens[t])
    codes = [e["policy"].get("reason_code") for e in jsonl_events(tmp_path) if e.get("status_code", 200) != 200]
    assert not result.errors_by_kind(), (result.errors_by_kind(), codes)
    await stack.components.audit.log.drain()
    alerts = [(a["outcome"], a["alert"]) for a in _alerts(tmp_path)]
    assert not alerts, alerts
    assert stack.components.audit.active_alerts() == []
