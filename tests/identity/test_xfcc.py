from __future__ import annotations

import ipaddress

import pytest

from gateway.identity import (
    AuthenticationError,
    InvalidXfcc,
    Reason,
    SpiffeId,
    WorkloadIdentity,
    check_binding,
    forwarded_spiffe_id,
    parse_xfcc,
)

PROXIES = [ipaddress.ip_network("10.0.0.0/24"), ipaddress.ip_network("fd00::/64")]
TDS = frozenset({"a.example"})


def forwarded(values: list[str], peer: str | None, proxies: list, *,
                       trust_domains: frozenset[str] | set[str] = TDS) -> SpiffeId | None:
    return forwarded_spiffe_id(values, peer, proxies, trust_domains=trust_domains)
ENVOY_EXAMPLE = (
    'By=spiffe://a.example/envoy;Hash=468ed33be74eee6556d90c0149c1309e9ba61d6425303443c0748a02dd8de688;'
    'Subject="/C=US/ST=CA/L=San Francisco/OU=Lyft/CN=Test Client";URI=spiffe://a.example/ns/prod/sa/chat'
)


def test_parse_quoted_values_and_separators() -> None:
    els = parse_xfcc(
        'By=spiffe://x/p;Subject="CN=a,O=b;c";URI=spiffe://a.example/one,'
        'Hash=abc;Subject="say \\"hi\\"";URI=spiffe://a.example/two;DNS=a.test;DNS=b.test'
    )
    assert len(els) == 2
    assert els[0].get_all("subject") == ["CN=a,O=b;c"]
    assert els[1].get_all("Subject") == ['say "hi"']
    assert els[1].get_all("DNS") == ["a.test", "b.test"]
    assert els[1].get_all("URI") == ["spiffe://a.example/two"]


@pytest.mark.parametrize("bad", ['Subject="open;URI=spiffe://a/b', "justtext", "=v", 'URI=a"b'])
def test_parse_errors(bad: str) -> None:
    with pytest.raises(InvalidXfcc):
        parse_xfcc(bad)


def test_trusted_peer_yields_identity() -> None:
    sid = forwarded([ENVOY_EXAMPLE], "10.0.0.7", PROXIES)
    # a SPIFFE ID to bind to, never a WorkloadIdentity (it cannot authenticate)
    assert sid == SpiffeId("a.example", "/ns/prod/sa/chat")


@pytest.mark.parametrize("peer", ["10.0.1.7", "192.168.0.1", "", None, "not-an-ip", "fd01::1"])
def test_untrusted_peer_is_ignored(peer: str | None) -> None:
    assert forwarded([ENVOY_EXAMPLE], peer, PROXIES) is None


def test_ipv6_and_mapped_ipv4_peers() -> None:
    assert forwarded([ENVOY_EXAMPLE], "fd00::5", PROXIES) is not None
    assert forwarded([ENVOY_EXAMPLE], "::ffff:10.0.0.9", PROXIES) is not None


def test_only_last_element_counts() -> None:
    # A client-supplied element first, the trusted proxy's element last.
    spoofed = "URI=spiffe://a.example/admin"
    ident = forwarded([spoofed + "," + ENVOY_EXAMPLE], "10.0.0.7", PROXIES)
    assert ident is not None and ident.path == "/ns/prod/sa/chat"
    # Several header lines are joined in order.
    ident2 = forwarded([spoofed, ENVOY_EXAMPLE], "10.0.0.7", PROXIES)
    assert ident2 == ident
    # If the last hop has no SPIFFE URI, earlier elements are NOT used.
    assert forwarded([ENVOY_EXAMPLE, "Hash=abc;DNS=x.test"], "10.0.0.7", PROXIES) is None


def test_bad_uri_from_trusted_proxy_fails_closed() -> None:
    with pytest.raises(InvalidXfcc):
        forwarded(["URI=spiffe://A.example/x"], "10.0.0.7", PROXIES)
    with pytest.raises(InvalidXfcc):
        forwarded(["URI=spiffe://a.example/x;URI=spiffe://a.example/y"], "10.0.0.7", PROXIES)
    with pytest.raises(InvalidXfcc):
        forwarded([ENVOY_EXAMPLE], "10.0.0.7", PROXIES, trust_domains={"b.example"})
    assert forwarded([ENVOY_EXAMPLE], "10.0.0.7", PROXIES, trust_domains={"a.example"})


def test_non_spiffe_uri_and_empty() -> None:
    assert forwarded(["URI=https://a.example/x"], "10.0.0.7", PROXIES) is None
    assert forwarded([], "10.0.0.7", PROXIES) is None
    assert forwarded([" "], "10.0.0.7", PROXIES) is None


def test_binding_policy() -> None:
    a = WorkloadIdentity(SpiffeId("a.example", "/w"), "a.example", {"x": 1})
    assert check_binding(a, SpiffeId("a.example", "/w")) is a
    assert check_binding(a, None) is a
    with pytest.raises(AuthenticationError) as ei:
        check_binding(a, SpiffeId("a.example", "/other"))
    assert ei.value.reason == Reason.IDENTITY_MISMATCH and ei.value.status == 401
    with pytest.raises(AuthenticationError):
        check_binding(a, SpiffeId("b.example", "/w"))
