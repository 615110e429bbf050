"""Micro-benchmark: CPU per event of each stage of the audit worker.

``python -m bench.audit_worker_cpu [--events N] [--reps R] [--out FILE]``

Builds ``N`` deterministic inference events (every field set as
``gateway/auditing.py`` ``record_request`` sets them) and measures process CPU
time (``time.process_time_ns``; microseconds per event, best of ``R``
repetitions) of each stage the worker runs, in isolation:

* ``from_dict``: :meth:`audit.event.AuditEvent.from_dict` of the pipe dict
* ``scrub_event``: :func:`audit.scrub.scrub_event`
* ``to_dict``: :meth:`AuditEvent.to_dict`
* ``jsonl_record``: ``to_json`` + :func:`audit.chain.encode_record` (the JSONL sink's
  ``_event_line``; sha256 inside ``encode_record``)
* ``ocsf``: :func:`audit.ocsf.to_ocsf` + ``orjson.dumps`` (OCSF file sink)
* ``syslog_cef``: :func:`audit.cef.format_cef` + :func:`audit.syslog.format_rfc5424`
  + octet-counted framing (syslog sink)
* ``otlp_build``: share of :func:`audit.otlp.build_request` per event (batch of 512,
  shared ``to_json`` cache, :mod:`audit.encoded`, cleared first) + ``SerializeToString``
* ``pipeline``: the whole worker path, ``from_dict`` + :meth:`audit.log.AuditLog.emit`
  through ``drain`` with JSONL + OCSF + syslog (TCP) + OTLP (HTTP) sinks built by
  :func:`audit.config.build_audit`. The TCP syslog receiver and the OTLP collector run
  in a child process so their CPU is not counted.

Results go to ``bench/results/audit_worker_cpu.json`` (or ``--out``). This is a
benchmark, not a test: numbers depend on the machine.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import multiprocessing as mp
import platform
import random
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import click
import orjson

from audit.cef import format_cef
from audit.chain import encode_record
from audit.encoded import _SHARED
from audit.event import AuditEvent, Identity, Kind, Latencies, Outcome, PolicyInfo, RouteInfo
from audit.ocsf import to_ocsf
from audit.otlp import SCOPE_NAME, build_request, build_resource
from audit.scrub import scrub_event
from audit.syslog import format_rfc5424, frame_octet_counted
from bench.harness import best_cpu_us
from sim.click_options import ClickOptions

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "audit_worker_cpu.json"
_BASE_MS = 1_735_787_045_678  # 2025-01-02T03:04:05.678Z


def make_events(n: int, seed: int = 7) -> list[AuditEvent]:
    """``n`` deterministic inference events shaped like ``record_request``'s
    (mostly allowed; some denied / rate limited / failed)."""
    rng = random.Random(seed)
    outcomes = [Outcome.ALLOWED] * 16 + [Outcome.DENIED, Outcome.RATE_LIMITED, Outcome.FAILED, Outcome.CANCELLED]
    events = []
    for i in range(n):
        tenant = f"tenant-{rng.randrange(8)}"
        outcome = rng.choice(outcomes)
        prompt = rng.randrange(50, 4000)
        matched = rng.randrange(0, prompt)
        total = rng.uniform(20, 900)
        events.append(AuditEvent(
            kind=Kind.INFERENCE,
            outcome=outcome,
            time_ms=_BASE_MS + i * 3 + rng.randrange(3),
            event_id=str(uuid.UUID(int=rng.getrandbits(128), version=4)),
            request_id=f"req-{rng.getrandbits(64):016x}",
            identity=Identity(f"spiffe://prod.example.org/ns/{tenant}/sa/client", "prod.example.org"),
            tenant=tenant,
            policy=PolicyInfo(str(uuid.UUID(int=rng.getrandbits(128), version=4)),
                              "allow" if outcome is Outcome.ALLOWED else "tenant_pool_denied",
                              "tenant may use pool" if outcome is Outcome.ALLOWED else "pool not allowed"),
            endpoint="/v1/chat/completions",
            model="llama-3.1-8b-instruct",
            prompt_tokens=prompt,
            output_tokens=rng.randrange(1, 512),
            route=RouteInfo(f"replica-{rng.randrange(4)}", "pool-a", "prefix_load", prompt, matched, matched,
                            float(rng.randrange(0, 20000))),
            latency=Latencies(rng.uniform(0.05, 0.5), rng.uniform(0.05, 0.5), rng.uniform(0.05, 0.5),
                              rng.uniform(0.1, 2.0), rng.uniform(0.01, 0.3), rng.uniform(10, 300), total),
            status_code=200 if outcome is Outcome.ALLOWED else 403,
            client_address=f"10.0.{rng.randrange(256)}.{rng.randrange(256)}",
            trace_id=f"{rng.getrandbits(128):032x}",
            prefix_fingerprint=f"{rng.getrandbits(128):032x}",
        ))
    return events


def stage_costs(events: list[AuditEvent], reps: int) -> dict[str, float]:
    """Microseconds of CPU per event for each isolated stage (best of ``reps``)."""
    n = len(events)
    dicts = [orjson.loads(ev.to_json()) for ev in events]
    resource = build_resource("prefixgate")
    from opentelemetry.proto.common.v1 import common_pb2

    scope = common_pb2.InstrumentationScope(name=SCOPE_NAME, version="bench")

    def from_dict() -> None:
        for d in dicts:
            AuditEvent.from_dict(d)

    def scrub() -> None:
        for ev in events:
            scrub_event(ev)

    def to_dict() -> None:
        for ev in events:
            ev.to_dict()

    def jsonl() -> None:
        prev = "0" * 64
        for seq, ev in enumerate(events, 1):
            _line, prev = encode_record(seq, "event", prev, ev.to_json())

    def ocsf() -> None:
        for ev in events:
            orjson.dumps(to_ocsf(ev), option=orjson.OPT_SORT_KEYS)

    def syslog() -> None:
        for ev in events:
            frame_octet_counted(format_rfc5424(ev, format_cef(ev), "bench-host"))

    def otlp() -> None:
        _SHARED.clear()  # the JSONL sink's encodings are not there in this isolated stage
        for i in range(0, n, 512):
            build_request(events[i:i + 512], resource, scope, 1).SerializeToString()

    stages = {"from_dict": from_dict, "scrub_event": scrub, "to_dict": to_dict, "jsonl_record": jsonl,
              "ocsf": ocsf, "syslog_cef": syslog, "otlp_build": otlp}
    return {name: round(best_cpu_us(fn, reps, n), 3) for name, fn in stages.items()}


def _receivers(conn: Any) -> None:
    """Child process: a TCP syslog receiver and an OTLP/HTTP collector on
    loopback; sends ``(syslog_port, otlp_port)`` then serves until killed."""
    from aiohttp import web

    async def main() -> None:
        async def syslog_conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while await reader.read(1 << 16):
                pass
            writer.close()

        server = await asyncio.start_server(syslog_conn, "127.0.0.1", 0)

        async def handle(request: web.Request) -> web.Response:
            await request.read()
            return web.Response(status=200, content_type="application/x-protobuf", body=b"")

        app = web.Application()
        app.router.add_post("/v1/logs", handle)
        app.router.add_post("/v1/traces", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        conn.send((server.sockets[0].getsockname()[1], site._server.sockets[0].getsockname()[1]))  # type: ignore[union-attr]
        await asyncio.Event().wait()

    asyncio.run(main())


async def _pipeline_once(dicts: list[dict[str, Any]], syslog_port: int, otlp_port: int) -> float:
    from prometheus_client import CollectorRegistry

    from audit.config import build_audit
    from audit.keys import generate_signing_key

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        generate_signing_key(work / "signing.key")
        (work / "logs").mkdir()
        config = {
            "jsonl": {"dir": str(work / "logs"), "signing_key_file": str(work / "signing.key")},
            "ocsf": {"file": str(work / "ocsf.jsonl")},
            "syslog": {"host": "127.0.0.1", "port": syslog_port, "protocol": "tcp", "format": "cef"},
            "otlp": {"endpoint": f"http://127.0.0.1:{otlp_port}/v1/logs"},
            "spill": {"dir": str(work / "spill")},
            "summary": False,
        }
        audit = build_audit(config, registry=CollectorRegistry())
        await audit.start()
        await audit.drain(10.0)
        t0 = time.process_time_ns()
        for i, d in enumerate(dicts):
            audit.emit(AuditEvent.from_dict(d))
            if i % 256 == 255:  # the worker yields once per read chunk
                await asyncio.sleep(0)
        ok = await audit.drain(60.0)
        dt = time.process_time_ns() - t0
        await audit.close(10.0)
        if not ok or audit.dropped:
            raise RuntimeError("pipeline did not deliver every event")
        return dt / len(dicts) / 1000.0


def pipeline_cost(events: list[AuditEvent], reps: int) -> float:
    """Microseconds of CPU per event of the whole worker path (best of ``reps``)."""
    dicts = [orjson.loads(ev.to_json()) for ev in events]
    parent, child = mp.Pipe()
    proc = mp.get_context("spawn").Process(target=_receivers, args=(child,), daemon=True)
    proc.start()
    try:
        syslog_port, otlp_port = parent.recv()
        return round(min(asyncio.run(_pipeline_once(dicts, syslog_port, otlp_port)) for _ in range(reps)), 3)
    finally:
        proc.kill()
        proc.join(5)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; prints and writes the JSON result."""
    ap = ClickOptions(description=__doc__.splitlines()[0])
    ap.option("--events", type=int, default=5000)
    ap.option("--reps", type=int, default=5)
    ap.option("--pipeline-reps", type=int, default=3)
    ap.option("--out", type=click.Path(path_type=Path), default=DEFAULT_OUT)
    ap.option("--label", default="")
    args = ap.parse(argv)
    events = make_events(args.events)
    digest = hashlib.sha256(b"".join(ev.to_json() for ev in events)).hexdigest()[:16]
    result: dict[str, Any] = {
        "label": args.label,
        "events": args.events,
        "events_sha256_16": digest,
        "unit": "us_cpu_per_event",
        "python": platform.python_version(),
        "machine": platform.machine(),
        "stages": stage_costs(events, args.reps),
        "pipeline": pipeline_cost(events, args.pipeline_reps),
    }
    text = json.dumps(result, indent=2)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
