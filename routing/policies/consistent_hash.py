"""``consistent_hash``: consistent hashing with bounded loads.

Mirrokni, Thorup, Zadimoghaddam, "Consistent Hashing with Bounded Loads",
SODA 2018 / arXiv 1608.01350: walk the ring clockwise from the request's
point to the first replica whose running requests stay within
``ceil((1 + epsilon) · mean)``, the mean counting this request.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from routing.filters.load_guard import LoadGuardFilter
from routing.params import PolicyParams
from routing.pickers.fewest_requests import FewestRequestsPicker
from routing.pickers.ring import RingPicker
from routing.scheduler import Scheduler
from routing.scorers.running_requests import RunningRequestsScorer

__all__ = ["ConsistentHashConfig", "ConsistentHashPolicy"]


class ConsistentHashConfig(PolicyParams):
    """``routing.policy`` for consistent hashing: ``epsilon`` (> 0, load bound
    ``1 + epsilon`` times the mean), ``virtual_nodes`` per replica (>= 1),
    ``skip_blocks`` (>= 0) leading blocks left out of the request's point."""

    name: Literal["consistent_hash"] = "consistent_hash"
    epsilon: float = Field(0.25, gt=0)
    virtual_nodes: int = Field(64, ge=1)
    skip_blocks: int = Field(1, ge=0)


class ConsistentHashPolicy(Scheduler):
    """filter :class:`LoadGuardFilter` (requests, factor ``1 + epsilon``),
    scorer :class:`RunningRequestsScorer` (reported), picker
    :class:`RingPicker`, fallback :class:`FewestRequestsPicker` (unreachable:
    the least loaded replica always fits under the bound)."""

    def __init__(self, config: ConsistentHashConfig | None = None, /, **params: Any) -> None:
        cfg = self.config = config if config is not None else ConsistentHashConfig(**params)
        super().__init__(
            "consistent_hash",
            filters=[LoadGuardFilter(request_factor=1.0 + cfg.epsilon)],
            scorers=[RunningRequestsScorer()],
            picker=RingPicker(cfg.virtual_nodes, cfg.skip_blocks),
            fallback=FewestRequestsPicker("ring_fallback"),
        )

    @property
    def load_factor(self) -> float:
        """Bound on a replica's load relative to the mean: ``1 + epsilon``."""
        return 1.0 + self.config.epsilon
