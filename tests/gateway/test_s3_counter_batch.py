"""Issue 14: the gateway's counters are added up per child on the request path and handed to
prometheus_client at the next scrape (one ``inc`` per child, not per request); every scrape and
``get_sample_value`` sees every increment."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from gateway.metrics import GatewayMetrics


def test_increments_are_seen_by_every_read_after_them() -> None:
    m = GatewayMetrics()
    for _ in range(5):
        m.requests.labels("/v1/completions", "200", "allowed").inc()
        m.prompt_tokens.inc(64)
        m.tenant_tokens_charged.labels("t", "prompt").inc(10)
    assert m.batch.pending == 3  # three children, five requests: nothing handed over yet
    assert m.admin.get_sample_value("prefixgate_requests_total",
                                    {"endpoint": "/v1/completions", "status": "200", "outcome": "allowed"}) == 5
    assert m.admin.get_sample_value("prefixgate_prompt_tokens_total") == 320
    assert m.batch.pending == 0  # one batch for both registries: any read hands everything over
    assert 'prefixgate_tenant_tokens_charged_total{kind="prompt",tenant="t"} 50.0' in generate_latest(m.admin).decode()
    m.tenant_tokens_charged.labels("t", "prompt").inc(1)
    assert 'prefixgate_tenant_tokens_charged_total{kind="prompt",tenant="t"} 51.0' in generate_latest(m.admin).decode()
    m.prefix_tokens.labels("delivered").inc(0)
    assert m.admin.get_sample_value("prefixgate_prefix_tokens_total", {"kind": "delivered"}) == 0


def test_negative_increment_is_refused_at_once() -> None:
    m = GatewayMetrics()
    with pytest.raises(ValueError):
        m.requests.labels("/v1/completions", "200", "allowed").inc(-1)
    with pytest.raises(ValueError):
        m.prompt_tokens.inc(-1)
