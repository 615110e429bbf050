"""Session 28 (S28-audit28-2): ``audit.cef.cef_line`` caches the pairs of the values that repeat together
(client address, identity, endpoint, tenant; replica, model) as one string each and writes plain numbers
without a call. The line must stay ``format_cef``'s exactly: values of any type in those fields (a number
or another object takes the per-pair path), cache hits and misses, and the caches' clearing at their bound."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from audit import cef
from audit.cef import cef_line, format_cef
from audit.event import AuditEvent, Identity, Kind, Latencies, Outcome, PolicyInfo, RouteInfo

_any = st.one_of(st.none(), st.sampled_from(["", "t", "a=b", "l1\nl2", "127.0.0.1", "::1", "unattested@p", "ü"]),
                 st.integers(-3, 3), st.floats(allow_nan=False, allow_infinity=False, width=32), st.booleans(),
                 st.text(max_size=8))


@settings(max_examples=400, deadline=None)
@given(_any, _any, _any, _any, _any, _any, _any, _any, _any, _any)
def test_cef_line_equals_format_cef_for_any_value_types(client, spiffe, domain, endpoint, tenant, replica, model,
                                                       prompt, queue, version) -> None:
    ev = AuditEvent(kind=Kind.INFERENCE, outcome=Outcome.ALLOWED, time_ms=1_764_000_000_123, event_id="e-1",
                    request_id="r", identity=Identity(spiffe, domain), tenant=tenant,
                    policy=PolicyInfo("d", "allow", None, version), endpoint=endpoint, model=model,
                    prompt_tokens=prompt, route=RouteInfo(replica, "p", "cache_aware", None, None, None, None, queue),
                    latency=Latencies(queue_wait_ms=queue), client_address=client, status_code=200)
    assert cef_line(ev) == format_cef(ev)
    assert cef_line(ev) == format_cef(ev)  # from the caches


def test_cef_line_past_the_cache_bound() -> None:
    n = cef._ESCAPED_MAX + 10
    for i in range(n):
        ev = AuditEvent(kind=Kind.INFERENCE, outcome=Outcome.SUCCEEDED, time_ms=i + 1, event_id=f"e{i}",
                        identity=Identity(f"spiffe://d/t{i}", "d"), tenant=f"t{i}", endpoint="/v1/completions",
                        model=f"m{i}", route=RouteInfo(replica=f"r{i}"), client_address="10.0.0.1")
        assert cef_line(ev) == format_cef(ev)
    assert len(cef._WHO) <= cef._ESCAPED_MAX and len(cef._WHERE) <= cef._ESCAPED_MAX
