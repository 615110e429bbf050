"""Concentration and cache-miss alerts over routing decisions.

Per pool, a sliding window of ``window_s`` seconds keeps, per replica, the
number of requests and prefill tokens (prompt tokens not served from cache).
From it: request share and prefill-token share per replica, max/mean ratio,
and the normalised Herfindahl-Hirschman index
``HHI* = (sum s_i^2 - 1/n) / (1 - 1/n)`` over request shares (0 = perfectly
even over the n replicas seen in the pool, 1 = everything on one replica).
The prefix-cache hit rate ``cached_tokens / prompt_tokens`` of the window is compared with a baseline
over ``baseline_windows`` windows (per-second sums: a second leaves it once all of it is older).

Alerts (once per episode, with hysteresis):
* ``replica_concentration``: a replica's request or prefill share stays above
  ``share_threshold`` for ``hold_s``. Attributed to tenants (R3-14, :mod:`audit.attribution`):
  when at most ``attribution_max_tenants`` tenants cover
  ``attribution_cover_ratio`` of the replica's excess over its fair share,
  one alert per such tenant (``tenant_id`` set; the shipped policy steers
  only that tenant's requests away); otherwise one global alert
  (``tenant_id`` None). While the alert lasts, newly attributed tenants are
  added (a set that grows beyond the maximum adds the global alert);
* ``pool_concentration``: HHI* stays above ``index_threshold`` for ``hold_s``;
* ``cache_miss_spike``: window hit rate < baseline × (1 - hit_drop_ratio)
  for ``hold_s``.
An alert clears when its value falls below threshold × ``clear_ratio`` (for
the hit rate: rises above baseline × (1 - hit_drop_ratio × clear_ratio)).
Each raise and clear is also one gateway log line (WARNING / INFO, rate-bounded per alert id:
:mod:`audit.alert_log`, S24-newcomer-8).

Defaults are relative to the router's bounded-load guard factor ``c``
(consistent hashing with bounded loads, Mirrokni et al. 2018: no replica
takes more than ``c`` × the mean load): with n replicas the guard allows a
share of at most c/n, so ``share_threshold=None`` means c/n — an alert says
the guard is not holding (or only one replica is healthy). A window of N
requests gets a sampling margin on top, ``3·sqrt(p(1-p)/N)`` with p = c/n
(:meth:`ConcentrationMonitor.default_share_threshold`), so chance imbalance in
short windows does not alert. The monitor must know each pool's replicas
(:meth:`ConcentrationMonitor.set_pool_members`): a replica that gets no
traffic at all is otherwise invisible.

Evaluation (issue 14): an observation only updates the window counts; the figures and
alert checks of its pool run at most once per ``eval_interval_s`` (default 0.05 s) or every
``EVAL_EVERY`` observations, whichever comes first, and before any read:
:meth:`~ConcentrationMonitor.stats` and a scrape of either registry run the pending checks and
gauge updates. :meth:`~ConcentrationMonitor.active_alerts` (the policy input, read per request)
runs the pending alert checks only when the last alert set was computed ``eval_interval_s`` or
more ago on the monitor's ``clock`` (session 7, bounded staleness): within that bound it returns
the set computed last, kept until an alert is raised or cleared. A hold timer therefore starts
up to ``eval_interval_s`` late, and the policy sees an alert up to ``eval_interval_s`` late;
``eval_interval_s`` 0 checks on every observation and every read.
"""
from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, Gauge

from audit.alert_log import AlertLogLines
from audit.attribution import attribute_concentration
from audit.concentration_state import BASELINE_BUCKET_S as BUCKET_S
from audit.concentration_state import _alert_id, _Episode, _FlushOnCollect, _Pool, alert_fields, expire, pool_stats
from audit.event import AuditEvent, Kind, Outcome, iso_ms


class ConcentrationMonitor:
    """Sliding-window concentration / cache-miss monitor (see module doc).

    Args:
        window_s: window length, seconds.
        share_threshold: replica share (0..1) that alerts; None → c/n.
        index_threshold: normalised HHI (0..1) that alerts.
        hold_s: seconds a breach must last before alerting.
        clear_ratio: hysteresis factor (<1) for clearing.
        hit_drop_ratio: relative hit-rate drop that alerts (0.5 = halved).
        on_alert: receives raised/cleared ``kind="alert"`` events.
        load_guard_factor: the router's bounded-load factor c.
        min_requests: requests in the window before anything is judged.
        baseline_windows: baseline length in windows for the hit rate.
        registry: public metrics (pool level); admin_registry: metrics that
            name replicas (admin listener only).
        pools: configured replica ids per pool (see :meth:`set_pool_members`).
        significance_z: sampling margin of the default share threshold (see
            :meth:`default_share_threshold`); 0 gives plain c/n.
        attribution_cover_ratio: share (0..1] of a concentrated replica's
            excess the named tenants must cover (:mod:`audit.attribution`).
        attribution_max_tenants: most tenants a replica alert names; more
            needed → a global alert. 0 turns attribution off (always global).
        eval_interval_s: seconds (≥ 0) between evaluations of a pool's figures and alert
            checks (module doc "Evaluation"); 0 evaluates on every observation and read.
        clock: monotonic seconds, the age of the alert set :meth:`active_alerts` returns
            (default :func:`time.monotonic`, the clock the gateway's observations use).
    """

    EVAL_EVERY = 256  # observations of a pool that force an evaluation within eval_interval_s

    def __init__(
        self,
        window_s: float = 60.0,
        share_threshold: float | None = None,
        index_threshold: float = 0.5,
        hold_s: float = 30.0,
        clear_ratio: float = 0.8,
        hit_drop_ratio: float = 0.5,
        on_alert: Callable[[AuditEvent], None] | None = None,
        load_guard_factor: float = 1.25,
        min_requests: int = 20,
        baseline_windows: int = 10,
        registry: CollectorRegistry | None = None,
        admin_registry: CollectorRegistry | None = None,
        pools: Mapping[str, Iterable[str]] | None = None,
        significance_z: float = 3.0,
        attribution_cover_ratio: float = 0.8,
        attribution_max_tenants: int = 3,
        eval_interval_s: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < clear_ratio < 1:
            raise ValueError("clear_ratio must be in (0, 1)")
        self.window_s = window_s
        self.share_threshold = share_threshold
        self.index_threshold = index_threshold
        self.hold_s = hold_s
        self.clear_ratio = clear_ratio
        self.hit_drop_ratio = hit_drop_ratio
        self.load_guard_factor = load_guard_factor
        self.min_requests = min_requests
        self.significance_z = significance_z
        if not 0 < attribution_cover_ratio <= 1 or attribution_max_tenants < 0:
            raise ValueError("attribution_cover_ratio must be in (0, 1], attribution_max_tenants >= 0")
        self.attribution_cover_ratio = attribution_cover_ratio
        self.attribution_max_tenants = attribution_max_tenants
        self.eval_interval_s = eval_interval_s
        self._clock = clock
        self._alerts: list[dict[str, object]] | None = None  # the active set, until a raise or clear
        self.baseline_s = window_s * baseline_windows
        self._on_alert = on_alert
        #: one log line per raise (WARNING) and clear (INFO), rate-bounded per alert id (:mod:`audit.alert_log`)
        self.alert_log = AlertLogLines(window_s, clock=clock)
        self._pools: dict[str, _Pool] = defaultdict(_Pool)
        self._episodes: dict[tuple[str, str, str], _Episode] = defaultdict(_Episode)
        self.registry = registry if registry is not None else CollectorRegistry()
        self.admin_registry = admin_registry if admin_registry is not None else CollectorRegistry()
        for reg in (self.registry, self.admin_registry):  # before the gauges: a scrape runs pending updates first
            reg.register(_FlushOnCollect(self))
        self._g_index = Gauge("prefixgate_pool_concentration_hhi", "Normalised HHI of request shares", ["pool"], registry=self.registry)
        self._g_hit = Gauge("prefixgate_pool_prefix_hit_rate", "cached/prompt tokens in the window", ["pool"], registry=self.registry)
        self._g_alerts = Gauge("prefixgate_concentration_alerts_active", "Active concentration alerts", registry=self.registry)
        self._g_share = Gauge("prefixgate_replica_request_share", "Request share", ["pool", "replica"], registry=self.admin_registry)
        self._g_pshare = Gauge("prefixgate_replica_prefill_share", "Prefill-token share", ["pool", "replica"], registry=self.admin_registry)
        self._g_ratio = Gauge("prefixgate_pool_max_mean_ratio", "Max/mean requests per replica", ["pool"], registry=self.admin_registry)
        # children per label values (``labels()`` costs a lock and a dict build per call; pools and
        # replicas are few and never forgotten, like the gauges' own children)
        self._pool_children: dict[str, tuple[Gauge, Gauge, Gauge]] = {}
        self._replica_children: dict[tuple[str, str], tuple[Gauge, Gauge]] = {}
        self._set_values: dict[Gauge, float] = {}  # the value each child above was last set to
        for pool, members in (pools or {}).items():
            self.set_pool_members(pool, members)

    def default_share_threshold(self, n_replicas: int, requests: int) -> float:
        """The share threshold used when ``share_threshold`` is None.

        ``p = c / n`` (the bounded-load guard's bound with factor c over n
        replicas) plus a sampling margin ``z · sqrt(p (1 - p) / N)`` for a
        window of N requests (``significance_z``, default 3): a window of a
        few dozen requests on a balanced pool routinely shows one replica
        above c/n by chance; the margin vanishes as the window grows.
        Capped at 1.0.
        """
        p = min(self.load_guard_factor / max(n_replicas, 1), 1.0)
        margin = self.significance_z * math.sqrt(p * (1 - p) / requests) if requests > 0 else 0.0
        return min(p + margin, 1.0)

    def set_pool_members(self, pool: str, replicas: Iterable[str]) -> None:
        """Declare the replicas of ``pool`` (from the gateway's replica config).

        Shares are computed over these replicas plus any replica seen in
        observations, so a pool whose traffic all lands on one of its n
        replicas shows share 1.0 against the threshold c/n; without it the
        monitor only knows the replicas it has seen, and total concentration
        onto one replica would look like a one-replica pool (never judged).
        """
        self._pools[pool].replicas.update(replicas)

    # ---- statistics ---------------------------------------------------
    def stats(self, pool: str) -> dict[str, object]:
        """Current window stats of ``pool``: requests, shares, prefill_shares,
        max_mean_ratio, hhi, hit_rate, baseline_hit_rate."""
        self.flush(alerts=False)
        total, shares, pshares, ratio, hhi, hit, base = self._stats(self._pools[pool])
        return {"requests": total, "shares": shares, "prefill_shares": pshares, "max_mean_ratio": ratio,
                "hhi": hhi, "hit_rate": hit, "baseline_hit_rate": base}

    _stats = staticmethod(pool_stats)  # :meth:`stats` as a tuple (no dict per observation)

    def observe(self, pool: str, replica: str, prefill_tokens: int, prompt_tokens: int, cached_tokens: int, now: float,
                tenant: str | None = None) -> None:
        """Record one routed request (tokens; ``now`` in seconds, monotonic; ``tenant``: the tenant id,
        None = unattributed); the pool's alert conditions and gauges are evaluated when due (module doc)."""
        p = self._pools[pool]
        p.replicas.add(replica)
        p.window.append((now, replica, prefill_tokens, prompt_tokens, cached_tokens, tenant))
        base, bucket = p.baseline, now - now % BUCKET_S  # the hit-rate baseline: sums per bucket
        if base and base[-1][0] == bucket:
            base[-1][1] += prompt_tokens
            base[-1][2] += cached_tokens
        else:
            base.append([bucket, prompt_tokens, cached_tokens])
        p.requests[replica] += 1
        p.prefill[replica] += prefill_tokens
        p.t_requests[(replica, tenant)] += 1
        p.t_prefill[(replica, tenant)] += prefill_tokens
        p.tenant_requests[tenant] += 1
        p.tenant_prefill[tenant] += prefill_tokens
        p.prompt += prompt_tokens
        p.cached += cached_tokens
        p.base_prompt += prompt_tokens
        p.base_cached += cached_tokens
        window = p.window
        if window[0][0] <= now - self.window_s:  # never empty here: this observation was just appended
            expire(p, now - self.window_s)
        while base and base[0][0] + BUCKET_S <= now - self.baseline_s:  # the whole bucket is older
            _, gone_prompt, gone_cached = base.popleft()
            p.base_prompt -= gone_prompt
            p.base_cached -= gone_cached
        p.last_t, p.dirty_alerts, p.dirty_gauges = now, True, True
        p.pending += 1
        if p.pending >= self.EVAL_EVERY or now - p.eval_t >= self.eval_interval_s:
            self._evaluate(pool, now)

    def flush(self, alerts: bool = True, gauges: bool = True) -> None:
        """Run the pending alert checks (``alerts``) and/or gauge updates (``gauges``) of every pool,
        at the time of its last observation (called by the reads; see module doc "Evaluation")."""
        for pool, p in self._pools.items():
            if (alerts and p.dirty_alerts) or (gauges and p.dirty_gauges):
                self._evaluate(pool, p.last_t, alerts=alerts and p.dirty_alerts, gauges=gauges and p.dirty_gauges)

    def attribution(self, pool: str, replica: str, by_prefill: bool = False) -> tuple[str, ...] | None:
        """The tenants that explain ``replica``'s concentration in ``pool``'s window
        (:func:`audit.attribution.attribute_concentration` over requests, or prefill
        tokens if ``by_prefill``), or None: global (no small set, unattributed traffic,
        or attribution off)."""
        if self.attribution_max_tenants == 0:
            return None
        p = self._pools[pool]
        per, totals = (p.t_prefill, p.tenant_prefill) if by_prefill else (p.t_requests, p.tenant_requests)
        on_replica = {t: float(v) for (r, t), v in per.items() if r == replica}
        return attribute_concentration(on_replica, totals, len(p.replicas), self.attribution_cover_ratio,
                                       self.attribution_max_tenants)

    # ---- alerts -------------------------------------------------------
    def active_alerts(self) -> list[dict[str, object]]:
        """Active alerts for the policy input: ``{id, kind, pool, replica,
        replica_id, tenant_id, since}``. ``replica_id`` repeats ``replica`` under
        the name the policy input uses (``policy.input``); ``tenant_id``: the
        tenant a ``replica_concentration`` alert is attributed to (id
        ``kind:pool:replica:tenant``), None for a global alert (id
        ``kind:pool:replica``; pool and cache-miss alerts are always global);
        ``since`` is the monotonic-clock second the alert was raised at. The list and its
        dicts are shared until the next raise or clear: read only. Its checks ran at most
        ``eval_interval_s`` ago on ``clock`` (module doc "Evaluation")."""
        now = self._clock()
        for pool, p in self._pools.items():  # the pending checks of a pool whose set is as old as the bound
            if p.dirty_alerts and now - p.alerts_t >= self.eval_interval_s:
                self._evaluate(pool, p.last_t, alerts=True, gauges=False)
        got = self._alerts
        if got is None:
            got = self._alerts = self._active()
        return got

    def _active(self) -> list[dict[str, object]]:
        out = []
        for (kind, pool, replica), ep in self._episodes.items():
            if ep.active_since is not None:
                scopes: list[str | None] = [*ep.tenants, *([None] if ep.everyone else [])]
                for tenant in scopes:
                    out.append({"id": _alert_id(kind, pool, replica, tenant), "kind": kind, "pool": pool,
                                "replica": replica or None, "replica_id": replica or None, "tenant_id": tenant,
                                "since": ep.active_since})
        return out

    def _evaluate(self, pool: str, now: float, alerts: bool = True, gauges: bool = True) -> None:
        p = self._pools[pool]
        if alerts and gauges:
            p.eval_t, p.pending = now, 0
        p.dirty_alerts &= not alerts
        if alerts:
            p.alerts_t = self._clock()
        p.dirty_gauges &= not gauges
        total, shares, pshares, ratio, hhi_st, hit_st, base_st = self._stats(p)
        if gauges:
            self._set_gauges(pool, shares, pshares, ratio, hhi_st, hit_st)
        if alerts:
            self._check(pool, now, total, shares, pshares, hhi_st, hit_st, base_st)

    def _set_gauges(self, pool: str, shares: dict[str, float], pshares: dict[str, float], ratio: float,
                    hhi_st: float, hit_st: float | None) -> None:
        last = self._set_values  # a gauge is set only when its value changed (same scrape, no lock per call)
        g_index, g_hit, g_ratio = self._pool_gauges(pool)
        for g, v in ((g_index, hhi_st), (g_hit, hit_st), (g_ratio, ratio)):
            if v is not None and last.get(g) != v:
                g.set(v)
                last[g] = v
        for r in shares:
            for g, v in zip(self._replica_gauges(pool, r), (shares[r], pshares[r])):
                if last.get(g) != v:
                    g.set(v)
                    last[g] = v

    def _check(self, pool: str, now: float, total: int, shares: dict[str, float], pshares: dict[str, float],
               hhi_st: float, hit_st: float | None, base_st: float | None) -> None:
        if int(total) < self.min_requests or len(shares) < 2:
            return
        thr = self.share_threshold if self.share_threshold is not None else self.default_share_threshold(
            len(shares), int(total))
        for r in shares:
            value = max(shares[r], pshares[r])
            by_prefill = pshares[r] > shares[r]
            self._step(("replica_concentration", pool, r), value >= thr, value < thr * self.clear_ratio, now, value, thr,
                       lambda r=r, bp=by_prefill: self.attribution(pool, r, bp))  # type: ignore[misc]
        hhi = float(hhi_st)
        self._step(("pool_concentration", pool, ""), hhi >= self.index_threshold,
                   hhi < self.index_threshold * self.clear_ratio, now, hhi, self.index_threshold)
        hit, base = hit_st, base_st
        if hit is not None and base:
            low = base * (1 - self.hit_drop_ratio)
            ok = base * (1 - self.hit_drop_ratio * self.clear_ratio)
            self._step(("cache_miss_spike", pool, ""), hit < low, hit >= ok, now, hit, low)  # type: ignore[operator]

    def _pool_gauges(self, pool: str) -> tuple[Gauge, Gauge, Gauge]:
        """The pool's HHI, hit-rate and max/mean gauge children (looked up once per pool)."""
        got = self._pool_children.get(pool)
        if got is None:
            got = self._pool_children[pool] = (self._g_index.labels(pool), self._g_hit.labels(pool),
                                               self._g_ratio.labels(pool))
        return got

    def _replica_gauges(self, pool: str, replica: str) -> tuple[Gauge, Gauge]:
        """The replica's request-share and prefill-share gauge children (looked up once per replica)."""
        got = self._replica_children.get((pool, replica))
        if got is None:
            got = self._replica_children[(pool, replica)] = (self._g_share.labels(pool, replica),
                                                             self._g_pshare.labels(pool, replica))
        return got

    def _step(self, key: tuple[str, str, str], breach: bool, clear: bool, now: float, value: float, threshold: float,
              attribute: Callable[[], tuple[str, ...] | None] | None = None) -> None:
        """Hysteresis of one alert; ``attribute`` (replica alerts): the tenants it is raised for (None: global)."""
        ep = self._episodes[key]
        if ep.active_since is None:
            if not breach:
                ep.since = None
                return
            if ep.since is None:
                ep.since = now
            if now - ep.since >= self.hold_s:
                ep.active_since = now
                self._widen(key, ep, attribute() if attribute is not None else None, value, threshold, now)
        elif clear:
            scopes: list[str | None] = [*ep.tenants, *([None] if ep.everyone else [])]
            ep.active_since = None
            ep.since = None
            ep.tenants, ep.everyone = [], False
            for tenant in scopes:
                self._emit(key, Outcome.CLEARED, value, threshold, now, tenant)
        elif attribute is not None and not ep.everyone:
            self._widen(key, ep, attribute(), value, threshold, now)

    def _widen(self, key: tuple[str, str, str], ep: _Episode, tenants: tuple[str, ...] | None, value: float,
               threshold: float, now: float) -> None:
        """Raise the alert for ``tenants`` not yet named (None, or more than the
        attribution maximum in all: the global alert)."""
        new = [] if tenants is None else [t for t in tenants if t not in ep.tenants]
        if tenants is None or len(ep.tenants) + len(new) > max(self.attribution_max_tenants, 1):
            if not ep.everyone:
                ep.everyone = True
                self._emit(key, Outcome.RAISED, value, threshold, now, None)
            return
        for t in new:
            ep.tenants.append(t)
            self._emit(key, Outcome.RAISED, value, threshold, now, t)

    def _emit(self, key: tuple[str, str, str], outcome: Outcome, value: float, threshold: float, now: float,
              tenant: str | None = None) -> None:
        self._alerts = None  # the active set changed
        self._g_alerts.set(len(self._active()))
        alert = alert_fields(key, value, threshold, now, tenant)
        self.alert_log.note(outcome, alert)  # the gateway log's line, rate-bounded (S24-newcomer-8)
        if self._on_alert is not None:
            self._on_alert(AuditEvent(kind=Kind.ALERT, outcome=outcome, alert=alert, tenant=tenant))


__all__ = ["ConcentrationMonitor", "iso_ms"]
