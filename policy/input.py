"""Build the versioned policy input document (``input`` of the Rego query).

Shape of version ``"1"`` (every field is always present; lists are sorted so
equal requests build equal documents)::

    {
      "version": "1",
      "identity": {"spiffe_id": str, "trust_domain": str,
                   "claims": {"aud": [str], "iss": str|null, "exp": int|null}},
      "tenant":   {"id": str, "tier": str, "models": [str], "pools": [str],
                   "labels": {str: str}, "max_tokens": int|null,
                   "regulated": bool, "data_residency": str|null},
      "request":  {"endpoint": str, "model": str, "prompt_tokens": int,
                   "max_tokens": int|null, "stream": bool, "sequences": int,
                   "queued_requests": int},
      "candidates": [{"id": str, "pool": str, "labels": {str: str},
                      "healthy": bool, "load": number}],
      "alerts":   [{"id": str, "kind": str, "replica_id": str|null,
                    "tenant_id": str|null}],
      "time":     {"now": float (seconds since the Unix epoch)}
    }

``tenant`` carries every entitlement of the tenant as the gateway's tenant
registry holds it (:meth:`tenancy.registry.Tenant.policy_view`): the
registry is the single source of tenant facts, the shipped policy decides
from ``input.tenant`` and reads ``data`` only for operator facts the
registry does not hold (tier caps, reserved pools, the deny-list).

Only the fields above are copied: prompt text, messages, and any other
request field never enter the policy input (they would end up in OPA
decision logs). Claims are limited to :data:`SELECTED_CLAIMS`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from policy.decision import PolicyError

INPUT_VERSION = "1"

#: JWT-SVID claims copied into ``input.identity.claims`` (RFC 7519 names).
SELECTED_CLAIMS: tuple[str, ...] = ("aud", "iss", "exp")


class PolicyInputError(PolicyError):
    """The facts given to :func:`build_policy_input` are missing or mistyped."""


def _req_str(src: Mapping[str, Any], key: str, where: str) -> str:
    value = src.get(key)
    if not isinstance(value, str) or not value:
        raise PolicyInputError(f"{where}.{key} must be a non-empty string")
    return value


def _opt_int(src: Mapping[str, Any], key: str, where: str) -> int | None:
    value = src.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PolicyInputError(f"{where}.{key} must be a non-negative integer")
    return value


def _bool(src: Mapping[str, Any], key: str, where: str) -> bool:
    value = src.get(key, False)
    if not isinstance(value, bool):
        raise PolicyInputError(f"{where}.{key} must be a boolean")
    return value


def _opt_str(src: Mapping[str, Any], key: str, where: str) -> str | None:
    value = src.get(key)
    if value is not None and not isinstance(value, str):
        raise PolicyInputError(f"{where}.{key} must be a string or null")
    return value


def _str_list(src: Mapping[str, Any], key: str, where: str) -> list[str]:
    value = src.get(key) or []
    if isinstance(value, str) or not isinstance(value, (Sequence, set, frozenset)):
        raise PolicyInputError(f"{where}.{key} must be a list of strings")
    if not all(isinstance(v, str) for v in value):
        raise PolicyInputError(f"{where}.{key} must be a list of strings")
    return sorted(set(value))


def _labels(src: Mapping[str, Any], where: str) -> dict[str, str]:
    value = src.get("labels") or {}
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise PolicyInputError(f"{where}.labels must map strings to strings")
    return dict(sorted(value.items()))


def _claims(claims: Mapping[str, Any]) -> dict[str, Any]:
    aud = claims.get("aud")
    if isinstance(aud, str):
        aud = [aud]
    exp = claims.get("exp")
    iss = claims.get("iss")
    return {
        "aud": sorted(a for a in (aud or []) if isinstance(a, str)),
        "iss": iss if isinstance(iss, str) else None,
        "exp": exp if isinstance(exp, int) and not isinstance(exp, bool) else None,
    }


def _candidate(c: Mapping[str, Any], i: int) -> dict[str, Any]:
    where = f"candidates[{i}]"
    load = c.get("load", 0)
    if isinstance(load, bool) or not isinstance(load, (int, float)) or not math.isfinite(load):
        raise PolicyInputError(f"{where}.load must be a finite number")
    healthy = c.get("healthy", False)
    if not isinstance(healthy, bool):
        raise PolicyInputError(f"{where}.healthy must be a boolean")
    return {
        "id": _req_str(c, "id", where),
        "pool": _req_str(c, "pool", where),
        "labels": _labels(c, where),
        "healthy": healthy,
        "load": load,
    }


def _alert(a: Mapping[str, Any], i: int) -> dict[str, Any]:
    where = f"alerts[{i}]"
    # audit.concentration.ConcentrationMonitor.active_alerts() names the
    # replica ``replica``; input version 1 calls it ``replica_id``.
    replica = a.get("replica_id", a.get("replica"))
    tenant = a.get("tenant_id")
    return {
        "id": _req_str(a, "id", where),
        "kind": _req_str(a, "kind", where),
        "replica_id": replica if isinstance(replica, str) else None,
        "tenant_id": tenant if isinstance(tenant, str) else None,
    }


def build_policy_input(
    identity: Mapping[str, Any],
    tenant: Mapping[str, Any],
    request: Mapping[str, Any],
    candidates: Sequence[Mapping[str, Any]],
    alerts: Sequence[Mapping[str, Any]],
    now: float,
) -> dict[str, Any]:
    """Build the policy input document (version :data:`INPUT_VERSION`).

    Args:
        identity: ``{"spiffe_id", "trust_domain", "claims"}`` of the
            authenticated workload (JWT-SVID).
        tenant: ``{"id", "tier", "models", "pools", "labels", "max_tokens",
            "regulated", "data_residency"}`` from the tenant registry
            (``max_tokens`` in tokens, optional; ``regulated`` default false;
            ``data_residency`` a region name or None).
        request: ``{"endpoint", "model", "prompt_tokens", "max_tokens",
            "stream", "sequences"}``; token counts in tokens (``prompt_tokens``
            over all sequences, ``max_tokens`` per sequence); ``sequences``:
            prompts of a batch (elements of a list ``prompt``; default 1);
            ``queued_requests``: the tenant's requests waiting in the gateway's
            queue now (flow control; default 0; outside the decision-cache key).
            Other keys are ignored.
        candidates: replicas the router could use, each ``{"id", "pool",
            "labels", "healthy", "load"}`` (load: queued + running requests).
        alerts: active concentration alerts, each ``{"id", "kind",
            "replica_id", "tenant_id"}`` (``replica`` is accepted for
            ``replica_id``: the concentration monitor's shape; other keys
            such as ``pool`` and ``since`` are dropped).
        now: wall-clock time, seconds since the Unix epoch.

    Returns:
        The JSON-compatible input document described in the module docstring.

    Raises:
        PolicyInputError: a required field is missing or has a wrong type.
    """
    claims = identity.get("claims") or {}
    if not isinstance(claims, Mapping):
        raise PolicyInputError("identity.claims must be an object")
    stream = request.get("stream", False)
    if not isinstance(stream, bool):
        raise PolicyInputError("request.stream must be a boolean")
    prompt_tokens = _opt_int(request, "prompt_tokens", "request")
    sequences = request.get("sequences", 1)
    if isinstance(sequences, bool) or not isinstance(sequences, int) or sequences < 1:
        raise PolicyInputError("request.sequences must be a positive integer")
    cands = sorted((_candidate(c, i) for i, c in enumerate(candidates)), key=lambda c: c["id"])
    alts = sorted((_alert(a, i) for i, a in enumerate(alerts)), key=lambda a: a["id"])
    return {
        "version": INPUT_VERSION,
        "identity": {
            "spiffe_id": _req_str(identity, "spiffe_id", "identity"),
            "trust_domain": _req_str(identity, "trust_domain", "identity"),
            "claims": _claims(claims),
        },
        "tenant": {
            "id": _req_str(tenant, "id", "tenant"),
            "tier": str(tenant.get("tier") or ""),
            "models": _str_list(tenant, "models", "tenant"),
            "pools": _str_list(tenant, "pools", "tenant"),
            "labels": _labels(tenant, "tenant"),
            "max_tokens": _opt_int(tenant, "max_tokens", "tenant"),
            "regulated": _bool(tenant, "regulated", "tenant"),
            "data_residency": _opt_str(tenant, "data_residency", "tenant"),
        },
        "request": {
            "endpoint": _req_str(request, "endpoint", "request"),
            "model": _req_str(request, "model", "request"),
            "prompt_tokens": prompt_tokens or 0,
            "max_tokens": _opt_int(request, "max_tokens", "request"),
            "stream": stream,
            "sequences": sequences,
            "queued_requests": _queued(request),
        },
        "candidates": cands,
        "alerts": alts,
        "time": {"now": float(now)},
    }


def _queued(request: Mapping[str, Any]) -> int:
    """``request.queued_requests``: a non-negative integer (default 0)."""
    q = request.get("queued_requests", 0)
    if isinstance(q, bool) or not isinstance(q, int) or q < 0:
        raise PolicyInputError("request.queued_requests must be a non-negative integer")
    return q
