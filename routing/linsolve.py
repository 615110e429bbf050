"""A small dense linear solve for :mod:`routing.calibration`'s normal equations (pure, no state)."""

from __future__ import annotations

__all__ = ["solve3"]


def solve3(m: list[list[float]], v: list[float]) -> list[float] | None:
    """Solve the 3 x 3 system ``m x = v`` by Gaussian elimination with partial pivoting (the first
    row of largest magnitude); ``None`` when a pivot is below 1e-12. Unrolled (issue 14): the very
    same floating-point operations in the same order as the general elimination it replaced, so the
    same result bit for bit (the general one is the reference of tests/routing/test_s6_route_cost.py),
    without its row copies, ranges and index loops."""
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
