"""The replicas side of the configuration: routing policy and prefix index, the replica list, health checks."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from gateway.config_base import ConfigSection
from routing.config import PolicyConfig as RoutingPolicyConfig
from routing.policies import CacheAwareConfig


class RoutingConfig(ConfigSection):
    """Routing policy and the prefix index.

    ``policy``: the policy and its parameters, a discriminated union on
    ``name`` (``round_robin``, ``least_load``, ``consistent_hash``,
    ``cache_aware``; a bare name is short for ``{name: ...}``; see
    ``routing.config`` and docs/routing.md); ``block_size`` in tokens (must
    match the replicas' KV block size); ``index_capacity_blocks``: blocks
    remembered per replica (mirror the replica's KV capacity);
    ``max_prefix_blocks``: hashing bound per request. ``params`` (the old
    place of the policy parameters) is rejected with a pointer to
    ``policy``.
    """

    policy: RoutingPolicyConfig = Field(default_factory=CacheAwareConfig)
    block_size: int = Field(16, ge=1, le=1024)
    index_capacity_blocks: int = Field(4000, ge=1)
    max_prefix_blocks: int = Field(8192, ge=1)
    tokenizer: str = "word"
    params: Any = Field(None, exclude=True)

    @field_validator("params")
    @classmethod
    def _params_moved(cls, v: Any) -> None:
        if v is not None:
            raise ValueError("moved: give the policy parameters under routing.policy "
                             "(routing.policy.name: <policy>, then its parameters)")
        return None


class ReplicaConfig(ConfigSection):
    """One upstream replica. ``cache_salt: false`` for engines that reject the
    field (e.g. TensorRT-LLM); such replicas may serve one tenant's pools only."""

    id: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")
    url: str
    pool: str = "default"
    labels: dict[str, str] = Field(default_factory=dict)
    cache_salt: bool = True

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not (v.startswith("http://") or v.startswith("https://")):
            raise ValueError("replica url must start with http:// or https://")
        return v.rstrip("/")


class HealthConfig(ConfigSection):
    """Active health checks of replicas (GET /health)."""

    interval_s: float = Field(2.0, gt=0)
    timeout_s: float = Field(1.0, gt=0)
    unhealthy_after: int = Field(2, ge=1)
    healthy_after: int = Field(1, ge=1)
    passive_grace_s: float = Field(5.0, ge=0)
    breaker_failures: int = Field(3, ge=1)
    breaker_cooldown_s: float = Field(5.0, gt=0)
    breaker_tenant_window_s: float = Field(60.0, gt=0)  # R8-2, R9-2 (failures add up in it), gateway/tenant_breaker.py
