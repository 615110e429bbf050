"""OtlpLogSink against a real OTLP/HTTP logs receiver on loopback (aiohttp)."""
from __future__ import annotations

import asyncio
import json
import logging

import pytest
from aiohttp import web
from google.rpc import status_pb2
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.logs.v1 import logs_pb2

from audit.event import AuditEvent, Kind, Outcome
from audit.log import AuditLog
from audit.otlp import OtlpExportError, OtlpLogSink
from audit.sink import SinkUnavailable
from tests.support.waiting import wait_for

SECRET = "Bearer s3cr3t-collector-token-value"


class Collector:
    """Minimal OTLP/HTTP logs receiver: decodes ExportLogsServiceRequest.

    ``mode``: "ok", "partial" (200 with partial_success), "hang" (waits for
    ``release``) or an int status to answer with a google.rpc.Status body.
    """

    def __init__(self) -> None:
        self.mode: str | int = "ok"
        self.requests: list[logs_service_pb2.ExportLogsServiceRequest] = []
        self.headers: list[dict[str, str]] = []
        self.wire_lengths: list[tuple[int, int]] = []  # (bytes on the wire, decoded bytes)
        self.release = asyncio.Event()
        self.port = 0
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/logs"

    @property
    def records(self) -> list[logs_pb2.LogRecord]:
        return [r for req in self.requests for rl in req.resource_logs for sl in rl.scope_logs for r in sl.log_records]

    def event_ids(self) -> list[str]:
        return [json.loads(r.body.string_value)["event_id"] for r in self.records]

    async def _handle(self, request: web.Request) -> web.Response:
        mode = self.mode
        if mode == "hang":
            await asyncio.wait_for(self.release.wait(), 5)
        if isinstance(mode, int):
            st = status_pb2.Status(code=3, message="collector says no")
            return web.Response(status=mode, body=st.SerializeToString(), content_type="application/x-protobuf",
                                headers={"Retry-After": "7"} if mode in (429, 503) else None)
        raw = await request.read()  # aiohttp's server undoes Content-Encoding: gzip itself
        self.wire_lengths.append((request.content_length or 0, len(raw)))
        assert request.headers["Content-Type"] == "application/x-protobuf"
        req = logs_service_pb2.ExportLogsServiceRequest.FromString(raw)
        self.requests.append(req)
        self.headers.append(dict(request.headers))
        resp = logs_service_pb2.ExportLogsServiceResponse()
        if mode == "partial":
            resp.partial_success.rejected_log_records = 2
            resp.partial_success.error_message = "2 records too large"
        return web.Response(body=resp.SerializeToString(), content_type="application/x-protobuf")

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/logs", self._handle)
        self._runner = web.AppRunner(app, access_log=None)  # our own server's log is not under test
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)  # port 0 first, then the same port again
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        self.release.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


@pytest.fixture
async def collector():
    c = Collector()
    await c.start()
    yield c
    await c.stop()


def _ev(i: int, **kw) -> AuditEvent:
    kw.setdefault("kind", Kind.INFERENCE)
    kw.setdefault("outcome", Outcome.ALLOWED)
    return AuditEvent(request_id=f"r{i}", **kw)


async def test_records_carry_the_documented_fields(collector):
    sink = OtlpLogSink(endpoint=collector.url, resource_attributes={"deployment.environment": "test"})
    await sink.open()
    trace = "0af7651916cd43dd8448eb211c80319c"
    allowed = _ev(0, tenant="acme", trace_id=trace, time_ms=1_700_000_000_123)
    denied = _ev(1, kind=Kind.AUTH, outcome=Outcome.UNAUTHENTICATED)
    await sink.send([allowed, denied])
    await sink.close()

    (req,) = collector.requests
    (rl,) = req.resource_logs
    res = {kv.key: kv.value.string_value for kv in rl.resource.attributes}
    assert res == {"service.name": "prefixgate", "deployment.environment": "test"}
    (sl,) = rl.scope_logs
    assert sl.scope.name == "prefixgate.audit" and sl.scope.version
    r0, r1 = sl.log_records
    assert json.loads(r0.body.string_value) == allowed.to_dict()
    assert json.loads(r1.body.string_value) == denied.to_dict()
    assert r0.time_unix_nano == 1_700_000_000_123 * 1_000_000
    assert r0.observed_time_unix_nano >= r0.time_unix_nano and r1.observed_time_unix_nano > 0
    assert (r0.severity_number, r0.severity_text) == (logs_pb2.SEVERITY_NUMBER_INFO, "INFO")
    assert (r1.severity_number, r1.severity_text) == (logs_pb2.SEVERITY_NUMBER_WARN, "WARN")
    a0 = {kv.key: kv.value.string_value for kv in r0.attributes}
    assert a0 == {"event.name": "prefixgate.audit.inference", "prefixgate.event_id": allowed.event_id,
                  "prefixgate.outcome": "allowed", "prefixgate.tenant": "acme"}
    a1 = {kv.key: kv.value.string_value for kv in r1.attributes}
    assert "prefixgate.tenant" not in a1 and a1["event.name"] == "prefixgate.audit.auth"
    assert r0.trace_id == bytes.fromhex(trace)
    assert r1.trace_id == b""
    assert sink.requests == 1 and sink.rejected == 0


async def test_malformed_trace_id_is_not_exported(collector):
    sink = OtlpLogSink(endpoint=collector.url)
    await sink.send([_ev(0, trace_id="zz" * 16), _ev(1, trace_id="00" * 16)])
    await sink.close()
    assert [r.trace_id for r in collector.records] == [b"", b""]


async def test_large_batch_split_in_order(collector):
    sink = OtlpLogSink(endpoint=collector.url, max_batch=7)
    events = [_ev(i) for i in range(30)]
    await sink.send(events)
    await sink.close()
    assert [len(rl.scope_logs[0].log_records) for req in collector.requests for rl in req.resource_logs] == [7, 7, 7, 7, 2]
    assert collector.event_ids() == [e.event_id for e in events]


@pytest.mark.parametrize("status, retryable", [(503, True), (429, True), (400, False), (401, False), (500, False)])
async def test_error_statuses_raise_sink_unavailable(collector, caplog, status, retryable):
    collector.mode = status
    sink = OtlpLogSink(endpoint=collector.url)
    with caplog.at_level(logging.WARNING, logger="audit.otlp"):
        with pytest.raises(SinkUnavailable) as info:
            await sink.send([_ev(0)])
    await sink.close()
    err = info.value
    assert isinstance(err, OtlpExportError) and err.status == status and err.retryable is retryable
    assert f"HTTP {status}" in caplog.text and "collector says no" in caplog.text
    assert ("non-retryable" in caplog.text) is (not retryable)
    if status in (429, 503):
        assert err.retry_after == "7" and "Retry-After: 7" in caplog.text
    assert sink.requests == 0


async def test_failure_logged_once_until_recovery(collector, caplog):
    collector.mode = 400
    sink = OtlpLogSink(endpoint=collector.url)
    with caplog.at_level(logging.INFO, logger="audit.otlp"):
        for _ in range(3):
            with pytest.raises(SinkUnavailable):
                await sink.send([_ev(0)])
        collector.mode = "ok"
        await sink.send([_ev(1)])
    await sink.close()
    msgs = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert sum("HTTP 400" in m for m in msgs) == 1
    assert any("recovered" in m for m in msgs)


async def test_stopped_collector_and_timeout_raise(collector):
    sink = OtlpLogSink(endpoint=collector.url, timeout_s=0.3)
    collector.mode = "hang"
    with pytest.raises(OtlpExportError) as info:
        await sink.send([_ev(0)])
    assert info.value.status is None and info.value.retryable
    await collector.stop()
    with pytest.raises(SinkUnavailable):
        await sink.send([_ev(1)])
    await sink.close()


async def test_partial_success_counted_not_raised(collector, caplog):
    collector.mode = "partial"
    sink = OtlpLogSink(endpoint=collector.url)
    with caplog.at_level(logging.WARNING, logger="audit.otlp"):
        await sink.send([_ev(i) for i in range(5)])
        await sink.send([_ev(i) for i in range(5, 8)])
    await sink.close()
    assert sink.rejected == 4 and sink.requests == 2
    assert "rejected 2 of 5" in caplog.text and "2 records too large" in caplog.text


async def test_gzip_and_headers_arrive_and_headers_never_logged(collector, caplog):
    collector.mode = 503
    sink = OtlpLogSink(endpoint=collector.url + "?api_key=querysecret", compression="gzip",
                       headers={"Authorization": SECRET, "X-Scope-OrgID": "audit",
                                "Content-Type": "text/plain"})
    with caplog.at_level(logging.DEBUG):
        with pytest.raises(SinkUnavailable):
            await sink.send([_ev(0)])
        collector.mode = "ok"
        events = [_ev(i) for i in range(3)]
        await sink.send(events)
    await sink.close()
    (hdrs,) = collector.headers
    assert hdrs["Authorization"] == SECRET and hdrs["X-Scope-OrgID"] == "audit"
    assert hdrs["Content-Encoding"] == "gzip" and hdrs["Content-Type"] == "application/x-protobuf"
    ((wire, decoded),) = collector.wire_lengths
    assert 0 < wire < decoded  # really compressed on the wire, and decoded by the receiver
    assert collector.event_ids() == [e.event_id for e in events]
    assert caplog.records  # the 503 was logged
    assert "s3cr3t" not in caplog.text and "querysecret" not in caplog.text


def test_constructor_rejects_bad_arguments():
    with pytest.raises(ValueError):
        OtlpLogSink(endpoint="ftp://collector/v1/logs")
    with pytest.raises(ValueError):
        OtlpLogSink(endpoint="http://c:4318/v1/logs", compression="zstd")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        OtlpLogSink(endpoint="http://c:4318/v1/logs", max_batch=0)


async def test_audit_log_spills_during_outage_and_replays_in_order(collector, tmp_path):
    sink = OtlpLogSink(endpoint=collector.url, timeout_s=1.0, max_batch=50, linger_s=0.0)
    alog = AuditLog([sink], tmp_path / "spill", queue_size=16, batch_size=64,
                    retry_initial_s=0.02, retry_max_s=0.1)
    await alog.start()
    ids: list[str] = []

    def emit(n: int) -> None:
        for _ in range(n):
            ev = _ev(len(ids))
            ids.append(ev.event_id)
            alog.emit(ev)

    emit(20)
    assert await alog.drain(5)
    await collector.stop()
    for _ in range(10):
        emit(30)
        await asyncio.sleep(0.01)
    await wait_for(lambda: alog.spill_pending_bytes > 0, what="events spilled while the collector is down")
    assert alog.registry.get_sample_value("prefixgate_audit_sink_up", {"sink": "otlp"}) == 0
    await collector.start()  # same port
    emit(20)
    assert await alog.drain(10)
    assert alog.spill_pending_bytes == 0 and alog.dropped == 0
    assert list(dict.fromkeys(collector.event_ids())) == ids
    assert alog.registry.get_sample_value("prefixgate_audit_sink_up", {"sink": "otlp"}) == 1
    await alog.close()


def _self_signed(tmp_path):
    """A throw-away EC certificate for 127.0.0.1 (PEM files: cert, key)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test collector")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = tmp_path / "collector.pem", tmp_path / "collector.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_file, key_file


async def test_build_audit_otlp_block_over_tls(tmp_path):
    import ssl

    from audit.config import build_audit

    cert_file, key_file = _self_signed(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert_file, key_file)
    c = Collector()
    app = web.Application()
    app.router.add_post("/v1/logs", c._handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ctx).start()
    port = runner.addresses[0][1]
    try:
        cfg = {"otlp": {"endpoint": f"https://127.0.0.1:{port}/v1/logs", "ca_file": str(cert_file),
                        "headers": {"Authorization": SECRET}, "timeout_s": 2, "compression": "gzip"},
               "spill": {"dir": str(tmp_path / "spill")}, "summary": False}
        alog = build_audit(cfg)
        await alog.start()
        events = [_ev(i) for i in range(5)]
        for ev in events:
            alog.emit(ev)
        assert await alog.drain(5)
        await alog.close()
        assert c.event_ids() == [e.event_id for e in events]
        assert all(h["Authorization"] == SECRET and h["Content-Encoding"] == "gzip" for h in c.headers)
    finally:
        await runner.cleanup()


async def test_untrusted_collector_certificate_is_unavailable(tmp_path):
    import ssl

    cert_file, key_file = _self_signed(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert_file, key_file)
    c = Collector()
    app = web.Application()
    app.router.add_post("/v1/logs", c._handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ctx).start()
    try:
        sink = OtlpLogSink(endpoint=f"https://127.0.0.1:{runner.addresses[0][1]}/v1/logs", timeout_s=2)
        with pytest.raises(SinkUnavailable):  # system trust store does not know this CA: fail closed
            await sink.send([_ev(0)])
        await sink.close()
        assert c.requests == []
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("otlp, message", [
    ({"endpoint": "http://127.0.0.1:4318/v1/logs", "compression": "zstd"}, "compression"),
    ({"endpoint": "http://127.0.0.1:4318/v1/logs", "ca_file": "/nonexistent.pem"}, "https"),
    ({"endpoint": "https://127.0.0.1:4318/v1/logs", "ca_file": "/nonexistent.pem"}, "otlp"),
    ({"endpoint": "http://127.0.0.1:4318/v1/logs", "headers": ["Authorization: x"]}, "headers"),
    ({"endpoint": "http://127.0.0.1:4318/v1/logs", "timeout_s": 0}, "timeout"),
])
def test_build_audit_refuses_bad_otlp_options(tmp_path, otlp, message):
    from audit.config import AuditConfigError, build_audit

    with pytest.raises(AuditConfigError, match=message):
        build_audit({"otlp": otlp, "spill": {"dir": str(tmp_path)}})


async def test_linger_batches_a_burst_into_one_request(collector, tmp_path):
    """Events emitted one by one within the linger time leave in one request, in order."""
    sink = OtlpLogSink(endpoint=collector.url, linger_s=0.2)
    alog = AuditLog([sink], tmp_path / "spill")
    await alog.start()
    ids = []
    for i in range(30):
        ev = _ev(i)
        ids.append(ev.event_id)
        alog.emit(ev)
        # the delivery task runs between emits: one loop turn, no wall time (session 30, flake30: 30 sleeps of
        # 1 ms could take past the 0.2 s linger on a loaded machine, and the burst left in two requests)
        await asyncio.sleep(0)
    assert await alog.drain(5)
    assert collector.event_ids() == ids
    assert len(collector.requests) == 1
    await alog.close()
