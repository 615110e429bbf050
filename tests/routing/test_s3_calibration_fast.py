"""Issue 14: the calibration fit costs less per first byte, with bit-identical results, and its
observations can wait until the answer is sent (every read sees all of them)."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from routing.calibration import Calibration, PrefillRateEstimator

_SCALE = 1000.0
_N = 3


def _ref_solve(m: list[list[float]], v: list[float]) -> list[float] | None:
    """The session-2 solver, kept as the reference."""
    n = len(v)
    a = [row[:] + [v[i]] for i, row in enumerate(m)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[piv][col]) < 1e-12:
            return None
        a[col], a[piv] = a[piv], a[col]
        for r in range(n):
            if r != col:
                f = a[r][col] / a[col][col]
                for k in range(col, n + 1):
                    a[r][k] -= f * a[col][k]
    return [a[i][n] / a[i][i] for i in range(n)]


class _Ref:
    """The session-2 ``PrefillRateEstimator.observe`` arithmetic, operation for operation."""

    def __init__(self, prior_rate: float, forget: float, prior_weight: float, clip_k: float, min_samples: int) -> None:
        self.prior_rate, self.forget, self.prior_weight = prior_rate, forget, prior_weight
        self.clip_k, self.min_samples = clip_k, min_samples
        self.samples = 0
        self._xx = [[0.0] * _N for _ in range(_N)]
        self._xy = [0.0] * _N
        self._abs_res = 0.0
        self._theta: list[float] | None = None

    def _fit(self) -> list[float] | None:
        w = self.prior_weight
        b0 = _SCALE / self.prior_rate
        pm = [[1e-6, 0.0, 0.0], [0.0, 2 * w, -w], [0.0, -w, w]]
        pv = [0.0, w * b0, 0.0]
        m = [[self._xx[i][j] + pm[i][j] for j in range(_N)] for i in range(_N)]
        v = [self._xy[i] + pv[i] for i in range(_N)]
        return _ref_solve(m, v)

    @staticmethod
    def _features(u: float, q: float, shared: float | None) -> list[float]:
        s = q if shared is None else min(max(0.0, shared), q)
        return [1.0, (u + s) / _SCALE, (q - s) / _SCALE]

    def predict(self, u: float, q: float, s: float | None) -> float | None:
        th = self._theta
        if th is None:
            return None
        return sum(t * xi for t, xi in zip(th, self._features(u, q, s)))

    def observe(self, u: float, q: float, ttft: float, s: float | None) -> None:
        if not all(math.isfinite(x) and x >= 0 for x in (u, q, ttft)):
            return
        x = self._features(u, q, s)
        y = ttft
        pred = self.predict(u, q, s)
        if pred is not None and self.samples >= self.min_samples:
            bound = self.clip_k * max(self._abs_res, 1e-3 + 0.01 * abs(pred))
            r = max(-bound, min(bound, y - pred))
            y = pred + r
            self._abs_res = self.forget * self._abs_res + (1 - self.forget) * abs(r)
        elif pred is not None:
            self._abs_res = 0.8 * self._abs_res + 0.2 * abs(y - pred)
        lam = self.forget
        for i in range(_N):
            for j in range(_N):
                self._xx[i][j] = lam * self._xx[i][j] + x[i] * x[j]
            self._xy[i] = lam * self._xy[i] + x[i] * y
        self.samples += 1
        th = self._fit()
        if th is not None and all(math.isfinite(t) for t in th):
            self._theta = th


_obs = st.tuples(st.floats(0, 5000), st.floats(0, 20000), st.floats(0, 5),
                 st.one_of(st.none(), st.floats(-100, 20000)))


@settings(max_examples=300, deadline=None)
@given(st.lists(_obs, max_size=60), st.sampled_from([0.9, 0.98, 1.0]), st.sampled_from([0.1, 0.5, 3.0]),
       st.integers(1, 10), st.sampled_from([100.0, 10000.0]))
def test_fit_is_bit_identical_to_the_reference(obs, forget, prior_weight, min_samples, prior_rate) -> None:
    ref = _Ref(prior_rate, forget, prior_weight, 3.0, min_samples)
    est = PrefillRateEstimator(prior_rate, forget=forget, prior_weight=prior_weight, min_samples=min_samples)
    for u, q, y, s in obs:
        ref.observe(u, q, y, s)
        est.observe(u, q, y, s)
        assert est._theta == ref._theta and est._abs_res == ref._abs_res and est.samples == ref.samples
        assert est._xx == ref._xx and est._xy == ref._xy
        assert est.predict(u, q, s) == ref.predict(u, q, s)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["r0", "r1"]), _obs), max_size=80))
def test_deferred_observations_are_applied_before_any_read(obs) -> None:
    now, later = Calibration(prior_rate=1000.0, min_samples=3), Calibration(prior_rate=1000.0, min_samples=3)
    later.defer_observations(True)
    for rid, (u, q, y, s) in obs:
        now.observe_first_byte(rid, u, q, y, s)
        later.observe_first_byte(rid, u, q, y, s)
        assert later.estimate(rid) == now.estimate(rid)  # a read applies what waits
    later.observe_first_byte("r1", 10.0, 0.0, 0.01)
    now.observe_first_byte("r1", 10.0, 0.0, 0.01)
    assert later.pending == 1
    later.flush()
    assert later.pending == 0 and later.estimator("r1").samples == now.estimator("r1").samples


def test_deferred_observations_are_bounded() -> None:
    cal = Calibration(prior_rate=1000.0)
    cal.defer_observations(True)
    for _ in range(1000):
        cal.observe_first_byte("r0", 10.0, 0.0, 0.01)
    assert cal.pending <= Calibration.MAX_PENDING
    cal.forget_replica("r0")
    assert cal.pending == 0 and cal.estimate("r0") is None
