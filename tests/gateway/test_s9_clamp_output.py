"""Session 9 (issue 14): ``clamp_output`` without lists equals its composition of ``clamp_max_tokens``."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.admission import clamp_output
from tenancy.limits import clamp_max_tokens

_CAP = st.one_of(st.none(), st.integers(-3, 5000))


def _reference(requested, tenant_cap, policy_cap, gateway_cap):  # type: ignore[no-untyped-def]
    cap = clamp_max_tokens(requested, tenant_cap, policy_cap, default=gateway_cap)
    return max(1, min(cap, gateway_cap))


@settings(max_examples=2000, deadline=None)
@given(st.one_of(st.none(), st.booleans(), st.integers(-3, 5000)), _CAP, _CAP, st.integers(-1, 5000))
def test_clamp_output_equals_the_composition(requested, tenant_cap, policy_cap, gateway_cap) -> None:  # type: ignore[no-untyped-def]
    try:
        want = _reference(requested, tenant_cap, policy_cap, gateway_cap)
    except ValueError:
        with pytest.raises(ValueError):
            clamp_output(requested, tenant_cap, policy_cap, gateway_cap)
        return
    assert clamp_output(requested, tenant_cap, policy_cap, gateway_cap) == want
