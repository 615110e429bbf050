"""R3-14 with ``state.backend: redis``: the tenant id travels with each shared
concentration observation, so every instance attributes the alert to the same tenant."""
from __future__ import annotations

import json
import time
from pathlib import Path

from gateway.shared_alerts import Observed
from gateway.shared_routing import decode_events, encode_events
from tests.scaleout.s2_instances import instance, write_secret
from tests.support.waiting import wait_for


def test_observed_round_trips_with_tenant_and_reads_the_old_form() -> None:
    events = [Observed("default", "r0", 10, 20, 10, "acme"), Observed("default", "r1", 1, 2, 1, None)]
    assert decode_events(encode_events(events)) == events
    old = json.dumps([["o", "default", "r0", 10, 20, 10]]).encode()  # an instance before R3-14
    assert decode_events(old) == [Observed("default", "r0", 10, 20, 10, None)]


async def test_shared_alert_names_the_same_tenant(tmp_path: Path, redis_server) -> None:
    from audit.concentration import ConcentrationMonitor
    from gateway.auditing import AuditHub

    secret = write_secret(tmp_path / "master.key")
    gws = [instance(tmp_path, i, redis_server.url, secret,
                    audit=AuditHub(None, monitor=ConcentrationMonitor(hold_s=0, min_requests=5,
                                                                      pools={"default": ["r0", "r1"]},
                                                                      eval_interval_s=0)))  # no staleness
           for i in range(2)]
    a, b = gws
    try:
        for gw in gws:
            await gw.shared.start()
        for _ in range(10):  # as AuditHub.observe_request does for an allowed request of acme
            a.audit.monitor.observe("default", "r0", 128, 128, 0, time.monotonic(), tenant="acme")
        mine = [(al["replica_id"], al["tenant_id"]) for al in a.audit.active_alerts()
                if al["kind"] == "replica_concentration"]
        assert mine == [("r0", "acme")]
        await wait_for(lambda: [(al["replica_id"], al["tenant_id"]) for al in b.audit.active_alerts()
                                if al["kind"] == "replica_concentration"] == [("r0", "acme")],
                       what="b raised the shared alert for acme")
    finally:
        for gw in gws:
            await gw.shared.stop()
