"""Session 25, S25-newcomer-4: a policy change's operator audit event names the operator ``actor`` and its
time ``ts``, as tenancy's operator records do (``who`` and ``time`` stay for compatibility).

Before: the gateway audited ``{"action": "policy_change", **record.to_dict()}``: ``who`` and ``time`` only,
so a SIEM rule on ``operator.actor`` (docs/audit.md "Operator events") missed every policy change and
roll-back, while key rotations and reloads carried ``actor`` and ``ts``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from audit.event import AuditEvent
from gateway.auditing import AuditHub
from gateway.config_policy import PolicyConfig
from gateway.pep import build_decision_point

OPS = "spiffe://prefixgate.test/ops/alice"
TIERS = "prefixgate/config/tiers"


class _Log:
    def __init__(self) -> None:
        self.events: list[AuditEvent] = []

    def emit(self, event: AuditEvent) -> None:
        self.events.append(event)


async def test_policy_change_events_carry_actor_and_ts_like_tenancy_records(active: Path, tmp_path: Path) -> None:
    log = _Log()
    pc = PolicyConfig(mode="embedded", dir=str(active), versions_dir=str(tmp_path / "versions"))
    dp = build_decision_point(pc, audit=AuditHub(log))  # type: ignore[arg-type]
    store = dp.store
    assert store is not None
    tiers = store.get_data(TIERS)
    tiers["standard"] = {**tiers["standard"], "max_tokens": 8}
    change = await store.put_data(TIERS, tiers, OPS)
    rollback = await store.rollback(0, OPS)

    assert len(log.events) == 2
    for event, record in zip(log.events, (change, rollback), strict=True):
        operator: dict[str, Any] = event.to_dict()["operator"]
        assert operator["action"] == "policy_change" and operator["version"] == record.version
        assert operator["actor"] == operator["who"] == OPS                 # the tenancy name, and the old one
        assert operator["ts"] == operator["time"] == record.time
        assert event.identity is not None and event.identity.spiffe_id == OPS
    assert "actor" not in change.to_dict() and "ts" not in change.to_dict()  # record.json and the answer: as before
