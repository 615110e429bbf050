"""One replica's prefill-rate calibration, fitted per tenant and combined robustly (session 11, R10-3).

Review R10-3: a single fit per replica over every tenant's first bytes let one tenant move the rate
every tenant's routing uses. Requests whose first byte comes far later than their predicted
uncached tokens suggest (chat ``tools`` counted but not hashed, a ``json_schema`` compiling, long
"words" under the ``word`` tokenizer) made a replica look 2-4x slower, or left it without an
estimate, which switched calibration off for the whole pool.

:class:`ReplicaFits` keeps one :class:`routing.calibration.PrefillRateEstimator` per
(replica, tenant) (the tenant's configured id, as the load ticket carries it: nothing secret) and
gives the replica the **median over tenants of each figure** (rate, queue weight, overhead, each on
its own): with ``n`` tenants having an estimate there, the middle value when ``n`` is odd, the two
middle ones averaged when it is even (rate by geometric mean: its unit is a ratio). So with three or
more tenants each figure lies between two honest tenants' as long as fewer than half of them lie (either way: a
tenant can make a replica look slower, and, with first bytes that do not grow with its counted
tokens, e.g. long "words" under the ``word`` tokenizer, faster); with two, a liar moves it by half
its own distortion in log-rate (bounded: ×1024 range); one tenant alone (or a single-tenant
deployment) gets exactly the single fit of before.

Bounds, all O(1) amortised per observation: at most ``max_tenants`` fits per replica (the least
recently observed one is dropped for a new tenant), a fit not fed for ``stale_after``
observations of the replica **and** for ``stale_after_s`` seconds is dropped (its estimate no longer
speaks for the replica; review R11b-2: by observations alone a high-volume tenant pushed every
quieter tenant's fit out and set the replica's figures alone again), and the
ready figures are kept sorted (``bisect``, at most ``max_tenants`` entries per figure).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # no import cycle at run time: routing.calibration imports this module
    from routing.calibration import PrefillRateEstimator

__all__ = ["ReplicaFits"]

class _TenantFit:
    __slots__ = ("est", "params", "seen", "at")

    def __init__(self, est: PrefillRateEstimator) -> None:
        self.est = est
        self.params: tuple[float, float, float] | None = None  # in ReplicaFits._sorted while not None
        self.seen = 0  # the replica's observation count at its last observation
        self.at = 0.0  # the clock's reading (s) at its last observation


class ReplicaFits:
    """The per-tenant fits of one replica (module doc).

    ``make``: builds a fresh :class:`routing.calibration.PrefillRateEstimator`;
    ``max_tenants`` (>= 1) fits at most; ``stale_after`` (>= 1): observations of the replica after
    which a tenant's fit that saw none of them is dropped, once it also saw none for ``stale_after_s``
    seconds (>= 0) of ``clock`` (monotonic seconds; the gateway's load tracker's clock, see
    :class:`routing.calibration.Calibration` ``clock``; None: by observations alone, as before review
    R11b-2). Raises :class:`ValueError` out of range.
    ``observations``: first bytes accepted on this replica (all tenants); ``version`` changes
    whenever the combined estimate may have changed. Not thread-safe: one event loop."""

    __slots__ = ("_make", "_fits", "_sorted", "_clock", "max_tenants", "stale_after", "stale_after_s",
                 "observations", "version")

    def __init__(self, make: Callable[[], PrefillRateEstimator], *, max_tenants: int = 32,
                 stale_after: int = 1000, stale_after_s: float = 600.0,
                 clock: Callable[[], float] | None = None) -> None:
        if max_tenants < 1 or stale_after < 1:
            raise ValueError("max_tenants and stale_after must be >= 1")
        if not stale_after_s >= 0:
            raise ValueError("stale_after_s must be >= 0")
        self._clock = clock
        self.stale_after_s = stale_after_s
        self._make = make
        self._fits: dict[str, _TenantFit] = {}  # insertion order: least recently observed first
        # per figure (rate, queue weight, overhead), the ready fits' values, sorted
        self._sorted: tuple[list[float], list[float], list[float]] = ([], [], [])
        self.max_tenants = max_tenants
        self.stale_after = stale_after
        self.observations = 0
        self.version = 0

    def estimator(self, tenant: str) -> PrefillRateEstimator:
        """The estimator of ``tenant`` on this replica (created on first use)."""
        f = self._fits.get(tenant)
        if f is None:
            f = self._add(tenant)
        return f.est

    @property
    def tenants(self) -> int:
        """Tenants with a fit on this replica (ready or not)."""
        return len(self._fits)

    @property
    def ready(self) -> int:
        """Tenants whose fit gives an estimate (the medians are taken over them)."""
        return len(self._sorted[0])

    def _add(self, tenant: str) -> _TenantFit:
        fits = self._fits
        while len(fits) >= self.max_tenants:
            self._drop(next(iter(fits)))
        f = fits[tenant] = _TenantFit(self._make())
        return f

    def _drop(self, tenant: str) -> None:
        f = self._fits.pop(tenant)
        self._place(f, None)

    def _place(self, f: _TenantFit, params: tuple[float, float, float] | None) -> None:
        # each figure's list holds the ready fits' values sorted; equal values are interchangeable,
        # so removing the old value removes "this fit's" (unrolled: runs once per observation)
        old = f.params
        if old == params:
            return
        rates, qws, overheads = self._sorted
        if old is not None:
            del rates[bisect.bisect_left(rates, old[0])]
            del qws[bisect.bisect_left(qws, old[1])]
            del overheads[bisect.bisect_left(overheads, old[2])]
        if params is not None:
            bisect.insort(rates, params[0])
            bisect.insort(qws, params[1])
            bisect.insort(overheads, params[2])
        f.params = params
        self.version += 1

    def observe(self, tenant: str, uncached: float, queued: float, ttft_s: float, shared: float | None) -> None:
        """One first-byte observation of ``tenant`` (see :meth:`PrefillRateEstimator.observe`)."""
        fits = self._fits
        f = fits.pop(tenant, None)
        if f is None:
            f = self._add(tenant)
        else:
            fits[tenant] = f  # most recently observed last
        if not f.est.observe(uncached, queued, ttft_s, shared):
            return
        self.observations += 1
        self.version += 1
        f.seen = self.observations
        clock = self._clock
        if clock is not None:
            f.at = clock()
        self._place(f, f.est.params())
        # drop the fits no longer fed, oldest first, one per observation (amortised O(1))
        t = next(iter(fits))
        old = fits[t]
        if old.seen < self.observations - self.stale_after and (
                clock is None or f.at - old.at > self.stale_after_s):
            self._drop(t)

    def median(self) -> tuple[float, float, float] | None:
        """The median over tenants of each figure ``(rate tokens/s, queue weight, overhead s)``
        (module doc), or ``None`` while no tenant's fit gives an estimate."""
        rates, qws, overheads = self._sorted
        n = len(rates)
        if not n:
            return None
        m = n // 2
        if n % 2:
            return rates[m], qws[m], overheads[m]
        return math.sqrt(rates[m - 1] * rates[m]), (qws[m - 1] + qws[m]) / 2, (overheads[m - 1] + overheads[m]) / 2
