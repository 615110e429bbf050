"""gateway/tenant_breaker.py: a success within REFRESH_S of the last one is not written again, yet a
steady stream of successes keeps the evidence alive (expiry refreshed at least every REFRESH_S)."""

from __future__ import annotations

from gateway.tenant_breaker import REFRESH_S, TenantBreaker
from tests.routing.test_s7_tenant_breaker_unit import Clock


def test_steady_successes_keep_the_evidence_past_window_and_cooldown() -> None:
    clock = Clock()
    tb = TenantBreaker(2, 5.0, window_s=10.0, clock=clock)
    # successes of tenant b every REFRESH_S / 4 for three times the entry's lifetime
    for _ in range(int(3 * 15.0 / (REFRESH_S / 4))):
        tb.succeeded("r0", "b")
        clock.t += REFRESH_S / 4
    verdict = tb.failed("r0", "a")
    assert verdict.attributed  # b's success is recent evidence: a's failure is a's alone


def test_a_success_after_a_failure_is_always_written() -> None:
    clock = Clock()
    tb = TenantBreaker(3, 5.0, window_s=10.0, clock=clock)
    tb.succeeded("r0", "b")
    tb.succeeded("r0", "a")
    assert tb.failed("r0", "a").streak == 1
    clock.t += REFRESH_S / 10  # within REFRESH_S of a's last success, but a failure came between
    tb.succeeded("r0", "a")
    assert tb.failed("r0", "a").streak == 1  # the streak was reset by the success
