"""Freezing the health checker in fault tests."""

from __future__ import annotations

from typing import Any


async def stop_health(stack: Any) -> None:
    """Stop the health checker and leave every replica marked up, so that only the breaker and
    the request path react to the faults a test injects.

    The stack does not wait for a first passing health sweep: under CI load a 0.3 s probe can
    time out at start-up and mark replicas down (``unhealthy_after: 1``); stopping the checker
    at that moment froze them down and the test saw 503 ``no_replica`` instead of the fault it
    injected (the session 11 CI flake in test_i12_breaker_endings).
    """
    comps = stack.components
    await comps.health.stop()
    for replica in comps.replica_set.all():
        comps.replica_set.mark_health(replica.id, True)
