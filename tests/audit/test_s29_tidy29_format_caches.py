"""Session 29 (S29-tidy29-1, the fix of S28-final28-2): the CEF and OCSF line formatters cache what repeats
with ``functools.lru_cache`` (least recently used first out, not emptied whole), the client address apart
from the identity.

- Differential (hypothesis): on runs of events drawn from small pools of identities, addresses, endpoints,
  tenants, replicas and models (hostile strings included), every ``cef_line`` equals ``format_cef`` and every
  ``ocsf_line`` equals ``orjson.dumps(to_ocsf(...))``, with the caches as shipped and with caches of two
  entries (every run evicts).
- A spread of client addresses from one identity adds one identity entry (session 28: one per address).
- An identity in use stays cached through more distinct client addresses than the source cache holds, and
  through more other identities than the identity cache holds (session 28: all cleared at 4,096)."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from unittest import mock

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from audit import cef, ocsf
from audit.cef import cef_line, format_cef
from audit.event import AuditEvent, Identity, Kind, Outcome, PolicyInfo, RouteInfo
from audit.ocsf import ocsf_line, to_ocsf

_HOSTILE = ["", "a=b", "x|y", "back\\slash", "l1\nl2", "cr\r\nlf", "ü€😀"]
_ids = st.one_of(st.none(), st.sampled_from(["spiffe://d/ns/a", "spiffe://d/ns/b", "spiffe://d/" + "w" * 2000,
                                            *_HOSTILE]))
_addresses = st.one_of(st.none(), st.sampled_from(["10.0.0.1", "10.0.0.2", "fd00::1", "::ffff:1.2.3.4",
                                                  "unknown", "unattested@proxy", *_HOSTILE]))
_words = st.one_of(st.none(), st.sampled_from(["/v1/completions", "/v1/chat/completions", "acme", "r1", *_HOSTILE]))


@st.composite
def _event(draw: st.DrawFn) -> AuditEvent:
    return AuditEvent(kind=draw(st.sampled_from([Kind.INFERENCE, Kind.AUTH])),
                      outcome=draw(st.sampled_from([Outcome.SUCCEEDED, Outcome.DENIED, Outcome.UNAUTHENTICATED])),
                      time_ms=1_764_000_000_123, event_id="e-1", request_id="r",
                      identity=Identity(draw(_ids), draw(_words)), tenant=draw(_words),
                      policy=PolicyInfo("d", draw(_words), None, 3), endpoint=draw(_words), model=draw(_words),
                      route=RouteInfo(draw(_words)), client_address=draw(_addresses), status_code=200)


@contextmanager
def _small_caches(entries: int) -> Iterator[None]:
    """Both modules' caches replaced by fresh ones of ``entries`` entries for the duration."""
    with mock.patch.multiple(cef, _source=lru_cache(maxsize=entries)(cef.source_pair),
                             _who=lru_cache(maxsize=entries)(cef.identity_pairs),
                             _where=lru_cache(maxsize=entries)(cef.route_pairs),
                             _escaped=lru_cache(maxsize=entries)(cef.escape_extension)), \
         mock.patch.multiple(ocsf, _user=lru_cache(maxsize=entries)(ocsf.user_object),
                             _src=lru_cache(maxsize=entries)(ocsf.source_object),
                             _api=lru_cache(maxsize=entries)(ocsf.api_object),
                             _dst=lru_cache(maxsize=entries)(ocsf.dst_object)):
        yield


def _check(events: list[AuditEvent]) -> None:
    for ev in events:
        assert cef_line(ev) == format_cef(ev)
        assert ocsf_line(ev) == orjson.dumps(to_ocsf(ev), option=orjson.OPT_SORT_KEYS)


@settings(max_examples=300, deadline=None)
@given(st.lists(_event(), min_size=1, max_size=12))
def test_cached_lines_equal_the_uncached_formatting(events: list[AuditEvent]) -> None:
    _check(events + events)


@settings(max_examples=300, deadline=None)
@given(st.lists(_event(), min_size=1, max_size=12))
def test_cached_lines_equal_the_uncached_formatting_while_evicting(events: list[AuditEvent]) -> None:
    with _small_caches(2):
        _check(events + events[::-1] + events)
        assert cef._who.cache_info().currsize <= 2 and ocsf._src.cache_info().currsize <= 2


def _spread(n: int, sid: str = "spiffe://quickstart.test/acme/w") -> list[AuditEvent]:
    return [AuditEvent(kind=Kind.INFERENCE, outcome=Outcome.SUCCEEDED, time_ms=i + 1, event_id=f"e{i}",
                       identity=Identity(sid, "quickstart.test"), tenant="acme", endpoint="/v1/chat/completions",
                       model="m", route=RouteInfo(replica="r1"), client_address=f"fd00::{i:x}") for i in range(n)]


def test_a_spread_of_addresses_adds_one_identity_entry() -> None:
    sid = "spiffe://quickstart.test/acme/spread-one"
    before = cef._who.cache_info().currsize
    _check(_spread(300, sid))
    # session 28 keyed the identity's pairs by the client address too: 300 entries here
    assert cef._who.cache_info().currsize <= before + 1


def test_an_identity_in_use_stays_cached_through_a_spread_of_addresses() -> None:
    hot = _spread(1, "spiffe://quickstart.test/victim/w")[0]
    cef_line(hot)
    ocsf_line(hot)
    _check(_spread(cef._SOURCE_MAX + 50, "spiffe://quickstart.test/attacker/w"))  # every source entry replaced
    who, user = cef._who.cache_info().hits, ocsf._user.cache_info().hits
    cef_line(hot)
    ocsf_line(hot)
    assert cef._who.cache_info().hits == who + 1 and ocsf._user.cache_info().hits == user + 1


def test_an_identity_in_use_stays_cached_through_more_identities_than_the_cache_holds() -> None:
    hot = _spread(1, "spiffe://quickstart.test/hot/w")[0]
    cef_line(hot)
    for i in range(2 * cef._IDENTITY_MAX):
        cef_line(_spread(1, f"spiffe://quickstart.test/cold/w{i}")[0])
        if i % 100 == 0:  # in use: never the least recently used
            hits = cef._who.cache_info().hits
            cef_line(hot)
            assert cef._who.cache_info().hits == hits + 1
    assert cef._who.cache_info().currsize == cef._IDENTITY_MAX
