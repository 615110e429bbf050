"""The ``routing.policy`` configuration: a discriminated union on ``name``.

A mapping ``{name: cache_aware, prefix_weight: 8, ...}`` selects the policy
and its parameters; a bare name (``policy: round_robin``) is short for
``{name: round_robin}``. Unknown keys and out-of-range values are errors that
name the key (docs/configuration.md, section ``routing``).
"""

from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import BeforeValidator, Discriminator, Tag

from routing.plugins import RoutingPolicy
from routing.policies import (
    POLICY_NAMES,
    CacheAwareConfig,
    CacheAwarePolicy,
    ConsistentHashConfig,
    ConsistentHashPolicy,
    LeastLoadConfig,
    LeastLoadPolicy,
    RoundRobinConfig,
    RoundRobinPolicy,
)

__all__ = ["PolicyConfig", "policy_from_config", "expand_policy_name"]


def expand_policy_name(value: Any) -> Any:
    """A bare policy name becomes ``{"name": value}``; anything else is unchanged."""
    if isinstance(value, str):
        return {"name": value}
    return value


def _policy_name(value: Any) -> str | None:
    if isinstance(value, dict):
        name = value.get("name")
        return name if isinstance(name, str) else None
    return getattr(value, "name", None)


#: Validated ``routing.policy``: one parameter model per policy, chosen by ``name``.
PolicyConfig = Annotated[
    Union[
        Annotated[RoundRobinConfig, Tag("round_robin")],
        Annotated[LeastLoadConfig, Tag("least_load")],
        Annotated[ConsistentHashConfig, Tag("consistent_hash")],
        Annotated[CacheAwareConfig, Tag("cache_aware")],
    ],
    Discriminator(
        _policy_name,
        custom_error_type="routing_policy_name",
        custom_error_message="name must be one of " + ", ".join(POLICY_NAMES),
    ),
    BeforeValidator(expand_policy_name),
]


def policy_from_config(config: RoundRobinConfig | LeastLoadConfig | ConsistentHashConfig | CacheAwareConfig
                       ) -> RoutingPolicy:
    """A fresh policy for a validated ``config`` (stateful policies are not shared)."""
    if isinstance(config, CacheAwareConfig):
        return CacheAwarePolicy(config)
    if isinstance(config, ConsistentHashConfig):
        return ConsistentHashPolicy(config)
    if isinstance(config, LeastLoadConfig):
        return LeastLoadPolicy(config)
    return RoundRobinPolicy(config)
