"""Issue 14, session 11: less of the gateway's own work on the client's path.

* The request trace is started with its ids and sampling decision only (:class:`audit.tracing.TraceStart`):
  the upstream ``traceparent`` is the one the whole trace has; the :class:`audit.tracing.RequestTrace`
  (links, attributes, span context) is made while the replica works, and is the one
  :func:`audit.tracing.begin_request_trace` makes from the same ids.
* The token ledger's refund (:meth:`tenancy.ledger.Reservation.settle_later`) and a plain answer's
  ``Upstream.answered`` run after the answer's last body part, before the event loop runs anything
  else; the settlement's numbers (the audit event's) are fixed before it; debt is applied at once.
* The client's source address is worked out once per request; flow control's queue-wait metric is
  observed while the replica works.
"""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import pytest
from starlette.datastructures import Headers

import gateway.authn as authn
import gateway.auditing as auditing
from audit.tracing import (begin_request_trace, finish_trace_start, incoming_links, request_trace_headers,
                           setup_tracing, start_request_trace)
from gateway.app import build_public_app
from gateway.auditing import AuditHub
from gateway.record import RequestRecord
from gateway.upstream_conn import UpstreamConnection
from tenancy.ledger import InProcessLedger, LedgerReservation
from tenancy.registry import Tenant
from tests.conftest import Stack
from tests.gateway.test_s2_record_after_send import _scope
from tests.support.spies import log_answer_bytes, log_calls

BODY = json.dumps({"model": "sim-model", "prompt": "one two three four five six seven eight nine ten eleven "
                   "twelve thirteen fourteen fifteen sixteen seventeen", "max_tokens": 2}).encode()
TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def audit_hub() -> AuditHub:
    """The stack's hub with a provider of :func:`setup_tracing` (the served gateway's kind) whose spans are
    built (an exporter): the trace is made whole."""
    hub = AuditHub(None)
    hub.provider = setup_tracing("memory")
    return hub


# -- the trace split ------------------------------------------------------------------------------
@pytest.mark.parametrize("ratio", [1.0, 0.5, 0.0])
@pytest.mark.parametrize("seed", range(6))
def test_a_started_trace_finishes_as_the_one_begin_request_trace_makes(ratio: float, seed: int) -> None:
    provider = setup_tracing(None, sample_ratio=ratio)
    links = incoming_links({"traceparent": TP})
    random.seed(seed)  # the SDK's id generator draws from `random`: the same ids both ways
    want = begin_request_trace(provider, "POST /v1/completions", links, {"a": 1}, 123)
    random.seed(seed)
    ts = start_request_trace(provider, 123, carrier="headers")
    assert ts is not None and ts.carrier == "headers"
    got = finish_trace_start(ts, "POST /v1/completions", links, {"a": 1})
    assert want is not None and got == want
    headers: dict[str, str] = {}
    request_trace_headers(want, headers)
    assert headers == {"traceparent": ts.traceparent()}


def test_a_provider_not_from_setup_tracing_gets_no_trace_start() -> None:
    from opentelemetry.sdk.trace import TracerProvider

    assert start_request_trace(TracerProvider(), 1) is None


def test_a_trace_nobody_builds_spans_of_is_never_made_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[str] = []
    log_calls(auditing, "finish_trace_start", made, "made", monkeypatch)
    for ratio in (1.0, 0.0):
        hub = AuditHub(None)
        hub.provider = setup_tracing(None, sample_ratio=ratio)  # no exporter: spans are not built
        for prepared in (True, False):  # served (prepared in the wait) or refused (ended first)
            rec = RequestRecord(request_id="r", endpoint="/v1/completions", client_addr=None, t0=0.0)
            hub.start_span(rec, Headers(raw=[(b"traceparent", TP.encode())]))
            sent: dict[str, str] = {}
            hub.inject_trace_headers(sent, rec)
            if prepared:
                hub.prepare_request(rec)
            assert hub._end_spans(rec) == (sent["traceparent"][3:35], None)
            # nothing of the trace left (session 19: the event id made in the wait stays for emit_request)
            assert rec.extra == ({"event_id": rec.extra.get("event_id")} if prepared else {})
    assert made == []


@pytest.mark.parametrize("exporter", ["memory", "worker"])
def test_the_hub_starts_ids_only_and_makes_the_trace_with_the_clients_link_later(
        exporter: str, monkeypatch: pytest.MonkeyPatch) -> None:
    hub = AuditHub(None)
    if exporter == "memory":  # spans built here
        hub.provider = setup_tracing("memory")
    else:  # the audit worker builds them from the span extra (which needs the links)
        hub.provider, hub.worker_spans = setup_tracing(None), True
    made: list[str] = []
    log_calls(auditing, "finish_trace_start", made, "made", monkeypatch)
    log_calls(auditing, "incoming_links", made, "links", monkeypatch)
    rec = RequestRecord(request_id="r", endpoint="/v1/chat/completions", client_addr=None, t0=0.0)
    hub.start_span(rec, Headers(raw=[(b"traceparent", TP.encode())]))
    sent: dict[str, str] = {}
    hub.inject_trace_headers(sent, rec)
    assert made == []  # on the request's path: ids, flags and the header only
    hub.prepare_request(rec)  # the replica wait
    # the worker's span extra is made from the ids and the client's link, without the trace (session 12)
    assert made == (["links", "made"] if exporter == "memory" else ["links"])
    rt = hub.request_trace(rec)
    assert rt is not None and rt.name == "POST /v1/chat/completions"
    assert rt.attributes == {"http.request.method": "POST", "http.route": "/v1/chat/completions"}
    assert [link.context.trace_id for link in rt.links] == [0x0AF7651916CD43DD8448EB211C80319C]
    again: dict[str, str] = {}
    request_trace_headers(rt, again)
    assert again == sent  # the upstream got the whole trace's own traceparent
    trace_id, _ = hub._end_spans(rec)
    assert trace_id == format(rt.context.trace_id, "032x") == sent["traceparent"][3:35]


def test_a_request_ending_before_the_wait_still_gets_its_trace() -> None:
    hub = AuditHub(None)
    hub.provider = setup_tracing("memory")
    rec = RequestRecord(request_id="r", endpoint="/v1/completions", client_addr=None, t0=0.0)
    hub.start_span(rec, {})
    sent: dict[str, str] = {}
    hub.inject_trace_headers(sent, rec)
    trace_id, _ = hub._end_spans(rec)  # no prepare_request: a refusal
    assert trace_id is not None and sent["traceparent"][3:35] == trace_id


# -- the ledger's two-step settlement -------------------------------------------------------------
def _tenant() -> Tenant:
    return Tenant(id="t", spiffe_ids=("spiffe://td/t/",), prompt_tokens_per_s=1.0, prompt_tokens_burst=100.0,
                  output_tokens_per_s=1.0, output_tokens_burst=100.0)


def test_settle_later_fixes_the_settlement_now_and_refunds_when_called() -> None:
    now = [0.0]
    ledger, twin = InProcessLedger(clock=lambda: now[0]), InProcessLedger(clock=lambda: now[0])
    res, res2 = ledger.reserve(_tenant(), 30, 50), twin.reserve(_tenant(), 30, 50)
    s, refund = res.settle_later(20, 10, "usage")
    assert refund is not None and res.settlement is s
    assert (s.reserved_prompt, s.reserved_output, s.charged_prompt, s.charged_output) == (30, 50, 20, 10)
    assert ledger.level("t", "prompt") == 70 and ledger.level("t", "output") == 50  # still held
    assert ledger.totals()["t"].open_reservations == 1
    res.lower_output(1)  # settled: no-op
    assert res.settle(0, 0, "usage") is s  # the first call wins
    refund()
    assert res2.settle(20, 10, "usage") == s
    assert (ledger.level("t", "prompt"), ledger.level("t", "output")) == (twin.level("t", "prompt"),
                                                                        twin.level("t", "output")) == (80, 90)
    assert ledger.totals() == twin.totals()


@pytest.mark.parametrize("charged", [(40, 10), (20, 60), (40, 60)])
def test_debt_is_applied_at_once(charged: tuple[int, int]) -> None:
    ledger, twin = InProcessLedger(clock=lambda: 0.0), InProcessLedger(clock=lambda: 0.0)
    res, res2 = ledger.reserve(_tenant(), 30, 50), twin.reserve(_tenant(), 30, 50)
    s, refund = res.settle_later(*charged, "usage")
    assert refund is None  # a charge beyond the reservation: nothing left for later
    assert res2.settle(*charged, "usage") == s
    assert ledger.level("t", "prompt") == twin.level("t", "prompt")
    assert ledger.level("t", "output") == twin.level("t", "output")
    assert ledger.totals() == twin.totals()


def test_settle_later_checks_its_arguments_and_answers_a_settled_reservation() -> None:
    res = InProcessLedger(clock=lambda: 0.0).reserve(_tenant(), 3, 5)
    with pytest.raises(ValueError):
        res.settle_later(-1, 0, "usage")
    with pytest.raises(ValueError):
        res.settle_later(0, 0, "guess")
    s = res.settle(1, 1, "usage")
    assert res.settle_later(0, 0, "usage") == (s, None)


# -- the served request ---------------------------------------------------------------------------
async def _serve(stack: Stack, log: list[str]) -> None:
    app = build_public_app(stack.components, manage_lifecycle=False)
    messages = [{"type": "http.request", "body": BODY, "more_body": False}]
    ledger = stack.components.admission.ledger
    assert isinstance(ledger, InProcessLedger)

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    async def send(message: dict[str, Any]) -> None:
        log.append(message["type"])
        if message["type"] == "http.response.body" and not message.get("more_body"):
            log.append(f"open reservations {ledger.totals()['tenant-a'].open_reservations}")
            asyncio.get_running_loop().call_soon(log.append, "next turn")

    await app(_scope("/v1/completions", stack.auth()), receive, send)


async def test_refund_and_instance_check_after_the_last_part_before_the_next_turn(
        stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    gw = stack.components
    log: list[str] = []
    log_calls(gw.audit, "emit_request", log, "recorded", monkeypatch)
    log_calls(LedgerReservation, "_apply_locked", log, "refunded", monkeypatch)
    log_calls(gw.upstream, "answered", log, "answered", monkeypatch)
    await _serve(stack, log)
    assert stack.components.admission.ledger.totals()["tenant-a"].open_reservations == 0  # same step
    await asyncio.sleep(0)
    body = log.index("http.response.body")
    assert log.index("recorded") < body  # the event (with the settlement's numbers) before the answer
    assert log[body + 1] == "open reservations 1"  # the refund not yet applied while the last part goes out
    assert body < log.index("answered") < log.index("refunded") < log.index("next turn"), log
    assert log.count("refunded") == 1 and log.count("answered") == 1


async def test_the_trace_is_made_while_the_replica_works(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    log: list[str] = []
    log_calls(auditing, "finish_trace_start", log, "trace made", monkeypatch)
    log_calls(UpstreamConnection, "send", log, "upstream written", monkeypatch)
    log_calls(stack.components.pep, "decide_now", log, "decided", monkeypatch)  # s16: decide_now
    log_answer_bytes(log, monkeypatch)
    for _ in range(4):  # a kept-alive connection to each replica
        await _serve(stack, log)
    await asyncio.sleep(0)
    log.clear()
    log_calls(stack.components.flow, "observe_wait", log, "wait observed", monkeypatch)
    hist = stack.components.metrics.flow_queue_wait_seconds
    before = _count(hist)
    await _serve(stack, log)
    assert log[:5] == ["decided", "upstream written", "trace made", "wait observed", "answer bytes"], log
    assert log.count("trace made") == 1 and log.count("wait observed") == 1
    assert _count(hist) == before + 1  # the flow queue-wait histogram: one observation per released request


def _count(hist: Any) -> float:
    return next(s.value for m in hist.collect() for s in m.samples if s.name.endswith("_count"))


async def test_the_source_is_worked_out_once(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    log: list[str] = []
    log_calls(authn.Authenticator, "source", log, "peer", monkeypatch)  # s17: source reads the peer without _peer
    r = await stack.client.post("/v1/completions", content=BODY,
                                headers={**stack.auth(), "content-type": "application/json"})
    assert r.status_code == 200, r.text
    assert log == ["peer"]
