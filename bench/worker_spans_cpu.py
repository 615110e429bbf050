"""CPU of the audit worker's span export per request, this tree vs another (not a test).

``python -m bench.worker_spans_cpu --baseline DIR [--requests 8000] [--rate 2000] [--repeats 5]``
(``--same``: A/A, this tree twice per round).

What the audit worker process does for a sampled request's spans, alone (no audit sinks, so their
slow sends and spills do not hide a few µs): in a process per tree (``PYTHONPATH`` = that tree, a
uvloop event loop as the worker has), :class:`audit.worker_spans.WorkerSpans` with ``exporter: otlp``
gets ``--requests`` request rows and span extras as the worker decodes them from its pipe
(``bench.audit_worker_feed._row``, through orjson), in bursts of 16 at ``--rate`` per second, until
an OTLP/HTTP collector in another process (not counted) has all their spans. Measured (psutil,
user + system): this process (every thread: the event loop, a span writer thread if any) and its
children (the span exporter child, when the tree has one), µs per request, from after a warm-up
to the last span's arrival. Trees interleaved per round; medians. Results:
``bench/results/<name>.{json,md}``.
"""

from __future__ import annotations

import inspect
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
from pathlib import Path

import click

from sim.procs import free_port

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"


def _collector(port: int) -> None:
    """An OTLP/HTTP traces collector counting spans (``GET /count``)."""
    from aiohttp import web
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    total = [0]

    async def traces(request: web.Request) -> web.Response:
        msg = ExportTraceServiceRequest.FromString(await request.read())
        total[0] += sum(len(ss.spans) for rs in msg.resource_spans for ss in rs.scope_spans)
        return web.Response(body=b"", content_type="application/x-protobuf")

    async def count(request: web.Request) -> web.Response:
        return web.Response(text=str(total[0]))

    app = web.Application(client_max_size=64 << 20)
    app.router.add_post("/v1/traces", traces)
    app.router.add_get("/count", count)
    web.run_app(app, host="127.0.0.1", port=port, print=None, handle_signals=True)


def _cost(n: int, rate: float, port: int) -> dict[str, float]:  # runs in a child against one tree (source via -c)
    """µs per request of this process (all threads) and of its children, for ``n`` requests."""
    import asyncio
    import time
    import urllib.request

    import orjson
    import psutil

    from audit.row_spans import row_span_record
    from audit.worker_spans import WorkerSpans
    from bench.audit_worker_feed import _row

    base = f"http://127.0.0.1:{port}"

    def collected() -> int:
        with urllib.request.urlopen(base + "/count", timeout=5) as r:
            return int(r.read())

    warm = 400
    rows = [orjson.loads(orjson.dumps({"r": _row(i), "x": (0x1000 + i, 1, time.time_ns(), None, None)}))
            for i in range(n + warm)]
    want = [len(row_span_record(f["r"], f["x"])[12]) + 1 for f in rows]

    async def main() -> dict[str, float]:
        me = psutil.Process()
        spans = WorkerSpans({"exporter": "otlp", "endpoint": base + "/v1/traces",
                             "resource": {"service.name": "prefixgate", "telemetry.sdk.language": "python"},
                             "resource_schema_url": None}, None)
        start = await asyncio.to_thread(collected)
        loop = asyncio.get_running_loop()

        async def feed(lo: int, hi: int) -> None:
            t0 = loop.time()
            for i in range(lo, hi):
                f = rows[i]
                spans.request(f["r"], f["x"])
                if (i - lo) % 16 == 15:
                    await asyncio.sleep(max(0.0, t0 + (i - lo + 1) / rate - loop.time()))

        async def arrived(total: int) -> None:
            deadline = loop.time() + 120
            while await asyncio.to_thread(collected) < total and loop.time() < deadline:
                await asyncio.sleep(0.1)

        def cpu() -> tuple[float, float]:
            own = me.cpu_times()
            kids = sum(c.cpu_times().user + c.cpu_times().system for c in me.children(recursive=True))
            return own.user + own.system, kids

        await feed(0, warm)
        await arrived(start + sum(want[:warm]))
        s0, k0 = cpu()
        await feed(warm, warm + n)
        await arrived(start + sum(want))
        s1, k1 = cpu()
        got = await asyncio.to_thread(collected) - start
        await spans.close()
        return {"self_us": round((s1 - s0) * 1e6 / n, 2), "children_us": round((k1 - k0) * 1e6 / n, 2),
                "total_us": round((s1 - s0 + k1 - k0) * 1e6 / n, 2), "spans_missing": sum(want) - got}

    try:
        import uvloop
        return uvloop.run(main())
    except ImportError:
        return asyncio.run(main())


@click.command(help=__doc__.split("\n")[0])
@click.option("--baseline", type=click.Path(path_type=Path, exists=True, file_okay=False), default=None)
@click.option("--requests", "n", type=int, default=8000)
@click.option("--rate", type=float, default=2000.0, help="requests per second")
@click.option("--repeats", type=int, default=5)
@click.option("--same", is_flag=True, help="A/A: this tree twice per round (no --baseline)")
@click.option("--name", default="worker_spans_cpu")
def main(baseline: Path | None, n: int, rate: float, repeats: int, same: bool, name: str) -> None:
    """Entry point (see the module doc)."""
    this = REPO
    trees = {"this": this, "this_again": this} if same else {"this": this, "baseline": (baseline or this).resolve()}
    port = free_port()
    coll = multiprocessing.get_context("spawn").Process(target=_collector, args=(port,), daemon=True)
    coll.start()
    src = inspect.getsource(_cost) + f"\nimport json; print(json.dumps(_cost({n}, {rate}, {port})))\n"
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in trees}
    try:
        import time
        time.sleep(1.5)  # the collector's start
        for r in range(repeats):
            order = list(trees.items()) if r % 2 == 0 else list(reversed(trees.items()))
            for k, tree in order:
                out = subprocess.run([sys.executable, "-c", src], cwd=tree, env=dict(os.environ, PYTHONPATH=str(tree)),
                                     check=True, capture_output=True, text=True).stdout
                runs[k].append(json.loads(out.strip().splitlines()[-1]))
                print(k, runs[k][-1], flush=True)
    finally:
        coll.terminate()
        coll.join(5)
    keys = ("self_us", "children_us", "total_us")
    med = {k: {m: round(statistics.median(x[m] for x in v), 2) for m in keys} for k, v in runs.items()}
    doc = {"bench": "worker_spans_cpu", "baseline": None if same else str(baseline), "requests": n, "rate": rate,
           "repeats": repeats, "median": med, "runs": runs}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    md = "\n".join([
        f"# Audit worker span export CPU per request (`python -m bench.worker_spans_cpu "
        f"{'--same' if same else '--baseline ' + str(baseline)} --requests {n} --rate {rate:g} --repeats {repeats}`)",
        "", "| tree | worker process µs/request (median) | its children µs/request | total |", "|---|---:|---:|---:|",
        *[f"| {k} | {v['self_us']} | {v['children_us']} | {v['total_us']} |" for k, v in med.items()], "",
        "| round | tree | worker | children | total | spans missing |", "|---|---|---:|---:|---:|---:|",
        *[f"| {i} | {k} | {x['self_us']} | {x['children_us']} | {x['total_us']} | {x['spans_missing']} |"
          for k, v in runs.items() for i, x in enumerate(v)], ""])
    (RESULTS / f"{name}.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
