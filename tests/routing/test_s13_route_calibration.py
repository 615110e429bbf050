"""Session 13 (issue 14): the calibration estimator's flat observe pass and the scalar 3 x 3 solve give
the session-12 results bit for bit: every statistic, the fit, the clipped residual and the bounded
estimate (``params()``), for any inputs (ints, floats, no shared wait, negative shared wait, zero)."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from routing.calibration import PrefillRateEstimator
from routing.linsolve import solve3, solve3_flat

_SCALE = 1000.0


def _general_solve(m: list[list[float]], v: list[float]) -> list[float] | None:
    """The n x n elimination with partial pivoting (first row of largest magnitude) used before session 6."""
    n = len(v)
    a = [row[:] + [v[i]] for i, row in enumerate(m)]
    for col in range(n):
        piv, best = col, abs(a[col][col])
        for r in range(col + 1, n):
            x = abs(a[r][col])
            if x > best:
                piv, best = r, x
        if best < 1e-12:
            return None
        a[col], a[piv] = a[piv], a[col]
        ac = a[col]
        d = ac[col]
        for r in range(n):
            if r != col:
                ar = a[r]
                f = ar[col] / d
                for k in range(col, n + 1):
                    ar[k] -= f * ac[k]
    return [a[i][n] / a[i][i] for i in range(n)]


class _S12(PrefillRateEstimator):
    """The session-12 ``observe`` (features list, ``_fit``, ``min``/``max`` calls), operation for operation."""

    @staticmethod
    def _features12(uncached: float, queued: float, shared: float | None) -> list[float]:
        s = queued if shared is None else min(max(0.0, shared), queued)
        return [1.0, (uncached + s) / _SCALE, (queued - s) / _SCALE]

    def _fit12(self) -> list[float] | None:
        w = self.prior_weight
        (x00, x01, x02), (x10, x11, x12), (x20, x21, x22) = self._xx
        y0, y1, y2 = self._xy
        m = [[x00 + 1e-6, x01 + 0.0, x02 + 0.0], [x10 + 0.0, x11 + 2 * w, x12 + -w], [x20 + 0.0, x21 + -w, x22 + w]]
        return _general_solve(m, [y0 + 0.0, y1 + w * (_SCALE / self.prior_rate), y2 + 0.0])

    def observe(self, uncached_tokens, queued_tokens, ttft_s, shared_wait_tokens=None):  # type: ignore[no-untyped-def]
        isfinite = math.isfinite
        if not (isfinite(uncached_tokens) and uncached_tokens >= 0 and isfinite(queued_tokens)
                and queued_tokens >= 0 and isfinite(ttft_s) and ttft_s >= 0):
            return False
        x0, x1, x2 = self._features12(uncached_tokens, queued_tokens, shared_wait_tokens)
        y = ttft_s
        th = self._theta
        pred = None if th is None else 0.0 + th[0] * x0 + th[1] * x1 + th[2] * x2
        if pred is not None and self.samples >= self.min_samples:
            bound = self.clip_k * max(self._abs_res, 1e-3 + 0.01 * abs(pred))
            r = max(-bound, min(bound, y - pred))
            y = pred + r
            self._abs_res = self.forget * self._abs_res + (1 - self.forget) * abs(r)
        elif pred is not None:
            self._abs_res = 0.8 * self._abs_res + 0.2 * abs(y - pred)
        lam = self.forget
        x = (x0, x1, x2)
        for i in range(3):
            for j in range(3):
                self._xx[i][j] = lam * self._xx[i][j] + x[i] * x[j]
            self._xy[i] = lam * self._xy[i] + x[i] * y
        self.samples += 1
        th = self._fit12()
        if th is not None and isfinite(th[0]) and isfinite(th[1]) and isfinite(th[2]):
            self._theta = th
            if th[1] > 0 and self.samples >= self.min_samples:
                b, rate = th[1], self.prior_rate
                self._good = (min(rate * self.rate_range, max(rate / self.rate_range, _SCALE / b)),
                              min(1.0, max(0.0, th[2] / b)), min(self.max_overhead_s, max(0.0, th[0])))
        return True


_num = st.one_of(st.integers(0, 20000), st.floats(0, 20000), st.just(0.0))
_obs = st.tuples(_num, _num, st.one_of(st.floats(0, 5), st.floats(0, 1e-4), st.floats(-1, 5)),
                 st.one_of(st.none(), st.integers(-100, 20000), st.floats(-100, 20000), st.just(-0.0)))


@settings(max_examples=400, deadline=None)
@given(st.lists(_obs, max_size=80), st.sampled_from([0.9, 0.98, 1.0]), st.sampled_from([0.1, 0.5, 3.0]),
       st.integers(1, 10), st.sampled_from([100.0, 10000.0]), st.sampled_from([10.0, 10, 0.0, 1e-4]),
       st.sampled_from([1.0, 4.0, 1024.0]))
def test_flat_observe_is_the_session_12_observe_bit_for_bit(obs, forget, prior_weight, min_samples, prior_rate,
                                                            max_overhead, rate_range) -> None:
    kw = dict(forget=forget, prior_weight=prior_weight, min_samples=min_samples, max_overhead_s=max_overhead,
              rate_range=rate_range)
    ref, est = _S12(prior_rate, **kw), PrefillRateEstimator(prior_rate, **kw)
    for u, q, y, s in obs:
        assert est.observe(u, q, y, s) == ref.observe(u, q, y, s)
        assert repr(est._theta) == repr(ref._theta) and repr(est._abs_res) == repr(ref._abs_res)
        assert repr(est._xx) == repr(ref._xx) and repr(est._xy) == repr(ref._xy) and est.samples == ref.samples
        assert repr(est.params()) == repr(ref.params())  # repr: the type (an int bound) and -0.0 too
        assert repr(est.predict(u, q, s)) == repr(ref.predict(u, q, s))


_entry = st.one_of(st.just(0.0), st.just(-0.0), st.floats(-1e6, 1e6), st.floats(-1e-11, 1e-11),
                   st.floats(allow_nan=True, allow_infinity=True))


@settings(max_examples=3000, deadline=None)
@given(st.lists(st.lists(_entry, min_size=3, max_size=3), min_size=3, max_size=3), st.lists(_entry, min_size=3, max_size=3))
def test_scalar_solve_is_the_general_solve_with_nan_and_infinities(m, v) -> None:
    want = repr(_general_solve(m, v))
    assert repr(solve3(m, v)) == want
    assert repr(solve3_flat(*m[0], v[0], *m[1], v[1], *m[2], v[2])) == want


def test_swapped_pivots_take_the_same_path() -> None:
    """Each column's pivot swap (row 1 and row 2 for column 0; row 2 for column 1) and a singular system."""
    cases = [([[1e-3, 2.0, 3.0], [5.0, 1.0, 0.5], [2.0, 7.0, 1.0]], [1.0, 2.0, 3.0]),
             ([[1e-3, 2.0, 3.0], [2.0, 1.0, 0.5], [5.0, 7.0, 1.0]], [1.0, 2.0, 3.0]),
             ([[4.0, 2.0, 3.0], [2.0, 1.0, 0.5], [1.0, 7.0, 1.0]], [1.0, 2.0, 3.0]),
             ([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [1.0, 1.0, 1.0]], [1.0, 2.0, 3.0])]
    for m, v in cases:
        assert repr(solve3(m, v)) == repr(_general_solve(m, v))
    assert solve3(*cases[3]) is None
