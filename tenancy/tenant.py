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

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .spiffe_id import parse_spiffe_id_rule

_TENANT_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$")

_TENANT_KEYS = frozenset(
    {
        "id",
        "spiffe_ids",
        "models",
        "pools",
        "tier",
        "labels",
        "rate_rps",
        "rate_burst",
        "prompt_tokens_per_s",
        "prompt_tokens_burst",
        "output_tokens_per_s",
        "output_tokens_burst",
        "max_concurrency",
        "max_prompt_tokens",
        "max_output_tokens",
        "max_prompt_bytes",
        "max_messages",
        "max_batch_prompts",
        "forward_user",
        "regulated",
        "data_residency",
    }
)


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
    ``None`` means unlimited. ``max_prompt_tokens`` / ``max_output_tokens``
    are per request (per sequence of a batch), in tokens. ``max_prompt_bytes``
    (UTF-8 bytes of what becomes prompt tokens), ``max_messages`` (chat
    messages) and ``max_batch_prompts`` (elements of a list ``prompt``) are
    cheap per-request bounds checked before tokenizing; ``None`` takes the
    derived default (docs/tenancy.md, "Request bounds"). ``forward_user``:
    what reaches the replica as the OpenAI ``user`` field (``None``: the
    gateway default; ``"drop"``; ``"pseudonym"``). ``spiffe_ids`` are the
    identity rules that map to this tenant (prefix rules end in ``/``).
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
    max_concurrency: int | None = None
    max_prompt_tokens: int | None = None
    max_output_tokens: int | None = None
    max_prompt_bytes: int | None = None
    max_messages: int | None = None
    max_batch_prompts: int | None = None
    forward_user: str | None = None
    regulated: bool = False
    data_residency: str | None = None
    spiffe_ids: tuple[str, ...] = ()

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


# -- validation helpers ------------------------------------------------------


def config_error(where: str, msg: str) -> TenantConfigError:
    """A :class:`TenantConfigError` reading ``<where>: <msg>`` (``where`` dotted, e.g. ``tenants.0.rate_rps``)."""
    return TenantConfigError(f"{where}: {msg}")


def _opt_positive_number(doc: Mapping[str, Any], key: str, where: str) -> float | None:
    v = doc.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise config_error(f"{where}.{key}", "must be a positive finite number")
    return float(v)


def _opt_rate_and_burst(doc: Mapping[str, Any], rate_key: str, burst_key: str,
                        where: str) -> tuple[float | None, float | None]:
    """A token bucket's optional rate and burst (positive numbers); a burst needs its rate."""
    rate = _opt_positive_number(doc, rate_key, where)
    burst = _opt_positive_number(doc, burst_key, where)
    if burst is not None and rate is None:
        raise config_error(f"{where}.{burst_key}", f"needs {rate_key}")
    return rate, burst


def _opt_positive_int(doc: Mapping[str, Any], key: str, where: str) -> int | None:
    v = doc.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise config_error(f"{where}.{key}", "must be a positive integer")
    return v


def _name_set(doc: Mapping[str, Any], key: str, where: str) -> frozenset[str]:
    v = doc.get(key, [])
    if not isinstance(v, (list, tuple)):
        raise config_error(f"{where}.{key}", "must be a list of names")
    for i, item in enumerate(v):
        if not isinstance(item, str) or not _NAME_RE.match(item):
            raise config_error(f"{where}.{key}.{i}", "must be a name of [A-Za-z0-9._:/@+-], at most 128 chars")
    return frozenset(v)


def parse_tenant(doc: Any, index: int) -> Tenant:
    """Validate entry ``index`` of the ``tenants`` list and build its :class:`Tenant`.

    Unknown keys are refused. Raises :class:`TenantConfigError` naming the bad field
    (``tenants.<index>.<key>``)."""
    where = f"tenants.{index}"  # dotted, as pydantic locations (docs/configuration.md)
    if not isinstance(doc, Mapping):
        raise config_error(where, "must be a mapping")
    tid = doc.get("id")
    if not isinstance(tid, str) or not _TENANT_ID_RE.match(tid):
        raise config_error(f"{where}.id", "must match [A-Za-z0-9][A-Za-z0-9._-]{0,63}")
    unknown = sorted(set(doc) - _TENANT_KEYS)
    if unknown:
        raise config_error(f"{where}.{unknown[0]}", "unknown field")
    raw_ids = doc.get("spiffe_ids")
    if not isinstance(raw_ids, (list, tuple)) or not raw_ids:
        raise config_error(f"{where}.spiffe_ids", "must be a non-empty list of SPIFFE IDs or prefixes")
    rules: list[str] = []
    for i, rid in enumerate(raw_ids):
        try:
            rules.append(canonical_rule(*split_rule(rid)))
        except ValueError as exc:
            raise config_error(f"{where}.spiffe_ids.{i}", f"invalid SPIFFE ID or prefix ({exc})") from None
    tier = doc.get("tier", "standard")
    if not isinstance(tier, str) or not _NAME_RE.match(tier):
        raise config_error(f"{where}.tier", "must be a non-empty name")
    labels = doc.get("labels", {})
    if not isinstance(labels, Mapping) or not all(
        isinstance(k, str) and k and isinstance(v, str) for k, v in labels.items()
    ):
        raise config_error(f"{where}.labels", "must map non-empty strings to strings")
    regulated = doc.get("regulated", False)
    if not isinstance(regulated, bool):
        raise config_error(f"{where}.regulated", "must be true or false")
    residency = doc.get("data_residency")
    if residency is not None and (not isinstance(residency, str) or not _NAME_RE.match(residency)):
        raise config_error(f"{where}.data_residency", "must be a region name")
    rate, burst = _opt_rate_and_burst(doc, "rate_rps", "rate_burst", where)
    ptps, pburst = _opt_rate_and_burst(doc, "prompt_tokens_per_s", "prompt_tokens_burst", where)
    otps, oburst = _opt_rate_and_burst(doc, "output_tokens_per_s", "output_tokens_burst", where)
    concurrency = _opt_positive_int(doc, "max_concurrency", where)
    batch = _opt_positive_int(doc, "max_batch_prompts", where)
    if batch is not None and concurrency is not None and batch > concurrency:
        raise config_error(f"{where}.max_batch_prompts",
                   f"{batch} is larger than max_concurrency {concurrency} (each prompt of a batch takes a slot)")
    forward_user = doc.get("forward_user")
    if forward_user is not None and forward_user not in ("drop", "pseudonym"):
        raise config_error(f"{where}.forward_user", "must be 'drop' or 'pseudonym'")
    return Tenant(
        id=tid,
        models=_name_set(doc, "models", where),
        pools=_name_set(doc, "pools", where),
        tier=tier,
        labels=MappingProxyType(dict(labels)),
        rate_rps=rate,
        rate_burst=(burst if burst is not None else max(1.0, rate)) if rate is not None else None,
        prompt_tokens_per_s=ptps,
        prompt_tokens_burst=(pburst if pburst is not None else max(1.0, ptps)) if ptps is not None else None,
        output_tokens_per_s=otps,
        output_tokens_burst=(oburst if oburst is not None else max(1.0, otps)) if otps is not None else None,
        max_concurrency=concurrency,
        max_prompt_tokens=_opt_positive_int(doc, "max_prompt_tokens", where),
        max_output_tokens=_opt_positive_int(doc, "max_output_tokens", where),
        max_prompt_bytes=_opt_positive_int(doc, "max_prompt_bytes", where),
        max_messages=_opt_positive_int(doc, "max_messages", where),
        max_batch_prompts=batch,
        forward_user=forward_user,
        regulated=regulated,
        data_residency=residency,
        spiffe_ids=tuple(dict.fromkeys(rules)),
    )
