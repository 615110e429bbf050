"""Concentration windows and active alerts shared by gateway instances (issue 16, ``state.backend: redis``).

The policy input reads the active concentration alerts (``AuditHub.active_alerts``),
so every instance must judge the traffic of all of them, not its own share.
Each instance publishes every observation it feeds its
:class:`audit.concentration.ConcentrationMonitor` (pool, replica, prefill /
prompt / cached tokens, tenant id: numbers and ids only) as an :class:`Observed` event on
the routing stream (gateway/shared_routing.py); the others feed it to their own
monitor at the time they receive it. Every monitor then holds the same windows
(up to the stream lag) and raises the same alerts, attributed to the same
tenants (R3-14: the tenant id travels with each observation); each instance
audits the alerts it raises in its own chain.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from audit.concentration import ConcentrationMonitor

__all__ = ["Observed", "PublishingMonitor"]


@dataclass(frozen=True, slots=True)
class Observed:
    """One routed request as the concentration monitor sees it (tokens; ``tenant_id``: None = unattributed)."""

    pool: str
    replica_id: str
    prefill_tokens: int
    prompt_tokens: int
    cached_tokens: int
    tenant_id: str | None = None


class PublishingMonitor:
    """A :class:`audit.concentration.ConcentrationMonitor` whose local observations are also emitted.

    ``inner``: the monitor; ``emit``: called with each local :class:`Observed`
    (e.g. :meth:`gateway.shared_routing.RoutingStream.emit`); ``clock``:
    monotonic seconds for observations received from other instances. Every
    other attribute is the inner monitor's.
    """

    def __init__(self, inner: ConcentrationMonitor, emit: Callable[[Observed], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.inner = inner
        self._emit = emit
        self._clock = clock

    def observe(self, pool: str, replica: str, prefill_tokens: int, prompt_tokens: int, cached_tokens: int,
                now: float, tenant: str | None = None) -> None:
        """Observe locally (see ``ConcentrationMonitor.observe``) and emit the observation."""
        self.inner.observe(pool, replica, prefill_tokens, prompt_tokens, cached_tokens, now, tenant=tenant)
        self._emit(Observed(pool, replica, prefill_tokens, prompt_tokens, cached_tokens, tenant))

    def apply(self, event: Observed) -> None:
        """Feed another instance's observation to the inner monitor, at the receive time."""
        self.inner.observe(event.pool, event.replica_id, event.prefill_tokens, event.prompt_tokens,
                           event.cached_tokens, self._clock(), tenant=event.tenant_id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
