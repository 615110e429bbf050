"""Routing policies: each one module, a chain of plugins and a parameter model.

* ``round_robin`` (:mod:`routing.policies.round_robin`);
* ``least_load`` (:mod:`routing.policies.least_load`);
* ``consistent_hash`` (:mod:`routing.policies.consistent_hash`);
* ``cache_aware`` (:mod:`routing.policies.cache_aware`).

:func:`build_policy` makes one from its name and parameters;
:func:`routing.config.policy_from_config` from a validated
:data:`routing.config.PolicyConfig`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from routing.params import describe_errors
from routing.plugins import RoutingPolicy
from routing.policies.cache_aware import CacheAwareConfig, CacheAwarePolicy
from routing.policies.consistent_hash import ConsistentHashConfig, ConsistentHashPolicy
from routing.policies.least_load import LeastLoadConfig, LeastLoadPolicy
from routing.policies.round_robin import RoundRobinConfig, RoundRobinPolicy
from routing.types import Candidate, NoCandidateError, RouteChoice, RouteRequest

__all__ = [
    "RouteRequest",
    "Candidate",
    "RouteChoice",
    "RoutingPolicy",
    "NoCandidateError",
    "RoundRobinPolicy",
    "LeastLoadPolicy",
    "ConsistentHashPolicy",
    "CacheAwarePolicy",
    "RoundRobinConfig",
    "LeastLoadConfig",
    "ConsistentHashConfig",
    "CacheAwareConfig",
    "build_policy",
    "POLICY_NAMES",
]

POLICY_NAMES = ("round_robin", "least_load", "consistent_hash", "cache_aware")

_FACTORIES: dict[str, type[Any]] = {
    "round_robin": RoundRobinPolicy,
    "least_load": LeastLoadPolicy,
    "consistent_hash": ConsistentHashPolicy,
    "cache_aware": CacheAwarePolicy,
}


def build_policy(name: str, params: Mapping[str, Any] | None = None) -> RoutingPolicy:
    """Build the policy called ``name`` (one of :data:`POLICY_NAMES`) with
    keyword ``params``. Raises :class:`ValueError` for an unknown name, an
    unknown parameter or an out-of-range value; the message names the key."""
    cls = _FACTORIES.get(name)
    if cls is None:
        raise ValueError(f"unknown routing policy {name!r}; known: {', '.join(POLICY_NAMES)}")
    params = dict(params or {})
    if "name" in params:
        raise ValueError(f"bad parameters for routing policy {name!r}: name: give the name once")
    try:
        return cls(**params)  # type: ignore[no-any-return]
    except ValidationError as exc:
        raise ValueError(f"bad parameters for routing policy {name!r}: {describe_errors(exc)}") from None
