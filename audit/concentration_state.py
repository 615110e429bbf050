"""Window state of :class:`audit.concentration.ConcentrationMonitor` (pools, alert episodes) and its helpers."""
from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from audit.concentration import ConcentrationMonitor


#: One routed request in a pool's window: ``(t s, replica, prefill tokens, prompt tokens, cached tokens,
#: tenant or None)``. A plain tuple of atomic values, which the garbage collector untracks (session 12:
#: a slots class, or a NamedTuple, stays tracked; at 2,000 requests/s the 60 s window alone held
#: 120,000 of them in every full collection).
_Obs = tuple[float, str, int, int, int, "str | None"]


#: width of a hit-rate baseline bucket, seconds (the baseline keeps sums per bucket, not requests)
BASELINE_BUCKET_S = 1.0


@dataclass
class _Pool:
    window: deque[_Obs] = field(default_factory=deque)
    #: the hit-rate baseline: ``[bucket start s, prompt tokens, cached tokens]`` per
    #: :data:`BASELINE_BUCKET_S` (session 12: was one observation per request over
    #: ``baseline_windows`` x ``window_s``, 600 s: 1.2 million objects at 2,000 requests/s)
    baseline: deque[list[float]] = field(default_factory=deque)
    requests: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    prefill: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    prompt: int = 0
    cached: int = 0
    base_prompt: int = 0
    base_cached: int = 0
    replicas: set[str] = field(default_factory=set)
    # per (replica, tenant) and per tenant: requests and prefill tokens in the window
    t_requests: dict[tuple[str, str | None], int] = field(default_factory=lambda: defaultdict(int))
    t_prefill: dict[tuple[str, str | None], int] = field(default_factory=lambda: defaultdict(int))
    tenant_requests: dict[str | None, int] = field(default_factory=lambda: defaultdict(int))
    tenant_prefill: dict[str | None, int] = field(default_factory=lambda: defaultdict(int))
    last_t: float = 0.0  # time of the last observation
    eval_t: float = float("-inf")  # time of the last evaluation
    alerts_t: float = float("-inf")  # the monitor's clock at the last alert check
    pending: int = 0  # observations since then
    dirty_alerts: bool = False  # alert checks / gauges not yet run on the current counts
    dirty_gauges: bool = False


@dataclass
class _Episode:
    since: float | None = None  # breach start (hold timer)
    active_since: float | None = None  # alert raised at
    tenants: list[str] = field(default_factory=list)  # tenants it is raised for
    everyone: bool = False  # the global (tenant_id None) alert is raised


class _FlushOnCollect:
    """A collector with no metrics: collecting it runs the monitor's pending evaluations."""

    def __init__(self, monitor: ConcentrationMonitor) -> None:
        self._monitor = monitor

    def collect(self) -> list[object]:
        self._monitor.flush()
        return []


def pool_stats(p: _Pool) -> tuple[int, dict[str, float], dict[str, float], float, float, float | None,
                                  float | None]:
    """``(requests, shares, prefill shares, max/mean ratio, normalised HHI, hit rate, baseline hit
    rate)`` of ``p``'s window (``ConcentrationMonitor.stats`` as a tuple: no dict per observation)."""
    total = sum(p.requests.values())
    total_prefill = sum(p.prefill.values())
    n = max(len(p.replicas), 1)
    shares = {r: p.requests.get(r, 0) / total if total else 0.0 for r in p.replicas}
    pshares = {r: p.prefill.get(r, 0) / total_prefill if total_prefill else 0.0 for r in p.replicas}
    hhi = sum(s * s for s in shares.values())
    hhi_norm = (hhi - 1 / n) / (1 - 1 / n) if n > 1 and total else (1.0 if total else 0.0)
    mean = total / n
    return (total, shares, pshares, (max(p.requests.values(), default=0) / mean) if mean else 0.0,
            max(hhi_norm, 0.0), p.cached / p.prompt if p.prompt else None,
            p.base_cached / p.base_prompt if p.base_prompt else None)


def expire(p: _Pool, horizon: float) -> None:
    """Take the observations of ``p``'s window made at or before ``horizon`` (monotonic s) out of it and out
    of its counts, oldest first (per-tenant entries at zero are dropped). One call per expired stretch, not
    five per observation (session 17: at a steady rate one observation expires per request)."""
    window, requests, prefill_of = p.window, p.requests, p.prefill
    t_requests, t_prefill = p.t_requests, p.t_prefill
    tenant_requests, tenant_prefill = p.tenant_requests, p.tenant_prefill
    while window and window[0][0] <= horizon:
        _, replica, prefill, prompt, cached, tenant = window.popleft()
        requests[replica] -= 1
        prefill_of[replica] -= prefill
        p.prompt -= prompt
        p.cached -= cached
        key = (replica, tenant)
        for counts, k, v in ((t_requests, key, 1), (t_prefill, key, prefill), (tenant_requests, tenant, 1),
                             (tenant_prefill, tenant, prefill)):
            left = counts[k] - v
            if left > 0:
                counts[k] = left
            else:
                counts.pop(k, None)


def _alert_id(kind: str, pool: str, replica: str, tenant: str | None) -> str:
    """``kind:pool:replica`` for a global alert, ``kind:pool:replica:tenant`` for a tenant's."""
    return f"{kind}:{pool}:{replica}" if tenant is None else f"{kind}:{pool}:{replica}:{tenant}"


def alert_fields(key: tuple[str, str, str], value: float, threshold: float, now: float,
                 tenant: str | None) -> dict[str, object]:
    """The ``alert`` mapping of a ``kind="alert"`` audit event: ``key`` = ``(kind, pool, replica or "")``;
    ``value``/``threshold``: the figure and its threshold (rounded to 4 places); ``now``: monotonic s;
    ``tenant``: the tenant an attributed alert names (None: global)."""
    kind, pool, replica = key
    alert: dict[str, object] = {"alert_id": _alert_id(kind, pool, replica, tenant), "alert_kind": kind, "pool": pool,
                                "value": round(value, 4), "threshold": round(threshold, 4),
                                "observed_at_s": round(now, 3)}
    if replica:
        alert["replica"] = replica
    if tenant is not None:
        alert["tenant_id"] = tenant
    return alert


__all__ = ["_Obs", "_Pool", "_Episode", "_FlushOnCollect", "expire", "_alert_id", "alert_fields", "pool_stats"]
