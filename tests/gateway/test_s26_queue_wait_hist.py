"""Session 26 (cut26, issue 14): flow control's queue-wait histogram is a
:class:`gateway.metrics_hist.TallyHistogram` observed through its one child (was a
``prometheus_client.Histogram``: a lock and two value increments per released request).

Differential: the admin exposition of ``prefixgate_flow_queue_wait_seconds`` fed any values equals the
one the session 25 ``Histogram`` (same name, help, buckets, no labels) writes fed the same values, the
``_created`` timestamp aside (a different object's creation time).
"""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from gateway.metrics import _LAT_BUCKETS, GatewayMetrics

_NAME = "prefixgate_flow_queue_wait_seconds"
_CREATED = re.compile(rb"^(\S+_created) \S+$", re.M)


def _family_text(registry: CollectorRegistry) -> bytes:
    """The queue-wait family's lines of the exposition, ``_created`` blanked."""
    lines = [ln for ln in generate_latest(registry).splitlines(keepends=True) if _NAME.encode() in ln]
    return _CREATED.sub(rb"\1 T", b"".join(lines))


def _session25() -> tuple[CollectorRegistry, Histogram]:
    reg = CollectorRegistry(auto_describe=True)
    return reg, Histogram(_NAME, "Time requests waited in the gateway's queue before release",
                          buckets=(0.001,) + _LAT_BUCKETS, registry=reg)


_WAITS = st.lists(st.one_of(st.sampled_from([0.0, 0.001, *_LAT_BUCKETS, 1e9]),  # bounds: le is inclusive
                            st.floats(min_value=0.0, max_value=200.0, allow_nan=False)), max_size=40)


@settings(max_examples=150, deadline=None)
@given(_WAITS)
def test_queue_wait_exposition_equals_session25_histogram(waits: list[float]) -> None:
    m = GatewayMetrics()
    reg, old = _session25()
    for w in waits:
        m.flow_queue_wait.observe(w)
        old.observe(w)
    got = _family_text(m.admin)
    assert got == _family_text(reg)
    assert b"# TYPE prefixgate_flow_queue_wait_seconds histogram" in got
    assert f'{_NAME}_count {float(len(waits))}'.encode() in got


def test_the_observing_child_is_the_exposed_histogram() -> None:
    m = GatewayMetrics()
    m.flow_queue_wait.observe(0.0005)
    m.flow_queue_wait.observe(3.0)
    get = m.admin.get_sample_value
    assert get(_NAME + "_bucket", {"le": "0.001"}) == 1
    assert get(_NAME + "_bucket", {"le": "+Inf"}) == 2
    assert get(_NAME + "_count") == 2
    assert get(_NAME + "_sum") == 3.0005
