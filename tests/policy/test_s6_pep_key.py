"""Session 6 (issue 14): the PEP's decision-cache hit path (gateway/pep_key.py).

The PEP keys the decision cache from parts it keeps per Tenant object and per list of Replica
objects. Property: for random tenants, replicas, requests and alerts the key it looks up equals
``DecisionCache().key(build_policy_input(...))`` of the document it would build; a hit builds
neither that document nor the candidates' documents; a new Tenant or Replica object (reload)
is never answered from the old objects' key parts.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gateway.pep
from gateway.identity.spiffe_id import WorkloadIdentity
from tenancy.spiffe_id import parse_spiffe_id
from gateway.pep import PolicyEnforcementPoint
from gateway.pep_key import candidate_docs
from gateway.replicas import Replica
from gateway.request import InferenceRequest
from policy.cache import CachedDecisionPoint, DecisionCache
from policy.input import build_policy_input
from tenancy.registry import Tenant
from tests.support.pep import CountingDecisionPoint, cached_pep

NAMES = st.sampled_from(["a", "b", "eu", "us", "sim-model"])


def _pep(alerts: list[dict[str, Any]]) -> tuple[PolicyEnforcementPoint, CachedDecisionPoint, CountingDecisionPoint,
                                                list[Any]]:
    return cached_pep(600, alerts)


tenants = st.builds(
    Tenant, id=st.sampled_from(["acme", "globex"]), models=st.frozensets(NAMES, max_size=3),
    pools=st.frozensets(NAMES, max_size=3), tier=st.sampled_from(["standard", "gold", ""]),
    labels=st.dictionaries(NAMES, NAMES, max_size=2).map(MappingProxyType),
    max_output_tokens=st.one_of(st.none(), st.integers(0, 99)), regulated=st.booleans(),
    data_residency=st.sampled_from([None, "eu", "us"]))
replicas = st.lists(st.builds(
    Replica, id=st.sampled_from(["r0", "r1", "r2"]), url=st.just("http://x"), pool=NAMES,
    labels=st.sampled_from([{}, {"data_residency": "eu"}, {"data_residency": "us", "zone": "b"}])),
    max_size=3, unique_by=lambda r: r.id)
alerts = st.lists(st.fixed_dictionaries(
    {"id": st.sampled_from(["a1", "a2"]), "kind": st.sampled_from(["replica_concentration"])},
    optional={"replica": st.sampled_from(["r0", "r1"]), "tenant_id": st.sampled_from(["acme", None])}),
    max_size=2, unique_by=lambda a: a["id"])
requests = st.builds(
    InferenceRequest, endpoint=st.just("completions"), model=st.sampled_from(["sim-model", "m2"]),
    stream=st.booleans(), max_tokens=st.one_of(st.none(), st.integers(0, 99)), include_usage=st.just(False),
    body=st.just({}), text=st.just(""), prompts=st.sampled_from([(), ("x",), ("x", "y")]))
spiffe = st.sampled_from(["spiffe://t/ns/a", "spiffe://t/ns/b"])


def _identity(sid: str) -> WorkloadIdentity:
    return WorkloadIdentity(spiffe_id=parse_spiffe_id(sid), trust_domain="t", claims={"aud": ["gw"], "exp": 9})


def _built_key(pep: PolicyEnforcementPoint, ident: WorkloadIdentity, tenant: Tenant, req: InferenceRequest,
               pt: int, cands: list[Replica], endpoint: str, queued: int, alerts: list[Any]) -> tuple[Any, ...]:
    doc = build_policy_input(
        {"spiffe_id": str(ident.spiffe_id), "trust_domain": ident.trust_domain, "claims": ident.claims},
        pep.tenant_facts(tenant),
        {"endpoint": endpoint, "model": req.model, "prompt_tokens": pt, "max_tokens": req.max_tokens,
         "stream": req.stream, "sequences": req.sequences, "queued_requests": queued},
        candidate_docs(cands, pep.loads), alerts, 1.0)
    return DecisionCache().key(doc)


@settings(max_examples=300, deadline=None)
@given(sid=spiffe, tenant=tenants, req=requests, pt=st.integers(0, 50), cands=replicas, alerts=alerts,
       queued=st.integers(0, 3), twice=st.booleans())
async def test_the_peps_key_is_the_built_documents_key(sid: str, tenant: Tenant, req: InferenceRequest, pt: int,
                                                       cands: list[Replica], alerts: list[Any], queued: int,
                                                       twice: bool) -> None:
    pep, _, inner, keys = _pep(alerts)
    ident = _identity(sid)
    for _ in range(2 if twice else 1):  # the second call takes both parts from the memo
        await pep.decide(ident, tenant, req, pt, list(reversed(cands)), "/v1/completions", queued)
    want = _built_key(pep, ident, tenant, req, pt, cands, "/v1/completions", queued, alerts)
    assert keys == [want] * len(keys) and len(inner.docs) == 1
    assert DecisionCache().key(inner.docs[0]) == want


async def test_a_hit_builds_no_document(monkeypatch: pytest.MonkeyPatch) -> None:
    pep, _, inner, _ = _pep([])
    ident, t = _identity("spiffe://t/ns/a"), Tenant(id="acme", models=frozenset({"m"}), pools=frozenset({"p"}))
    cands = [Replica("r0", "http://x", pool="p")]
    req = InferenceRequest("completions", "m", False, 5, False, {}, "")
    first = await pep.decide(ident, t, req, 3, cands, "/v1/completions")
    built: list[str] = []
    real_docs, real_build = gateway.pep.candidate_docs, gateway.pep.build_policy_input
    monkeypatch.setattr(gateway.pep, "candidate_docs", lambda *a: built.append("cands") or real_docs(*a))
    monkeypatch.setattr(gateway.pep, "build_policy_input", lambda *a: built.append("doc") or real_build(*a))
    again = await pep.decide(ident, t, InferenceRequest("completions", "m", True, 9, False, {}, ""), 7,
                             cands, "/v1/completions", 2)
    assert (first.cached, again.cached, again.decision_id, len(inner.docs), built) == (False, True, "d1", 1, [])


async def test_new_objects_never_reuse_old_key_parts() -> None:
    pep, _, inner, _ = _pep([])
    ident = _identity("spiffe://t/ns/a")
    t = Tenant(id="acme", models=frozenset({"m"}), pools=frozenset({"p"}))
    req = InferenceRequest("completions", "m", False, 5, False, {}, "")
    r0 = Replica("r0", "http://x", pool="p", labels={"data_residency": "eu"})
    await pep.decide(ident, t, req, 3, [r0], "/v1/completions")
    await pep.decide(ident, t, req, 3, [Replica("r0", "http://x", pool="p", labels={"data_residency": "eu"})],
                     "/v1/completions")  # an equal replacement: same key, a hit
    assert len(inner.docs) == 1
    # a reloaded replica (other residency) and a reloaded tenant (model revoked): new keys, misses
    await pep.decide(ident, t, req, 3, [Replica("r0", "http://x", pool="p", labels={"data_residency": "us"})],
                     "/v1/completions")
    assert len(inner.docs) == 2 and inner.docs[-1]["candidates"][0]["labels"] == {"data_residency": "us"}
    await pep.decide(ident, Tenant(id="acme", models=frozenset(), pools=frozenset({"p"})), req, 3, [r0],
                     "/v1/completions")
    assert len(inner.docs) == 3 and inner.docs[-1]["tenant"]["models"] == []
