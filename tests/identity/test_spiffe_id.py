from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from gateway.identity import InvalidSpiffeId, SpiffeId, parse_spiffe_id, parse_trust_domain


@pytest.mark.parametrize(
    "s, td, path",
    [
        ("spiffe://example.org", "example.org", ""),
        ("spiffe://example.org/ns/prod/sa/billing", "example.org", "/ns/prod/sa/billing"),
        ("spiffe://a_b-c.9/x.y-z_Q", "a_b-c.9", "/x.y-z_Q"),
        ("spiffe://td/...", "td", "/..."),  # three dots is a plain segment
    ],
)
def test_valid(s: str, td: str, path: str) -> None:
    sid = parse_spiffe_id(s)
    assert sid == SpiffeId(td, path)
    assert str(sid) == s


@pytest.mark.parametrize(
    "s, reason",
    [
        ("", "empty"),
        ("http://example.org/x", "scheme"),
        ("SPIFFE://example.org/x", "scheme"),
        ("spiffe:/example.org/x", "scheme"),
        ("spiffe://", "trust_domain_empty"),
        ("spiffe:///path", "trust_domain_empty"),
        ("spiffe://Example.org/x", "trust_domain_char"),
        ("spiffe://exa mple.org", "trust_domain_char"),
        ("spiffe://example.org:8443/x", "port"),
        ("spiffe://user@example.org/x", "userinfo"),
        ("spiffe://example.org/x?y=1", "query"),
        ("spiffe://example.org/x#frag", "fragment"),
        ("spiffe://example.org/", "empty_segment"),
        ("spiffe://example.org/a/", "empty_segment"),
        ("spiffe://example.org/a//b", "empty_segment"),
        ("spiffe://example.org/a/./b", "dot_segment"),
        ("spiffe://example.org/a/..", "dot_segment"),
        ("spiffe://example.org/a%2Fb", "path_char"),
        ("spiffe://example.org/caf\u00e9", "path_char"),
        ("spiffe://example.org/" + "a" * 2040, "too_long"),
        ("spiffe://" + "a" * 256, "trust_domain_too_long"),
    ],
)
def test_invalid(s: str, reason: str) -> None:
    with pytest.raises(InvalidSpiffeId) as ei:
        parse_spiffe_id(s)
    assert ei.value.reason == reason


def test_length_limit_is_bytes_inclusive() -> None:
    base = "spiffe://example.org/"
    ok = base + "a" * (2048 - len(base))
    assert len(parse_spiffe_id(ok).uri) == 2048
    with pytest.raises(InvalidSpiffeId):
        parse_spiffe_id(ok + "a")


def test_trust_domain_parser() -> None:
    assert parse_trust_domain("prod.example.org") == "prod.example.org"
    with pytest.raises(InvalidSpiffeId):
        parse_trust_domain("spiffe://example.org")


_seg = st.text(alphabet="abcXYZ019.-_", min_size=1, max_size=8).filter(lambda s: s not in (".", ".."))


@given(td=st.text(alphabet="abc019.-_", min_size=1, max_size=20), segs=st.lists(_seg, max_size=5))
def test_roundtrip(td: str, segs: list[str]) -> None:
    s = "spiffe://" + td + "".join("/" + x for x in segs)
    sid = parse_spiffe_id(s)
    assert sid.trust_domain == td and str(sid) == s
