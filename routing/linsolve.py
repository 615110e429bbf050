"""A small dense linear solve for :mod:`routing.calibration`'s normal equations (pure, no state)."""

from __future__ import annotations

__all__ = ["solve"]


def solve(m: list[list[float]], v: list[float]) -> list[float] | None:
    """Solve the n x n system ``m x = v`` by Gaussian elimination with partial pivoting
    (the first row of largest magnitude); ``None`` when a pivot is below 1e-12."""
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
