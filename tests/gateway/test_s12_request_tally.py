"""Issue 14, session 12: the request counters of :meth:`gateway.recording.Recorder.finish` are tallied
per label set and handed to the counters when a registry is read: every read (scrape,
``get_sample_value``) sees every request finished before it, with the counts and token sums the
per-request increments gave, and the tally stays bounded."""

from __future__ import annotations

import random

from prometheus_client import generate_latest

import gateway.recording as recording
from gateway.auditing import AuditHub
from gateway.metrics import GatewayMetrics
from gateway.record import RequestRecord
from gateway.recording import Recorder


def _rec(rng: random.Random) -> RequestRecord:
    rec = RequestRecord(request_id="r", endpoint=rng.choice(["/v1/completions", "/v1/chat/completions"]),
                        client_addr=None, t0=1.0)
    rec.status, rec.outcome = rng.choice([(200, "allowed"), (403, "denied"), (503, "failed")])
    rec.tenant_id = rng.choice([None, "", "tenant-a", "tenant-b"])
    rec.replica, rec.pool = rng.choice([(None, None), ("", "p"), ("r0", "p"), ("r1", None)])
    rec.t_first_byte = rng.choice([None, 1.5])
    rec.t_end = 2.0
    rec.prompt_tokens = rng.choice([None, 0, 17])
    rec.available_prefix_tokens, rec.predicted_prefix_tokens = rng.choice([None, 4]), rng.choice([None, 3])
    rec.delivered_prefix_tokens = rng.choice([None, 0, 8])
    return rec


def _per_request(m: GatewayMetrics, rec: RequestRecord) -> None:
    """The session 11 Recorder.finish's counter increments, one request at a time."""
    m.requests.labels(rec.endpoint, str(rec.status), rec.outcome).inc()
    if rec.tenant_id:
        m.tenant_requests.labels(rec.tenant_id, rec.outcome).inc()
    if rec.replica and rec.t_first_byte is not None:
        m.replica_requests.labels(rec.replica, rec.pool or "").inc()
        m.prompt_tokens.inc(rec.prompt_tokens or 0)
        m.prefix_tokens.labels("available").inc(rec.available_prefix_tokens or 0)
        m.prefix_tokens.labels("predicted").inc(rec.predicted_prefix_tokens or 0)
        if rec.delivered_prefix_tokens is not None:
            m.prefix_tokens.labels("delivered").inc(rec.delivered_prefix_tokens)


def _counters(m: GatewayMetrics) -> list[str]:
    text = generate_latest(m.admin).decode()
    return sorted(ln for ln in text.splitlines() if ln.startswith("prefixgate_") and "_total" in ln
                  and "policy_cache" not in ln)


def test_tallied_counters_equal_per_request_increments_at_every_read() -> None:
    rng = random.Random(12)
    tallied, direct = GatewayMetrics(), GatewayMetrics()
    rc = Recorder(tallied, AuditHub(None))
    for round_ in range(5):
        for _ in range(rng.randrange(1, 80)):
            rec = _rec(rng)
            rc.finish(rec)
            _per_request(direct, rec)
        assert _counters(tallied) == _counters(direct)  # a scrape sees everything finished before it
    rec = _rec(rng)
    rec.replica, rec.t_first_byte, rec.status, rec.outcome = "r0", 1.5, 200, "allowed"
    rc.finish(rec)
    assert tallied.admin.get_sample_value(
        "prefixgate_requests_total", {"endpoint": rec.endpoint, "status": "200", "outcome": "allowed"}) == \
        1 + (direct.admin.get_sample_value(
            "prefixgate_requests_total", {"endpoint": rec.endpoint, "status": "200", "outcome": "allowed"}) or 0)


def test_the_tally_is_bounded(monkeypatch) -> None:
    monkeypatch.setattr(recording, "TALLY_MAX", 3)
    m = GatewayMetrics()
    rc = Recorder(m, AuditHub(None))
    for i in range(10):
        rec = RequestRecord(request_id="r", endpoint="/v1/completions", client_addr=None, t0=1.0)
        rec.status, rec.outcome, rec.tenant_id, rec.t_end = 200, "allowed", f"t{i}", 2.0
        rc.finish(rec)
        assert len(rc._tally) <= 3
    assert sum(m.admin.get_sample_value("prefixgate_tenant_requests_total", {"tenant": f"t{i}", "outcome": "allowed"})
               for i in range(10)) == 10
