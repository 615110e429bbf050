"""Session 4 (issue 14): ``Decision.as_cached`` equals ``dataclasses.replace(d, cached=True)``."""
from __future__ import annotations

from dataclasses import fields, replace

from hypothesis import given
from hypothesis import strategies as st

from policy.decision import Decision

_ids = st.one_of(st.none(), st.frozensets(st.sampled_from(["r0", "r1", "p"]), max_size=2))
decisions = st.builds(Decision, allow=st.booleans(), reason_code=st.text(max_size=5), reason=st.text(max_size=5),
                      allowed_replicas=_ids, allowed_pools=_ids, max_tokens=st.one_of(st.none(), st.integers(0, 9)),
                      decision_id=st.uuids().map(str), cached=st.booleans(),
                      policy_version=st.one_of(st.none(), st.integers(0, 9)))


@given(decisions)
def test_as_cached_is_replace_cached_true(d: Decision) -> None:
    got, want = d.as_cached(), replace(d, cached=True)
    assert got == want and [getattr(got, f.name) for f in fields(Decision)] == [getattr(want, f.name) for f in fields(Decision)]
    assert got.cached and (d.cached or got is not d)


def test_every_field_is_copied() -> None:
    assert [f.name for f in fields(Decision)] == ["allow", "reason_code", "reason", "allowed_replicas",
                                                  "allowed_pools", "max_tokens", "decision_id", "cached",
                                                  "policy_version"]
