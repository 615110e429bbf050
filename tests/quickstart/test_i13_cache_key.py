"""Issue 13: every input field the shipped policy reads is part of the decision cache's key,
or clears the cache.

- every tenant fact the policy now reads from ``input.tenant`` is in the key
  (before the fix ``tenant.tier/models/pools`` were not: a revoked
  entitlement was served from the cache until its TTL);
- a property test (hypothesis) varies each field the key leaves out and
  shows the shipped policy's decision does not change;
- a registry reload through the admin listener clears the cache.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policy.cache import DEFAULT_KEY_FIELDS, CachedDecisionPoint, DecisionCache
from policy.embedded import EmbeddedOpa
from policy.input import build_policy_input
from policy.loader import PolicySet
from rego import policy_dir

TENANT_FACTS = ("tier", "models", "pools", "regulated", "data_residency", "max_tokens")
#: Input fields outside the key, each with a strategy of values it may take.
NAMES = st.sampled_from(["sim-model", "m2", "default", "eu", "us", "batch"])
OUTSIDE_KEY = {
    "request.max_tokens": st.one_of(st.none(), st.integers(0, 100_000)),
    "request.prompt_tokens": st.integers(0, 100_000),
    "request.stream": st.booleans(),
    "request.sequences": st.integers(1, 16),
    "time.now": st.floats(0, 4e9),
    "identity.claims": st.fixed_dictionaries({"aud": st.lists(NAMES, max_size=2), "exp": st.integers(0, 2**31)}),
    "tenant.labels": st.dictionaries(NAMES, NAMES, max_size=3),
    "candidates[].load": st.integers(0, 500),
    "candidates[].labels.other": NAMES,
}


def _base(tenant: dict[str, Any], model: str, cands: list[dict[str, Any]], alerts: list[dict[str, Any]]) -> dict[str, Any]:
    return build_policy_input(
        identity={"spiffe_id": "spiffe://prefixgate.test/ns/a/app", "trust_domain": "prefixgate.test", "claims": {}},
        tenant=tenant,
        request={"endpoint": "/v1/chat/completions", "model": model, "prompt_tokens": 10, "max_tokens": None},
        candidates=cands, alerts=alerts, now=1_700_000_000.0)


tenants = st.fixed_dictionaries({
    "id": st.sampled_from(["acme", "globex"]),
    "tier": st.sampled_from(["standard", "premium", "gold"]),
    "models": st.lists(st.sampled_from(["sim-model", "m2"]), max_size=2),
    "pools": st.lists(st.sampled_from(["default", "eu", "batch"]), max_size=3),
    "regulated": st.booleans(),
    "data_residency": st.sampled_from([None, "eu", "us"]),
    "max_tokens": st.one_of(st.none(), st.integers(1, 5000)),
})
candidates = st.lists(st.fixed_dictionaries({
    "id": st.sampled_from(["r0", "r1", "r2", "r3"]),
    "pool": st.sampled_from(["default", "eu", "batch"]),
    "labels": st.sampled_from([{}, {"data_residency": "eu"}, {"data_residency": "us"}]),
    "healthy": st.booleans(),
    "load": st.integers(0, 9),
}), max_size=4, unique_by=lambda c: c["id"])
alerts = st.lists(st.fixed_dictionaries({
    "id": st.sampled_from(["a1", "a2"]),
    "kind": st.sampled_from(["replica_concentration", "concentration", "cache_miss"]),
    "replica_id": st.sampled_from([None, "r0", "r1"]),
    "tenant_id": st.sampled_from([None, "acme", "globex"]),
}), max_size=2, unique_by=lambda a: a["id"])


def _vary(doc: dict[str, Any], field: str, value: Any) -> None:
    if field.startswith("candidates[]."):
        for c in doc["candidates"]:
            if field == "candidates[].load":
                c["load"] = value
            else:
                c["labels"]["other"] = value
        return
    head, tail = field.split(".")
    doc[head][tail] = value


def _outcome(d: Any) -> tuple[Any, ...]:
    return (d.allow, d.reason_code, d.reason, d.allowed_replicas, d.allowed_pools, d.max_tokens)


@pytest.fixture(scope="module")
def opa() -> EmbeddedOpa:
    return EmbeddedOpa(policy_dir(), offload=False, timeout_s=None)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tenant=tenants, model=st.sampled_from(["sim-model", "m2"]), cands=candidates, alts=alerts,
       field=st.sampled_from(sorted(OUTSIDE_KEY)), data=st.data())
async def test_fields_outside_the_key_never_change_the_decision(opa: EmbeddedOpa, tenant: dict[str, Any], model: str,
                                                                 cands: list[dict[str, Any]], alts: list[dict[str, Any]],
                                                                 field: str, data: st.DataObject) -> None:
    cache = DecisionCache()
    base = _base(tenant, model, cands, alts)
    varied = copy.deepcopy(base)
    _vary(varied, field, data.draw(OUTSIDE_KEY[field], label=field))
    assert cache.key(varied) == cache.key(base)  # the field is indeed outside the key
    assert _outcome(await opa.decide(varied)) == _outcome(await opa.decide(base)), field


@pytest.mark.parametrize("fact,other", [("tier", "premium"), ("models", ["m2"]), ("pools", ["eu"]),
                                        ("regulated", True), ("data_residency", "us"), ("max_tokens", 7)])
def test_every_tenant_fact_is_in_the_key(fact: str, other: Any) -> None:
    assert f"tenant.{fact}" in DEFAULT_KEY_FIELDS
    tenant = {"id": "acme", "tier": "standard", "models": ["sim-model"], "pools": ["default"],
              "regulated": False, "data_residency": "eu", "max_tokens": None}
    cache = DecisionCache()
    a = _base(tenant, "sim-model", [], [])
    b = _base({**tenant, fact: other}, "sim-model", [], [])
    assert cache.key(a) != cache.key(b)


async def test_revoked_entitlement_is_never_served_from_the_cache() -> None:
    """A policy that entitles from ``input.tenant.models`` behind a one-hour cache: revoking the
    model in the input is denied at once (before the fix: the cached allow, for the whole TTL)."""
    src = ('package prefixgate.authz\n\ndecision := {"allow": true, "reason_code": "allowed", "reason": ""} '
           'if input.request.model in input.tenant.models\n'
           'else := {"allow": false, "reason_code": "model_not_entitled", "reason": ""}\n')
    pdp = CachedDecisionPoint(EmbeddedOpa(policy_set=PolicySet({"p.rego": src}, {})), DecisionCache(ttl_s=3600))
    tenant = {"id": "acme", "tier": "standard", "models": ["sim-model"], "pools": ["default"]}
    assert (await pdp.decide(_base(tenant, "sim-model", [], []))).allow
    revoked = await pdp.decide(_base({**tenant, "models": []}, "sim-model", [], []))
    assert (revoked.allow, revoked.cached) == (False, False)


@pytest.fixture
def config_overrides() -> dict[str, Any]:
    return {"policy": {"mode": "embedded", "dir": str(policy_dir()), "cache_ttl_s": 3600}}


async def test_registry_reload_clears_the_decision_cache(stack: Any) -> None:
    c = stack.components
    cache = c.pdp.dp.cache
    body = {"model": "sim-model", "prompt": "hello there", "max_tokens": 2}
    for _ in range(2):
        r = await stack.client.post("/v1/completions", headers=stack.auth(), json=body)
        assert r.status_code == 200, r.text
    assert len(cache) >= 1 and cache.hits >= 1
    clears = cache.clears
    # revoke tenant-a's model in the file, then reload through the admin listener
    cfg_file = Path(c.admin.config_path)
    doc = yaml.safe_load(cfg_file.read_text())
    next(t for t in doc["tenancy"]["tenants"] if t["id"] == "tenant-a")["models"] = []
    cfg_file.write_text(yaml.safe_dump(doc))
    h = {"Authorization": f"Bearer {stack.issuer.mint('spiffe://demo.prefixgate.test/ops/admin', 'prefixgate-admin')}"}
    async with httpx.AsyncClient(base_url=stack.admin_url, timeout=30) as admin:
        r = await admin.post("/admin/tenants/reload", headers=h)
    assert r.status_code == 200, r.text
    assert cache.clears == clears + 1 and len(cache) == 0
    denied = await stack.client.post("/v1/completions", headers=stack.auth(), json=body)
    # not entitled any more: the unknown model's 404 (review R3-7)
    assert denied.status_code == 404 and denied.json()["error"]["code"] == "model_not_found"
    models = await stack.client.get("/v1/models", headers=stack.auth())
    assert models.json()["data"] == []
