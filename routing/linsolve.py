"""A small dense linear solve for :mod:`routing.calibration`'s normal equations (pure, no state)."""

from __future__ import annotations

__all__ = ["solve", "solve3"]


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


def solve3(m: list[list[float]], v: list[float]) -> list[float] | None:
    """:func:`solve` of a 3 x 3 system, unrolled: the very same floating-point operations in the
    same order (so the same result, bit for bit: tests/routing/test_s6_route_cost.py), without
    the row copies, ranges and index loops of the general elimination (issue 14)."""
    rows = [[m[0][0], m[0][1], m[0][2], v[0]], [m[1][0], m[1][1], m[1][2], v[1]],
            [m[2][0], m[2][1], m[2][2], v[2]]]
    for col in (0, 1, 2):
        piv, best = col, abs(rows[col][col])
        if col < 1:
            x = abs(rows[1][col])
            if x > best:
                piv, best = 1, x
        if col < 2:
            x = abs(rows[2][col])
            if x > best:
                piv, best = 2, x
        if best < 1e-12:
            return None
        rows[col], rows[piv] = rows[piv], rows[col]
        ac = rows[col]
        d = ac[col]
        for r in (0, 1, 2):
            if r != col:
                ar = rows[r]
                f = ar[col] / d
                if col == 0:
                    ar[0] -= f * ac[0]
                    ar[1] -= f * ac[1]
                    ar[2] -= f * ac[2]
                    ar[3] -= f * ac[3]
                elif col == 1:
                    ar[1] -= f * ac[1]
                    ar[2] -= f * ac[2]
                    ar[3] -= f * ac[3]
                else:
                    ar[2] -= f * ac[2]
                    ar[3] -= f * ac[3]
    return [rows[0][3] / rows[0][0], rows[1][3] / rows[1][1], rows[2][3] / rows[2][2]]
