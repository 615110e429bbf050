"""The tenancy section of the configuration (tenants, key material source) and its check by the registry's rules."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from gateway.config_base import ConfigError, ConfigSection


class TenancyConfig(ConfigSection):
    """Tenants and their key material source (never the secret itself).

    ``forward_user``: what replicas get as the OpenAI ``user`` field:
    ``drop`` (default: nothing; the client's value never reaches a replica)
    or ``pseudonym`` (a stable HMAC pseudonym of the authenticated workload,
    see :func:`tenancy.keys.user_pseudonym`); a tenant's own
    ``forward_user`` overrides it.
    ``usage_cached_tokens``: whether answers relay the replica's
    ``usage.prompt_tokens_details.cached_tokens`` to clients: ``drop``
    (default: removed from plain answers and the stream's usage chunk; the
    exact counter is a cross-tenant prime+probe channel on the shared KV
    cache, review R12-1, gateway/usage_privacy.py) or ``pass``; a tenant's own
    ``usage_cached_tokens`` overrides it. The gateway's ledger, audit and
    routing read the true value either way.
    """

    forward_user: Literal["drop", "pseudonym"] = "drop"
    usage_cached_tokens: Literal["pass", "drop"] = "drop"
    master_secret_file: str | None = None
    master_secret_env: str | None = "PREFIXGATE_MASTER_SECRET"
    state_file: str | None = None
    key_grace_s: float = Field(3600.0, ge=0)
    tenants: list[dict[str, Any]] = Field(default_factory=list)
    operators: list[str] = Field(default_factory=list)
    #: weight of each tier in the gateway's fair release (tenancy/tiers.py; unlisted: 1)
    tier_weights: dict[str, float] = Field(default_factory=dict)

    @field_validator("tier_weights")
    @classmethod
    def _weights(cls, v: dict[str, float]) -> dict[str, float]:
        from tenancy.tiers import TierWeights

        TierWeights(v)
        return v


def check_tenancy(tenancy: TenancyConfig) -> None:
    """Validate ``tenancy.tenants`` and ``tenancy.operators`` with the registry's own rules.

    Raises :class:`ConfigError` in the form of every configuration error,
    ``invalid configuration: tenancy.tenants.0.max_output_token: unknown field``.
    """
    from tenancy.registry import TenantConfigError, TenantRegistry

    try:
        TenantRegistry.from_config(tenancy.tenants, operators=tenancy.operators)
    except TenantConfigError as exc:
        raise ConfigError(f"invalid configuration: tenancy.{exc}") from None
