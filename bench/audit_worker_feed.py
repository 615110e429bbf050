"""Audit worker CPU per event under a steady feed, this tree vs another, interleaved (not a test).

``python -m bench.audit_worker_feed [--baseline DIR] [--rate 800] [--seconds 6] [--rounds 4] [--spans]``

What ``bench.audit_worker_cpu``'s pipeline leaves out: the worker *process* fed as the
gateway feeds it, one request row per answer, each handed to the pipe at once
(``RemoteAuditLog.emit_request_row`` + ``flush_now``), ``--rate`` answers per second
spread evenly. Sinks: JSONL hash chain (1 s checkpoints), OCSF file, CEF over TCP,
OTLP logs over HTTP, spill (the receivers run in a child process whose CPU is not
counted). Per round one feeder process per tree (``PYTHONPATH`` = that tree, so its
``audit.remote`` and ``audit.worker`` run), rounds alternate the order. Reported: the
worker's CPU (psutil, user + system) in µs per event, and the feeder's (the gateway
side of the hand-off). Results: ``bench/results/<--name>.{json,md}``.

``--spans`` (session 9) feeds the worker as ``bench.audit_overhead``'s "on" gateway does with
OTLP tracing: the worker config gets a ``spans`` section (OTLP/HTTP to the same collector's
``/v1/traces``) and every row frame carries its span extra (``"x"``, :mod:`audit.row_spans`), so
the worker builds and exports each request's seven spans through its span exporter child,
whose CPU (psutil, user + system; the worker's child) is reported as ``exporter_us``.
``--same`` runs this tree twice per round (an A/A: the noise of the figures). ``slow sends``: sends
that ran over ``slow_send_s`` (the worker's metrics, per sink), whose events then went through the
sink's spill file (written, read back, decoded, sent again): on a loaded machine this roughly
doubles the worker's CPU per event, so the medians are also given over the rounds without any.
"""
from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _row(i: int) -> list[Any]:
    """A request row (audit.request_event.REQUEST_ROW_FIELDS) of an allowed completion."""
    t = time.perf_counter()
    return [str(uuid.uuid4()), int(time.time() * 1000), "allowed", f"{i:032x}",
            "spiffe://demo.prefixgate.test/tenant-a/bench", "demo.prefixgate.test", "tenant-a",
            str(uuid.uuid4()), "allow", "tenant may use pool", "/v1/completions", "sim-model", 100, 4, 1,
            104, 104, 100, 4, 4, "tokens", None, "r0", "default", "cache_aware", 64, 64, 64, 1200.0,
            t, t + 1e-4, t + 2e-4, t + 3e-4, t + 4e-4, t + 5e-4, t + 2e-3, t + 3e-3,
            200, "127.0.0.1", f"{i:032x}", f"{i * 7:032x}", None, 0.0, None, 3]


async def _feed(args: dict[str, Any]) -> dict[str, Any]:
    import psutil

    from audit.keys import generate_signing_key
    from audit.remote import RemoteAuditLog

    work = Path(args["work"])
    generate_signing_key(work / "audit.key")
    doc = args["config"]  # bench.audit_feed_rounds.worker_config (the parent's tree)
    spans = bool(args.get("spans"))
    log = RemoteAuditLog(doc)
    await log.start()
    worker = psutil.Process(log.worker_pid)
    me = psutil.Process()

    def emit(i: int) -> None:
        row = _row(i)
        if spans:
            log.emit_request_row(row, (0x1000 + i, 1, time.time_ns(), None, None))
        else:
            log.emit_request_row(row)
        log.flush_now()

    for i in range(200):  # warm-up
        emit(i)
        await asyncio.sleep(0.002)
    await log.drain(30)
    await asyncio.sleep(1.2)  # the span exporter child's export interval (0.5 s) and the writer's (0.2 s)
    exporter = [c for c in worker.children() if "span_exporter_proc" in " ".join(c.cmdline())]

    def cpu(procs: list[Any]) -> float:
        return sum(t.user + t.system for t in (p.cpu_times() for p in procs))

    loop = asyncio.get_running_loop()
    n = int(args["rate"] * args["seconds"])
    w0, m0, x0 = worker.cpu_times(), me.cpu_times(), cpu(exporter)
    t0 = loop.time()
    for i in range(n):
        emit(i)
        delay = t0 + (i + 1) / args["rate"] - loop.time()
        await asyncio.sleep(max(delay, 0))
    ok = await log.drain(60)
    if spans:
        await asyncio.sleep(1.2)  # the spans of the last rows reach the collector
    w1, m1, x1 = worker.cpu_times(), me.cpu_times(), cpu(exporter)
    await asyncio.sleep(1.1)  # the worker's next metrics report
    lines = [line for line in log.worker_metrics_text.decode().splitlines()
             if line.startswith("prefixgate_audit_slow_sends_total{") and not line.endswith(" 0.0")]
    slow = {line.split('"')[1]: float(line.rsplit(" ", 1)[1]) for line in lines}  # sink -> slow sends
    await log.close()
    # slow_sends: sends that ran over slow_send_s, so their events went through the spill (written, read back,
    # sent again: extra worker CPU); a loaded machine's receivers cause them, compare rounds without
    return {"events": n, "drained": ok, "dropped": log.dropped, "slow_sends": slow,
            "worker_us": round((w1.user + w1.system - w0.user - w0.system) * 1e6 / n, 1),
            "exporter_us": round((x1 - x0) * 1e6 / n, 1),
            "feeder_us": round((m1.user + m1.system - m0.user - m0.system) * 1e6 / n, 1)}


def _round(tree: Path, ports: tuple[int, int], rate: float, seconds: float, spans: bool = False,
           checkpoint_s: float = 1.0) -> dict[str, Any]:
    from bench.audit_feed_rounds import worker_config

    with tempfile.TemporaryDirectory(prefix="pg-feed-") as work:
        config = worker_config(Path(work), Path(work) / "audit.key", ports, spans=spans, checkpoint_s=checkpoint_s)
        arg = json.dumps({"work": work, "config": config, "rate": rate, "seconds": seconds, "spans": spans})
        out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", arg], cwd=str(tree),
                             env=dict(os.environ, PYTHONPATH=str(tree)), capture_output=True, check=True, timeout=300)
        return json.loads(out.stdout.splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    """CLI (see the module doc); returns 0."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        print(json.dumps(asyncio.run(_feed(json.loads(argv[1])))))
        return 0
    import click

    from bench.audit_feed_rounds import alternate_rounds, feed_trees, paired_medians
    from sim.click_options import ClickOptions

    ap = ClickOptions(description=__doc__.splitlines()[0])
    ap.option("--baseline", type=click.Path(path_type=Path, file_okay=False), default=None)
    ap.option("--rate", type=float, default=800.0, help="answers per second")
    ap.option("--seconds", type=float, default=6.0)
    ap.option("--rounds", type=int, default=4)
    ap.option("--spans", is_flag=True, help="row frames carry span extras; the worker exports the spans")
    ap.option("--checkpoint-s", type=float, default=1.0, help="JSONL checkpoint interval (bench.audit_overhead: 1)")
    ap.option("--same", is_flag=True, help="A/A: this tree twice per round (no --baseline)")
    ap.option("--name", default="audit_worker_feed")
    ap.option("--out", type=click.Path(path_type=Path), default=REPO / "bench" / "results")
    args = ap.parse(argv)
    trees = feed_trees(REPO, args.baseline, args.same)
    rows = alternate_rounds(trees, args.rounds, lambda name, tree, ports, i: _round(
        tree, ports, args.rate, args.seconds, args.spans, args.checkpoint_s))
    keys = ("worker_us", "exporter_us", "feeder_us")
    # per-round difference of each tree against the first (paired: same round, same machine state)
    med, diff = paired_medians(rows, list(trees), keys, args.rounds)
    quiet = {name: [r for r in rows if r["tree"] == name and not r.get("slow_sends")] for name in trees}
    med_quiet = {name: {k: statistics.median(r[k] for r in rs) for k in keys} if rs else None for name, rs in quiet.items()}
    result = {"rate": args.rate, "seconds": args.seconds, "spans": args.spans, "rounds": rows, "median": med,
              "median_rounds_without_slow_sends": med_quiet,
              "median_round_difference_vs_this": diff,
              "baseline": str(args.baseline) if args.baseline else None}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=2))
    md = [f"# Audit worker CPU under a steady feed ({args.rate:g} answers/s, {args.seconds:g} s x {args.rounds}"
          f"{', spans' if args.spans else ''})", "",
          "| tree | worker µs/event (median) | span exporter µs/event | feeder µs/event (median) |", "|---|---|---|---|",
          *[f"| {k} | {v['worker_us']} | {v['exporter_us']} | {v['feeder_us']} |" for k, v in med.items()], "",
          *[f"{k}, rounds without slow sends ({len(quiet[k])}): worker {v['worker_us']}, exporter {v['exporter_us']}, "
            f"feeder {v['feeder_us']} µs/event (medians)." for k, v in med_quiet.items() if v], "",
          *[f"Median per-round difference {k} − this: worker {v['worker_us']:+.1f}, exporter {v['exporter_us']:+.1f}, "
            f"feeder {v['feeder_us']:+.1f} µs/event." for k, v in diff.items()], "",
          "| round | tree | worker µs | exporter µs | feeder µs | dropped | drained | slow sends |",
          "|---|---|---|---|---|---|---|---|",
          *[f"| {r['round']} | {r['tree']} | {r['worker_us']} | {r['exporter_us']} | {r['feeder_us']} | {r['dropped']} "
            f"| {r['drained']} | {r.get('slow_sends', '')} |" for r in rows], ""]
    (args.out / f"{args.name}.md").write_text("\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
