"""Session 29 (S29-tidy29-3): the OTLP span exporters' retry decision and body coding, once for both
(:class:`audit.otlp_traces.OtlpHttpSender`, :class:`audit.span_post.SpanPoster`): ``ExportOutcomes.retry_delay``
and ``compress``. The exporters' behaviour end to end: tests/audit/test_i11_otlp_http.py, test_s10_span_post.py."""
from __future__ import annotations

import gzip
import logging
import math
import zlib

import pytest

from audit.backoff import Backoff
from audit.otlp_traces import ExportOutcomes, compress

log = logging.getLogger("tests.s29.export_retry")


def test_not_retryable_drops_the_batch_and_logs(caplog: pytest.LogCaptureFixture) -> None:
    out = ExportOutcomes("http://c/v1/traces", log)
    with caplog.at_level(logging.WARNING, logger=log.name):
        assert out.retry_delay(400, False, "HTTP 400", "1", Backoff(0.1, 1.0), 10.0) is None
    assert "failed: HTTP 400 (not retryable per the OTLP spec; batch dropped)" in caplog.text


def test_retry_after_then_jittered_backoff() -> None:
    out = ExportOutcomes("http://c/v1/traces", log)
    assert out.retry_delay(503, True, "HTTP 503", "2", Backoff(0.1, 1.0), 10.0) == 2.0
    delay = out.retry_delay(503, True, "HTTP 503", None, Backoff(0.1, 1.0), 10.0)
    assert delay is not None and 0.08 <= delay <= 0.12 * 1.0001


@pytest.mark.parametrize("remaining", [1.0, 0.0, -math.inf])
def test_a_wait_past_the_deadline_or_a_stop_drops_the_batch(caplog: pytest.LogCaptureFixture, remaining: float) -> None:
    out = ExportOutcomes("http://c/v1/traces", log)
    with caplog.at_level(logging.WARNING, logger=log.name):
        assert out.retry_delay(None, True, "timeout", "5" if remaining > 0 else None, Backoff(0.1, 1.0),
                               remaining) is None
    assert "failed: timeout (retryable; timeout spent, batch dropped)" in caplog.text


def test_compress() -> None:
    body = b"span " * 100
    assert gzip.decompress(compress(body, "gzip")) == body and zlib.decompress(compress(body, "deflate")) == body
    assert compress(body, None) is body
