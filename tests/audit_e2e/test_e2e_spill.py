"""Against the running app: the spill fills while the syslog receiver is down → the gateway
fails closed (503 for new requests, readiness down, an ``audit_spill_full`` alert event);
after the receiver (a real rsyslogd) comes up the spill is replayed in order, the alert
clears and requests are served again. Nothing is dropped; the spill holds no secrets.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from e2e_helpers import CANARY, PROMPT, Rsyslog, audit_section, jsonl_events, wait_for  # noqa: E402

from audit.cef import parse_cef  # noqa: E402
from gateway.auditing import AuditHub  # noqa: E402

pytestmark = pytest.mark.usefixtures("rsyslogd_binary")  # skip without rsyslogd; under CI: fail (S21-newcomer-9)

SPILL_MAX = 8000  # bytes; one request event is ~0.8 kB in the spill


@pytest.fixture
def receiver(tmp_path: Path):
    d = tmp_path / "rsyslog"
    d.mkdir()
    r = Rsyslog(d)  # port reserved, not started: the syslog sink is down from the start
    yield r
    r.stop()


@pytest.fixture
def audit_hub(tmp_path: Path, receiver: Rsyslog) -> AuditHub:
    return AuditHub.from_config(audit_section(tmp_path, syslog_port=receiver.port,
                                              jsonl={"checkpoint_s": 600}, spill={"max_bytes": SPILL_MAX}))


async def test_spill_full_fails_closed_and_recovers(stack, receiver: Rsyslog, tmp_path: Path) -> None:
    hub = stack.components.audit
    body: dict[str, Any] = {"model": "sim-model", "prompt": PROMPT, "max_tokens": 2}
    token = stack.token()
    served = 0
    for _ in range(40):
        r = await stack.client.post("/v1/completions", headers={"Authorization": f"Bearer {token}"}, json=body)
        if r.status_code == 503:
            break
        assert r.status_code == 200
        served += 1
    assert 2 <= served < 40 and not hub.accepting
    assert r.json()["error"]["code"] == "audit_unavailable"
    for _ in range(4):  # a client retrying while the audit trail is full
        again = await stack.client.post("/v1/completions", headers={"Authorization": f"Bearer {token}"}, json=body)
        assert again.status_code == 503
    ready = await stack.client.get("/readyz")
    assert ready.status_code == 503 and "audit trail not accepting events" in ready.json()["problems"]
    # the alert is an audit event; the refusals are counted, not written one by one
    await wait_for(lambda: any(e.get("alert", {}).get("alert_kind") == "audit_spill_full" for e in jsonl_events(tmp_path)))
    events = jsonl_events(tmp_path)
    raised = [e for e in events if e["kind"] == "alert" and e["alert"]["alert_kind"] == "audit_spill_full"]
    assert [e["outcome"] for e in raised] == ["raised"] and raised[0]["alert"]["spill_max_bytes"] == SPILL_MAX
    assert not [e for e in events if e.get("status_code") == 503]
    # the spill holds the syslog sink's backlog, and no prompt text or token
    spill = b"".join(p.read_bytes() for p in (tmp_path / "spill").glob("*.spill.jsonl"))
    assert len(spill) >= SPILL_MAX
    assert CANARY.encode() not in spill and token.encode() not in spill and token.split(".")[1].encode() not in spill

    receiver.start()
    await wait_for(lambda: hub.accepting, timeout_s=15)
    r = await stack.client.post("/v1/completions", headers={"Authorization": f"Bearer {token}"}, json=body)
    assert r.status_code == 200
    assert (await stack.client.get("/readyz")).status_code == 200
    assert await hub.log.drain()
    assert hub.dropped == 0
    events = jsonl_events(tmp_path)
    alerts = [e["outcome"] for e in events if e["kind"] == "alert" and e["alert"]["alert_kind"] == "audit_spill_full"]
    assert alerts == ["raised", "cleared"]
    (refusals,) = [e for e in events if e["kind"] == "summary"]
    assert refusals["summary"]["reason"] == "audit_unavailable" and refusals["summary"]["suppressed"] == 5
    assert refusals["client_address"] == "127.0.0.1" and refusals["status_code"] == 503
    # every event reached rsyslog, in emit order (first occurrences; re-sends are duplicates by event id)
    want = [e["event_id"] for e in events]
    await wait_for(lambda: set(want) <= {parse_cef(line)[1]["externalId"] for line in receiver.lines()}, timeout_s=10)
    got: list[str] = []
    for line in receiver.lines():
        eid = parse_cef(line)[1]["externalId"]
        if eid not in got:
            got.append(eid)
    assert [e for e in got if e in set(want)] == want
