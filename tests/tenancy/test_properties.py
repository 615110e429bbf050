"""Property tests: registry matching against a brute-force reference; chain isolation."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tenancy.keys import KeyRing
from tenancy.registry import TenantConfigError, TenantRegistry

SEG = st.sampled_from(["a", "b", "ab", "a.b"])
PATH = st.lists(SEG, min_size=1, max_size=3).map(tuple)
RULE = st.tuples(PATH, st.booleans())  # (segments, is_prefix)


def _text(segs: tuple[str, ...], prefix: bool) -> str:
    return "spiffe://td/" + "/".join(segs) + ("/" if prefix else "")


def _matches(rule: tuple[tuple[str, ...], bool], ident: tuple[str, ...]) -> bool:
    segs, prefix = rule
    if prefix:
        return len(ident) > len(segs) and ident[: len(segs)] == segs
    return ident == segs


def _overlap(r1, r2) -> bool:
    (s1, p1), (s2, p2) = r1, r2
    if r1 == r2:
        return True
    if p1 and len(s2) >= len(s1) and s2[: len(s1)] == s1 and (p2 or len(s2) > len(s1)):
        return True
    if p2 and len(s1) >= len(s2) and s1[: len(s2)] == s2 and (p1 or len(s1) > len(s2)):
        return True
    return False


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(RULE, min_size=1, max_size=3), min_size=1, max_size=4), st.lists(PATH, max_size=10))
def test_resolve_matches_reference(tenant_rules, idents) -> None:
    cfg = [
        {"id": f"t{i}", "spiffe_ids": [_text(s, p) for s, p in rules]} for i, rules in enumerate(tenant_rules)
    ]
    owners = [(rule, i) for i, rules in enumerate(tenant_rules) for rule in rules]
    expect_overlap = any(
        i != j and _overlap(r1, r2) for (r1, i) in owners for (r2, j) in owners
    )
    try:
        reg = TenantRegistry.from_config(cfg)
    except TenantConfigError:
        assert expect_overlap
        return
    assert not expect_overlap
    for ident in idents:
        candidates = [(len(r[0]) + (0.5 if not r[1] else 0), i) for r, i in owners if _matches(r, ident)]
        got = reg.resolve("spiffe://td/" + "/".join(ident))
        if not candidates:
            assert got is None
        else:
            assert got is not None and got.id == f"t{max(candidates)[1]}"


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 2**32 - 1), min_size=16, max_size=96))
def test_two_tenants_never_share_a_block_hash(tokens) -> None:
    ring = KeyRing(b"property-test-master-secret-0123456789")
    a = ring.prefix_chain("a", tokens, 16)
    b = ring.prefix_chain("b", tokens, 16)
    assert len(a.current) == len(b.current) == len(tokens) // 16
    assert set(a.current).isdisjoint(b.current)
