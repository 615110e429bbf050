"""Session 27 (tidy27, S27-tidy27-4): a bad ``tenants[].json_schema_limits`` is refused with a message that states
each key's range: ``max_pattern_chars`` takes 0 (no pattern allowed), the other keys a positive integer. Before, the
message said "positive integers" for all six, so an operator reading it would not try 0 for ``max_pattern_chars``."""

from __future__ import annotations

import pytest

from tenancy.registry import TenantConfigError
from tenancy.tenant import parse_tenant

DOC = {"id": "t", "spiffe_ids": ["spiffe://td/t/"]}


@pytest.mark.parametrize("bad", [{"max_pattern_chars": -1}, {"max_depth": 0}, {"max_tool_schemas_bytes": 0}])
def test_the_refusal_states_each_keys_range(bad: dict[str, int]) -> None:
    with pytest.raises(TenantConfigError) as got:
        parse_tenant({**DOC, "json_schema_limits": bad}, 0)
    message = str(got.value)
    assert "tenants.0.json_schema_limits" in message
    assert "max_pattern_chars to an integer >= 0" in message
    assert "max_tool_schemas_bytes to positive integers" in message


def test_zero_pattern_characters_is_accepted() -> None:
    assert dict(parse_tenant({**DOC, "json_schema_limits": {"max_pattern_chars": 0}}, 0).json_schema_limits) == {
        "max_pattern_chars": 0}
