"""A small dense linear solve for :mod:`routing.calibration`'s normal equations (pure, no state)."""

from __future__ import annotations

__all__ = ["solve3", "solve3_flat"]


def solve3(m: list[list[float]], v: list[float]) -> list[float] | None:
    """Solve the 3 x 3 system ``m x = v`` by Gaussian elimination with partial pivoting (the first
    row of largest magnitude); ``None`` when a pivot is below 1e-12. The very same floating-point
    operations in the same order as the general elimination it replaced (issue 14), so the same
    result bit for bit (the general one is the reference of tests/routing/test_s6_route_cost.py):
    :func:`solve3_flat` of the entries."""
    r0, r1, r2 = m[0], m[1], m[2]
    return solve3_flat(r0[0], r0[1], r0[2], v[0], r1[0], r1[1], r1[2], v[1], r2[0], r2[1], r2[2], v[2])


def solve3_flat(a0: float, a1: float, a2: float, a3: float, b0: float, b1: float, b2: float, b3: float,
                c0: float, c1: float, c2: float, c3: float) -> list[float] | None:
    """:func:`solve3` of the augmented rows ``(a0 a1 a2 | a3)``, ``(b0 b1 b2 | b3)``, ``(c0 c1 c2 | c3)``
    given as scalars (session 13: no row lists, no index loops). Each live entry gets the general
    elimination's operations in its order; the entries it updates but never reads again (below and
    above a pivot: each column's eliminated entries) are not computed (floats raise nothing, so
    skipping them changes nothing). Returns ``[x0, x1, x2]`` or ``None`` (a pivot below 1e-12)."""
    # column 0: pivot among the three rows (the first of largest magnitude)
    best = abs(a0)
    piv = 0
    x = abs(b0)
    if x > best:
        piv, best = 1, x
    x = abs(c0)
    if x > best:
        piv, best = 2, x
    if best < 1e-12:
        return None
    if piv == 1:
        a0, a1, a2, a3, b0, b1, b2, b3 = b0, b1, b2, b3, a0, a1, a2, a3
    elif piv == 2:
        a0, a1, a2, a3, c0, c1, c2, c3 = c0, c1, c2, c3, a0, a1, a2, a3
    f = b0 / a0
    b1 -= f * a1
    b2 -= f * a2
    b3 -= f * a3
    f = c0 / a0
    c1 -= f * a1
    c2 -= f * a2
    c3 -= f * a3
    # column 1: pivot among rows 1 and 2
    best = abs(b1)
    x = abs(c1)
    if x > best:
        best = x
        b1, b2, b3, c1, c2, c3 = c1, c2, c3, b1, b2, b3
    if best < 1e-12:
        return None
    f = a1 / b1
    a2 -= f * b2
    a3 -= f * b3
    f = c1 / b1
    c2 -= f * b2
    c3 -= f * b3
    # column 2: row 2 is its own pivot
    if abs(c2) < 1e-12:
        return None
    f = a2 / c2
    a3 -= f * c3
    f = b2 / c2
    b3 -= f * c3
    return [a3 / a0, b3 / b1, c3 / c2]
