"""Which tenants cause a replica's concentration (R3-14).

A replica r of a pool with n replicas is concentrated when its share of the
window stays above the threshold. Its excess over the fair share is
``x_r - X/n`` (x_r: r's requests, or prefill tokens, in the window; X: the
pool's), and it splits exactly over the tenants:
``x_r - X/n = sum_t (x_{t,r} - X_t/n)`` (x_{t,r}: tenant t's traffic on r;
X_t: t's traffic in the pool). A tenant's term is its *contribution*: zero
for a tenant spread evenly over the replicas, large for one that piles onto
r. A tenant whose few requests happen to stick to r (one warm prefix)
contributes little.

Rule: sort the positive contributions (largest first, ties by tenant id) and
take the smallest prefix whose sum covers at least ``cover_ratio`` of the
excess. If that set has at most ``max_tenants`` tenants and none of them is
unattributed traffic (tenant None), those tenants explain the concentration;
otherwise nothing small explains it and the alert stays global.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["attribute_concentration"]


def attribute_concentration(
    on_replica: Mapping[str | None, float],
    in_pool: Mapping[str | None, float],
    n_replicas: int,
    cover_ratio: float = 0.8,
    max_tenants: int = 3,
) -> tuple[str, ...] | None:
    """The tenants that explain a replica's concentration, or None (global).

    Args:
        on_replica: per tenant id (None = unattributed), its requests (or
            prefill tokens) on the replica in the window.
        in_pool: per tenant id, its requests (or prefill tokens) in the whole
            pool in the same window (≥ ``on_replica``'s value).
        n_replicas: replicas in the pool (≥ 1).
        cover_ratio: share of the excess (0..1] the named tenants must cover.
        max_tenants: the most tenants an attributed alert names (≥ 1).

    Returns:
        Tenant ids (largest contribution first), or None when no set of at
        most ``max_tenants`` named tenants covers ``cover_ratio`` of the
        excess, or when there is no excess.
    """
    n = max(n_replicas, 1)
    contrib = {t: v - in_pool.get(t, v) / n for t, v in on_replica.items()}
    excess = sum(contrib.values())
    if excess <= 0:
        return None
    ranked = sorted(((c, t) for t, c in contrib.items() if c > 0), key=lambda ct: (-ct[0], ct[1] or ""))
    chosen: list[str] = []
    covered = 0.0
    for c, t in ranked:
        if t is None or len(chosen) >= max_tenants:
            return None
        chosen.append(t)
        covered += c
        if covered >= cover_ratio * excess:
            return tuple(chosen)
    return None
