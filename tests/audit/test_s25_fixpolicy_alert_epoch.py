"""Session 25, S25-newcomer-5: a concentration alert event carries its observation time as a time.

``alert.observed_at_s`` is the monitor's monotonic clock (seconds since boot on Linux: 68793.789 is not a time
of day). It stays; the gateway's alert events now also carry ``alert.observed_at_epoch_s``, the same instant in
Unix seconds (the event's wall time minus the observation's age on the monotonic clock). Additive: the
audit schema version is unchanged.

Before: no ``observed_at_epoch_s`` in the JSONL chain's alert events (the gateway emitted the monitor's event
as it was).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from audit.alert_epoch import with_observed_epoch
from audit.event import SCHEMA_VERSION, AuditEvent, Kind, Outcome
from gateway.auditing import AuditHub

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "audit_e2e"))
from e2e_helpers import audit_section, jsonl_events  # noqa: E402


def _alert(observed_at_s: object, time_ms: int = 1_764_800_000_000) -> AuditEvent:
    return AuditEvent(kind=Kind.ALERT, outcome=Outcome.RAISED, time_ms=time_ms,
                      alert={"alert_id": "pool_concentration:default:", "alert_kind": "pool_concentration",
                             "pool": "default", "value": 0.9, "threshold": 0.5, "observed_at_s": observed_at_s})


def test_the_epoch_time_is_the_event_time_minus_the_observations_age() -> None:
    stamped = with_observed_epoch(_alert(68793.789), monotonic_now_s=68796.289)
    assert stamped.alert is not None and stamped.alert["observed_at_epoch_s"] == 1_764_799_997.5
    assert stamped.alert["observed_at_s"] == 68793.789                # kept as it was
    later = with_observed_epoch(_alert(68800.0), monotonic_now_s=68796.289)
    assert later.alert is not None and later.alert["observed_at_epoch_s"] == 1_764_800_000.0  # never after the event
    for other in (_alert("x"), _alert(True), AuditEvent(kind=Kind.OPERATOR, outcome=Outcome.SUCCEEDED)):
        assert with_observed_epoch(other, 1.0) is other
    assert json.loads(stamped.to_json())["alert"]["observed_at_epoch_s"] == 1_764_799_997.5


async def test_the_gateways_alert_events_carry_observed_at_epoch_s(tmp_path: Path) -> None:
    hub = AuditHub.from_config(audit_section(tmp_path, concentration={"window_s": 60.0, "hold_s": 1.0,
                                                                      "min_requests": 4, "eval_interval_s": 0}),
                               router_factor=1.25)
    assert hub.monitor is not None
    hub.monitor.set_pool_members("default", ["r0", "r1", "r2"])
    await hub.start()
    try:
        wall0, mono0 = time.time(), time.monotonic()
        for i in range(40):                                           # every request on r0, over 2 s of the clock
            hub.monitor.observe("default", "r0", 100, 100, 0, mono0 - 2.0 + i * 0.05, tenant="tenant-a")
        wall1, mono1 = time.time(), time.monotonic()
        assert await hub.log.drain()
    finally:
        await hub.close()
    alerts = [e for e in jsonl_events(tmp_path) if e["kind"] == "alert"]
    assert alerts and all(e["schema_version"] == SCHEMA_VERSION for e in alerts)
    for e in alerts:
        observed = e["alert"]["observed_at_s"]
        assert mono0 - 2.0 <= observed <= mono0                       # the monotonic reading, as before
        # wall - monotonic is one offset: bounded by the readings taken around the run (1 ms rounding)
        low, high = wall0 - mono1 + observed - 0.001, wall1 - mono0 + observed + 0.001
        assert low <= e["alert"]["observed_at_epoch_s"] <= high, e["alert"]
