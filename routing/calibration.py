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
  (queue weight 1) with the weight of ``prior_weight`` observations, so a
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

from routing.types import ReplicaLoad

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
class EngineSample:
    """One scrape of a replica's engine metrics; ``None`` where not exposed.

    ``running`` / ``waiting``: requests; ``kv_usage``: 0..1;
    ``prefix_hit_rate``: cumulative hit tokens / queried tokens (0..1);
    ``engine``: ``"vllm"`` or ``"sglang"`` (or ``""`` when nothing known was found).
    """

    engine: str = ""
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None
    prefix_hit_rate: float | None = None


@dataclass(frozen=True)
class ReplicaEstimate:
    """Calibrated view of one replica.

    ``prefill_tokens_per_s``: tokens/s (router tokens); ``queue_weight``: 0..1;
    ``overhead_s``: seconds; ``samples``: first-byte observations so far;
    ``engine``: the last engine metrics sample, if any; ``calibrated``: the
    first three come from at least ``min_samples`` observations (else they
    are the prior: configured rate, queue weight 1, no overhead).
    """

    prefill_tokens_per_s: float
    queue_weight: float
    overhead_s: float
    samples: int
    engine: EngineSample | None = None
    calibrated: bool = True


def _solve3(m: list[list[float]], v: list[float]) -> list[float] | None:
    """Solve the 3x3 system ``m x = v`` by Gaussian elimination with partial pivoting."""
    a = [row[:] + [v[i]] for i, row in enumerate(m)]
    for col in range(3):
        piv = max(range(col, 3), key=lambda r: abs(a[r][col]))
        if abs(a[piv][col]) < 1e-12:
            return None
        a[col], a[piv] = a[piv], a[col]
        for r in range(3):
            if r != col:
                f = a[r][col] / a[col][col]
                for k in range(col, 4):
                    a[r][k] -= f * a[col][k]
    return [a[i][3] / a[i][i] for i in range(3)]


class PrefillRateEstimator:
    """Per-replica fit of ``ttft ≈ a + b·uncached + c·queued`` (module doc).

    Parameters: ``prior_rate`` (> 0, tokens/s), ``forget`` in (0, 1],
    ``prior_weight`` (> 0, in observations), ``clip_k`` (> 0), ``min_samples``
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
        self._xx = [[0.0] * 3 for _ in range(3)]
        self._xy = [0.0] * 3
        self._abs_res = 0.0  # EW mean absolute residual (s)
        self._theta: list[float] | None = None

    def _prior(self) -> tuple[list[list[float]], list[float]]:
        w = self.prior_weight
        b0 = _SCALE / self.prior_rate
        # ridge: a toward 0 (tiny), b toward b0, and (c - b) toward 0
        m = [[1e-6, 0.0, 0.0], [0.0, w + w, -w], [0.0, -w, w]]
        v = [0.0, w * b0, 0.0]
        return m, v

    def _solve(self) -> list[float] | None:
        pm, pv = self._prior()
        m = [[self._xx[i][j] + pm[i][j] for j in range(3)] for i in range(3)]
        v = [self._xy[i] + pv[i] for i in range(3)]
        return _solve3(m, v)

    def predict(self, uncached_tokens: float, queued_tokens: float) -> float | None:
        """Predicted time to first byte (s), or ``None`` before any fit."""
        th = self._theta
        if th is None:
            return None
        return th[0] + th[1] * uncached_tokens / _SCALE + th[2] * queued_tokens / _SCALE

    def observe(self, uncached_tokens: float, queued_tokens: float, ttft_s: float) -> None:
        """Add one observation: ``uncached_tokens``, ``queued_tokens`` (>= 0,
        tokens) and the measured ``ttft_s`` (s). Non-finite or negative values
        are ignored."""
        if not all(math.isfinite(x) and x >= 0 for x in (uncached_tokens, queued_tokens, ttft_s)):
            return
        x = [1.0, uncached_tokens / _SCALE, queued_tokens / _SCALE]
        y = ttft_s
        pred = self.predict(uncached_tokens, queued_tokens)
        if pred is not None and self.samples >= self.min_samples:
            bound = self.clip_k * max(self._abs_res, 1e-3 + 0.01 * abs(pred))
            r = max(-bound, min(bound, y - pred))
            y = pred + r
            self._abs_res = self.forget * self._abs_res + (1 - self.forget) * abs(r)
        elif pred is not None:
            self._abs_res = 0.8 * self._abs_res + 0.2 * abs(y - pred)
        lam = self.forget
        for i in range(3):
            for j in range(3):
                self._xx[i][j] = lam * self._xx[i][j] + x[i] * x[j]
            self._xy[i] = lam * self._xy[i] + x[i] * y
        self.samples += 1
        th = self._solve()
        if th is not None and all(math.isfinite(t) for t in th):
            self._theta = th

    def estimate(self) -> ReplicaEstimate | None:
        """The bounded estimate (module doc), or ``None`` before ``min_samples``."""
        th = self._theta
        if th is None or self.samples < self.min_samples:
            return None
        lo, hi = self.prior_rate / self.rate_range, self.prior_rate * self.rate_range
        b = th[1]
        rate = _SCALE / b if b > 0 else hi
        rate = min(hi, max(lo, rate))
        qw = th[2] / b if b > 0 else 1.0
        return ReplicaEstimate(
            prefill_tokens_per_s=rate,
            queue_weight=min(1.0, max(0.0, qw)),
            overhead_s=min(self.max_overhead_s, max(0.0, th[0])),
            samples=self.samples,
        )


class Calibration:
    """Per-replica estimators and the last engine sample of each replica.

    ``prior_rate``: tokens/s before calibration (the policy's configured
    constant); keyword arguments go to every :class:`PrefillRateEstimator`.
    Not thread-safe: one event loop.
    """

    def __init__(self, prior_rate: float = 10000.0, **estimator_kw: float) -> None:
        if not prior_rate > 0:
            raise ValueError("prior_rate must be > 0")
        self.prior_rate = prior_rate
        self._kw = estimator_kw
        self._est: dict[str, PrefillRateEstimator] = {}
        self._engine: dict[str, EngineSample] = {}

    def estimator(self, replica_id: str) -> PrefillRateEstimator:
        """The estimator of ``replica_id`` (created on first use)."""
        e = self._est.get(replica_id)
        if e is None:
            e = self._est[replica_id] = PrefillRateEstimator(self.prior_rate, **self._kw)  # type: ignore[arg-type]
        return e

    def observe_first_byte(self, replica_id: str, uncached_tokens: float, queued_tokens: float,
                           ttft_s: float) -> None:
        """One first-byte observation (see :meth:`PrefillRateEstimator.observe`)."""
        self.estimator(replica_id).observe(uncached_tokens, queued_tokens, ttft_s)

    def observe_engine(self, replica_id: str, sample: EngineSample) -> None:
        """Store the latest engine metrics of ``replica_id``."""
        self._engine[replica_id] = sample

    def estimate(self, replica_id: str) -> ReplicaEstimate | None:
        """The replica's estimate with its last engine sample; ``None`` while
        neither is known (the estimate fields hold the prior until
        ``min_samples`` first bytes were seen)."""
        est = self._est.get(replica_id)
        e = est.estimate() if est is not None else None
        eng = self._engine.get(replica_id)
        if e is None:
            if eng is None:
                return None
            return ReplicaEstimate(self.prior_rate, 1.0, 0.0, est.samples if est else 0, eng, calibrated=False)
        return ReplicaEstimate(e.prefill_tokens_per_s, e.queue_weight, e.overhead_s, e.samples, eng)

    def forget_replica(self, replica_id: str) -> None:
        """Drop everything learnt about ``replica_id`` (it restarted or was removed)."""
        self._est.pop(replica_id, None)
        self._engine.pop(replica_id, None)


class _CalibratingTicket:
    """A load ticket that reports its first byte to a :class:`Calibration`."""

    __slots__ = ("_cal", "_clock", "_inner", "_queued", "_t0", "_uncached", "replica_id")

    def __init__(self, inner: object, cal: Calibration, clock: Callable[[], float], queued: int,
                 uncached: int, replica_id: str) -> None:
        self._inner = inner
        self._cal = cal
        self._clock = clock
        self._t0: float | None = clock()
        self._queued = queued
        self._uncached = uncached
        self.replica_id = replica_id

    @property
    def active(self) -> bool:
        """True until :meth:`finish` has been called."""
        return self._inner.active  # type: ignore[attr-defined,no-any-return]

    def first_byte(self) -> None:
        """Feed the observation once, then release the prefill part."""
        if self._t0 is not None and self._inner.active:  # type: ignore[attr-defined]
            self._cal.observe_first_byte(self.replica_id, self._uncached, self._queued, self._clock() - self._t0)
        self._t0 = None
        self._inner.first_byte()  # type: ignore[attr-defined]

    def finish(self) -> None:
        """Release everything still held (no observation without a first byte)."""
        self._t0 = None
        self._inner.finish()  # type: ignore[attr-defined]


class CalibratingLoadTracker:
    """A :class:`routing.load.LoadTracker` wrapper that times each ticket from
    dispatch to ``first_byte()`` with ``clock`` (seconds; ``time.monotonic``
    in the gateway, simulated time in ``sim/des.py``) and feeds ``calibration``
    with (uncached = the ticket's prefill tokens, queued = the replica's
    queued prefill tokens before this dispatch, elapsed)."""

    def __init__(self, inner: object, calibration: Calibration, clock: Callable[[], float]) -> None:
        self.inner = inner
        self.calibration = calibration
        self.clock = clock

    def dispatch(self, replica_id: str, prefill_tokens: int, decode_tokens: int,
                 requests: int = 1) -> _CalibratingTicket:
        """See :meth:`routing.load.LoadTracker.dispatch`."""
        queued = self.inner.snapshot(replica_id).queued_prefill_tokens  # type: ignore[attr-defined]
        t = self.inner.dispatch(replica_id, prefill_tokens, decode_tokens, requests)  # type: ignore[attr-defined]
        return _CalibratingTicket(t, self.calibration, self.clock, queued, prefill_tokens, replica_id)

    def snapshot(self, replica_id: str) -> ReplicaLoad:
        """See :meth:`routing.load.LoadTracker.snapshot`."""
        return self.inner.snapshot(replica_id)  # type: ignore[attr-defined,no-any-return]


# --------------------------------------------------------------------------- engine metrics

_VLLM = {"vllm:num_requests_running": "running", "vllm:num_requests_waiting": "waiting",
         "vllm:kv_cache_usage_perc": "kv_usage", "vllm:gpu_cache_usage_perc": "kv_usage"}
_SGLANG = {"sglang:num_running_reqs": "running", "sglang:num_queue_reqs": "waiting",
           "sglang:token_usage": "kv_usage", "sglang:cache_hit_rate": "prefix_hit_rate"}


def parse_engine_metrics(text: str) -> EngineSample:
    """Parse Prometheus text exposition of a vLLM or SGLang server.

    Values of one name are summed over label sets (one model per replica;
    several ``engine`` labels of a data-parallel server add up). Counters
    ``vllm:prefix_cache_hits`` / ``vllm:prefix_cache_queries`` (with or
    without ``_total``) give ``prefix_hit_rate``. Unknown names are ignored;
    malformed text raises :class:`ValueError`.
    """
    from prometheus_client.parser import text_string_to_metric_families

    vals: dict[str, float] = {}
    engine = ""
    hits = queries = None
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            name = s.name
            if name.endswith("_total"):
                base = name[: -len("_total")]
            else:
                base = name
            v = float(s.value)
            if not math.isfinite(v):
                continue
            if base in _VLLM or base in _SGLANG:
                field = _VLLM.get(base) or _SGLANG[base]
                engine = engine or ("vllm" if base in _VLLM else "sglang")
                key = f"{base}|{field}"
                vals[key] = vals.get(key, 0.0) + v
            elif base == "vllm:prefix_cache_hits":
                hits = (hits or 0.0) + v
                engine = engine or "vllm"
            elif base == "vllm:prefix_cache_queries":
                queries = (queries or 0.0) + v
    out: dict[str, float] = {}
    for key, v in vals.items():
        base, field = key.split("|")
        if field in out and base == "vllm:gpu_cache_usage_perc":
            continue  # prefer kv_cache_usage_perc (the newer name)
        out[field] = v
    if "prefix_hit_rate" not in out and hits is not None and queries:
        out["prefix_hit_rate"] = hits / queries
    return EngineSample(engine=engine, running=out.get("running"), waiting=out.get("waiting"),
                        kv_usage=out.get("kv_usage"), prefix_hit_rate=out.get("prefix_hit_rate"))
