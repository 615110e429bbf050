"""Session 4 (issue 14): the faster :func:`policy.cache.fast_key` returns exactly what the
session-3 version (copied below as ``fast_key_s3``) returns, for random facts (mostly valid,
some mistyped), including duplicate candidate ids (stable sort order) and custom mappings."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from policy.cache import _MISSING_KEY, fast_key
from tests.policy.test_i14_fast_key import alert, candidate, identity, request, tenant

def _tenant_list(tenant: Mapping[str, Any], key: str) -> tuple[str, ...] | None:
    value = tenant.get(key) or ()
    if isinstance(value, str) or not isinstance(value, (Sequence, set, frozenset)):
        return None
    for v in value:
        if not isinstance(v, str):
            return None
    return tuple(sorted(set(value)))


def _count(value: Any, low: int) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= low


def fast_key_s3(
    identity: Mapping[str, Any],
    tenant: Mapping[str, Any],
    request: Mapping[str, Any],
    candidates: Sequence[Mapping[str, Any]],
    alerts: Sequence[Mapping[str, Any]],
) -> tuple[Any, ...] | None:
    """The :data:`DEFAULT_KEY_FIELDS` key of the document :func:`policy.input.build_policy_input`
    would build from these facts, computed without building it (issue 14).

    Takes the same arguments as ``build_policy_input`` (without ``now``: time is not in the
    key) and returns exactly ``DecisionCache().key(build_policy_input(...))`` (property test:
    tests/policy/test_i14_fast_key.py). Returns ``None`` when any fact is missing or mistyped,
    including fields outside the key (request counts, ``stream``, claims, candidate loads and
    labels): the caller then builds the document, whose validation raises
    :class:`policy.input.PolicyInputError` — a cache hit never skips input validation.
    """
    from policy.input import INPUT_VERSION  # noqa: PLC0415 (policy.input imports policy.decision only)

    sid, td = identity.get("spiffe_id"), identity.get("trust_domain")
    claims = identity.get("claims") or {}
    tid = tenant.get("id")
    endpoint, model = request.get("endpoint"), request.get("model")
    if not (isinstance(sid, str) and sid and isinstance(td, str) and td and isinstance(claims, Mapping)
            and isinstance(tid, str) and tid and isinstance(endpoint, str) and endpoint
            and isinstance(model, str) and model):
        return None
    # fields outside the key are still validated as build_policy_input would
    pt, mt, seq = request.get("prompt_tokens"), request.get("max_tokens"), request.get("sequences", 1)
    if not (isinstance(request.get("stream", False), bool) and (pt is None or _count(pt, 0))
            and (mt is None or _count(mt, 0)) and _count(seq, 1)):
        return None
    models, pools = _tenant_list(tenant, "models"), _tenant_list(tenant, "pools")
    t_max, regulated, residency = tenant.get("max_tokens"), tenant.get("regulated", False), tenant.get("data_residency")
    labels = tenant.get("labels") or {}
    if (models is None or pools is None or not (t_max is None or _count(t_max, 0))
            or not isinstance(regulated, bool) or not (residency is None or isinstance(residency, str))
            or not isinstance(labels, Mapping)
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items())):
        return None
    cands = []
    for c in candidates:
        cid, pool, healthy, load, clabels = (c.get("id"), c.get("pool"), c.get("healthy", False),
                                             c.get("load", 0), c.get("labels") or {})
        if not (isinstance(cid, str) and cid and isinstance(pool, str) and pool and isinstance(healthy, bool)
                and not isinstance(load, bool) and isinstance(load, (int, float)) and math.isfinite(load)
                and isinstance(clabels, Mapping)
                and all(isinstance(k, str) and isinstance(v, str) for k, v in clabels.items())):
            return None
        cands.append((cid, pool, healthy, clabels.get("data_residency", _MISSING_KEY)))
    cands.sort(key=lambda c: c[0])
    alts = []
    for a in alerts:
        aid, kind = a.get("id"), a.get("kind")
        if not (isinstance(aid, str) and aid and isinstance(kind, str) and kind):
            return None
        replica, atid = a.get("replica_id", a.get("replica")), a.get("tenant_id")
        alts.append((aid, kind, replica if isinstance(replica, str) else None, atid if isinstance(atid, str) else None))
    alts.sort(key=lambda a: a[0])
    return (
        INPUT_VERSION, sid, td, tid, str(tenant.get("tier") or ""), models, pools, regulated, residency, t_max,
        endpoint, model,
        tuple(c[0] for c in cands), tuple(c[1] for c in cands), tuple(c[2] for c in cands),
        tuple(c[3] for c in cands),
        tuple(a[0] for a in alts), tuple(a[1] for a in alts), tuple(a[2] for a in alts), tuple(a[3] for a in alts),
    )


facts = st.tuples(identity, tenant, request, st.lists(candidate, max_size=4), st.lists(alert, max_size=3))


def _proxied(f: tuple[Any, ...]) -> tuple[Any, ...]:
    """The same facts with every mapping a read-only proxy (not a dict)."""
    ident, ten, req, cands, alerts = f
    wrap = lambda d: MappingProxyType({k: (MappingProxyType(v) if isinstance(v, dict) else v) for k, v in d.items()})  # noqa: E731
    return wrap(ident), wrap(ten), wrap(req), [wrap(c) for c in cands], [wrap(a) for a in alerts]


@settings(max_examples=1500, deadline=None)
@given(f=facts)
def test_fast_key_equals_the_session_3_version(f: tuple[Any, ...]) -> None:
    assert fast_key(*f) == fast_key_s3(*f)
    p = _proxied(f)
    assert fast_key(*p) == fast_key_s3(*p)


def test_duplicate_candidate_ids_keep_their_order() -> None:
    ident = {"spiffe_id": "spiffe://t/a", "trust_domain": "t", "claims": {}}
    ten = {"id": "acme", "models": ["m"], "pools": ["p"], "labels": {}}
    req = {"endpoint": "/v1/completions", "model": "m"}
    cands = [{"id": "r1", "pool": "b", "healthy": True}, {"id": "r0", "pool": "a"}, {"id": "r1", "pool": "a"}]
    assert fast_key(ident, ten, req, cands, []) == fast_key_s3(ident, ten, req, cands, [])
