"""The warnings about a tenant set that start-up, ``config check`` and a tenants reload log: one function.

Each is a line, never fatal: ``configuration: ...`` for a tenant entry that loads but cannot be
served as written (:func:`gateway.readiness.configuration_warnings`: a model not served, a pool no
replica is in, a regulated tenant without a replica of its residency; and
:func:`gateway.config_tenancy.shared_pass_warnings`, review R12b-6), ``limits: ...`` for a tenant
whose prompt tokens are unbounded (:func:`gateway.readiness.limit_warnings`, review R3-4) or one
request of which may pass its prompt-token burst (:func:`gateway.config_tenancy.burst_warnings`,
review S15-5).

Before session 23 the three callers each composed these lists, and a reload
(:meth:`gateway.admin.Admin.apply_registry`) logged only two of the four, so a tenant added with a
pool no replica is in was served ``503 no_replica`` without a word in the log (S23-newcomer-5).
"""
from __future__ import annotations

from collections.abc import Iterable

from gateway.config import GatewayConfig
from gateway.config_tenancy import burst_warnings, shared_pass_warnings
from gateway.readiness import configuration_warnings, limit_warnings
from tenancy.registry import TenantRegistry

__all__ = ["entry_warnings", "tenant_limit_warnings", "tenant_warnings"]


def entry_warnings(registry: TenantRegistry, config: GatewayConfig, served_models: Iterable[str]) -> list[str]:
    """Tenant entries that cannot be served as written (without the ``configuration:`` prefix).

    ``config``: replicas and ``tenancy.usage_cached_tokens`` are read from it; ``served_models``:
    the models the gateway serves (``models``)."""
    return (configuration_warnings(registry, config.replicas, frozenset(served_models))
            + shared_pass_warnings(registry.tenants(), config.tenancy.usage_cached_tokens))


def tenant_limit_warnings(registry: TenantRegistry, config: GatewayConfig) -> list[str]:
    """Tenants with unbounded prompt tokens or a burst one request may pass (without the ``limits:`` prefix);
    ``limits.max_prompt_tokens`` / ``max_output_tokens`` (tokens) are read from ``config``."""
    lim = config.limits
    return (limit_warnings(registry, lim.max_prompt_tokens)
            + burst_warnings(registry.tenants(), lim.max_prompt_tokens, lim.max_output_tokens))


def tenant_warnings(registry: TenantRegistry, config: GatewayConfig, served_models: Iterable[str]) -> list[str]:
    """Every warning line about ``registry``'s tenants, prefixed, in the order start-up logs them:
    ``configuration: ...`` lines, then ``limits: ...`` lines. Empty when there is nothing to say."""
    return ([f"configuration: {w}" for w in entry_warnings(registry, config, served_models)]
            + [f"limits: {w}" for w in tenant_limit_warnings(registry, config)])
