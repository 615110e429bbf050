"""Session 16 (issue 14): the front's cache hits answer without a coroutine, and fail closed as before.

``Authenticator.authenticate_now`` (a verified-token cache hit) and ``PolicyEnforcementPoint.decide_now``
(a decision-cache hit) answer at once; anything else hands back the awaitable of the full path. Each test
below fails if one check of the fast path is removed: the token's expiry, a trust-bundle change (key
rotation), the unmapped-identity budget, a second ``Authorization`` header, the trusted proxy's binding,
the decision cache's TTL and a policy reload (cache cleared). Property: the key the fast path looks up is
the key of the document the full path builds.
"""
from __future__ import annotations

import asyncio
import inspect
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.authn import Authenticator
from gateway.errors import GatewayError
from gateway.identity import WorkloadIdentity, parse_bundle
from gateway.pep import PolicyEnforcementPoint
from gateway.pep_key import candidate_docs
from gateway.replicas import Replica
from gateway.request import InferenceRequest
from policy.cache import CachedDecisionPoint, DecisionCache
from policy.decision import Decision
from policy.input import build_policy_input
from tenancy.limits import RateLimited
from tenancy.registry import Tenant
from tenancy.spiffe_id import parse_spiffe_id
from tests.support.pep import CountingDecisionPoint, cached_pep
from tests.support.verifier import AUD, T0, Clock, impostor_bundle, make_verifier, verify

TD = "s16.example"
SID = f"spiffe://{TD}/w"


class _Req:
    """What the authenticator reads of a Starlette request: the ASGI scope (and its headers)."""

    def __init__(self, *values: str, client: str = "10.0.0.9") -> None:
        self.scope = {"headers": [(b"authorization", f"Bearer {v}".encode()) for v in values],
                      "client": (client, 1234)}

    @property
    def headers(self) -> Any:
        from starlette.datastructures import Headers

        return Headers(scope=self.scope)


def _settle(got: Any) -> Any:
    """An answer of a fast path: as is when it answered at once, else awaited."""
    return asyncio.run(got) if inspect.isawaitable(got) else got


def _answered_now(got: Any) -> bool:
    if inspect.iscoroutine(got):
        got.close()  # not awaited: the test only asks whether the fast path answered
        return False
    return True


def _auth(clock: Clock, **kw: Any) -> tuple[Any, Any, Authenticator]:
    iss, src, v = make_verifier(TD, clock)
    return iss, src, Authenticator(v, **kw)


def test_a_verified_token_is_answered_at_once_a_new_one_is_not() -> None:
    iss, _src, auth = _auth(Clock())
    token = iss.mint(SID, AUD, now=T0)
    first = auth.authenticate_now(_Req(token), "10.0.0.9")  # type: ignore[arg-type]
    assert inspect.isawaitable(first)  # never verified: the full check (and its signature)
    ident = asyncio.run(first)
    again = auth.authenticate_now(_Req(token), "10.0.0.9")  # type: ignore[arg-type]
    assert again == (ident, None) and isinstance(ident, WorkloadIdentity)  # session 19: (identity, found)
    assert auth.verifier.signature_checks == 1


def test_an_expired_token_is_never_answered_from_the_cache() -> None:
    clock = Clock()
    iss, _src, auth = _auth(clock)
    token = iss.mint(SID, AUD, ttl_s=60, now=T0)
    verify(auth.verifier, token)
    clock.t = T0 + 61
    got = auth.authenticate_now(_Req(token), "10.0.0.9")  # type: ignore[arg-type]
    assert not isinstance(got, WorkloadIdentity)
    with pytest.raises(GatewayError) as ei:
        _settle(got)
    assert ei.value.status == 401


def test_changed_keys_are_never_answered_from_the_cache() -> None:
    iss, src, auth = _auth(Clock())
    token = iss.mint(SID, AUD, now=T0)
    verify(auth.verifier, token)
    src.replace(parse_bundle(TD, impostor_bundle(iss)))  # a rotation: same kid, other key material
    got = auth.authenticate_now(_Req(token), "10.0.0.9")  # type: ignore[arg-type]
    assert not isinstance(got, WorkloadIdentity)
    with pytest.raises(GatewayError) as ei:
        _settle(got)
    assert ei.value.status == 401


def test_the_unmapped_budget_is_charged_on_a_hit() -> None:
    class _Budget:
        def __init__(self) -> None:
            self.left = 1

        def check(self, source: str, now: float) -> None:
            if self.left <= 0:
                raise RateLimited(3.0, "source_request_rate")
            self.left -= 1

    iss, _src, auth = _auth(Clock(), unmapped_limiter=_Budget(), mapped=lambda sid: False)
    token = iss.mint(SID, AUD, now=T0)
    verify(auth.verifier, token)
    got = auth.authenticate_now(_Req(token), "10.0.0.9")  # type: ignore[arg-type]
    assert type(got) is tuple and isinstance(got[0], WorkloadIdentity) and got[1] is False  # mapped's answer
    with pytest.raises(GatewayError) as ei:  # the budget is spent: the hit answers 429 too
        auth.authenticate_now(_Req(token), "10.0.0.9")  # type: ignore[arg-type]
    assert ei.value.status == 429 and ei.value.code == "too_many_unmapped"


def test_two_authorization_headers_are_refused_as_before() -> None:
    iss, _src, auth = _auth(Clock())
    token = iss.mint(SID, AUD, now=T0)
    verify(auth.verifier, token)
    got = auth.authenticate_now(_Req(token, token), "10.0.0.9")  # type: ignore[arg-type]
    assert not isinstance(got, WorkloadIdentity)
    with pytest.raises(GatewayError) as ei:
        _settle(got)
    assert ei.value.status == 400 and ei.value.code == "malformed_authorization_header"


def test_behind_a_trusted_proxy_the_binding_decides() -> None:
    iss, _src, auth = _auth(Clock(), trusted_proxies=["10.0.0.0/8"])
    token = iss.mint(SID, AUD, now=T0)
    verify(auth.verifier, token)
    got = auth.authenticate_now(_Req(token), "10.0.0.9")  # type: ignore[arg-type]
    assert not _answered_now(got)  # the forwarded certificate's binding: the full path


# -- the decision cache --------------------------------------------------------------------------

class _Monotonic:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _pep(ttl_s: float = 5.0) -> tuple[PolicyEnforcementPoint, CachedDecisionPoint, CountingDecisionPoint, _Monotonic,
                                      list[Any]]:
    clock = _Monotonic()
    pep, cached, inner, keys = cached_pep(ttl_s, clock=clock)
    return pep, cached, inner, clock, keys


IDENT = WorkloadIdentity(spiffe_id=parse_spiffe_id("spiffe://t/ns/a"), trust_domain="t")
TENANT = Tenant(id="acme", models=frozenset({"m"}), pools=frozenset({"p"}))
CANDS = [Replica("r0", "http://x", pool="p")]
REQ = InferenceRequest("completions", "m", False, 5, False, {}, "")


def _decide_now(pep: PolicyEnforcementPoint) -> Any:
    return pep.decide_now(IDENT, TENANT, REQ, 3, CANDS, "/v1/completions")


def test_a_cached_decision_is_answered_at_once_and_a_miss_counts_once() -> None:
    pep, cached, inner, _clock, _ = _pep()
    first = _decide_now(pep)
    assert inspect.isawaitable(first)
    decision = asyncio.run(first)
    assert cached.cache.misses == 1 and len(inner.docs) == 1  # the key computed once, the miss counted once
    hit = _decide_now(pep)
    assert type(hit) is Decision and hit.cached and hit.decision_id == decision.decision_id
    assert len(inner.docs) == 1 and cached.cache.hits == 1


def test_a_decision_never_outlives_its_ttl() -> None:
    pep, _cached, inner, clock, _ = _pep(ttl_s=5.0)
    asyncio.run(_decide_now(pep))
    clock.t += 5.0
    assert not _answered_now(_decide_now(pep))
    assert len(inner.docs) == 1


def test_a_policy_reload_drops_the_fast_answer() -> None:
    pep, cached, inner, _clock, _ = _pep()
    asyncio.run(_decide_now(pep))
    cached.clear()  # what a policy or data change does (change listener) and a registry reload
    got = _decide_now(pep)
    assert not isinstance(got, Decision)
    asyncio.run(got)
    assert len(inner.docs) == 2


NAMES = st.sampled_from(["a", "b", "eu", "us", "m"])


@settings(max_examples=200, deadline=None)
@given(model=NAMES, pt=st.integers(0, 50), mt=st.one_of(st.none(), st.integers(1, 99)), stream=st.booleans(),
       prompts=st.sampled_from([(), ("x",), ("x", "y")]), queued=st.integers(0, 3),
       pools=st.frozensets(NAMES, max_size=3), rpools=st.lists(NAMES, min_size=0, max_size=3))
def test_the_fast_key_is_the_built_documents_key(model: str, pt: int, mt: int | None, stream: bool,
                                                 prompts: tuple[str, ...], queued: int, pools: frozenset[str],
                                                 rpools: list[str]) -> None:
    pep, _cached, inner, _clock, keys = _pep()
    tenant = Tenant(id="acme", models=frozenset({model}), pools=pools)
    cands = [Replica(f"r{i}", "http://x", pool=p) for i, p in enumerate(rpools)]
    req = InferenceRequest("completions", model, stream, mt, False, {}, "", prompts)
    for _ in range(2):  # a miss (built), then the hit (fast)
        _settle(pep.decide_now(IDENT, tenant, req, pt, cands, "/v1/completions", queued))
    doc = build_policy_input(
        {"spiffe_id": str(IDENT.spiffe_id), "trust_domain": "t", "claims": IDENT.claims}, pep.tenant_facts(tenant),
        {"endpoint": "/v1/completions", "model": model, "prompt_tokens": pt, "max_tokens": mt, "stream": stream,
         "sequences": max(1, len(prompts)), "queued_requests": queued}, candidate_docs(cands, None), [], 1.0)
    want = DecisionCache().key(doc)
    assert keys == [want, want] and len(inner.docs) == 1 and DecisionCache().key(inner.docs[0]) == want
