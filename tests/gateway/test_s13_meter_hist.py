"""Session 13 (meter, issue 14): the request latency histograms are counted in lists and handed to
the registry at collect time (gateway/metrics_hist.py); the exposition must be the one of
prometheus_client's own Histogram fed the same values (names, labels, buckets, _count, _sum)."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from gateway.metrics import _LAT_BUCKETS, GatewayMetrics
from gateway.metrics_hist import TallyHistogram

_CREATED = re.compile(rb"^(\S+_created\{[^}]*\}) \S+$", re.M)


def _text(registry: CollectorRegistry) -> bytes:
    """The exposition with each ``_created`` timestamp blanked (a child's creation time differs)."""
    return _CREATED.sub(rb"\1 T", generate_latest(registry))


def _pair() -> tuple[CollectorRegistry, Histogram, CollectorRegistry, TallyHistogram]:
    ra, rb = CollectorRegistry(auto_describe=True), CollectorRegistry(auto_describe=True)
    h = Histogram("prefixgate_request_duration_seconds", "Whole request duration", ["endpoint"],
                  buckets=_LAT_BUCKETS, registry=ra)
    t = TallyHistogram("prefixgate_request_duration_seconds", "Whole request duration", ["endpoint"],
                       buckets=_LAT_BUCKETS, registry=rb)
    return ra, h, rb, t


_VALUES = st.lists(st.tuples(
    st.sampled_from(["chat", "completions", "embeddings"]),
    st.one_of(st.sampled_from([0.0, *_LAT_BUCKETS, 1e9]),  # bounds themselves: le is inclusive
              st.floats(min_value=0.0, max_value=200.0, allow_nan=False))), max_size=60)


@settings(max_examples=200, deadline=None)
@given(_VALUES)
def test_tally_histogram_exposition_equals_prometheus_client_histogram(values: list[tuple[str, float]]) -> None:
    ra, h, rb, t = _pair()
    for endpoint, v in values:
        h.labels(endpoint).observe(v)
        t.labels(endpoint).observe(v)
    assert _text(rb) == _text(ra)
    assert b"_created" in _text(rb) or not values


def test_gateway_histograms_expose_buckets_count_sum_per_endpoint() -> None:
    m = GatewayMetrics()
    for v in (0.004, 0.005, 0.3, 200.0):
        m.request_seconds.labels("chat").observe(v)
    m.first_byte_seconds.labels("chat").observe(0.002)
    get = m.admin.get_sample_value
    assert get("prefixgate_request_duration_seconds_bucket", {"endpoint": "chat", "le": "0.005"}) == 2
    assert get("prefixgate_request_duration_seconds_bucket", {"endpoint": "chat", "le": "120.0"}) == 3
    assert get("prefixgate_request_duration_seconds_bucket", {"endpoint": "chat", "le": "+Inf"}) == 4
    assert get("prefixgate_request_duration_seconds_count", {"endpoint": "chat"}) == 4
    assert get("prefixgate_request_duration_seconds_sum", {"endpoint": "chat"}) == 0.004 + 0.005 + 0.3 + 200.0
    assert get("prefixgate_time_to_first_byte_seconds_count", {"endpoint": "chat"}) == 1
    assert b"prefixgate_request_duration_seconds" not in generate_latest(m.public)  # admin only (R3-5)
