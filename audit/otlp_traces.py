"""OTLP/HTTP span export from wire records, on public APIs only: settings and the HTTP sender.

Used by the span exporter child (:mod:`audit.span_exporter_proc`) for
``exporter: otlp``:

* :class:`~audit.otlp_trace_request.OtlpRequestEncoder` (in
  :mod:`audit.otlp_trace_request`) builds the ``ExportTraceServiceRequest`` from
  the wire records (``audit.span_frames.SPAN_FIELDS`` order) with the
  generated messages of ``opentelemetry-proto``, no ``ReadableSpan`` in
  between (~3.5 us per span instead of ~17 us for rebuild + the SDK's
  ``encode_spans``; bench/results/span_offload.json). The bytes equal the
  SDK encoder's for the same spans (tests/audit/test_span_offload.py).
* :class:`OtlpHttpSender` POSTs the body with its own ``requests.Session``,
  following the OTLP specification, OTLP/HTTP section
  (https://opentelemetry.io/docs/specs/otlp/#otlphttp): binary protobuf
  (``Content-Type: application/x-protobuf``), optional ``Content-Encoding``
  gzip or deflate; a 2xx answer is a success whose
  ``partial_success.rejected_spans`` were refused for good (counted, logged,
  never retried); 429, 502, 503, 504 and connection failures are retried with
  a doubling, jittered backoff (:class:`audit.backoff.Backoff`), honouring a
  ``Retry-After`` in seconds, until the export timeout is spent; any other
  status fails the batch at once.
* :class:`OtlpHttpSettings` resolves endpoint, headers, timeout, compression
  and TLS files from the arguments and the standard ``OTEL_EXPORTER_OTLP_*``
  environment variables (OpenTelemetry "OTLP Exporter Configuration"), the
  signal-specific ``..._TRACES_...`` variable first.

Header values (collector credentials) and the endpoint's user info and query
are never logged.
"""

from __future__ import annotations

import gzip
import logging
import math
import random
import threading
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import requests
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceResponse,
)
from opentelemetry.util.re import parse_env_headers

from audit.backoff import Backoff
from audit.tls import requests_session

__all__ = [
    "DEFAULT_ENDPOINT",
    "DEFAULT_TIMEOUT_S",
    "MAX_REQUEST_BYTES",
    "RETRYABLE_STATUSES",
    "RETRY_BACKOFF_S",
    "OtlpHttpSender",
    "OtlpHttpSettings",
    "loggable_url",
    "retry_after_s",
]


log = logging.getLogger("prefixgate.span_exporter_proc")

#: Default OTLP/HTTP traces endpoint (OTLP spec: port 4318, path ``/v1/traces``).
DEFAULT_ENDPOINT = "http://localhost:4318/v1/traces"
#: Default export timeout, seconds (as the Python SDK, which reads
#: ``OTEL_EXPORTER_OTLP_TIMEOUT`` in seconds too).
DEFAULT_TIMEOUT_S = 10.0
#: A serialized request above this many bytes (before compression) is dropped
#: unsent, as the SDK exporter's default ``max_request_size`` (64 MiB).
MAX_REQUEST_BYTES = 64 << 20
#: HTTP statuses the OTLP spec marks retryable; every other non-2xx is not.
RETRYABLE_STATUSES = frozenset({429, 502, 503, 504})
#: First retry delay and cap, seconds (doubling, x0.8..1.2 jitter), bounded by the timeout.
RETRY_BACKOFF_S = (1.0, 32.0)

_PROTOBUF = "application/x-protobuf"


def _env(env: Mapping[str, str], name: str) -> str | None:
    """``OTEL_EXPORTER_OTLP_TRACES_<name>`` or else ``OTEL_EXPORTER_OTLP_<name>``; None if unset/empty."""
    return env.get(f"OTEL_EXPORTER_OTLP_TRACES_{name}") or env.get(f"OTEL_EXPORTER_OTLP_{name}") or None


def loggable_url(endpoint: str) -> str:
    """``endpoint`` without user info, query and fragment (they may carry credentials)."""
    parts = urlsplit(endpoint)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


@dataclass(frozen=True)
class OtlpHttpSettings:
    """Where and how :class:`OtlpHttpSender` POSTs.

    ``endpoint``: full traces URL; ``headers``: extra request headers;
    ``timeout_s``: budget of one export including retries, seconds;
    ``compression``: ``"gzip"``, ``"deflate"`` or None; ``ca_file``: CA bundle
    for an https endpoint (None: system defaults); ``client_cert`` /
    ``client_key``: files for mutual TLS.
    """

    endpoint: str = DEFAULT_ENDPOINT
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = DEFAULT_TIMEOUT_S
    compression: str | None = None
    ca_file: str | None = None
    client_cert: str | None = None
    client_key: str | None = None

    @classmethod
    def resolve(cls, endpoint: str | None = None, headers: Mapping[str, str] | None = None,
                timeout_s: float | None = None, env: Mapping[str, str] | None = None) -> OtlpHttpSettings:
        """Arguments first, then the environment (OTLP Exporter Configuration):

        * endpoint: ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` as is, else
          ``OTEL_EXPORTER_OTLP_ENDPOINT`` + ``/v1/traces``, else
          :data:`DEFAULT_ENDPOINT`;
        * headers: ``..._HEADERS`` (``k=v,k2=v2``, values URL-decoded);
        * timeout: ``..._TIMEOUT`` in seconds (the Python SDK's reading);
        * compression: ``..._COMPRESSION`` = ``gzip`` | ``deflate`` | ``none``;
        * TLS: ``..._CERTIFICATE``, ``..._CLIENT_CERTIFICATE``, ``..._CLIENT_KEY``.

        Raises :class:`ValueError` for a non-http(s) endpoint, an unknown
        compression or a non-positive or unparsable timeout.
        """
        import os

        env = os.environ if env is None else env
        if not endpoint:
            endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or None
        if not endpoint:
            base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
            endpoint = base.rstrip("/") + "/v1/traces" if base else DEFAULT_ENDPOINT
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("OTLP traces endpoint must be an http:// or https:// URL")
        if not headers:
            raw = _env(env, "HEADERS")
            headers = parse_env_headers(raw, liberal=True) if raw else {}
        if timeout_s is None:
            raw = _env(env, "TIMEOUT")
            timeout_s = float(raw) if raw else DEFAULT_TIMEOUT_S
        if not timeout_s > 0:
            raise ValueError("OTLP timeout must be > 0 seconds")
        compression = (_env(env, "COMPRESSION") or "none").strip().lower()
        if compression not in ("gzip", "deflate", "none"):
            raise ValueError(f"OTLP compression must be gzip, deflate or none, not {compression!r}")
        return cls(endpoint=endpoint, headers=dict(headers), timeout_s=float(timeout_s),
                   compression=None if compression == "none" else compression,
                   ca_file=_env(env, "CERTIFICATE"), client_cert=_env(env, "CLIENT_CERTIFICATE"),
                   client_key=_env(env, "CLIENT_KEY"))



def compress(body: bytes, compression: str | None) -> bytes:
    """``body`` coded for the OTLP ``Content-Encoding`` ``compression``: ``gzip`` (level 6), ``deflate``
    (zlib), anything else (None: ``none``) as it is. One definition for :class:`OtlpHttpSender` and
    :class:`audit.span_post.SpanPoster` (S29-tidy29-3)."""
    if compression == "gzip":
        return gzip.compress(body, compresslevel=6)
    if compression == "deflate":
        return zlib.compress(body)
    return body


class ExportOutcomes:
    """What :class:`OtlpHttpSender` and :class:`audit.span_post.SpanPoster` share about an export's
    outcome (one definition, session 11): a failure is logged once per change of (status, retryable)
    and at debug level while it repeats; the first success after failures is logged as recovered; a
    2xx answer's ``partial_success.rejected_spans`` are read, logged with the collector's message
    (at most 200 characters, one line) and returned. Logs on ``logger`` (each caller keeps its own)."""

    def __init__(self, log_url: str, logger: logging.Logger) -> None:
        self.log_url = log_url
        self._log = logger
        self._last_failure: tuple[int | None, bool] | None = None

    def failure(self, status: int | None, retryable: bool, message: str) -> None:
        """Log ``message`` (warning) unless the previous failure had the same (status, retryable)."""
        key = (status, retryable)
        if key != self._last_failure:
            self._log.warning("%s", message)
            self._last_failure = key
        else:
            self._log.debug("%s", message)

    def retry_delay(self, status: int | None, retryable: bool, reason: str, retry_after: str | None,
                    backoff: Backoff, remaining_s: float) -> float | None:
        """Seconds to wait before the next try of a failed POST: the answer's ``Retry-After``
        (:func:`retry_after_s`) or else ``backoff.next()`` jittered by ±20 %. None, with the failure
        logged (:meth:`failure`, ``reason`` e.g. ``HTTP 503`` or ``timeout``), when the batch is dropped: the
        failure is not ``retryable`` per the OTLP spec, or the wait is longer than ``remaining_s`` (the
        seconds left before the export's deadline; ``-inf`` when the caller stops). Shared by
        :class:`OtlpHttpSender` and :class:`audit.span_post.SpanPoster` (S29-tidy29-3)."""
        if not retryable:
            self.failure(status, False, f"OTLP span export to {self.log_url} failed: {reason} "
                                        "(not retryable per the OTLP spec; batch dropped)")
            return None
        delay = retry_after_s(retry_after)
        if delay is None:
            delay = backoff.next() * random.uniform(0.8, 1.2)
        if delay > remaining_s:
            self.failure(status, True, f"OTLP span export to {self.log_url} failed: {reason} "
                                       "(retryable; timeout spent, batch dropped)")
            return None
        return delay

    def success(self, payload: bytes, content_type: str) -> int:
        """A 2xx answer with body ``payload``: spans it rejected (0 unless a protobuf
        ``ExportTraceServiceResponse`` says so; an undecodable one is logged and counts 0)."""
        if self._last_failure is not None:
            self._log.info("OTLP span export to %s recovered", self.log_url)
            self._last_failure = None
        if not payload or content_type.split(";")[0].strip() != _PROTOBUF:
            return 0
        try:
            answer = ExportTraceServiceResponse.FromString(payload)
        except DecodeError:
            self._log.warning("OTLP span export to %s: 2xx answer is not an ExportTraceServiceResponse", self.log_url)
            return 0
        rejected = answer.partial_success.rejected_spans
        if rejected > 0:
            msg = answer.partial_success.error_message.replace("\n", " ")[:200]
            self._log.warning("OTLP collector at %s rejected %d spans (not retried): %s", self.log_url, rejected, msg)
        return rejected


class OtlpHttpSender:
    """POST serialized ``ExportTraceServiceRequest`` bodies to an OTLP/HTTP collector.

    Synchronous (the exporter child has one thread). :meth:`export` returns
    True once the collector answered 2xx, False when the batch is lost
    (non-retryable status, retries exhausted within ``timeout_s``, request
    over :data:`MAX_REQUEST_BYTES`, or after :meth:`shutdown`).

    Attributes:
        rejected_spans: spans the collector accepted the request for but
            rejected (``partial_success.rejected_spans``; not retried).
        requests: requests answered 2xx.
        retries: retried attempts.
    """

    def __init__(self, settings: OtlpHttpSettings, *, sleep: Any = None,
                 session: requests.Session | None = None) -> None:
        self.settings = settings
        self._session = session or requests_session()  # TLS: audit/tls.py (S19-R3)
        self._session.headers.update({k: v for k, v in settings.headers.items()
                                      if k.lower() not in ("content-type", "content-encoding", "content-length")})
        self._session.headers["Content-Type"] = _PROTOBUF
        if settings.compression is not None:
            self._session.headers["Content-Encoding"] = settings.compression
        self._verify: bool | str = settings.ca_file or True
        self._cert: tuple[str, str] | str | None = (
            (settings.client_cert, settings.client_key) if settings.client_cert and settings.client_key
            else settings.client_cert
        )
        self._stop = threading.Event()
        self._sleep = sleep or self._stop.wait
        self._log_url = loggable_url(settings.endpoint)
        self._outcomes = ExportOutcomes(self._log_url, log)
        self.rejected_spans = 0
        self.requests = 0
        self.retries = 0

    def export(self, body: bytes) -> bool:
        """POST one serialized request; retry transient failures (see module doc)."""
        if self._stop.is_set():
            return False
        if len(body) > MAX_REQUEST_BYTES:
            log.warning("dropping span batch: %d bytes exceeds %d", len(body), MAX_REQUEST_BYTES)
            return False
        data = compress(body, self.settings.compression)
        deadline = time.monotonic() + self.settings.timeout_s
        backoff = Backoff(*RETRY_BACKOFF_S)
        while True:
            remaining = deadline - time.monotonic()
            status: int | None = None
            retry_after: str | None = None
            try:
                resp = self._session.post(self.settings.endpoint, data=data, timeout=max(remaining, 0.001),
                                          verify=self._verify, cert=self._cert, allow_redirects=False)
            except requests.RequestException as exc:
                reason = "timeout" if isinstance(exc, requests.Timeout) else type(exc).__name__
                retryable = True
            else:
                status = resp.status_code
                if 200 <= status < 300:
                    self.requests += 1
                    self.rejected_spans += self._outcomes.success(resp.content, resp.headers.get("Content-Type", ""))
                    return True
                retryable = status in RETRYABLE_STATUSES
                retry_after = resp.headers.get("Retry-After")
                reason = f"HTTP {status}"
                resp.close()
            remaining = -math.inf if self._stop.is_set() else deadline - time.monotonic()  # stopping: no time left
            delay = self._outcomes.retry_delay(status, retryable, reason, retry_after, backoff, remaining)
            if delay is None:
                return False
            self.retries += 1
            log.debug("OTLP span export to %s: %s, retrying in %.2f s", self._log_url, reason, delay)
            if self._sleep(delay):  # Event.wait: True when shutdown() interrupted the wait
                return False

    def shutdown(self) -> None:
        """Stop: abort a retry wait, refuse later exports, close the connections. Idempotent."""
        self._stop.set()
        self._session.close()


def retry_after_s(value: str | None) -> float | None:
    """A ``Retry-After`` in delta seconds (RFC 9110 10.2.3), or None (absent, a date, malformed)."""
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if seconds >= 0 else None
