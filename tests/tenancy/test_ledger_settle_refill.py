"""A settle's overshoot is charged against the bucket refilled to the settle time,
whether or not anything read the bucket in between (found while mirroring the
ledger in Redis, issue 16)."""

from __future__ import annotations

from tenancy.ledger import InProcessLedger
from tenancy.registry import Tenant


def _settle_late(read_before: bool) -> float:
    t = {"now": 0.0}
    ledger = InProcessLedger(clock=lambda: t["now"])
    tenant = Tenant(id="acme", prompt_tokens_per_s=1.0, prompt_tokens_burst=40)
    res = ledger.reserve(tenant, 41, 0, 0.0)  # from a full bucket into debt: level -1
    t["now"] = 1000.0
    if read_before:
        ledger.level("acme", "prompt", 1000.0)
    res.settle(130, 0, "usage")  # 89 tokens beyond the reservation
    level = ledger.level("acme", "prompt", 1000.0)
    assert level is not None
    return level


def test_overshoot_is_charged_whether_or_not_the_bucket_was_read() -> None:
    assert _settle_late(read_before=False) == _settle_late(read_before=True) == 40.0 - 89.0
