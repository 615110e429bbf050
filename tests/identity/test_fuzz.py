from __future__ import annotations

import ipaddress

from hypothesis import HealthCheck, given, settings, strategies as st

from gateway.identity import (
    AuthenticationError,
    InvalidXfcc,
    JwtSvidVerifier,
    TrustBundleStore,
    forwarded_spiffe_id,
    parse_bundle,
)
from sim.spiffe_issuer import DemoIssuer

_ISS = DemoIssuer("a.example")
_BUNDLE = parse_bundle("a.example", _ISS.bundle())
_V = JwtSvidVerifier(TrustBundleStore(), "prefixgate", {"a.example"})
_TOKEN = _ISS.mint("spiffe://a.example/w", "prefixgate", ttl_s=3000)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=300))
def test_verifier_refuses_arbitrary_text_with_auth_error_only(s: str) -> None:
    try:
        _V.verify_with_bundle(s, _BUNDLE)
    except AuthenticationError:
        return
    raise AssertionError("arbitrary text verified")


@settings(max_examples=200)
@given(pos=st.integers(min_value=0, max_value=len(_TOKEN) - 1), ch=st.sampled_from("AQgw_-0."))
def test_any_single_character_change_is_refused(pos: int, ch: str) -> None:
    mutated = _TOKEN[:pos] + ch + _TOKEN[pos + 1:]
    if mutated == _TOKEN:
        return
    try:
        _V.verify_with_bundle(mutated, _BUNDLE)
    except AuthenticationError:
        return
    # PyJWT also refuses non-canonical base64url (trailing bits), so no
    # mutation at all may pass.
    raise AssertionError(f"mutation at {pos} accepted")


@settings(max_examples=300)
@given(st.text(alphabet=st.sampled_from(list('URI=spiffe://a.example/x;,"\\ Hash')), max_size=80))
def test_xfcc_parser_raises_only_its_error(h: str) -> None:
    try:
        forwarded_spiffe_id([h], "10.0.0.1", [ipaddress.ip_network("10.0.0.0/8")], trust_domains={"a.example"})
    except InvalidXfcc:
        pass
