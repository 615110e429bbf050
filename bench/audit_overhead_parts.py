"""Gateway-side audit cost per request, call by call, this tree vs another (not a test).

``python -m bench.audit_overhead_parts [--baseline DIR] [--repeats 3] [--requests 4000]``

``bench.audit_overhead`` reads the gateway process's CPU per request with every sink and
tracing on vs ``AuditHub(None)``; on a shared 2-core machine that figure moves by tens of µs
from round to round with the machine's speed (session 12: the load generator's and the
replicas' CPU per request, which run no audit code, rise 5-18 % in the "on" rounds too). Here
each tree runs, in a process of its own, the audit hub calls of one request in the order the
gateway makes them, each timed alone (``time.perf_counter_ns``): ``start_span``,
``accepting``, ``active_alerts``, ``inject_trace_headers``, ``prepare_request``,
``emit_request``, ``hand_off`` and ``Recorder.finish`` (the request's metrics and
concentration observation), for mode **on** (:meth:`gateway.auditing.AuditHub.from_config`
with the audit worker process: JSONL chain + OCSF + spill; tracing ``otlp`` offloaded to the
worker; the exporter's collector address is a closed port, so spans are dropped at export,
after the gateway's part) and **off** (``AuditHub(None)``, no tracing: the "off" gateway of
``bench.audit_overhead``). 16 requests, then a 3 ms sleep (acknowledgements, flush timers).
Reported per tree and mode: each call's median and mean (µs; the mean holds the rare
expensive calls, e.g. a batch of ids drawn every 256 requests) and the event-loop thread's CPU
per request over the whole loop (``time.thread_time``, sleeps excluded). Trees and modes
interleaved, medians of the repeats. Results: ``bench/results/<name>.{json,md}``.
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
CALLS = ("start_span", "accepting", "active_alerts", "inject", "prepare", "emit", "hand_off", "finish")


def _parts(n: int, mode: str, work: str) -> dict[str, Any]:  # runs in a child against one tree (source sent with -c)
    """{call: [median µs, mean µs]} and ``loop_us`` (thread CPU per request) for ``n`` requests."""
    import asyncio
    import statistics
    import time
    from pathlib import Path

    from starlette.datastructures import Headers

    from gateway.auditing import AuditHub
    from gateway.metrics import GatewayMetrics
    from gateway.record import RequestRecord
    from gateway.recording import Recorder

    names = ("start_span", "accepting", "active_alerts", "inject", "prepare", "emit", "hand_off", "finish")
    headers = Headers(raw=[(b"host", b"gw"), (b"content-type", b"application/json"), (b"authorization", b"Bearer x")])
    pc = time.perf_counter_ns

    async def main() -> dict[str, Any]:
        if mode == "on":
            from audit.keys import generate_signing_key

            tmp = Path(work)
            key = tmp / "keys" / "audit-signing.key"
            key.parent.mkdir(parents=True, exist_ok=True)
            generate_signing_key(key)
            section = {"jsonl": {"dir": str(tmp / "audit"), "signing_key_file": str(key), "checkpoint_s": 1},
                       "ocsf": {"file": str(tmp / "ocsf.jsonl")},
                       "spill": {"dir": str(tmp / "spill"), "max_bytes": 1 << 26}}
            hub = AuditHub.from_config(section, tracing={"exporter": "otlp", "otlp_endpoint": "http://127.0.0.1:9/v1/traces"})
            hub.monitor.set_pool_members("default", ["r0", "r1"])
        else:
            hub = AuditHub(None)
        recorder = Recorder(GatewayMetrics(), hub)
        await hub.start()
        times: dict[str, list[int]] = {k: [] for k in names}
        try:
            for warm in (True, False):
                count = 1000 if warm else n
                if not warm:
                    times = {k: [] for k in names}
                cpu = 0.0
                for i in range(count):
                    c0 = time.thread_time()
                    rec = RequestRecord(request_id=f"r{i}", endpoint="/v1/completions", client_addr="127.0.0.1",
                                        t0=time.perf_counter())
                    a = pc(); hub.start_span(rec, headers); b = pc(); times["start_span"].append(b - a)  # noqa: E702
                    a = pc(); ok = hub.accepting; b = pc(); times["accepting"].append(b - a)  # noqa: E702
                    a = pc(); hub.active_alerts(); b = pc(); times["active_alerts"].append(b - a)  # noqa: E702
                    rec.t_auth = rec.t_parsed = rec.t_keys = rec.t_decided = time.perf_counter()
                    rec.spiffe_id, rec.trust_domain = "spiffe://demo.test/tenant-a/app", "demo.test"
                    rec.status, rec.outcome, rec.tenant_id, rec.pool, rec.replica = (
                        200, "allowed", "tenant-a", "default", f"r{i % 2}")
                    rec.model, rec.prompt_tokens, rec.predicted_prefix_tokens = "m", 100, 64
                    rec.available_prefix_tokens, rec.decision_id, rec.routing_policy = 64, "d" * 32, "prefix"
                    rec.t_route = time.perf_counter()
                    upstream: dict[str, str] = {}
                    a = pc(); hub.inject_trace_headers(upstream, rec); b = pc(); times["inject"].append(b - a)  # noqa: E702
                    a = pc(); hub.prepare_request(rec); b = pc(); times["prepare"].append(b - a)  # noqa: E702
                    rec.t_first_byte = rec.t_end = time.perf_counter()
                    rec.output_tokens, rec.delivered_prefix_tokens = 4, 64
                    a = pc(); hub.emit_request(rec); b = pc(); times["emit"].append(b - a)  # noqa: E702
                    a = pc(); recorder.hand_off(); b = pc(); times["hand_off"].append(b - a)  # noqa: E702
                    a = pc(); recorder.finish(rec); b = pc(); times["finish"].append(b - a)  # noqa: E702
                    cpu += time.thread_time() - c0
                    if i % 16 == 15 or not ok:
                        await asyncio.sleep(0.003)
                    while not hub.accepting:  # the worker fell behind (a loaded machine): let it catch up
                        await asyncio.sleep(0.01)
            assert hub.dropped == 0
        finally:
            await hub.close()
        out: dict[str, Any] = {k: [statistics.median(v) / 1000, statistics.fmean(v) / 1000] for k, v in times.items()}
        out["loop_us"] = cpu / n * 1e6
        return out

    return asyncio.run(main())


def run(baseline: Path | None, repeats: int, requests: int, name: str, out: Path) -> str:
    """:func:`_parts` in a child per tree and mode, interleaved ``repeats`` times (order alternating);
    medians to ``out/<name>.{json,md}``. Returns the markdown."""
    import tempfile

    src = "from __future__ import annotations\n" + inspect.getsource(_parts) + (
        "\nimport json, sys; print(json.dumps(_parts(int(sys.argv[1]), sys.argv[2], sys.argv[3])))\n")
    trees = {"this": REPO} | ({"baseline": baseline.resolve()} if baseline is not None else {})
    runs: dict[str, list[dict[str, Any]]] = {f"{t}/{m}": [] for t in trees for m in ("on", "off")}
    for r in range(repeats):
        order = list(runs) if r % 2 == 0 else list(reversed(runs))
        for key in order:
            tree, mode = key.split("/")
            with tempfile.TemporaryDirectory(prefix="pg-parts-") as work:
                env = dict(os.environ, PYTHONPATH=str(trees[tree]), PYTHONDONTWRITEBYTECODE="1")
                res = subprocess.run([sys.executable, "-c", src, str(requests), mode, work], cwd=trees[tree], env=env,
                                     capture_output=True, text=True)
            if res.returncode:
                raise SystemExit(f"{key} failed:\n{res.stderr[-3000:]}")
            runs[key].append(json.loads(res.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1}/{repeats} {key}: loop {runs[key][-1]['loop_us']:.1f} µs/req", flush=True)
    med: dict[str, dict[str, Any]] = {}
    for key, v in runs.items():
        med[key] = {c: [round(statistics.median(x[c][0] for x in v), 2), round(statistics.median(x[c][1] for x in v), 2)]
                    for c in CALLS}
        med[key]["loop_us"] = round(statistics.median(x["loop_us"] for x in v), 1)
    doc = {"bench": "audit_overhead_parts", "baseline": str(baseline) if baseline else None, "requests": requests,
           "repeats": repeats, "median": med, "runs": runs, "cpus": os.cpu_count(), "load": os.getloadavg()}
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    cols = list(med)
    md = "\n".join([
        "# Gateway-side audit cost per request, call by call (`python -m bench.audit_overhead_parts"
        + (f" --baseline {baseline}" if baseline else "") + "`)",
        "", f"{repeats} interleaved runs of {requests} requests per tree and mode, each in its own process; "
        f"medians of the runs, µs per request: each call's median / mean. Load average at the end: "
        f"{tuple(round(x, 1) for x in os.getloadavg())}.", "",
        "| call | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols),
        *[f"| {c} | " + " | ".join(f"{med[k][c][0]:.2f} / {med[k][c][1]:.2f}" for k in cols) + " |" for c in CALLS],
        "| sum of means | " + " | ".join(f"{sum(med[k][c][1] for c in CALLS):.2f}" for k in cols) + " |",
        "| loop thread CPU | " + " | ".join(f"{med[k]['loop_us']:.1f}" for k in cols) + " |", ""])
    (out / f"{name}.md").write_text(md)
    return md


@click.command(help=__doc__.split("\n")[0])
@click.option("--baseline", type=click.Path(path_type=Path, file_okay=False), default=None)
@click.option("--repeats", type=int, default=3)
@click.option("--requests", type=int, default=4000)
@click.option("--name", default="audit_overhead_parts")
@click.option("--out", type=click.Path(path_type=Path), default=RESULTS)
def main(baseline: Path | None, repeats: int, requests: int, name: str, out: Path) -> None:
    """Entry point (module doc)."""
    print(run(baseline, repeats, requests, name, out))


if __name__ == "__main__":
    main()
