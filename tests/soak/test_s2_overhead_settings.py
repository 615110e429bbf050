"""bench.overhead --baseline-set: configuration values for the baseline target only."""
from __future__ import annotations

import pytest

from bench.overhead import apply_settings


def test_dotted_keys_set_yaml_values_and_create_sections() -> None:
    doc = {"flow": {"enabled": True}, "routing": {"policy": {"name": "cache_aware"}}}
    apply_settings(doc, ["flow.enabled=false", "routing.policy.calibrate=false", "state.lease_ttl_s=5",
                         "audit.instance=null"])
    assert doc == {"flow": {"enabled": False}, "routing": {"policy": {"name": "cache_aware", "calibrate": False}},
                   "state": {"lease_ttl_s": 5}, "audit": {"instance": None}}


@pytest.mark.parametrize("bad", ["flow.enabled", "=1", "flow..enabled=1"])
def test_malformed_pairs_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="expected KEY=VALUE"):
        apply_settings({}, [bad])
