"""Session 29 (caches29, S29-caches29-1..3): the OTLP attribute caches of the audit worker (audit/otlp_pb.py
``key_field`` / ``_str_kv`` / ``_client_kv``, audit/row_spans.py ``_str_field`` / ``_model_field`` /
``int_field``, audit/otlp_log_build.py ``_cached_kv``, audit/otlp_log_request.py ``_heads``) are
``functools.lru_cache`` s on pure functions (least recently used out, not emptied whole), and per-request
values (decision ids) never enter them.

- Differential (hypothesis): over random attribute values (hostile strings, the int edges), the cached
  encodings equal the uncached ones (every cache replaced by its pure function) and the generated messages'
  (``KeyValue``; the record path's pre-session-7 reference encoder for a request's spans; the pre-session-6
  OTLP log construction), with the caches as shipped and with caches of two entries (every run evicts).
- A flood of distinct decision ids does not grow a value cache, and a tenant's entry stays cached through
  it; a spread of model names evicts only the model cache's entries; a hot int entry stays through more
  token counts than the int cache holds (session 28: every cache emptied whole at its bound).
"""
from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Any
from unittest import mock

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.sdk.resources import Resource

from audit import otlp, otlp_log_build, otlp_log_request, otlp_pb, row_spans
from audit.event import Kind, Outcome
from audit.otlp_log_request import encode_logs_request
from audit.otlp_pb import key_value
from audit.otlp_trace_request import OtlpRequestEncoder, check_records
from audit.request_event import REQUEST_ROW_FIELDS
from audit.row_spans import SCOPE, row_span_bytes, row_span_record
from audit.span_request import BYTES_MARK, expand_request_record
from tests.audit.test_s6_worker_batch import _events, _reference_otlp
from tests.audit.test_s7_span_encode import _reference_encode
from tests.audit.test_s9_otlp_pb import _row

_HOSTILE = ["", "a=b", "x|y", "back\\slash", "l1\nl2", "ü€😀", "k" * 200, "\x00"]
_I = {name: i for i, name in enumerate(REQUEST_ROW_FIELDS)}
_LINK = (0x0AF7651916CD43DD, 0x8448EB211C80319C, 0xB7AD6B7169203331, 1, True,
         {"prefixgate.link": "client_traceparent"})


def _pure(cached: Any) -> Any:
    return cached.__wrapped__


_CACHES = ((otlp_pb, "key_field"), (otlp_pb, "_str_kv"), (otlp_pb, "_client_kv"), (row_spans, "_str_field"),
           (row_spans, "_model_field"), (row_spans, "int_field"), (otlp_log_build, "_cached_kv"),
           (otlp_log_request, "_heads"))


@contextmanager
def _caches(entries: int | None) -> Iterator[None]:
    """Every cache replaced by a fresh one of ``entries`` entries (None: by its pure function, uncached)."""
    new = {(m, n): _wrap(getattr(m, n), entries) for m, n in _CACHES}
    of = {**otlp_pb._VALUE_CACHE_OF, **dict.fromkeys(otlp_pb.CLIENT_KEYS, new[otlp_pb, "_client_kv"])}
    with mock.patch.multiple(otlp_pb, **{n: f for (m, n), f in new.items() if m is otlp_pb}), \
         mock.patch.multiple(row_spans, **{n: f for (m, n), f in new.items() if m is row_spans}), \
         mock.patch.object(otlp_log_build, "_cached_kv", new[otlp_log_build, "_cached_kv"]), \
         mock.patch.object(otlp_log_request, "_heads", new[otlp_log_request, "_heads"]), \
         mock.patch.dict(otlp_pb._VALUE_CACHE_OF, of):
        yield


def _wrap(cached: Any, entries: int | None) -> Any:
    return _pure(cached) if entries is None else lru_cache(maxsize=entries)(_pure(cached))


_words = st.one_of(st.none(), st.sampled_from(["tenant-a", "tenant-b", "r0", "r1", "m", *_HOSTILE]),
                   st.text(max_size=12))
_tokens = st.one_of(st.none(), st.sampled_from([0, 1, 127, 128, 16384, 2**63 - 1]), st.integers(0, 5000))


@st.composite
def _pair(draw: st.DrawFn) -> tuple[list[Any], tuple]:
    """A request row as the worker decodes it, with random attribute values, and its span extra."""
    rng = random.Random(draw(st.integers(0, 2**32)))
    row = _row(rng, draw(st.integers(0, 10**6)))
    for field in ("tenant", "model", "replica", "decision_id"):
        row[_I[field]] = draw(_words)
    for field in ("prompt_tokens", "output_tokens", "predicted_prefix_tokens"):
        row[_I[field]] = draw(_tokens)
    row[_I["endpoint"]] = draw(st.sampled_from(["/v1/completions", "/v1/chat/completions"]))
    row[_I["outcome"]] = draw(st.sampled_from(["allowed", "denied", "failed"]))
    row[_I["status_code"]] = draw(st.sampled_from([200, 403, 429, 502, None]))
    extra = (draw(st.integers(1, 2**64 - 1)), 1, 1_764_000_000_000_000_000 + draw(st.integers(0, 10**9)),
             draw(st.sampled_from([None, [_LINK]])), draw(st.sampled_from([None, "a=b"])))
    return orjson.loads(orjson.dumps(row)), orjson.loads(orjson.dumps(extra))  # as decoded from the pipe


def _span_bytes(pairs: list[tuple[list[Any], tuple]]) -> list[tuple[bytes, int]]:
    ids = iter(range(1, 1 << 40))
    return [row_span_bytes(row, extra, lambda: next(ids)) for row, extra in pairs]


@settings(max_examples=150, deadline=None)
@given(st.lists(_pair(), min_size=1, max_size=8))
def test_span_bytes_equal_the_uncached_and_the_generated_encodings(pairs: list[tuple[list[Any], tuple]]) -> None:
    pairs = pairs + pairs[::-1]
    shipped = _span_bytes(pairs)
    with _caches(2):
        small = _span_bytes(pairs)
    with _caches(None):
        uncached = _span_bytes(pairs)
    assert shipped == small == uncached
    # the generated messages: the record path's spans through the pre-session-7 reference encoder
    ids = iter(range(1, 1 << 40))
    records: list[Any] = []
    for row, extra in pairs:
        records.extend(expand_request_record(orjson.loads(orjson.dumps(row_span_record(row, extra))),
                                             lambda: next(ids)))
    resource = Resource({"service.name": "prefixgate"})
    want = _reference_encode(resource, records)
    got = OtlpRequestEncoder(resource).encode(check_records([[BYTES_MARK, n, *SCOPE, data] for data, n in shipped]))
    assert want[1] == 0 and got == want


_values = st.one_of(st.text(max_size=20), st.sampled_from(_HOSTILE), st.booleans(),
                    st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False))
_keys = st.sampled_from(["prefixgate.tenant", "gen_ai.request.model", "prefixgate.decision_id", "", "ключ", "k"])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_keys, _values), min_size=1, max_size=10))
def test_key_value_equals_the_generated_message(pairs: list[tuple[str, Any]]) -> None:
    def want(key: str, v: Any) -> bytes:
        field = {str: "string_value", bool: "bool_value", int: "int_value", float: "double_value"}[type(v)]
        return KeyValue(key=key, value=AnyValue(**{field: v})).SerializeToString()

    pairs = pairs + pairs[::-1]
    expected = [want(k, v) for k, v in pairs]
    assert [key_value(k, v) for k, v in pairs] == expected
    with _caches(2):
        assert [key_value(k, v) for k, v in pairs] == expected


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(list(Kind)), st.sampled_from(list(Outcome)), _words),
                min_size=1, max_size=10))
def test_otlp_log_body_equals_the_generated_messages(shapes: list[tuple[Kind, Outcome, str | None]]) -> None:
    base = _events()
    evs = [dataclasses.replace(base[i % len(base)], kind=k, outcome=o, tenant=t) for i, (k, o, t) in enumerate(shapes)]
    evs = evs + evs[::-1]
    scope = common_pb2.InstrumentationScope(name=otlp.SCOPE_NAME, version="t")
    resource = otlp.build_resource("prefixgate")
    expected = _reference_otlp(evs, resource, scope, 7).SerializeToString()
    assert encode_logs_request(evs, resource, scope, 7) == expected
    assert otlp.build_request(evs, resource, scope, 7).SerializeToString() == expected
    with _caches(2):
        assert encode_logs_request(evs, resource, scope, 7) == expected
        assert otlp.build_request(evs, resource, scope, 7).SerializeToString() == expected


def _rows(n: int, tenant: str, links: bool = False, **fields: Any) -> list[tuple[list[Any], tuple]]:
    """``n`` rows of ``tenant`` (every stage run, status 200, a decision id each) and their extras (with the
    client's link when ``links``); ``fields``: row fields set to a value or ``f(i)``."""
    rng = random.Random(29)
    out = []
    for i in range(n):
        row = _row(rng, i)
        row[_I["tenant"]], row[_I["decision_id"]], row[_I["status_code"]] = tenant, f"{rng.getrandbits(128):032x}", 200
        for k, v in fields.items():
            row[_I[k]] = v(i) if callable(v) else v
        for k in ("t0", "t_auth", "t_parsed", "t_keys", "t_decided", "t_route", "t_first_byte", "t_end"):
            row[_I[k]] = 100.0 + _I[k] * 1e-3
        out.append((row, (i + 1, 1, 1_764_000_000_000_000_000, [_LINK] if links else None, None)))
    return out


def test_a_flood_of_decision_ids_neither_grows_the_value_caches_nor_evicts_a_tenant() -> None:
    otlp_pb._str_kv.cache_clear()
    row_spans._str_field.cache_clear()
    hot_plain, hot_linked = _rows(1, "tenant-hot")[0], _rows(1, "tenant-hot", links=True)[0]
    flood = _rows(otlp_pb._VALUE_MAX + 100, "tenant-flood", links=True) + _rows(200, "tenant-flood")
    for row, extra in [hot_plain, hot_linked, *flood[:20], *flood[-20:]]:  # every repeating value seen once
        row_span_bytes(row, extra)
    sizes = otlp_pb._str_kv.cache_info().currsize, row_spans._str_field.cache_info().currsize
    for row, extra in flood:  # a decision id per row (session 28: each linked one an entry in _KV)
        row_span_bytes(row, extra)
    assert (otlp_pb._str_kv.cache_info().currsize, row_spans._str_field.cache_info().currsize) == sizes
    for cache, (row, extra) in ((row_spans._str_field, hot_plain), (otlp_pb._str_kv, hot_linked)):
        before = cache.cache_info()
        row_span_bytes(row, extra)  # the hot tenant's entries stayed (session 28: _KV emptied at 4,096)
        after = cache.cache_info()
        assert after.hits > before.hits and after.misses == before.misses
    for i in range(500):
        key_value("prefixgate.decision_id", f"d-{i}")
    assert otlp_pb._str_kv.cache_info().currsize == sizes[0]


def test_a_spread_of_model_names_evicts_only_model_entries() -> None:
    hot = _rows(1, "tenant-models-hot")[0]
    row_span_bytes(*hot)
    for row, extra in _rows(row_spans._MODEL_MAX + 50, "tenant-models-hot", model=lambda i: f"model-{i}"):
        row_span_bytes(row, extra)
    assert row_spans._model_field.cache_info().currsize == row_spans._MODEL_MAX
    misses = row_spans._str_field.cache_info().misses
    row_span_bytes(*hot)  # the tenant, replica, route and outcome entries stayed
    assert row_spans._str_field.cache_info().misses == misses


def test_a_hot_int_entry_stays_through_more_token_counts_than_the_cache_holds() -> None:
    row_spans.int_field(0, 200)
    for i in range(2 * row_spans._INT_MAX):
        row_spans.int_field(2, 10_000 + i)
        if i % 100 == 0:  # in use: never the least recently used
            hits = row_spans.int_field.cache_info().hits
            row_spans.int_field(0, 200)
            assert row_spans.int_field.cache_info().hits == hits + 1
    assert row_spans.int_field.cache_info().currsize == row_spans._INT_MAX
