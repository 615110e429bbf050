"""Session 9 (issue 14): the span exporter child writes the OTLP ``Span`` bytes of plain records
directly (audit/otlp_pb.py) instead of filling generated messages; the request body and the
bad-record counts stay those of the generated messages (the reference encoder of session 7's test),
and the direct path is the one the gateway's request spans take."""
from __future__ import annotations

import random
from typing import Any

import orjson
import pytest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.sdk.resources import Resource

from audit.otlp_pb import NotPlain, any_value, key_value, varint
from audit.otlp_trace_request import OtlpRequestEncoder
from audit.row_spans import row_span_record
from audit.span_request import expand_request_record
from tests.audit.test_s7_span_encode import _record, _reference_encode

_INTS = [0, 1, 127, 128, 300, 2**31, 2**63 - 1, -1, -128, -(2**63)]


@pytest.mark.parametrize("value", [*_INTS, 0.0, -2.5, 1e300, float("inf"), True, False, "", "a", "ü" * 70,
                                   "x" * 200])
def test_any_value_and_key_value_equal_the_generated_messages(value: Any) -> None:
    want = AnyValue(**{{str: "string_value", bool: "bool_value", int: "int_value",
                        float: "double_value"}[type(value)]: value})
    assert any_value(value) == want.SerializeToString()
    for key in ("k", "", "ключ" * 40):
        assert key_value(key, value) == KeyValue(key=key, value=want).SerializeToString()
        assert key_value(key, value) == KeyValue(key=key, value=want).SerializeToString()  # cached


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, b"x", [1], {"b": "00"}, None])
def test_other_values_are_not_plain(value: Any) -> None:
    with pytest.raises(NotPlain):
        any_value(value)


def test_varint() -> None:
    for n in (0, 1, 127, 128, 16383, 16384, 2**32, 2**64 - 1):
        raw, m, shift = varint(n), 0, 0
        for i, b in enumerate(raw):
            m |= (b & 0x7F) << shift
            shift += 7
            assert (b & 0x80 == 0) == (i == len(raw) - 1)
        assert m == n


def _row(rng: random.Random, i: int) -> list[Any]:
    t = rng.uniform(1, 1000)
    marks = [t + k * rng.uniform(0, 0.01) for k in range(8)]
    if rng.random() < 0.2:
        marks[rng.randrange(1, 8)] = None
    status = rng.choice([200, 200, 429, 502, None])
    return [f"e{i}", 1_764_000_000_000 + i, rng.choice(["allowed", "denied", "failed"]), f"{i:032x}",
            "spiffe://td/x", "td", rng.choice(["tenant-a", None, "ü"]), rng.choice([None, "d-1"]), "allow", "ok",
            rng.choice(["/v1/completions", "/v1/chat/completions"]), rng.choice(["m", None]),
            rng.choice([0, 100, None]), rng.choice([4, None]), 1, 104, 104, 100, 4, 4, "usage", None,
            rng.choice(["r0", None]), "default", "cache_aware", 64, rng.choice([64, None, 2**40]), 64, 1200.0,
            *marks[:6], marks[6], marks[7], status, "127.0.0.1", f"{rng.getrandbits(128):032x}", "fp", None, 0.0, None, rng.choice([None, 0, 7])]


def _request_records(seed: int, n: int) -> list[Any]:
    rng = random.Random(seed)
    ids = iter(range(1, 1 << 30))
    out: list[Any] = []
    for i in range(n):
        links = None
        if rng.random() < 0.3:  # a client traceparent: a link without attributes
            links = [(rng.getrandbits(64), rng.getrandbits(64), rng.getrandbits(64), 1, True, None)]
        extra = (rng.getrandbits(64) or 1, rng.choice([0, 1]), 1_764_000_000_000_000_000 + i, links,
                 rng.choice([None, None, "a=b,c=d"]))
        record = row_span_record(_row(rng, i), extra)
        # through JSON as on the pipe: tuples become lists, SpanKind members their values
        out.extend(expand_request_record(orjson.loads(orjson.dumps(record)), lambda: next(ids)))
    return out


@pytest.mark.parametrize("seed", range(12))
def test_request_spans_take_the_direct_path_and_equal_the_generated_messages(seed: int,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    resource = Resource({"service.name": "prefixgate", "seed": seed})
    records = _request_records(seed, 60)
    want = _reference_encode(resource, records)
    assert want[1] == 0 and want[0]

    def no_generated(*_: Any) -> Any:
        raise AssertionError("a request span left the direct path")

    enc = OtlpRequestEncoder(resource)
    monkeypatch.setattr(enc, "_generated", no_generated)
    assert enc.encode(records) == want
    assert enc.encode(records) == want  # warm caches give the same bytes


@pytest.mark.parametrize("seed", range(40, 120))
def test_mixed_and_malformed_records_equal_the_generated_messages(seed: int) -> None:
    rng = random.Random(seed)
    resource = Resource({"service.name": "prefixgate"})
    records = [_record(rng) for _ in range(rng.randrange(1, 40))] + _request_records(seed, 3)
    rng.shuffle(records)
    enc = OtlpRequestEncoder(resource)
    assert enc.encode(records) == _reference_encode(resource, records)
    assert enc.encode(records[::-1]) == _reference_encode(resource, records[::-1])
