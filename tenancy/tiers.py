"""Tier weights: each tier's share of replica time under contention (issue 17).

A tenant's ``tier`` (``tenancy.registry.Tenant.tier``) is a tier fact of the
registry; its weight is configured beside the tenants (``tenancy.tier_weights``)
and read by the gateway's fair release (``routing.fairness``): two backlogged
tenants of weights 2 and 1 get replica tokens 2:1. A tier not listed weighs 1.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType

__all__ = ["TierWeights", "DEFAULT_TIER_WEIGHT"]

#: weight of a tier that ``tenancy.tier_weights`` does not list
DEFAULT_TIER_WEIGHT = 1.0


class TierWeights:
    """Weight per tier name (positive, finite). Raises :class:`ValueError` on a bad weight."""

    def __init__(self, weights: Mapping[str, float] | None = None) -> None:
        clean: dict[str, float] = {}
        for tier, w in (weights or {}).items():
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w <= 0:
                raise ValueError(f"tier_weights.{tier}: must be a positive number")
            clean[str(tier)] = float(w)
        self._w = MappingProxyType(clean)

    def weight(self, tier: str) -> float:
        """The weight of ``tier`` (:data:`DEFAULT_TIER_WEIGHT` when not listed)."""
        return self._w.get(tier, DEFAULT_TIER_WEIGHT)

    def as_dict(self) -> dict[str, float]:
        """The configured weights (tiers not listed weigh :data:`DEFAULT_TIER_WEIGHT`)."""
        return dict(self._w)
