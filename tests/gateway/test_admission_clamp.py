"""Small pure pieces of gateway.admission."""

from __future__ import annotations

from gateway.admission import clamp_output


def test_max_tokens_without_any_cap_falls_back_to_the_gateway_limit() -> None:
    assert clamp_output(None, None, None, 777) == 777
    assert clamp_output(5, None, None, 777) == 5
    assert clamp_output(10_000, None, None, 777) == 777


def test_max_tokens_takes_the_smallest_cap() -> None:
    assert clamp_output(None, 300, 200, 1000) == 200
    assert clamp_output(250, 300, 200, 1000) == 200
    assert clamp_output(250, 300, 200, 100) == 100
