"""Session 17, helper secfix (S17-2): ``serving_refusal`` with ``state.on_unavailable: local``."""
from __future__ import annotations

from gateway.cli import serving_refusal


def test_local_mode_needs_a_divisor_counting_the_workers() -> None:
    said = serving_refusal("redis", 4, on_unavailable="local", instances_expected=2) or ""
    assert "instances_expected >= 4" in said
    assert serving_refusal("redis", 4, on_unavailable="local", instances_expected=4) is None
    assert serving_refusal("redis", 4, on_unavailable="local", instances_expected=8) is None  # other hosts too
    assert serving_refusal("redis", 4, on_unavailable="fail_closed", instances_expected=1) is None
    assert serving_refusal("redis", 1, on_unavailable="local", instances_expected=1) is None
