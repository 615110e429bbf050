"""Session 28 (S28-audit28-2): ``audit.cef.cef_line`` caches the pairs of the values that repeat together
(client address, identity, endpoint, tenant; replica, model) as one string each and writes plain numbers
without a call. The line must stay ``format_cef``'s exactly: values of any type in those fields (a number
or another object takes the per-pair path), cache hits and misses, and the caches' eviction at their bound. Likewise ``audit.ocsf.ocsf_line``, which shares the sub-objects
that repeat (user, source, api, destination) between records: ``orjson.dumps(to_ocsf(event), OPT_SORT_KEYS)``
exactly, for values of any type (1, 1.0 and True are equal keys of a dict: only exact str values are cached)."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

import orjson

from audit import cef, ocsf
from audit.cef import cef_line, format_cef
from audit.event import AuditEvent, Identity, Kind, Latencies, Outcome, PolicyInfo, RouteInfo
from audit.ocsf import ocsf_line, to_ocsf

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
    n = cef._IDENTITY_MAX + 10
    for i in range(n):
        ev = AuditEvent(kind=Kind.INFERENCE, outcome=Outcome.SUCCEEDED, time_ms=i + 1, event_id=f"e{i}",
                        identity=Identity(f"spiffe://d/t{i}", "d"), tenant=f"t{i}", endpoint="/v1/completions",
                        model=f"m{i}", route=RouteInfo(replica=f"r{i}"), client_address="10.0.0.1")
        assert cef_line(ev) == format_cef(ev)
    assert cef._who.cache_info().currsize <= cef._IDENTITY_MAX and cef._where.cache_info().currsize <= cef._IDENTITY_MAX


@settings(max_examples=400, deadline=None)
@given(_any, _any, _any, _any, _any, _any, st.sampled_from([Kind.INFERENCE, Kind.AUTH]),
       st.sampled_from([Outcome.ALLOWED, Outcome.SUCCEEDED, Outcome.DENIED, Outcome.UNAUTHENTICATED]))
def test_ocsf_line_equals_to_ocsf_for_any_value_types(client, spiffe, domain, endpoint, replica, decision,
                                                     kind, outcome) -> None:
    ev = AuditEvent(kind=kind, outcome=outcome, time_ms=1_764_000_000_123, event_id="e-1",
                    identity=Identity(spiffe, domain), policy=PolicyInfo(decision, "allow", None, 3),
                    endpoint=endpoint, route=RouteInfo(replica), client_address=client, status_code=200)
    want = orjson.dumps(to_ocsf(ev), option=orjson.OPT_SORT_KEYS)
    assert ocsf_line(ev) == want
    assert ocsf_line(ev) == want  # from the shared sub-objects


def test_ocsf_line_past_the_cache_bound() -> None:
    for i in range(max(ocsf._IDENTITY_MAX, ocsf._SOURCE_MAX) + 10):
        ev = AuditEvent(kind=Kind.INFERENCE, outcome=Outcome.SUCCEEDED, time_ms=i + 1, event_id=f"e{i}",
                        identity=Identity(f"spiffe://d/t{i}", "d"), endpoint=f"/v1/e{i}",
                        route=RouteInfo(replica=f"r{i}"), client_address=f"10.0.{i % 256}.{i // 256}")
        assert ocsf_line(ev) == orjson.dumps(to_ocsf(ev), option=orjson.OPT_SORT_KEYS)
    assert ocsf._src.cache_info().currsize <= ocsf._SOURCE_MAX
    assert max(f.cache_info().currsize for f in (ocsf._user, ocsf._api, ocsf._dst)) <= ocsf._IDENTITY_MAX
