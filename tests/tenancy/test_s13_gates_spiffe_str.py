"""Session 13 (issue 14): a SpiffeId builds its URI string once; equality, hashing, repr and
``dataclasses.replace`` are those of the two parsed fields only."""
from __future__ import annotations

import dataclasses

from tenancy.spiffe_id import SpiffeId, parse_spiffe_id


def test_uri_built_once_and_fields_alone_decide_equality() -> None:
    a = parse_spiffe_id("spiffe://x.org/ns/a")
    assert str(a) == "spiffe://x.org/ns/a" == a.uri
    assert str(a) is str(a)  # one string object: its hash is computed once
    b = SpiffeId("x.org", "/ns/a")
    assert a == b and hash(a) == hash(b) and {a: 1}[b] == 1
    assert repr(a) == "SpiffeId(trust_domain='x.org', path='/ns/a')"
    c = dataclasses.replace(a, path="/ns/c")
    assert str(c) == "spiffe://x.org/ns/c" and c != a
    assert str(SpiffeId("x.org", "")) == "spiffe://x.org"
