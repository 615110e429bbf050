"""AuditHub.start_span reads the client's traceparent straight from Starlette's
headers: the same link as incoming_links of all headers (last one wins, any case)."""
from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from starlette.datastructures import Headers

from audit.tracing import incoming_links
from gateway.auditing import AuditHub
from gateway.record import RequestRecord

TP1 = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
TP2 = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize("raw", [
    [],
    [(b"traceparent", TP1.encode())],
    [(b"traceparent", TP1.encode()), (b"traceparent", TP2.encode())],
    [(b"traceparent", b"garbage")],
    [(b"x-other", b"1"), (b"traceparent", TP2.encode()), (b"baggage", b"a=b")],
])
def test_links_from_starlette_headers_equal_links_from_all_headers(raw: list[tuple[bytes, bytes]]) -> None:
    headers = Headers(raw=raw)
    hub = AuditHub(None, tracer=TracerProvider().get_tracer("test"))  # its own tracer: nothing global
    rec = RequestRecord(request_id="r", endpoint="/v1/completions", client_addr=None, t0=0.0)
    captured = []
    original = hub.tracer.start_span

    def spy(name, **kw):  # type: ignore[no-untyped-def]
        captured.append(kw["links"])
        return original(name, **kw)

    hub.tracer.start_span = spy  # type: ignore[method-assign]
    hub.start_span(rec, headers)
    want = incoming_links(headers)  # the generic path: every header, lower-cased, last one wins
    (got,) = captured
    assert [(link.context, dict(link.attributes or {})) for link in got] == \
        [(link.context, dict(link.attributes or {})) for link in want]
