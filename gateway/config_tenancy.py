"""The tenancy section of the configuration (tenants, key material source) and its check by the registry's rules."""

from __future__ import annotations

from collections.abc import Iterable
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


def shared_pass_warnings(tenants: Iterable[Any], default: str) -> list[str]:
    """Tenants that receive ``cached_tokens`` (``usage_cached_tokens: pass``, their own or the
    ``tenancy`` ``default``) while another tenant is in one of their pools (session 13, review R12b-6):
    one line each, naming the shared pools and the other tenants. Such a tenant can run review R12-1's
    prime+probe on the shared KV cache and read those tenants' uncached prompt lengths, whatever their
    own setting: the risk of ``pass`` is theirs, not the passing tenant's. Logged at start with the
    ``configuration:`` lines and printed by ``prefixgate config check``; never fatal (the operator chose
    ``pass``). ``tenants``: :class:`tenancy.tenant.Tenant` (``id``, ``pools``, ``usage_cached_tokens``).

    A tenant with empty ``pools`` may be routed to every pool (:class:`routing.filters.TenantPoolFilter`):
    it shares a pool with every other tenant (session 14, review RV2-4; before, it shared none)."""
    from gateway.usage_privacy import drops_cached

    listed = list(tenants)
    everywhere = {t.id for t in listed if not t.pools}  # routed to every pool (RV2-4)
    in_pool: dict[str, set[str]] = {}
    for t in listed:
        for p in t.pools:
            in_pool.setdefault(p, set(everywhere)).add(t.id)
    out: list[str] = []
    for t in listed:
        if drops_cached(t.usage_cached_tokens, default):
            continue
        if t.pools:
            shared = sorted(p for p in t.pools if len(in_pool[p]) > 1)
            others = sorted(set().union(*(in_pool[p] for p in shared)) - {t.id}) if shared else []
        else:  # every pool: every other tenant is in one of them
            others = sorted(u.id for u in listed if u.id != t.id)
            shared = ["every pool (its pools is empty)"]
        if others:
            out.append(f"tenant {t.id}: usage_cached_tokens is pass while pool(s) {', '.join(shared)} also serve "
                       f"tenant(s) {', '.join(others)}: it can measure their uncached prompt lengths through "
                       "cached_tokens (prime+probe on the shared KV cache, review R12-1); give pass only to a "
                       "tenant whose pools are its own (docs/tenancy.md)")
    return out


def request_prompt_bound(tenant: Any, default_max_prompt_tokens: int | None) -> int | None:
    """The most prompt tokens one request of ``tenant`` (a :class:`tenancy.tenant.Tenant`) may reserve:
    ``max_batch_prompts`` x ``max_prompt_tokens`` (a completions batch; a chat request is one prompt), with
    the effective values of :func:`tenancy.bounds.request_bounds` (``max_prompt_tokens``: the tenant's, else
    ``default_max_prompt_tokens`` = ``limits.max_prompt_tokens``; ``max_batch_prompts``: the tenant's, else
    min(16, ``max_concurrency``)). None when no token limit applies (the body size bounds it). Tokens."""
    tokens = tenant.max_prompt_tokens if tenant.max_prompt_tokens is not None else default_max_prompt_tokens
    if tokens is None:
        return None
    return request_sequences(tenant) * tokens


def request_sequences(tenant: Any) -> int:
    """The most sequences (prompts) one request of ``tenant`` may hold: its ``max_batch_prompts``, else
    min(16, ``max_concurrency``) (:func:`tenancy.bounds.request_bounds`), at least 1."""
    from tenancy.bounds import DEFAULT_MAX_BATCH_PROMPTS

    batch = tenant.max_batch_prompts
    if batch is None:
        batch = DEFAULT_MAX_BATCH_PROMPTS
        if tenant.max_concurrency is not None:
            batch = min(batch, tenant.max_concurrency)
    return max(1, batch)


def burst_warnings(tenants: Iterable[Any], default_max_prompt_tokens: int | None,
                   default_max_output_tokens: int | None = None) -> list[str]:
    """Tenants one request of which may reserve more prompt tokens than their ``prompt_tokens_burst``
    (review S15-5): one line each. A bucket admits ``n`` tokens when it holds ``min(n, burst)`` and goes
    into debt (docs/tenancy.md, "Request bounds"), so such a request is served from a full bucket: the
    per-request bound is :func:`request_prompt_bound`, not the burst. Logged at start with the ``limits:``
    lines and printed by ``prefixgate config check``; never fatal (the bound is documented; the operator
    may lower ``max_batch_prompts`` or ``max_prompt_tokens``, or raise the burst). ``tenants``:
    :class:`tenancy.tenant.Tenant`; ``default_max_prompt_tokens``: ``limits.max_prompt_tokens``. The
    effective burst is the tenant's ``prompt_tokens_burst``, else max(1, ``prompt_tokens_per_s``)
    (tenancy/ledger.py); a tenant without ``prompt_tokens_per_s`` has no bucket and no line.
    Review R16-1: the output bucket follows the same rule; one request reserves ``max_tokens`` x sequences
    output tokens, at most the effective output cap (the tenant's ``max_output_tokens``, else
    ``default_max_output_tokens`` = ``limits.max_output_tokens``) x ``max_batch_prompts``, so a line also
    names a tenant whose ``output_tokens_burst`` (else max(1, ``output_tokens_per_s``)) is below that."""
    out: list[str] = []
    for t in tenants:
        out_cap = t.max_output_tokens if t.max_output_tokens is not None else default_max_output_tokens
        bounds = {"prompt": request_prompt_bound(t, default_max_prompt_tokens),
                  "output": None if out_cap is None else out_cap * request_sequences(t)}
        for kind, bound in bounds.items():  # one rule for both buckets (tenancy/ledger.py)
            rate = getattr(t, f"{kind}_tokens_per_s")
            if rate is None or bound is None:
                continue
            burst = getattr(t, f"{kind}_tokens_burst")
            burst = burst if burst is not None else max(1.0, rate)
            if bound > burst:
                out.append(f"tenant {t.id}: one request may reserve {bound} {kind} tokens (max_batch_prompts x "
                           f"max_{kind}_tokens), more than its {kind}_tokens_burst {burst:g}: it is served from a full "
                           "bucket, which goes into debt (docs/tenancy.md, per-request bound); lower max_batch_prompts "
                           f"or max_{kind}_tokens, or raise {kind}_tokens_burst, to keep one request within the burst")
    return out
