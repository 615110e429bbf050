"""Gateway-process CPU per span: OffloadSpanProcessor vs the SDK's
BatchSpanProcessor + OTLPSpanExporter (not a test).

``python -m bench.span_offload [--requests 4000]`` writes
``bench/results/span_offload.json``.

A dummy OTLP/HTTP collector runs in a separate process (its CPU is not
counted). In this process, each variant ends the same ``--requests`` x 5
spans shaped like the gateway's (a SERVER span with HTTP/gen_ai/PrefixGate
attributes and a client-traceparent link, and four children with explicit
start/end times), in bursts of 20 requests with a 2 ms pause (so the export
threads run alongside, as under load), then flushes everything to the
collector (``BatchSpanProcessor``) or to the child (offload; the child's own
CPU is not gateway CPU). Measured:

* ``process_cpu_us_per_span``: ``time.process_time`` (all threads of this
  process) of the variant minus the no-processor baseline, divided by spans:
  what the gateway process pays per span, including the writer/export thread.
* ``on_end_us_per_span``: wall time inside the processor's ``on_end`` alone
  (the part that runs on the event-loop thread).
* ``sdk_encode_us_per_span``: ``encode_spans(batch).SerializeToString()``
  alone, for reference (the protobuf work the offload moves out).
* ``child_cpu_us_per_span`` (variant ``offload``: the child's own encoder
  and OTLP/HTTP client, :mod:`audit.otlp_traces`): the exporter child's own CPU
  (psutil user+system) from idle before the burst to idle after it, divided
  by spans; includes JSON parsing, protobuf and the HTTP POSTs.
* ``child_decode_encode_us_per_span``: the child's per-span work without
  HTTP, in this process (``process_time``): frame parse + request body, for
  the child's encoder and, for reference, a ``ReadableSpan`` rebuild + the
  SDK's ``encode_spans``.
"""
from __future__ import annotations

import json
import multiprocessing
import platform
import socket
import time
from pathlib import Path
from typing import Any

import click
import psutil
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags, set_span_in_context

from sim.click_options import ClickOptions
from sim.procs import free_port

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "results" / "span_offload.json"
CHILDREN = ("authenticate", "policy", "route", "upstream")


def _collector(port: int) -> None:
    from aiohttp import web

    async def ok(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=b"", content_type="application/x-protobuf")

    app = web.Application(client_max_size=64 << 20)
    app.router.add_post("/v1/traces", ok)
    web.run_app(app, host="127.0.0.1", port=port, print=None, handle_signals=True)


def _wait_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("collector did not start")


class _Timed(SpanProcessor):
    """Wraps a processor and sums the wall time of its on_end (ns)."""

    def __init__(self, inner: SpanProcessor) -> None:
        self.inner = inner
        self.on_end_ns = 0

    def on_start(self, span: Any, parent_context: Context | None = None) -> None:
        self.inner.on_start(span, parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        t0 = time.perf_counter_ns()
        self.inner.on_end(span)
        self.on_end_ns += time.perf_counter_ns() - t0

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)

    def shutdown(self) -> None:
        self.inner.shutdown()


def _emit(provider: TracerProvider, requests: int) -> None:
    tracer = provider.get_tracer("prefixgate.gateway", "0.1")
    link = Link(SpanContext(0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, True, TraceFlags(1)),
                {"prefixgate.link": "client_traceparent"})
    for r in range(requests):
        t = time.time_ns()
        server = tracer.start_span("POST /v1/chat/completions", context=Context(), kind=SpanKind.SERVER,
                                   links=[link], start_time=t,
                                   attributes={"http.request.method": "POST", "http.route": "/v1/chat/completions"})
        ctx = set_span_in_context(server)
        for i, name in enumerate(CHILDREN):
            child = tracer.start_span(name, context=ctx, kind=SpanKind.CLIENT if name == "upstream" else SpanKind.INTERNAL,
                                      start_time=t + i * 100_000)
            child.end(end_time=t + i * 100_000 + 90_000)
        server.set_attributes({"http.response.status_code": 200, "gen_ai.request.model": "m",
                               "gen_ai.usage.input_tokens": 100, "gen_ai.usage.output_tokens": 4,
                               "prefixgate.tenant": "acme", "prefixgate.replica": "r1",
                               "prefixgate.predicted_prefix_tokens": 64, "prefixgate.decision_id": f"d-{r}"})
        server.end(end_time=t + 500_000)
        if r % 20 == 19:
            time.sleep(0.002)


def _run(kind: str, requests: int, endpoint: str) -> dict[str, Any]:
    resource = Resource.create({"service.name": "prefixgate-bench"})
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    timed: _Timed | None = None
    if kind == "sdk_batch_otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        timed = _Timed(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    elif kind == "offload":
        from audit.span_export import OffloadSpanProcessor
        inner = OffloadSpanProcessor("otlp", resource, endpoint=endpoint)
        inner.start()
        timed = _Timed(inner)
    if timed is not None:
        provider.add_span_processor(timed)
    time.sleep(0.5)  # child start-up / connection set-up not counted
    child = psutil.Process(timed.inner.child_pid) if kind.startswith("offload") else None
    child_cpu0 = _idle_cpu(child) if child is not None else 0.0
    cpu0, wall0 = time.process_time(), time.perf_counter()
    _emit(provider, requests)
    provider.force_flush()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    child_cpu = _idle_cpu(child) - child_cpu0 if child is not None else 0.0
    dropped = getattr(timed.inner, "dropped", 0) if timed is not None else 0
    provider.shutdown()
    return {"cpu_s": cpu, "wall_s": wall, "on_end_ns": timed.on_end_ns if timed else 0, "dropped": dropped,
            "child_cpu_s": child_cpu}


def _idle_cpu(proc: psutil.Process, settle_s: float = 0.7, timeout_s: float = 30.0) -> float:
    """CPU seconds (user + system) of ``proc`` once it has gone idle: two
    reads ``settle_s`` apart (longer than the child's 0.5 s flush interval)
    differing by under 2 ms."""
    deadline = time.monotonic() + timeout_s
    t = proc.cpu_times()
    last = t.user + t.system
    while time.monotonic() < deadline:
        time.sleep(settle_s)
        t = proc.cpu_times()
        now = t.user + t.system
        if now - last < 0.002:
            return now
        last = now
    return last


def _child_work_cost(requests: int) -> dict[str, float]:
    """The child's per-span CPU without HTTP (us per span, min of 3): the
    rebuild path (``SpanDecoder.decode_frame`` + ``encode_spans`` +
    ``SerializePartialToString``, what ``OTLPSpanExporter.export`` does before
    the POST, as reference) and the child's encoder (``parse_records`` +
    ``OtlpRequestEncoder.encode``), on the same frames of 512 spans."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from audit.span_exporter_proc import OtlpRequestEncoder, SpanDecoder, parse_records
    from audit.span_frames import encode_frames, encode_span

    resource = Resource.create({"service.name": "prefixgate-bench"})
    mem = InMemorySpanExporter()
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(mem))
    _emit(provider, requests)
    spans = mem.get_finished_spans()
    data, _ = encode_frames([encode_span(s) for s in spans], 512)
    lines = data.split(b"\n")[:-1]
    out: dict[str, list[float]] = {"sdk_rebuild_path": [], "child_encoder": []}
    for _ in range(3):
        decoder = SpanDecoder(resource)
        t0 = time.process_time()
        old = [encode_spans(decoder.decode_frame(line)).SerializePartialToString() for line in lines]
        out["sdk_rebuild_path"].append(time.process_time() - t0)
        encoder = OtlpRequestEncoder(resource)
        t0 = time.process_time()
        new = [encoder.encode(parse_records(line))[0] for line in lines]
        out["child_encoder"].append(time.process_time() - t0)
        if old != new:
            raise AssertionError("child encoder bytes differ from the SDK encoder's")
    return {k: round(min(v) / len(spans) * 1e6, 2) for k, v in out.items()}


def _encode_cost(requests: int) -> float:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    mem = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "b"}), shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(mem))
    _emit(provider, requests)
    spans = mem.get_finished_spans()
    t0 = time.process_time()
    for i in range(0, len(spans), 512):
        encode_spans(spans[i:i + 512]).SerializeToString()
    return (time.process_time() - t0) / len(spans) * 1e6


def _request_path_cost(n: int) -> tuple[float, float, float]:  # runs in a child against one tree (source sent with -c)
    """Gateway CPU (process_time, µs per request) of one request's trace as the hub drives it (begin,
    ``traceparent``, end with six stage children and nine attributes, into an offload processor that
    is never started), of the writer thread's frame encoding of what that queued, and of the
    :class:`gateway.auditing.AuditHub` calls per request (start_span, inject_trace_headers, emit_request)."""
    import time

    from opentelemetry.sdk.resources import Resource
    from opentelemetry.trace import SpanKind

    import audit.tracing as tracing
    from audit.span_export import OffloadSpanProcessor
    from audit.span_frames import encode_frames

    provider = tracing.setup_tracing("memory")
    proc = OffloadSpanProcessor("otlp", Resource({}), endpoint="http://127.0.0.1:9/v1/traces", max_queue_spans=10**9)
    tracing._PROCESSORS[provider][:] = [proc]  # noqa: SLF001
    attrs = {"http.response.status_code": 200, "gen_ai.request.model": "m", "gen_ai.usage.input_tokens": 100,
             "gen_ai.usage.output_tokens": 4, "prefixgate.tenant": "tenant-a", "prefixgate.replica": "r0",
             "prefixgate.predicted_prefix_tokens": 64, "prefixgate.decision_id": "d" * 32,
             "prefixgate.outcome": "allowed"}
    s = time.time_ns()
    children = [(name, SpanKind.CLIENT if name == "upstream" else SpanKind.INTERNAL, s + i, s + i + 1)
                for i, name in enumerate(["authenticate", "parse", "prefix_keys", "policy", "route", "upstream"])]
    t0 = time.process_time()
    for _ in range(n):
        rt = tracing.begin_request_trace(provider, "POST /v1/completions", [],
                                         {"http.request.method": "POST", "http.route": "/v1/completions"}, s)
        tracing.request_trace_headers(rt, {})
        if tracing.records(rt):
            tracing.end_request_trace(rt, s + 100, dict(attrs), False, children)
    hub = time.process_time() - t0
    batch = list(proc._queue)  # noqa: SLF001
    t0 = time.process_time()
    for i in range(0, len(batch), 512):
        encode_frames(batch[i:i + 512], 512)
    frames = time.process_time() - t0
    # the hub as the pipeline drives it: start_span, inject_trace_headers, emit_request (the audit log's
    # row hand-off replaced by a list append); the queue drained every 100 requests as the writer would
    from starlette.datastructures import Headers

    from gateway.auditing import AuditHub
    from gateway.record import RequestRecord

    rows: list = []

    class _Log:
        accepting, dropped = True, 0
        emit_request_row = rows.append

    audit_hub = AuditHub(_Log(), tracer=provider.get_tracer("b"))
    audit_hub.provider = provider
    headers = Headers(raw=[(b"content-type", b"application/json"), (b"authorization", b"Bearer x")])
    recs = []
    for i in range(n):
        rec = RequestRecord(request_id=f"r{i}", endpoint="/v1/completions", client_addr="127.0.0.1", t0=1000.0 + i)
        rec.t_auth, rec.t_parsed, rec.t_keys, rec.t_decided, rec.t_route, rec.t_end = (
            1000.0 + i + 1e-4 * k for k in range(1, 7))
        rec.status, rec.outcome, rec.tenant_id, rec.replica, rec.model = 200, "allowed", "tenant-a", "r0", "m"
        rec.prompt_tokens, rec.output_tokens = 100, 4
        recs.append(rec)
    q = proc._queue  # noqa: SLF001
    q.clear()
    t0 = time.process_time()
    for i, rec in enumerate(recs):
        if i % 100 == 0:
            q.clear()
            rows.clear()
        audit_hub.start_span(rec, headers)
        audit_hub.inject_trace_headers({}, rec)
        audit_hub.emit_request(rec)
    return hub / n * 1e6, frames / n * 1e6, (time.process_time() - t0) / n * 1e6


def request_path(baseline: Path, repeats: int, requests: int, name: str) -> str:
    """``--request-path``: :func:`_request_path_cost` in a child per tree (this one, ``baseline``),
    interleaved ``repeats`` times; medians to ``bench/results/<name>.{json,md}``. Returns the markdown."""
    import inspect
    import os
    import statistics
    import subprocess
    import sys

    src = inspect.getsource(_request_path_cost) + f"\nimport json; print(json.dumps(_request_path_cost({requests})))\n"
    trees = {"this": Path(__file__).resolve().parents[1], "baseline": baseline.resolve()}
    runs: dict[str, list[list[float]]] = {k: [] for k in trees}
    for _ in range(repeats):
        for k, tree in trees.items():
            out = subprocess.run([sys.executable, "-c", src], cwd=tree, env=dict(os.environ, PYTHONPATH=str(tree)),
                                 check=True, capture_output=True, text=True).stdout
            runs[k].append(json.loads(out.strip().splitlines()[-1]))
    med = {k: [round(statistics.median(r[i] for r in v), 2) for i in (0, 1, 2)] for k, v in runs.items()}
    doc = {"bench": "span_offload --request-path", "baseline": str(baseline), "requests": requests,
           "repeats": repeats, "median_us_per_request": med, "runs": runs}
    (OUT.parent / f"{name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    md = "\n".join([
        f"# Gateway CPU of a request's trace (`python -m bench.span_offload --request-path --baseline {baseline}`)",
        "", f"{repeats} interleaved runs of {requests} requests per tree, each in its own process; "
        "medians of process_time per request (µs).", "",
        "| tree | trace begin + traceparent + end (event-loop thread) | writer thread frame encode | "
        "hub start_span + inject + emit_request (queue drained every 100) |",
        "|---|---:|---:|---:|",
        *[f"| {k} | {v[0]} | {v[1]} | {v[2]} |" for k, v in med.items()], ""])
    (OUT.parent / f"{name}.md").write_text(md)
    return md


def main() -> None:
    ap = ClickOptions(description=__doc__.split("\n")[0])
    ap.option("--requests", type=int, default=4000, help="requests per variant (5 spans each)")
    ap.option("--repeats", type=int, default=3)
    ap.option("--request-path", is_flag=True, help="only the gateway CPU of a request's trace, this tree vs --baseline")
    ap.option("--baseline", type=click.Path(path_type=Path), default=None, help="another source tree (--request-path)")
    ap.option("--name", default="span_request", help="result file stem (--request-path)")
    args = ap.parse()
    if args.request_path:
        print(request_path(args.baseline or Path(__file__).resolve().parents[1], max(args.repeats, 5), 20000,
                           args.name))
        return
    port = free_port()
    coll = multiprocessing.get_context("spawn").Process(target=_collector, args=(port,), daemon=True)
    coll.start()
    try:
        _wait_port(port)
        endpoint = f"http://127.0.0.1:{port}/v1/traces"
        spans = args.requests * 5
        runs: dict[str, list[dict[str, Any]]] = {"baseline": [], "sdk_batch_otlp": [], "offload": []}
        for _ in range(args.repeats):  # interleaved so all variants see the same machine state
            for kind in runs:
                runs[kind].append(_run(kind, args.requests, endpoint))
        base_cpu = min(r["cpu_s"] for r in runs["baseline"])
        summary: dict[str, Any] = {}
        for kind in ("sdk_batch_otlp", "offload"):
            cpu = min(r["cpu_s"] for r in runs[kind])
            summary[kind] = {
                "process_cpu_us_per_span": round((cpu - base_cpu) / spans * 1e6, 2),
                "on_end_us_per_span": round(min(r["on_end_ns"] for r in runs[kind]) / spans / 1e3, 2),
                "dropped": max(r["dropped"] for r in runs[kind]),
            }
            if kind != "sdk_batch_otlp":
                summary[kind]["child_cpu_us_per_span"] = round(min(r["child_cpu_s"] for r in runs[kind])
                                                               / spans * 1e6, 2)
        summary["child_decode_encode_us_per_span"] = _child_work_cost(args.requests)
        summary["baseline_span_creation_cpu_us_per_span"] = round(base_cpu / spans * 1e6, 2)
        summary["sdk_encode_us_per_span"] = round(_encode_cost(args.requests), 2)
        result = {
            "bench": "span_offload", "spans_per_variant": spans, "repeats": args.repeats,
            "python": platform.python_version(), "cpus": multiprocessing.cpu_count(),
            "method": "min over repeats of time.process_time() of this process (all threads), minus the "
                      "no-processor baseline; collector and exporter child run in other processes",
            "summary": summary, "runs": runs,
        }
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(summary, indent=2))
    finally:
        coll.terminate()
        coll.join(5)


if __name__ == "__main__":
    main()
