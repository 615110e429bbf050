"""Session 18 (issue 14, helper front3): the front's steps cut without changing an answer.

``Admission.check_request`` calls ``check_model`` only when it refuses (the same 404 for an unserved
and for a not-entitled model, the audit's true reason kept); ``PrefixKeys.prefix_chains`` builds its
view without ``ChainView.__init__`` outside a grace period (the same chains, kid and previous chains
as ``ChainView(keyring.prefix_chain(...))``, in and out of grace); a trust bundle source's
``current()`` serves its bundle up to ``max_stale_s`` and fails closed past it, as ``_serve`` does.
"""

from __future__ import annotations

import math

import pytest

from gateway.admission import Admission
from gateway.config_state import StateConfig
from gateway.errors import GatewayError
from gateway.identity import BundleUnavailable, parse_bundle
from gateway.identity.bundle_sources import TrustBundleSource
from gateway.metrics import GatewayMetrics
from gateway.prefix_keys import ChainView, PrefixKeys
from gateway.request import parse_inference_request
from sim.spiffe_issuer import DemoIssuer
from tenancy.keys import KeyRing
from tenancy.registry import Tenant, TenantRegistry
from tenancy.shared import make_limits
from tenancy.tokenizer import WordTokenizer


def _admission() -> Admission:
    return Admission(TenantRegistry.from_config([]), make_limits(StateConfig()), WordTokenizer(), ["m", "served"],
                     GatewayMetrics(), max_messages=256, max_output_tokens=4096, default_max_prompt_tokens=100)


def _req(model: str, **extra: object):  # type: ignore[no-untyped-def]
    import json
    return parse_inference_request(json.dumps({"model": model, "prompt": "hi", **extra}).encode(), "completions")


def test_check_request_refuses_as_check_model() -> None:
    adm = _admission()
    t = Tenant(id="acme", models=frozenset({"m", "unserved-but-entitled"}))
    adm.check_request(_req("m"), t)  # served and entitled: no refusal
    for model, record in (("nope", {}), ("unserved-but-entitled", {}),
                          ("served", {"reason_code": "model_not_entitled", "model": "served"})):
        with pytest.raises(GatewayError) as fused:
            adm.check_request(_req(model), t)
        with pytest.raises(GatewayError) as alone:
            adm.check_model(model, t)
        assert (fused.value.status, fused.value.code, fused.value.message, fused.value.param) == \
            (alone.value.status, alone.value.code, alone.value.message, alone.value.param) == \
            (404, "model_not_found", "the requested model does not exist", "model")
        assert fused.value.record == alone.value.record == record and fused.value.outcome == alone.value.outcome
    with pytest.raises(GatewayError) as ei:  # the later rule still runs after the model check passed
        adm.check_request(_req("m", echo=True, logprobs=1), t)
    assert ei.value.code == "prompt_logprobs_not_allowed"


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _view_fields(v: ChainView) -> tuple:
    return v.current, v.kid, v.previous_chains()


def test_prefix_chains_view_equals_chain_view_in_and_out_of_grace() -> None:
    clock = _Clock()
    ring = KeyRing(b"k" * 32, grace_s=60, clock=clock)
    keys = PrefixKeys(ring, block_size=4, max_prefix_blocks=3, forward_user=None)
    tokens, tenant = list(range(30)), Tenant(id="acme", models=frozenset({"m"}))

    def both() -> tuple[ChainView, ChainView]:
        return keys.prefix_chains(tenant, tokens), ChainView(ring.prefix_chain("acme", tokens, 4, max_blocks=3))

    fast, ref = both()
    assert type(fast) is ChainView and _view_fields(fast) == _view_fields(ref)
    assert len(fast.current) == 3 and fast.previous_chains() == ()
    assert PrefixKeys.prefix_fingerprint(fast) == PrefixKeys.prefix_fingerprint(ref)
    ring.rotate_tenant("acme")
    fast, ref = both()
    assert _view_fields(fast) == _view_fields(ref) and len(fast.previous_chains()) == 1
    clock.t += 61
    fast, ref = both()
    assert _view_fields(fast) == _view_fields(ref) and fast.previous_chains() == ()


class _Source(TrustBundleSource):
    """No refresh ever due; clock ``now``; ``max_stale_s`` 10."""

    def __init__(self, doc: dict) -> None:
        self.now = 0.0
        super().__init__("s18.example", max_stale_s=10, clock=lambda: self.now)
        self.doc = doc

    def _refresh_due(self, now: float) -> bool:
        return False

    async def _load(self, now: float):  # type: ignore[no-untyped-def]
        return parse_bundle("s18.example", self.doc)


def test_bundle_current_serves_until_max_stale_and_fails_closed_past_it() -> None:
    import asyncio
    src = _Source(DemoIssuer("s18.example").bundle())
    assert src.current() is None  # nothing loaded: the awaited path
    asyncio.run(src.refresh())
    bundle = src.current()
    assert bundle is not None
    src.now = 10.0  # exactly max_stale_s after the load: still served (_serve's bound is "more than")
    assert src.current() is bundle
    src.now = math.nextafter(10.0, 11.0)
    with pytest.raises(BundleUnavailable, match="stale"):
        src.current()
