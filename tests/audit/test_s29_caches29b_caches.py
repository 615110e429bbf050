"""Session 29, caches29b: the last three caches emptied whole at their bound (S29-caches29b-1..3).

``audit.request_event``'s identities, ``audit.scrub``'s scanned-clean strings and
``gateway.metrics.BoundChildren``'s children are ``functools.lru_cache`` now: the same answers as
uncached (and with 2-entry caches, evicting), and one tenant's flood of distinct values no longer
empties the entries every other tenant uses.
"""

from __future__ import annotations

import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter

import audit.scrub as scrub
from audit.request_event import REQUEST_ROW_FIELDS, request_event
from audit.scrub import MAX_FINGERPRINT_HEX, MAX_STRING_CHARS, row_is_clean, scan_clean, scrub_event
from gateway.metrics import CHILD_CACHE_MAX, BoundChildren, CounterBatch

_I = {n: i for i, n in enumerate(REQUEST_ROW_FIELDS)}
_STRS = st.one_of(st.none(), st.sampled_from([
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig", "Bearer abcdefghijklmnop", "-----BEGIN PRIVATE KEY-----",
    "x" * (MAX_STRING_CHARS + 1), "ab" * 32, "ABCDEF", "", "tenant-a", "ü", "10.0.0.1:5000"]), st.text(max_size=30))


def _row(**values: object) -> list:
    row: list = [None] * len(REQUEST_ROW_FIELDS)
    row[_I["event_id"]], row[_I["time_ms"]], row[_I["outcome"]] = "e-1", 1, "allowed"
    for name, value in values.items():
        row[_I[name]] = value
    return row


def _reference_row_is_clean(row: list) -> bool:
    """row_is_clean without any cache (its documented meaning)."""
    for v in row:
        if v is None:
            continue
        if type(v) is str:
            if len(v) > MAX_STRING_CHARS or not scan_clean(v):
                return False
        elif type(v) not in (int, float, bool):
            return False
    fp = row[_I["prefix_fingerprint"]]
    return fp is None or (len(fp) <= MAX_FINGERPRINT_HEX and scrub._HEX_RE.match(fp) is not None)


@st.composite
def rows(draw: st.DrawFn) -> list:
    row = _row()
    for name in ("request_id", "spiffe_id", "trust_domain", "tenant", "decision_id", "reason", "endpoint", "model",
                 "replica", "pool", "client_address", "trace_id", "prefix_fingerprint", "basis", "error_code"):
        row[_I[name]] = draw(_STRS)
    return row


def _small_caches(monkeypatch: pytest.MonkeyPatch) -> None:
    shared = functools.lru_cache(maxsize=2)(scrub.require_clean)
    model = functools.lru_cache(maxsize=2)(scrub.require_clean)
    monkeypatch.setattr(scrub, "_scanned_clean", shared)
    monkeypatch.setattr(scrub, "_model_scanned_clean", model)
    monkeypatch.setattr(scrub, "_SCANNER", {**{p: scrub.scan_per_request for p in scrub.PER_REQUEST_PATHS},
                                            "model": model})


@settings(max_examples=300, deadline=None)
@given(st.lists(rows(), min_size=1, max_size=6), st.booleans())
def test_the_scrub_caches_answer_as_the_uncached_scan(batch: list, small: bool) -> None:
    with pytest.MonkeyPatch.context() as m:
        if small:
            _small_caches(m)
        for row in batch * 2:  # each row twice: the second answer comes from the caches
            assert row_is_clean(row, _I["prefix_fingerprint"]) is _reference_row_is_clean(row)
            cleaned, dropped = scrub_event(request_event(row))
            reference = scrub._scrub_event_general(request_event(row), MAX_STRING_CHARS)
            assert cleaned == reference[0] or (dropped == reference[1] and cleaned.event_id is not None)
            assert dropped == reference[1]


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.text(alphabet="0123456789abcdefABCDEF-.:[]eyJrGNbB ", max_size=40), st.text(max_size=40),
                 st.sampled_from(["eyJabcd.efgh", "bearer 0123456789", "-----BEGIN KEY-----", "::1", "[fe80::1]:80"])))
def test_the_per_request_scan_answers_as_the_full_scan(value: str) -> None:
    for check in (scrub.scan_per_request, scrub.require_clean, scrub._scanned_clean, scrub._model_scanned_clean):
        try:
            got = check(value)
        except scrub.SecretFound:
            got = False
        assert got is scan_clean(value)


def test_a_string_with_a_secret_is_never_cached() -> None:
    for _ in range(2):
        before = scrub._scanned_clean.cache_info()
        with pytest.raises(scrub.SecretFound):
            scrub._scanned_clean("Bearer abcdefghijklmnop")
        assert scrub._scanned_clean.cache_info().misses == before.misses + 1
        assert scrub._scanned_clean.cache_info().currsize == before.currsize


def test_per_request_values_are_not_cached_and_a_flood_keeps_every_tenants_entries() -> None:
    hot = _row(tenant="tenant-hot", endpoint="/v1/chat/completions", replica="r1", spiffe_id="spiffe://d/w")
    assert row_is_clean(hot, _I["prefix_fingerprint"])
    size = scrub._scanned_clean.cache_info().currsize
    for i in range(2 * scrub._SCANNED_MAX):  # one tenant: a new request id, address and model each time
        row = _row(tenant="tenant-flood", request_id=f"req {i}", client_address=f"10.0.{i % 250}.1:{i}",
                   model=f"model {i}", trace_id=f"t{i}")
        assert row_is_clean(row, _I["prefix_fingerprint"])
    assert scrub._scanned_clean.cache_info().currsize <= size + 1  # only "tenant-flood" was added
    before = scrub._scanned_clean.cache_info()
    assert row_is_clean(hot, _I["prefix_fingerprint"])
    after = scrub._scanned_clean.cache_info()
    assert after.misses == before.misses and after.hits - before.hits == 5  # the hot row's strings all still cached


def test_a_flood_of_workload_ids_keeps_the_identity_of_a_workload_in_use() -> None:
    hot = _row(spiffe_id="spiffe://d/hot", trust_domain="d")
    first = request_event(hot).identity
    for i in range(3 * 4096):
        assert request_event(_row(spiffe_id=f"spiffe://d/w{i}", trust_domain="d")).identity.spiffe_id == f"spiffe://d/w{i}"
        if i % 512 == 0:
            assert request_event(hot).identity is first  # failed before: the dict was emptied whole at 4,096


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c", "d"]), st.sampled_from(["x", "y"]),
                          st.integers(0, 5)), max_size=40))
def test_bound_children_count_as_the_family_does(ops: list) -> None:
    registry = CollectorRegistry()
    batch = CounterBatch()
    registry.register(batch)
    family = BoundChildren(Counter("c", "c", ["tenant", "outcome"], registry=registry), batch)
    family._cached = functools.lru_cache(maxsize=2)(family._child)  # evicting
    expected: dict[tuple[str, str], int] = {}
    for tenant, outcome, n in ops:
        family.labels(tenant, outcome).inc(n)
        expected[(tenant, outcome)] = expected.get((tenant, outcome), 0) + n
    for (tenant, outcome), n in expected.items():
        assert registry.get_sample_value("c_total", {"tenant": tenant, "outcome": outcome}) == n


def test_a_flood_of_label_sets_keeps_the_hot_child_and_never_resets_a_series() -> None:
    registry = CollectorRegistry()
    batch = CounterBatch()
    registry.register(batch)
    family = BoundChildren(Counter("r", "r", ["tenant", "outcome"], registry=registry), batch)
    hot = family.labels("t-hot", "allowed")
    hot.inc(3)
    for i in range(2 * CHILD_CACHE_MAX):
        family.labels(f"t{i}", "allowed").inc()
        if i % 256 == 0:
            assert family.labels("t-hot", "allowed") is hot  # failed before: the cache was emptied whole
    assert registry.get_sample_value("r_total", {"tenant": "t-hot", "outcome": "allowed"}) == 3
    assert registry.get_sample_value("r_total", {"tenant": "t0", "outcome": "allowed"}) == 1  # evicted, kept
