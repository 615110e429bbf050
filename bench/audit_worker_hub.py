"""Gateway-process CPU of the audit trail per request, this tree vs another (not a test).

``python -m bench.audit_worker_hub --baseline DIR [--repeats 5] [--requests 20000]``

The full ``bench.audit_overhead`` does not resolve differences of a few tens of µs of gateway CPU
on a shared machine (an A/A of two identical trees read 36 µs and 0.19 apart in session 8). Here
each tree runs, in a process of its own, what the gateway's event loop does for the audit trail
of one request, with the real parts: :meth:`gateway.auditing.AuditHub.from_config` with the
audit worker process (JSONL chain + OCSF + spill), tracing ``otlp`` with offload (to a dummy
collector in this process, answering 200 with an empty response), and per request ``start_span``,
``accepting``, ``active_alerts``, ``inject_trace_headers``, ``emit_request``, ``hand_off`` (the
durability writes) and ``observe_request``, sleeping 4 ms every 16 requests (acks, flush timers;
at most ~4,000 requests/s, a rate the worker keeps up with; while the trail does not accept, it
waits). Measured: the process's own CPU (psutil user + system, every thread: the event
loop's and the span writer thread if any; not the children) and the event-loop thread's alone
(``time.thread_time``), µs per request; trees interleaved, medians. Results:
``bench/results/<name>.{json,md}``.
"""

from __future__ import annotations

import inspect
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import click

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"


def _hub_cost(n: int, work: str, endpoint: str) -> list[float]:  # runs in a child against one tree (source sent with -c)
    """[process CPU µs/request (all threads), event-loop thread CPU µs/request] for ``n`` requests."""
    import asyncio
    import time
    from pathlib import Path

    import psutil

    from audit.keys import generate_signing_key
    from gateway.auditing import AuditHub
    from gateway.record import RequestRecord

    tmp = Path(work)
    key = tmp / "keys" / "audit-signing.key"
    key.parent.mkdir(parents=True, exist_ok=True)
    generate_signing_key(key)
    section = {"jsonl": {"dir": str(tmp / "audit"), "signing_key_file": str(key), "checkpoint_s": 1},
               "ocsf": {"file": str(tmp / "ocsf.jsonl")}, "spill": {"dir": str(tmp / "spill"), "max_bytes": 1 << 26}}
    async def main() -> list[float]:
        hub = AuditHub.from_config(section, tracing={"exporter": "otlp", "otlp_endpoint": endpoint})
        hub.monitor.set_pool_members("default", ["r0", "r1"])
        await hub.start()
        me = psutil.Process()
        try:
            for warm in (True, False):
                count = 2000 if warm else n
                await asyncio.sleep(0.2)
                c0, t0 = me.cpu_times(), time.thread_time()
                for i in range(count):
                    rec = RequestRecord(request_id=f"r{i}", endpoint="/v1/completions", client_addr="127.0.0.1",
                                        t0=time.perf_counter())
                    hub.start_span(rec, {})
                    while not hub.accepting:  # the worker fell behind (a loaded machine): let it catch up
                        await asyncio.sleep(0.05)
                    hub.active_alerts()
                    hub.inject_trace_headers({}, rec)
                    rec.t_auth = rec.t_parsed = rec.t_keys = rec.t_decided = rec.t_route = time.perf_counter()
                    rec.t_first_byte = rec.t_end = time.perf_counter()
                    rec.status, rec.outcome, rec.tenant_id, rec.pool, rec.replica = (
                        200, "allowed", "tenant-a", "default", f"r{i % 2}")
                    rec.model, rec.prompt_tokens, rec.output_tokens, rec.predicted_prefix_tokens = "m", 100, 1, 64
                    rec.delivered_prefix_tokens, rec.decision_id = 64, "d" * 32
                    hub.emit_request(rec)
                    hub.hand_off()
                    hub.observe_request(rec)
                    if i % 16 == 15:  # at most ~4,000 requests/s: the worker keeps up (backlog and age stay low)
                        await asyncio.sleep(0.004)
                c1, t1 = me.cpu_times(), time.thread_time()
            assert hub.dropped == 0
            return [((c1.user + c1.system) - (c0.user + c0.system)) / n * 1e6, (t1 - t0) / n * 1e6]
        finally:
            await hub.close()

    return asyncio.run(main())


def run(baseline: Path, repeats: int, requests: int, name: str, out: Path) -> str:
    """:func:`_hub_cost` in a child per tree (this one, ``baseline``), interleaved ``repeats`` times
    (order alternating); medians to ``out/<name>.{json,md}``. Returns the markdown."""
    import tempfile

    import http.server
    import threading

    class _Collector(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 -- http.server's name
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    src = inspect.getsource(_hub_cost) + (
        "\nimport json, sys; print(json.dumps(_hub_cost(int(sys.argv[1]), sys.argv[2], sys.argv[3])))\n")
    trees = {"this": REPO, "baseline": baseline.resolve()}
    runs: dict[str, list[list[float]]] = {k: [] for k in trees}
    for r in range(repeats):
        for k in (list(trees) if r % 2 == 0 else list(reversed(trees))):
            with tempfile.TemporaryDirectory(prefix="pg-hub-") as work:
                env = dict(os.environ, PYTHONPATH=str(trees[k]))
                res = subprocess.run([sys.executable, "-c", src, str(requests), work, endpoint], cwd=trees[k], env=env,
                                     capture_output=True, text=True)
            if res.returncode:
                raise SystemExit(f"{k} failed:\n{res.stderr[-3000:]}")
            runs[k].append(json.loads(res.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1}/{repeats} {k}: process {runs[k][-1][0]:.1f} µs/req, "
                  f"event loop {runs[k][-1][1]:.1f}", flush=True)
    server.shutdown()
    med = {k: [round(statistics.median(x[i] for x in v), 1) for i in (0, 1)] for k, v in runs.items()}
    doc = {"bench": "audit_worker_hub", "baseline": str(baseline), "requests": requests, "repeats": repeats,
           "median_us_per_request": med, "runs": runs, "cpus": os.cpu_count(), "load": os.getloadavg()}
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    md = "\n".join([
        f"# Gateway-process CPU of the audit trail per request (`python -m bench.audit_worker_hub --baseline {baseline}`)",
        "", f"{repeats} interleaved runs of {requests} requests per tree, each in its own process; medians "
        f"(µs per request). Load average at the end: {tuple(round(x, 1) for x in os.getloadavg())}.", "",
        "| tree | process CPU, all threads | event-loop thread |", "|---|---:|---:|",
        *[f"| {k} | {v[0]} | {v[1]} |" for k, v in med.items()], ""])
    (out / f"{name}.md").write_text(md)
    return md


@click.command(help=__doc__.split("\n")[0])
@click.option("--baseline", type=click.Path(path_type=Path, file_okay=False), required=True)
@click.option("--repeats", type=int, default=5)
@click.option("--requests", type=int, default=20000)
@click.option("--name", default="audit_worker_hub")
@click.option("--out", type=click.Path(path_type=Path), default=RESULTS)
def main(baseline: Path, repeats: int, requests: int, name: str, out: Path) -> None:
    """Entry point (module doc)."""
    print(run(baseline, repeats, requests, name, out))


if __name__ == "__main__":
    main()
