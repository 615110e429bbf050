"""Small pure pieces of gateway.components."""

from __future__ import annotations

from types import SimpleNamespace

from gateway.components import Components


def _fake(limit: int) -> SimpleNamespace:
    return SimpleNamespace(config=SimpleNamespace(limits=SimpleNamespace(max_output_tokens=limit)))


def test_max_tokens_without_any_cap_falls_back_to_the_gateway_limit() -> None:
    none = SimpleNamespace(max_output_tokens=None)
    no_cap = SimpleNamespace(max_tokens=None)
    assert Components.clamp_max_tokens(_fake(777), None, none, no_cap) == 777
    assert Components.clamp_max_tokens(_fake(777), 5, none, no_cap) == 5
    assert Components.clamp_max_tokens(_fake(777), 10_000, none, no_cap) == 777


def test_max_tokens_takes_the_smallest_cap() -> None:
    tenant = SimpleNamespace(max_output_tokens=300)
    decision = SimpleNamespace(max_tokens=200)
    assert Components.clamp_max_tokens(_fake(1000), None, tenant, decision) == 200
    assert Components.clamp_max_tokens(_fake(1000), 250, tenant, decision) == 200
    assert Components.clamp_max_tokens(_fake(100), 250, tenant, decision) == 100
