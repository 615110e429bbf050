"""Overload shedding for everyone (issue 17): past a bound the gateway answers new inference
requests 503 ``overloaded`` with ``Retry-After`` before any authentication or body work.

Two signals, both of this process: inference requests in flight (entered and not ended) and the
event loop's lag (how late a periodic probe wakes up, smoothed). :meth:`OverloadGuard.shed` is a
counter comparison and a prebuilt answer; ``/readyz`` reports the overload (not ready) meanwhile.

Shedding cannot tell tenants apart (it runs before authentication), so one tenant alone must not
reach its bound (review finding R2-1): right after the tenant is resolved,
:meth:`OverloadGuard.enter_tenant` refuses (429 ``in_flight_limited``) a request of a tenant that
already has ``flow.tenant_max_in_flight_requests`` requests in flight here, a bound the
configuration keeps below ``flow.shed_max_in_flight_requests``.
"""

from __future__ import annotations

import asyncio

from starlette.responses import Response

from gateway.errors import GatewayError
from gateway.config_flow import FlowConfig
from gateway.metrics import GatewayMetrics
from tenancy.shared_store import cancel_task

__all__ = ["OverloadGuard"]

#: weight of the newest lag sample in the smoothed lag
_LAG_ALPHA = 0.5


class OverloadGuard:
    """In-flight count and loop lag against the ``flow`` section's shedding bounds
    (a :class:`gateway.build.Lifecycle`: the lag probe runs between start and stop)."""

    def __init__(self, cfg: FlowConfig, metrics: GatewayMetrics) -> None:
        self.max_in_flight = cfg.shed_max_in_flight_requests
        self.max_lag_s = cfg.shed_loop_lag_s
        self.probe_s = cfg.loop_lag_probe_s
        self.retry_after_s = cfg.shed_retry_after_s
        self.metrics = metrics
        self.max_tenant = cfg.tenant_in_flight_bound()
        self.in_flight = 0
        self.tenant_in_flight: dict[str, int] = {}
        self.lag_s = 0.0
        self._task: asyncio.Task[None] | None = None

    def reason(self) -> str | None:
        """Why new requests are shed now (``in_flight`` or ``loop_lag``), None when not overloaded."""
        if self.in_flight >= self.max_in_flight:
            return "in_flight"
        if self.max_lag_s is not None and self.lag_s > self.max_lag_s:
            return "loop_lag"
        return None

    def shed(self) -> Response | None:
        """The 503 answer for a new request when overloaded (counted), else None (then call :meth:`enter`)."""
        why = self.reason()
        if why is None:
            return None
        self.metrics.shed_requests.labels(why).inc()
        return GatewayError(503, "overloaded", "the gateway is overloaded; retry later",
                            headers={"Retry-After": str(self.retry_after_s)}).response()

    def enter(self) -> None:
        """A request was let in."""
        self.in_flight += 1

    def shed_or_enter(self) -> Response | None:
        """:meth:`shed`'s 503 answer when overloaded (counted; the request is not let in), else None with the
        request let in (:meth:`enter`; the exit path calls :meth:`leave`). One call on the request path instead
        of three (issue 14, session 15); the same tests as :meth:`reason`."""
        if self.in_flight < self.max_in_flight and (self.max_lag_s is None or self.lag_s <= self.max_lag_s):
            self.in_flight += 1
            return None
        shed = self.shed()
        if shed is None:  # R15-3: the two tests disagreed (cannot today): let it in, counted as leave() expects
            self.in_flight += 1
        return shed

    def enter_tenant(self, tenant_id: str) -> str:
        """The request let in is ``tenant_id``'s: count it, returning ``tenant_id`` (hand it to
        :meth:`leave`). Raises :class:`GatewayError` 429 ``in_flight_limited`` (``Retry-After``
        ``flow.shed_retry_after_s``; not counted) when the tenant already has
        ``tenant_max_in_flight_requests`` requests in flight in this process."""
        n = self.tenant_in_flight.get(tenant_id, 0)
        if n >= self.max_tenant:
            self.metrics.flow_refused.labels("in_flight").inc()
            raise GatewayError(429, "in_flight_limited", "this tenant has too many requests in flight; retry later",
                               headers={"Retry-After": str(self.retry_after_s)}, outcome="rate_limited",
                               record={"reason": f"{n} in flight (bound {self.max_tenant})"})
        self.tenant_in_flight[tenant_id] = n + 1
        return tenant_id

    def leave(self, tenant_id: str | None = None) -> None:
        """A request that was let in ended (``tenant_id``: the one :meth:`enter_tenant` counted it for)."""
        self.in_flight = max(0, self.in_flight - 1)
        if tenant_id is not None:
            n = self.tenant_in_flight.get(tenant_id, 0) - 1
            if n > 0:
                self.tenant_in_flight[tenant_id] = n
            else:
                self.tenant_in_flight.pop(tenant_id, None)

    def problems(self) -> list[str]:
        """``/readyz`` problems: the overload, if any."""
        why = self.reason()
        if why == "in_flight":
            return [f"overloaded: {self.in_flight} requests in flight (bound {self.max_in_flight})"]
        if why == "loop_lag":
            return [f"overloaded: event loop lag {self.lag_s * 1000:.0f} ms (bound {self.max_lag_s * 1000:.0f} ms)"]
        return []

    async def _probe(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            t = loop.time()
            await asyncio.sleep(self.probe_s)
            late = max(0.0, loop.time() - t - self.probe_s)
            self.lag_s = _LAG_ALPHA * late + (1 - _LAG_ALPHA) * self.lag_s

    async def start(self) -> None:
        """Start the loop-lag probe (none when ``shed_loop_lag_s`` is off)."""
        if self.max_lag_s is not None and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._probe())

    async def stop(self) -> None:
        """Stop the probe."""
        task, self._task = self._task, None
        if task is not None:
            await cancel_task(task)
