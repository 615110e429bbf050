"""The audit worker's CPU per event split by part, in thread CPU, this tree vs another (not a test).

``python -m bench.audit_worker_parts [--baseline DIR | --same] [--events 6000] [--batch 75] [--passes 5]
[--rounds 4] [--name NAME]``

Session 28 (issue 14's audit ratio, register S27-lead-1). ``bench.audit_overhead_worker`` gives the whole
worker's CPU per event (the real ``audit.worker.main()`` fed at a rate); cProfile of it inflates call-heavy
code. Here each tree runs, in a process of its own (``PYTHONPATH`` = that tree), the parts of the worker's
per-event path on request rows shaped as ``bench.audit_overhead``'s "on" gateway sends them
(``bench.audit_overhead_worker.make_rows``, with the span extra), in batches of ``--batch`` events (one
50 ms pipe read at 1,500 answers/s), each part over the whole batch before the next part, as the worker's
sinks take their batches. Each part is timed with the calling thread's CPU clock
(``time.thread_time_ns``: preemption by other processes on the shared machine is not charged):

* ``decode``: the read chunk split into lines and each frame ``orjson.loads``-ed (the worker's read loop);
* ``request_event``: :func:`audit.request_event.request_event` of each row (with the log's instance);
* ``row_is_clean``: :func:`audit.scrub.row_is_clean` of each row;
* ``emit``: :meth:`audit.log.AuditLog.emit` of each event (``scrubbed`` as the worker passes it) into the
  sinks' queues (cleared after each batch, untimed; no delivery task runs);
* ``jsonl``: the JSONL hash-chain sink's ``send`` of the batch (canonical JSON, the chain's SHA-256, one
  ``write`` to a file under a temporary directory; checkpoints every 3600 s, so none in the window: the
  real worker signs one per second, ~0.1-0.2 µs per event at 1,500/s);
* ``ocsf``: the OCSF file sink's ``send`` (OCSF mapping, ``orjson``, one ``write``);
* ``syslog``: the CEF syslog sink's ``send`` over TCP to a receiver thread in the same process (CEF line,
  RFC 5424 header, octet-counted framing, one ``write``; the receiver's thread CPU is not counted);
* ``otlp_logs``: :func:`audit.otlp_log_request.encode_logs_request` of the batch with the OTLP log sink's
  resource and scope (the HTTP POST is not included);
* ``spans``: :func:`audit.row_spans.row_span_bytes` of each row and its span extra (the OTLP bytes of the
  request's spans; the POST is not included).

``total`` is their sum. What these leave out of the worker's figure: the event loop's wake-ups, the delivery
tasks, the HTTP exchanges (OTLP logs, spans), the status and metrics frames, the 1 s checkpoints, the GC.
Per tree and pass, µs per event for each part; per round the median over ``--passes`` passes; rounds
alternate the trees' order; reported: per tree the median over rounds and the median per-round difference
against this tree. Results: ``bench/results/<--name>.{json,md}``.
"""
from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
PARTS = ("decode", "request_event", "row_is_clean", "emit", "jsonl", "ocsf", "syslog", "otlp_logs", "spans")


def _receiver() -> int:
    """A TCP listener on loopback whose thread reads and discards what arrives; returns its port."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)

    def run() -> None:
        while True:
            conn, _ = srv.accept()
            threading.Thread(target=lambda c=conn: [None for _ in iter(lambda: c.recv(1 << 16), b"")],
                             daemon=True).start()

    threading.Thread(target=run, daemon=True).start()
    return srv.getsockname()[1]


def _child(arg: dict[str, Any]) -> dict[str, Any]:
    """Runs in the child (``PYTHONPATH`` = the tree under test; module doc)."""
    import asyncio
    import importlib.util

    import orjson

    spec = importlib.util.spec_from_file_location("_aow", arg["feed_script"])
    aow = importlib.util.module_from_spec(spec)  # this tree's row maker, whichever tree runs
    spec.loader.exec_module(aow)  # type: ignore[union-attr]

    from audit.config import build_audit
    from audit.keys import generate_signing_key
    from audit.otlp_log_request import encode_logs_request
    from audit.request_event import REQUEST_ROW_FIELDS, request_event
    from audit.row_spans import row_span_bytes
    from audit.scrub import row_is_clean

    work = Path(arg["work"])
    (work / "keys").mkdir()
    generate_signing_key(work / "keys" / "audit.key")
    port = _receiver()
    config = {
        "jsonl": {"dir": str(work / "audit"), "signing_key_file": str(work / "keys" / "audit.key"),
                  "checkpoint_s": 3600},
        "ocsf": {"file": str(work / "ocsf.jsonl")},
        "syslog": {"host": "127.0.0.1", "port": port, "protocol": "tcp", "format": "cef"},
        "otlp": {"endpoint": "http://127.0.0.1:9/v1/logs"},
        "spill": {"dir": str(work / "spill")}}
    n, batch, passes = int(arg["events"]), int(arg["batch"]), int(arg["passes"])
    fp_index = REQUEST_ROW_FIELDS.index("prefix_fingerprint")
    clock = time.thread_time_ns

    async def main() -> dict[str, Any]:
        audit = build_audit(config, input_batched=True)
        sinks = {w.sink.name: w.sink for w in audit._workers}
        jsonl, ocsf, syslog, otlp = sinks["jsonl"], sinks["ocsf"], sinks["syslog"], sinks["otlp"]
        for s in (jsonl, ocsf, syslog):
            await s.open()
        instance = audit.instance
        instance_clean = row_is_clean((instance, None), 1)
        per_pass: list[dict[str, float]] = []
        for p in range(passes + 1):  # the first pass warms up (not reported)
            chunks = [b"".join(aow._frames(aow.make_rows(batch, i), 1 + i, True)) for i in range(0, n, batch)]
            t = dict.fromkeys(PARTS, 0)
            count = 0
            for chunk in chunks:
                t0 = clock()
                frames = [orjson.loads(line) for line in chunk.split(b"\n") if line]
                t1 = clock()
                events = [request_event(f["r"], instance) for f in frames]
                t2 = clock()
                clean = [instance_clean and row_is_clean(f["r"], fp_index) for f in frames]
                t3 = clock()
                for ev, c in zip(events, clean):
                    audit.emit(ev, scrubbed=c)
                t4 = clock()
                await jsonl.send(events)
                t5 = clock()
                await ocsf.send(events)
                t6 = clock()
                await syslog.send(events)
                t7 = clock()
                encode_logs_request(events, otlp._resource, otlp._scope, time.time_ns())
                t8 = clock()
                for f in frames:
                    row_span_bytes(f["r"], f["x"])
                t9 = clock()
                for w in audit._workers:
                    w.queue.clear()
                for k, a, b in zip(PARTS, (t0, t1, t2, t3, t4, t5, t6, t7, t8), (t1, t2, t3, t4, t5, t6, t7, t8, t9)):
                    t[k] += b - a
                count += len(events)
            if p:
                per_pass.append({k: v / 1000 / count for k, v in t.items()})
        for s in (jsonl, ocsf, syslog):
            await s.close()
        out = {k: round(statistics.median(pp[k] for pp in per_pass), 3) for k in PARTS}
        out["total"] = round(statistics.median(sum(pp.values()) for pp in per_pass), 3)
        return out

    return asyncio.run(main())


def _run(tree: Path, args: Any) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="pg-awp-") as work:
        arg = {"work": work, "events": args.events, "batch": args.batch, "passes": args.passes,
               "feed_script": str(REPO / "bench" / "audit_overhead_worker.py")}
        res = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(arg)],
                             cwd=str(tree), env=dict(os.environ, PYTHONPATH=str(tree)), capture_output=True,
                             timeout=600)
        lines = res.stdout.decode().strip().splitlines()
        if res.returncode or not lines:
            raise SystemExit(f"{tree}: rc {res.returncode}\n{res.stderr.decode()[-3000:]}")
        return json.loads(lines[-1])


def main(argv: list[str] | None = None) -> int:
    """CLI (module doc); returns 0."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        print(json.dumps(_child(json.loads(argv[1]))), flush=True)
        return 0
    import click

    from bench.audit_feed_rounds import feed_trees, paired_medians
    from sim.click_options import ClickOptions

    ap = ClickOptions(description=__doc__.splitlines()[0])
    ap.option("--baseline", type=click.Path(path_type=Path, file_okay=False), default=None)
    ap.option("--same", is_flag=True, help="A/A: this tree twice per round")
    ap.option("--events", type=int, default=6000, help="events per pass")
    ap.option("--batch", type=int, default=75, help="events per read (batch)")
    ap.option("--passes", type=int, default=5, help="measured passes per run (after one warm-up pass)")
    ap.option("--rounds", type=int, default=4)
    ap.option("--name", default="audit_worker_parts")
    ap.option("--out", type=click.Path(path_type=Path), default=RESULTS)
    args = ap.parse(argv)
    trees = feed_trees(REPO, args.baseline, args.same)
    names = list(trees)
    rows: list[dict[str, Any]] = []
    load0 = os.getloadavg()
    for i in range(args.rounds):
        for name in (names if i % 2 == 0 else names[::-1]):
            r = _run(trees[name], args) | {"tree": name, "round": i}
            rows.append(r)
            print(r, flush=True)
    keys = (*PARTS, "total")
    med, diff = paired_medians(rows, names, keys, args.rounds, digits=3)
    result = {"bench": "audit_worker_parts", "events": args.events, "batch": args.batch, "passes": args.passes,
              "baseline": str(args.baseline) if args.baseline else None, "median": med,
              "median_round_difference_vs_this": diff, "runs": rows, "load_start": load0,
              "load_end": os.getloadavg()}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    md = [f"# Audit worker CPU per event by part, thread CPU ({args.events} events per pass, batches of "
          f"{args.batch}, median of {args.passes} passes per run, {args.rounds} rounds)", "",
          f"Load average at the start {tuple(round(x, 1) for x in load0)}, at the end "
          f"{tuple(round(x, 1) for x in os.getloadavg())}.", "",
          "| part | " + " | ".join(f"{t} µs/event" for t in names)
          + "".join(f" | {t} − {names[0]}" for t in names[1:]) + " |",
          "|---|" + "---:|" * (2 * len(names) - 1),
          *[f"| {k} | " + " | ".join(f"{med[t][k]:.2f}" for t in names)
            + "".join(f" | {diff[t][k]:+.2f}" for t in names[1:]) + " |" for k in keys], ""]
    (args.out / f"{args.name}.md").write_text("\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
