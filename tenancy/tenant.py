"""One tenant: the :class:`Tenant` record and the validation of one ``tenancy.tenants`` entry.

Configuration (one list entry per tenant; unknown keys are refused so that a
typo never silently drops a limit)::

    tenants:
      - id: acme                         # [A-Za-z0-9][A-Za-z0-9._-]{0,63}
        spiffe_ids:                      # exact IDs, or prefixes ending in "/"
          - spiffe://prod.example/ns/acme/      # every workload under ns/acme
          - spiffe://prod.example/batch/acme-etl
        models: [llama-3-8b]
        pools: [general]
        tier: standard                   # default "standard"
        labels: {team: search}
        rate_rps: 20                     # requests/s; omitted = unlimited
        rate_burst: 40                   # default max(1, rate_rps)
        prompt_tokens_per_s: 50000       # omitted = unlimited
        prompt_tokens_burst: 200000      # default max(1, prompt_tokens_per_s)
        output_tokens_per_s: 20000       # output tokens/s (max_tokens x sequences reserved); omitted = unlimited
        output_tokens_burst: 80000       # default max(1, output_tokens_per_s)
        refused_cpu_ms_per_s: 100        # gateway CPU ms/s for refused requests; default limits.refused_cpu_ms_per_s
        refused_cpu_burst_ms: 250        # its bucket, CPU ms; default limits.refused_cpu_burst_ms
        max_concurrency: 16
        max_prompt_tokens: 32768
        max_output_tokens: 4096
        regulated: false
        data_residency: eu
    operators:                           # may sit in the same section
      - spiffe://prod.example/ns/ops/sa/admin

The registry of all tenants and the identity rules that map to them is
:mod:`tenancy.registry`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from pydantic import ValidationError

from .spiffe_id import parse_spiffe_id_rule
from .tenant_schema import FIELD_MESSAGES, ITEM_MESSAGES, TenantEntry

class TenantConfigError(ValueError):
    """Invalid tenant configuration; the message names the offending field."""


def split_rule(value: str) -> tuple[str, tuple[str, ...], bool]:
    """``(trust_domain, path_segments, is_prefix)`` of a rule (exact ID or
    prefix ending in ``/``), parsed by :func:`tenancy.spiffe_id.parse_spiffe_id_rule`."""
    sid, is_prefix = parse_spiffe_id_rule(value)
    return sid.trust_domain, sid.segments, is_prefix


def canonical_rule(td: str, segments: tuple[str, ...], is_prefix: bool) -> str:
    """The canonical spelling of a rule: ``spiffe://<td>/<segments>``, plus a trailing ``/`` for a prefix rule."""
    base = "spiffe://" + td + "".join("/" + s for s in segments)
    return base + "/" if is_prefix else base


@dataclass(frozen=True)
class Tenant:
    """A tenant and its quotas.

    Rates are per second (``rate_rps`` requests/s, ``prompt_tokens_per_s``
    prompt tokens/s, ``output_tokens_per_s`` output tokens/s, reserved as
    ``max_tokens`` x sequences at admission: :mod:`tenancy.ledger`); bursts are bucket capacities in requests / tokens;
    ``None`` means unlimited. ``refused_cpu_ms_per_s`` / ``refused_cpu_burst_ms``: the
    tenant's budget of gateway CPU for refused requests (ms/s, ms; ``None``: the
    ``limits.refused_cpu_*`` defaults; gateway/cpu_budget.py). ``max_prompt_tokens`` / ``max_output_tokens``
    are per request (per sequence of a batch), in tokens. ``max_prompt_bytes``
    (UTF-8 bytes of what becomes prompt tokens), ``max_messages`` (chat
    messages) and ``max_batch_prompts`` (elements of a list ``prompt``) are
    cheap per-request bounds checked before tokenizing; ``None`` takes the
    derived default (docs/tenancy.md, "Request bounds"). ``forward_user``:
    what reaches the replica as the OpenAI ``user`` field (``None``: the
    gateway default; ``"drop"``; ``"pseudonym"``). ``usage_cached_tokens``: whether its
    answers relay ``usage.prompt_tokens_details.cached_tokens`` (``None``: the gateway
    default, ``tenancy.usage_cached_tokens``; ``"pass"``; ``"drop"``: review R12-1,
    gateway/usage_privacy.py). ``allow_prompt_logprobs``: a
    completion may ask for ``echo`` with ``logprobs`` (log-probabilities of every prompt
    token, computed by the engine; R4-12); off, it answers 400. ``spiffe_ids`` are the
    identity rules that map to this tenant (prefix rules end in ``/``). ``json_schema_limits``: the tenant's own
    bounds on a chat body's ``response_format`` schema by name (``max_bytes``, ``max_depth``, ...), each
    overriding ``limits.json_schema`` (empty: the gateway's; gateway/response_format.py; session 24); since session
    27 (expand27) ``max_regex_chars``, since session 29 ``max_item_count`` and since session 30
    ``max_pattern_states``, may map to None: not checked for
    this tenant; since session 29 (pattern29) ``quote_reading_patterns`` maps to "refuse" or "allow".
    """

    id: str
    models: frozenset[str] = frozenset()
    pools: frozenset[str] = frozenset()
    tier: str = "standard"
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    rate_rps: float | None = None
    rate_burst: float | None = None
    prompt_tokens_per_s: float | None = None
    prompt_tokens_burst: float | None = None
    output_tokens_per_s: float | None = None
    output_tokens_burst: float | None = None
    refused_cpu_ms_per_s: float | None = None
    refused_cpu_burst_ms: float | None = None
    max_concurrency: int | None = None
    max_prompt_tokens: int | None = None
    max_output_tokens: int | None = None
    max_prompt_bytes: int | None = None
    max_messages: int | None = None
    max_batch_prompts: int | None = None
    forward_user: str | None = None
    usage_cached_tokens: str | None = None
    allow_prompt_logprobs: bool = False
    regulated: bool = False
    data_residency: str | None = None
    spiffe_ids: tuple[str, ...] = ()
    json_schema_limits: Mapping[str, int | str | None] = field(default_factory=lambda: MappingProxyType({}))

    def policy_view(self) -> dict[str, Any]:
        """Return a JSON-able summary for policy input and audit (no secrets)."""
        return {
            "id": self.id,
            "models": sorted(self.models),
            "pools": sorted(self.pools),
            "tier": self.tier,
            "labels": dict(self.labels),
            "regulated": self.regulated,
            "data_residency": self.data_residency,
            "max_prompt_tokens": self.max_prompt_tokens,
            "max_output_tokens": self.max_output_tokens,
        }


# -- validation --------------------------------------------------------------


def config_error(where: str, msg: str) -> TenantConfigError:
    """A :class:`TenantConfigError` reading ``<where>: <msg>`` (``where`` dotted, e.g. ``tenants.0.rate_rps``)."""
    return TenantConfigError(f"{where}: {msg}")


def _first_error(exc: ValidationError, where: str) -> TenantConfigError:
    """The first pydantic error of ``exc`` as ``<where>.<loc>: <meaning>`` (id first, then unknown keys, as before the schema)."""
    errors = exc.errors()
    errors.sort(key=lambda e: 0 if e["loc"][:1] == ("id",) else 1 if e["type"] == "extra_forbidden" else 2)
    err = errors[0]
    loc = [str(p) for p in err["loc"]]
    if err["type"] == "extra_forbidden":
        return config_error(".".join([where, *loc]), "unknown field")
    key = loc[0] if loc else ""
    if len(loc) >= 2 and loc[1].isdigit() and key in ITEM_MESSAGES:
        return config_error(f"{where}.{key}.{loc[1]}", ITEM_MESSAGES[key])
    return config_error(f"{where}.{key}" if key else where, FIELD_MESSAGES.get(key, err["msg"]))


def _check_burst(entry: TenantEntry, rate_key: str, burst_key: str, where: str) -> None:
    if getattr(entry, burst_key) is not None and getattr(entry, rate_key) is None:
        raise config_error(f"{where}.{burst_key}", f"needs {rate_key}")


def _burst(rate: float | None, burst: float | None) -> float | None:
    if rate is None:
        return None
    return float(burst) if burst is not None else max(1.0, float(rate))


def _json_schema_limits(entry: Any) -> dict[str, int | str | None]:
    """A ``json_schema_limits`` entry's values by name: the keys written with a value, and ``max_regex_chars`` or
    ``max_item_count`` or ``max_pattern_states`` written as null (None: the bound is off for the tenant; sessions 27,
    29 and 30). Empty for no
    entry."""
    if entry is None:
        return {}
    out: dict[str, int | str | None] = entry.model_dump(exclude_none=True)
    for name in ("max_regex_chars", "max_item_count", "max_pattern_states"):  # sessions 29, 30: the later two
        if name in entry.model_fields_set and getattr(entry, name) is None:
            out[name] = None
    return out


def parse_tenant(doc: Any, index: int) -> Tenant:
    """Validate entry ``index`` of the ``tenants`` list and build its :class:`Tenant`.

    The entry is validated with the pydantic schema :class:`tenancy.tenant_schema.TenantEntry`
    (unknown keys refused). Raises :class:`TenantConfigError` naming the bad field
    (``tenants.<index>.<key>``)."""
    where = f"tenants.{index}"  # dotted, as pydantic locations (docs/configuration.md)
    if not isinstance(doc, Mapping):
        raise config_error(where, "must be a mapping")
    try:
        entry = TenantEntry.model_validate(dict(doc))
    except ValidationError as exc:
        raise _first_error(exc, where) from None
    rules: list[str] = []
    for i, rid in enumerate(entry.spiffe_ids):
        try:
            rules.append(canonical_rule(*split_rule(rid)))
        except ValueError as exc:
            raise config_error(f"{where}.spiffe_ids.{i}", f"invalid SPIFFE ID or prefix ({exc})") from None
    _check_burst(entry, "rate_rps", "rate_burst", where)
    _check_burst(entry, "prompt_tokens_per_s", "prompt_tokens_burst", where)
    _check_burst(entry, "output_tokens_per_s", "output_tokens_burst", where)
    batch, concurrency = entry.max_batch_prompts, entry.max_concurrency
    if batch is not None and concurrency is not None and batch > concurrency:
        raise config_error(f"{where}.max_batch_prompts",
                   f"{batch} is larger than max_concurrency {concurrency} (each prompt of a batch takes a slot)")
    as_float = lambda v: None if v is None else float(v)  # noqa: E731
    return Tenant(
        id=entry.id,
        models=frozenset(entry.models),
        pools=frozenset(entry.pools),
        tier=entry.tier,
        labels=MappingProxyType(dict(entry.labels)),
        rate_rps=as_float(entry.rate_rps),
        rate_burst=_burst(entry.rate_rps, entry.rate_burst),
        prompt_tokens_per_s=as_float(entry.prompt_tokens_per_s),
        prompt_tokens_burst=_burst(entry.prompt_tokens_per_s, entry.prompt_tokens_burst),
        output_tokens_per_s=as_float(entry.output_tokens_per_s),
        output_tokens_burst=_burst(entry.output_tokens_per_s, entry.output_tokens_burst),
        refused_cpu_ms_per_s=as_float(entry.refused_cpu_ms_per_s),
        refused_cpu_burst_ms=as_float(entry.refused_cpu_burst_ms),
        max_concurrency=concurrency,
        max_prompt_tokens=entry.max_prompt_tokens,
        max_output_tokens=entry.max_output_tokens,
        max_prompt_bytes=entry.max_prompt_bytes,
        max_messages=entry.max_messages,
        max_batch_prompts=batch,
        forward_user=entry.forward_user,
        usage_cached_tokens=entry.usage_cached_tokens,
        allow_prompt_logprobs=entry.allow_prompt_logprobs,
        regulated=entry.regulated,
        data_residency=entry.data_residency,
        spiffe_ids=tuple(dict.fromkeys(rules)),
        json_schema_limits=MappingProxyType(_json_schema_limits(entry.json_schema_limits)),
    )
