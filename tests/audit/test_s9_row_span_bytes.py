"""Session 9 (issue 14): the audit worker hands the span exporter child a request's spans as OTLP
bytes (audit.row_spans.row_span_bytes, a bytes record) instead of a compact record the child
expands and encodes; the child's request body is byte for byte the one the record path gives
(same child span ids), the export loop batches by spans, and malformed bytes records are counted."""
from __future__ import annotations

import random
from typing import Any

import orjson
import pytest
from opentelemetry.sdk.resources import Resource

from audit.otlp_trace_request import OtlpRequestEncoder, check_records
from audit.row_spans import SCOPE, row_span_bytes, row_span_record
from audit.span_exporter_proc import ExportLoop
from audit.span_frames import encode_frames
from audit.span_request import BYTES_MARK, expand_request_record, span_count
from tests.audit.test_s9_otlp_pb import _row


def _pairs(seed: int, n: int) -> list[tuple[list[Any], tuple]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        links = None
        if rng.random() < 0.4:  # a client traceparent, as audit.tracing.incoming_links makes it
            links = [(rng.getrandbits(64), rng.getrandbits(64), rng.getrandbits(64), 1, True,
                      {"prefixgate.link": "client_traceparent"})]
        extra = (rng.getrandbits(64) or 1, rng.choice([0, 1]), 1_764_000_000_000_000_000 + i, links,
                 rng.choice([None, "a=b"]))
        # as the worker gets them: decoded from the row frame's JSON
        out.append((orjson.loads(orjson.dumps(_row(rng, i))), orjson.loads(orjson.dumps(extra))))
    return out


def _bytes_record(row: list[Any], extra: Any, ids: Any) -> list[Any]:
    from binascii import b2a_base64

    data, n = row_span_bytes(row, extra, lambda: next(ids))
    record = [BYTES_MARK, n, *SCOPE, b2a_base64(data, newline=False).decode()]
    return orjson.loads(orjson.dumps(record))  # through the pipe's JSON


@pytest.mark.parametrize("seed", range(10))
def test_bytes_records_give_the_record_paths_request_body(seed: int) -> None:
    pairs = _pairs(seed, 50)
    resource = Resource({"service.name": "prefixgate"})
    ids = iter(range(1, 1 << 40))
    old: list[Any] = []
    for row, extra in pairs:
        record = orjson.loads(orjson.dumps(row_span_record(row, extra)))
        old.extend(expand_request_record(record, lambda: next(ids)))
    ids = iter(range(1, 1 << 40))
    new = check_records([_bytes_record(row, extra, ids) for row, extra in pairs])
    assert sum(map(span_count, new)) == len(old)
    want = OtlpRequestEncoder(resource).encode(old)
    assert want[1] == 0
    assert OtlpRequestEncoder(resource).encode(new) == want
    # mixed with plain span records of the same scope: the same body as all of them as span records
    half = len(pairs) // 2
    ids = iter(range(1, 1 << 40))
    mixed: list[Any] = [_bytes_record(row, extra, ids) for row, extra in pairs[:half]]
    for row, extra in pairs[half:]:
        mixed.extend(expand_request_record(orjson.loads(orjson.dumps(row_span_record(row, extra))), lambda: next(ids)))
    assert OtlpRequestEncoder(resource).encode(mixed) == want


def test_malformed_bytes_records_are_counted_as_their_spans() -> None:
    (row, extra), = _pairs(3, 1)
    good = _bytes_record(row, extra, iter(range(1, 99)))
    broken = [BYTES_MARK, 7, "prefixgate", None, "", "not base64!"]
    body, bad = OtlpRequestEncoder(Resource({})).encode([broken, good, [BYTES_MARK, 2, 5, None, "", "AA=="]])
    assert bad == 9 and body
    assert OtlpRequestEncoder(Resource({})).encode([broken]) == (b"", 7)


def test_frames_carry_bytes_records_and_the_loop_batches_by_spans() -> None:
    pairs = _pairs(5, 30)
    ids = iter(range(1, 1 << 40))
    records = [tuple(_bytes_record(row, extra, ids)) for row, extra in pairs]
    data, bad = encode_frames(records, 512)
    assert bad == 0
    parsed = [r for line in data.splitlines() for r in check_records(orjson.loads(line))]
    assert parsed == [list(r) for r in records]
    batches: list[int] = []

    def export(batch: Any) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        batches.append(sum(map(span_count, batch)))
        return SpanExportResult.SUCCESS

    loop = ExportLoop(export, 20, 1.0)
    loop.add(parsed)
    loop.flush()
    total = sum(map(span_count, parsed))
    assert sum(batches) == total == loop.exported
    assert all(b <= 20 for b in batches) and len(batches) >= total // 20
