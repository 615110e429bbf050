"""Self-calibration of the cost model from what replicas show (issue 15).

Pure (no I/O): the gateway (``gateway/engine_metrics.py``, the load tracker's
first-byte hook) and the offline simulator (``sim/des.py``) feed it.

Two sources, both available from a real engine:

* **First-byte times.** For each request the router knows, at dispatch, the
  prefill tokens already queued on the replica by this router (``q``, its own
  load view) and the uncached tokens of the request (``u``, prompt minus the
  predicted prefix). The time to first byte ``y`` (seconds, dispatch to first
  byte) is fitted per replica as

      y ≈ a + b·u + c·q

  by exponentially weighted least squares (forgetting factor ``forget``, so
  an effective memory of ``1 / (1 - forget)`` requests) with outlier
  clipping (a residual beyond ``clip_k`` times the running mean absolute
  residual is clipped to that bound before it enters the fit, a Huber-style
  update). From the fit: **prefill rate** ``1 / b`` (tokens/s, the router's
  token unit), **queue weight** ``c / b`` (how much one queued token delays
  this request compared with one of its own: 1 on a replica that prefills one
  request at a time, well below 1 where concurrent prefills share the
  replica's rate, chunked prefill as vLLM and SGLang run by default), and a
  fixed **overhead** ``a`` (s). A weak prior holds the fit where the data do
  not identify it: ``b`` toward ``1 / prior_rate`` and ``c`` toward ``b``
  (queue weight 1) with the weight of ``prior_weight`` observations whose
  features are 1000 tokens each (the weight is in squared feature units: against
  observations of smaller queues and prompts it counts for more, session 13), so a
  lightly loaded replica (``q`` always 0) keeps the FIFO assumption.

  Bounds: the rate is clipped to ``[prior_rate / rate_range, prior_rate ·
  rate_range]`` (default range 1024: the configured constant may be nominal real tokens while the router counts its own tokenizer's tokens per wall second), the queue weight to ``[0, 1]``, the
  overhead to ``[0, max_overhead_s]``; no estimate is given before
  ``min_samples`` observations (the configured constant is used until then).

* **Engine metrics** (Prometheus text of ``GET /metrics``): requests running
  and waiting, KV cache usage and the prefix-cache hit ratio, under vLLM's
  names (``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
  ``vllm:kv_cache_usage_perc`` or the older ``vllm:gpu_cache_usage_perc``,
  ``vllm:prefix_cache_hits`` / ``vllm:prefix_cache_queries``) or SGLang's
  (``sglang:num_running_reqs``, ``sglang:num_queue_reqs``,
  ``sglang:token_usage``, ``sglang:cache_hit_rate``). See
  :func:`parse_engine_metrics`. The engine's waiting queue covers requests
  from every client of the replica, not only this gateway's.

Which replica model (one prefill at a time or shared) is *learned* (the queue
weight), not configured: no engine exports "chunked prefill on" as a metric.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from routing.calibration_tenants import ReplicaFits
from routing.calibration_tracker import CalibratingLoadTracker  # split out in session 11, re-exported
from routing.engine_metrics import EngineSample, parse_engine_metrics
from routing.linsolve import solve3 as _solve
from routing.linsolve import solve3_flat as _solve_flat

__all__ = [
    "CalibratingLoadTracker",
    "Calibration",
    "EngineSample",
    "PrefillRateEstimator",
    "ReplicaEstimate",
    "parse_engine_metrics",
]

_SCALE = 1000.0  # tokens per feature unit (keeps the normal equations well scaled)


@dataclass(frozen=True)
class ReplicaEstimate:
    """Calibrated view of one replica.

    ``prefill_tokens_per_s``: tokens/s (router tokens); ``queue_weight``: 0..1;
    ``overhead_s``: seconds; ``samples``: first-byte observations so far;
    ``engine``: the last engine metrics sample, if any; ``calibrated``: the
    first three come from at least ``min_samples`` observations (else they
    are the prior: configured rate, queue weight 1, no overhead);
    ``external_requests``: requests the engine reported running or waiting
    beyond this router's own at the scrape (other clients of the replica;
    0 when unknown).
    """

    prefill_tokens_per_s: float
    queue_weight: float
    overhead_s: float
    samples: int
    engine: EngineSample | None = None
    calibrated: bool = True
    external_requests: float = 0.0


_N = 3  # features: 1, own + shared work u + s (s = min(q, k·u)), the rest of the queue q - s


class PrefillRateEstimator:
    """Per-replica fit of ``ttft ≈ a + b·(u + s) + c·(q − s)`` (module doc),
    with ``s`` the shared wait (:meth:`routing.types.ReplicaLoad.shared_wait_tokens`).

    Parameters: ``prior_rate`` (> 0, tokens/s), ``forget`` in (0, 1],
    ``prior_weight`` (> 0, in observations of 1000-token features: module doc), ``clip_k`` (> 0), ``min_samples``
    (>= 1), ``rate_range`` (>= 1), ``max_overhead_s`` (>= 0). Raises
    :class:`ValueError` out of range.
    """

    def __init__(self, prior_rate: float, *, forget: float = 0.98, prior_weight: float = 0.5,
                 clip_k: float = 3.0, min_samples: int = 20, rate_range: float = 1024.0,
                 max_overhead_s: float = 10.0) -> None:
        if not prior_rate > 0 or not 0 < forget <= 1 or not prior_weight > 0 or not clip_k > 0:
            raise ValueError("prior_rate, prior_weight, clip_k must be > 0 and forget in (0, 1]")
        if min_samples < 1 or rate_range < 1 or max_overhead_s < 0:
            raise ValueError("min_samples >= 1, rate_range >= 1, max_overhead_s >= 0")
        self.prior_rate = prior_rate
        self.forget = forget
        self.prior_weight = prior_weight
        self.clip_k = clip_k
        self.min_samples = min_samples
        self.rate_range = rate_range
        self.max_overhead_s = max_overhead_s
        self.samples = 0
        self._xx = [[0.0] * _N for _ in range(_N)]
        self._xy = [0.0] * _N
        self._abs_res = 0.0  # EW mean absolute residual (s)
        self._theta: list[float] | None = None
        self._good: tuple[float, float, float] | None = None  # the last identified estimate (params())

    def _fit(self) -> list[float] | None:
        # the statistics plus a weak ridge prior of weight w: a toward 0 (tiny), b toward
        # b0 = 1 / prior rate, (c - b) toward 0 (a FIFO replica); unrolled
        w = self.prior_weight
        (x00, x01, x02), (x10, x11, x12), (x20, x21, x22) = self._xx
        y0, y1, y2 = self._xy
        m = [[x00 + 1e-6, x01 + 0.0, x02 + 0.0], [x10 + 0.0, x11 + 2 * w, x12 + -w], [x20 + 0.0, x21 + -w, x22 + w]]
        return _solve(m, [y0 + 0.0, y1 + w * (_SCALE / self.prior_rate), y2 + 0.0])

    @staticmethod
    def _features(uncached: float, queued: float, shared: float | None) -> list[float]:
        s = queued if shared is None else min(max(0.0, shared), queued)
        return [1.0, (uncached + s) / _SCALE, (queued - s) / _SCALE]

    def predict(self, uncached_tokens: float, queued_tokens: float,
                shared_wait_tokens: float | None = None) -> float | None:
        """Predicted time to first byte (s), or ``None`` before any fit
        (``shared_wait_tokens`` ``None``: the whole queue, as on a FIFO replica)."""
        th = self._theta
        if th is None:
            return None
        x = self._features(uncached_tokens, queued_tokens, shared_wait_tokens)
        return 0.0 + th[0] * x[0] + th[1] * x[1] + th[2] * x[2]  # = sum(...) on CPython 3.11, left to right

    def observe(self, uncached_tokens: float, queued_tokens: float, ttft_s: float,
                shared_wait_tokens: float | None = None) -> bool:
        """Add one observation: ``uncached_tokens``, ``queued_tokens`` (>= 0,
        tokens), the measured ``ttft_s`` (s) and ``shared_wait_tokens`` (the
        part of the queue that delays it on a shared replica, ``min(q, k·u)``;
        ``None``: unknown, the whole queue). Non-finite or negative values
        are ignored. Returns whether it was taken."""
        isfinite = math.isfinite
        if not (isfinite(uncached_tokens) and uncached_tokens >= 0 and isfinite(queued_tokens)
                and queued_tokens >= 0 and isfinite(ttft_s) and ttft_s >= 0):
            return False
        # session 13 (issue 14): one flat pass, no list per feature, no builtin call per min/max and the
        # fit solved from locals (routing.linsolve.solve3_flat): the very same floating-point operations
        # as _features/_fit/solve3 (``max(a, b)`` is ``b if b > a else a``, ``min(a, b)`` is
        # ``b if b < a else a``, the same object either way), bit for bit
        # (tests/routing/test_s3_calibration_fast.py, tests/routing/test_s13_route_calibration.py)
        if shared_wait_tokens is None:
            s = queued_tokens
        else:
            s = shared_wait_tokens if shared_wait_tokens > 0.0 else 0.0
            if queued_tokens < s:
                s = queued_tokens
        x0 = 1.0
        x1 = (uncached_tokens + s) / _SCALE
        x2 = (queued_tokens - s) / _SCALE
        y = ttft_s
        th = self._theta
        if th is not None:
            pred = 0.0 + th[0] * x0 + th[1] * x1 + th[2] * x2  # = predict()
            if self.samples >= self.min_samples:
                ar = self._abs_res
                lo = 1e-3 + 0.01 * abs(pred)
                bound = self.clip_k * (lo if lo > ar else ar)
                d = y - pred
                r = d if d < bound else bound
                if not r > -bound:
                    r = -bound
                y = pred + r
                self._abs_res = self.forget * ar + (1 - self.forget) * abs(r)
            else:
                self._abs_res = 0.8 * self._abs_res + 0.2 * abs(y - pred)
        lam = self.forget
        r0, r1, r2 = self._xx  # exponentially weighted x·xᵀ and x·y (unrolled)
        r0[0] = m00 = lam * r0[0] + x0 * x0
        r0[1] = m01 = lam * r0[1] + x0 * x1
        r0[2] = m02 = lam * r0[2] + x0 * x2
        r1[0] = m10 = lam * r1[0] + x1 * x0
        r1[1] = m11 = lam * r1[1] + x1 * x1
        r1[2] = m12 = lam * r1[2] + x1 * x2
        r2[0] = m20 = lam * r2[0] + x2 * x0
        r2[1] = m21 = lam * r2[1] + x2 * x1
        r2[2] = m22 = lam * r2[2] + x2 * x2
        xy = self._xy
        xy[0] = v0 = lam * xy[0] + x0 * y
        xy[1] = v1 = lam * xy[1] + x1 * y
        xy[2] = v2 = lam * xy[2] + x2 * y
        self.samples += 1
        # _fit(): the statistics plus the weak ridge prior, solved
        w = self.prior_weight
        th = _solve_flat(m00 + 1e-6, m01 + 0.0, m02 + 0.0, v0 + 0.0,
                         m10 + 0.0, m11 + 2 * w, m12 + -w, v1 + w * (_SCALE / self.prior_rate),
                         m20 + 0.0, m21 + -w, m22 + w, v2 + 0.0)
        if th is not None:
            t0, b, t2 = th
            if isfinite(t0) and isfinite(b) and isfinite(t2):
                self._theta = th
                if b > 0 and self.samples >= self.min_samples:
                    rate, span = self.prior_rate, self.rate_range
                    est = _SCALE / b  # min(rate * span, max(rate / span, est)), as conditionals
                    lo = rate / span
                    if not est > lo:
                        est = lo
                    hi = rate * span
                    if not est < hi:
                        est = hi
                    qw = t2 / b  # min(1.0, max(0.0, qw))
                    if not qw > 0.0:
                        qw = 0.0
                    if not qw < 1.0:
                        qw = 1.0
                    oh = t0 if t0 > 0.0 else 0.0  # min(max_overhead_s, max(0.0, t0))
                    if not oh < self.max_overhead_s:
                        oh = self.max_overhead_s
                    self._good = (est, qw, oh)
        return True

    def params(self) -> tuple[float, float, float] | None:
        """The bounded ``(rate tokens/s, queue weight, overhead s)`` (module doc), or ``None`` before
        ``min_samples`` or while the fit never identified a rate. When the latest fit does not (time
        does not grow with work, e.g. deep overload on a shared replica), the last one that did
        stands (R10-3: before session 11 the replica lost its estimate, which switched calibration
        off for every candidate of the pool)."""
        return self._good

    def estimate(self, engine: EngineSample | None = None, external_requests: float = 0.0) -> ReplicaEstimate | None:
        """:meth:`params` as a :class:`ReplicaEstimate` (``None`` when it is); ``engine`` and
        ``external_requests`` are set on it as given (:meth:`Calibration.estimate`)."""
        p = self._good
        if p is None:
            return None
        return ReplicaEstimate(prefill_tokens_per_s=p[0], queue_weight=p[1], overhead_s=p[2], samples=self.samples,
                               engine=engine, external_requests=external_requests)


class Calibration:
    """Per-replica calibration (per-tenant fits combined by :class:`routing.calibration_tenants.ReplicaFits`)
    and the last engine sample of each replica.

    ``prior_rate``: tokens/s before calibration (the policy's configured
    constant); keyword arguments go to every :class:`PrefillRateEstimator`.
    Not thread-safe: one event loop.
    """

    def __init__(self, prior_rate: float = 10000.0, **estimator_kw: float) -> None:
        if not prior_rate > 0:
            raise ValueError("prior_rate must be > 0")
        self.prior_rate = prior_rate
        self._kw = estimator_kw
        PrefillRateEstimator(prior_rate, **estimator_kw)  # type: ignore[arg-type]  # its ValueError now
        self._fits: dict[str, ReplicaFits] = {}
        #: monotonic seconds for the per-tenant fits' staleness (review R11b-2); the calibrating load
        #: tracker sets its own clock here when it is built; None: staleness by observations alone
        self.clock: Callable[[], float] | None = None
        self._engine: dict[str, EngineSample] = {}
        self._external: dict[str, float] = {}
        self._defer = False
        self._pending: list[tuple[str, str, float, float, float, float | None]] = []
        # the last estimate per replica with what it was built from (fits, their version, engine
        # sample, external requests): rebuilt only when one of them changed
        self._built: dict[str, tuple[ReplicaFits | None, int, EngineSample | None, float,
                                     ReplicaEstimate | None]] = {}

    #: deferred first-byte observations held at most (then they are applied at once)
    MAX_PENDING = 256

    def defer_observations(self, on: bool) -> None:
        """With ``on``, :meth:`observe_first_byte` only queues the observation; it is applied,
        in order, by :meth:`flush` or before any read (:meth:`estimate`, :meth:`estimator`,
        :meth:`forget_replica`), so every read sees exactly what it would have seen (the gateway
        flushes after the answer is sent). Off: pending ones are applied now."""
        if not on:
            self.flush()
        self._defer = on

    @property
    def pending(self) -> int:
        """First-byte observations queued and not yet applied."""
        return len(self._pending)

    def flush(self) -> None:
        """Apply the queued first-byte observations in arrival order, then build the estimate of each
        replica they touched (:meth:`estimate`'s own cache, a pure function of what it is built from:
        the next decision reads it ready; issue 14, session 15: the gateway flushes after the answer)."""
        pending = self._pending
        if pending:
            self._pending = []
            fits = self._fits
            for rid, tenant, u, q, y, s in pending:
                f = fits.get(rid)  # _replica(rid), inline (session 17: the flush runs once per answer)
                (self._replica(rid) if f is None else f).observe(tenant, u, q, y, s)
            if len(pending) == 1:  # an answer's own observation (no generator for one replica)
                self.estimate(pending[0][0])
            else:
                for rid in dict.fromkeys([p[0] for p in pending]):
                    self.estimate(rid)

    def _replica(self, replica_id: str) -> ReplicaFits:
        f = self._fits.get(replica_id)
        if f is None:
            f = self._fits[replica_id] = ReplicaFits(self._new_estimator, clock=self.clock)
        return f

    def _new_estimator(self) -> PrefillRateEstimator:
        return PrefillRateEstimator(self.prior_rate, **self._kw)  # type: ignore[arg-type]

    def estimator(self, replica_id: str, tenant: str = "") -> PrefillRateEstimator:
        """The estimator of ``tenant`` on ``replica_id`` (created on first use), queued observations
        applied."""
        self.flush()
        return self._replica(replica_id).estimator(tenant)

    def observations(self, replica_id: str) -> int:
        """First bytes taken on ``replica_id`` so far (every tenant), queued ones applied."""
        self.flush()
        f = self._fits.get(replica_id)
        return 0 if f is None else f.observations

    def observe_first_byte(self, replica_id: str, uncached_tokens: float, queued_tokens: float,
                           ttft_s: float, shared_wait_tokens: float | None = None, tenant: str = "") -> None:
        """One first-byte observation of ``tenant`` (its configured id; "" when none) on
        ``replica_id`` (see :meth:`PrefillRateEstimator.observe`; queued while
        :meth:`defer_observations` is on, at most :attr:`MAX_PENDING`)."""
        if self._defer:
            self._pending.append((replica_id, tenant, uncached_tokens, queued_tokens, ttft_s, shared_wait_tokens))
            if len(self._pending) >= self.MAX_PENDING:
                self.flush()
            return
        self._replica(replica_id).observe(tenant, uncached_tokens, queued_tokens, ttft_s, shared_wait_tokens)

    def observe_engine(self, replica_id: str, sample: EngineSample, own_requests: int | None = None) -> None:
        """Store the latest engine metrics of ``replica_id``; with
        ``own_requests`` (this router's running requests on it at the scrape),
        also the requests the engine holds beyond them (running + waiting −
        own, floored at 0): load from other clients that this router's own
        view does not have."""
        self._engine[replica_id] = sample
        if own_requests is not None and (sample.running is not None or sample.waiting is not None):
            total = (sample.running or 0.0) + (sample.waiting or 0.0)
            self._external[replica_id] = max(0.0, total - own_requests)

    def estimate(self, replica_id: str) -> ReplicaEstimate | None:
        """The replica's estimate (the upper-median tenant's fit, R10-3) with its last engine
        sample; ``None`` while neither is known (the estimate fields hold the prior until a
        tenant's fit there has ``min_samples`` first bytes)."""
        if self._pending:
            self.flush()
        fits = self._fits.get(replica_id)
        eng = self._engine.get(replica_id)
        ext = self._external.get(replica_id, 0.0)
        version = fits.version if fits is not None else 0
        built = self._built.get(replica_id)
        if built is not None and built[0] is fits and built[1] == version and built[2] is eng and built[3] == ext:
            return built[4]
        # built here (session 17: no helper call per rebuild; the flush rebuilds once per answer)
        m = fits.median() if fits is not None else None
        samples = fits.observations if fits is not None else 0
        if m is not None:
            out: ReplicaEstimate | None = ReplicaEstimate(m[0], m[1], m[2], samples, eng, external_requests=ext)
        elif eng is not None:
            out = ReplicaEstimate(self.prior_rate, 1.0, 0.0, samples, eng, calibrated=False, external_requests=ext)
        else:
            out = None
        self._built[replica_id] = (fits, version, eng, ext, out)
        return out

    def forget_replica(self, replica_id: str) -> None:
        """Drop everything learnt about ``replica_id`` (it restarted or was removed)."""
        self.flush()
        self._fits.pop(replica_id, None)
        self._engine.pop(replica_id, None)
        self._external.pop(replica_id, None)
        self._built.pop(replica_id, None)
