"""Session 26 review (review26) of gateway/flow_share.py: what a registry reload's ``forget`` leaves behind.

Before: ``forget`` dropped only the tenants still in the active set, so an idle removed tenant's weight stayed in
``TenantShares.weights`` for the process's life (one entry per tenant ever removed), and a removed tenant whose
prefill ended after the reload became active again at weight 1.0 for ``tenant_share_idle_s``, lowering every
remaining tenant's share for a tenant that no longer exists.
"""

from __future__ import annotations

from gateway.flow_share import TenantShares


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Notify:
    def __init__(self) -> None:
        self.calls = 0

    def on_release(self) -> None:
        self.calls += 1


def test_forget_drops_an_idle_removed_tenants_weight() -> None:
    clock = _Clock()
    shares = TenantShares(1.0, lambda t: 0, clock)
    shares.touch("a", 1.0)
    shares.touch("gone", 2.0)
    clock.now += 5.0
    assert shares.others_weight("a") == 0.0  # both idle: out of the active set
    shares.forget({"a"})
    assert set(shares.weights) == {"a"}


def test_a_removed_tenants_prefill_ending_after_forget_does_not_make_it_active() -> None:
    clock = _Clock()
    shares = TenantShares(5.0, lambda t: 0, clock)
    shares.touch("a", 1.0)
    shares.touch("gone", 1.0)
    notify = _Notify()
    hold = shares.take("r0", "gone", 100, notify)
    shares.forget({"a"})
    hold.on_release()  # its first byte: the prefill's tokens given back
    hold.on_release()  # its end
    assert notify.calls == 2 and shares.held == {} and shares.holding == {}
    assert shares.others_weight("a") == 0.0 and "gone" not in shares.seen and "gone" not in shares.weights
