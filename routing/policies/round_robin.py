"""``round_robin``: cycle over the candidates sorted by id (no filter, no scorer)."""

from __future__ import annotations

from typing import Any, Literal

from routing.params import PolicyParams
from routing.pickers.round_robin import RoundRobinPicker
from routing.scheduler import Scheduler

__all__ = ["RoundRobinConfig", "RoundRobinPolicy"]


class RoundRobinConfig(PolicyParams):
    """``routing.policy`` for round robin: no parameters."""

    name: Literal["round_robin"] = "round_robin"


class RoundRobinPolicy(Scheduler):
    """picker :class:`RoundRobinPicker`; scores all 0.0."""

    def __init__(self, config: RoundRobinConfig | None = None, /, **params: Any) -> None:
        self.config = config if config is not None else RoundRobinConfig(**params)
        super().__init__("round_robin", picker=RoundRobinPicker())
