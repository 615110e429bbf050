"""``least_load``: fewest token load, then fewest running requests."""

from __future__ import annotations

from typing import Any, Literal

from routing.params import PolicyParams
from routing.pickers.least_load import LeastLoadPicker
from routing.scheduler import Scheduler
from routing.scorers.token_load import TokenLoadScorer

__all__ = ["LeastLoadConfig", "LeastLoadPolicy"]


class LeastLoadConfig(PolicyParams):
    """``routing.policy`` for least load: no parameters."""

    name: Literal["least_load"] = "least_load"


class LeastLoadPolicy(Scheduler):
    """scorer :class:`TokenLoadScorer` (reported), picker :class:`LeastLoadPicker`
    (tie: rendezvous hash of block 0)."""

    def __init__(self, config: LeastLoadConfig | None = None, /, **params: Any) -> None:
        self.config = config if config is not None else LeastLoadConfig(**params)
        super().__init__("least_load", scorers=[TokenLoadScorer()], picker=LeastLoadPicker(0, "min_token_load"))
