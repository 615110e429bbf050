"""The audit worker's CPU per event, this tree vs another, as ``bench.audit_overhead``'s "on" gateway feeds it (not a test).

``python -m bench.audit_overhead_worker [--baseline DIR] [--same] [--rate 1000] [--events 6000] [--rounds 6]
[--sinks all|overhead] [--profile DIR]``

``--sinks overhead`` (session 13): the sinks ``bench.overhead``'s PrefixGate has instead (``sim.demo``'s
audit section: JSONL hash chain with 10 s checkpoints, OCSF file, spill; no syslog, no OTLP, no spans, so
the frames carry no span extra).

Each run is one process per tree (``PYTHONPATH`` = that tree, started with THIS tree's script) that runs
that tree's real ``audit.worker.main()`` on its main thread, with its stdin and stdout replaced by pipes:
a feeder thread writes the config line (``bench.audit_overhead``'s "on" audit section: JSONL hash chain
with 1 s checkpoints, OCSF file, CEF over TCP syslog, OTLP logs, spill, flood summaries, and the
``spans`` section of OTLP tracing) and then request-row frames with their span extras, byte for byte as
``audit.remote.RemoteAuditLog`` writes them, ``--rate`` answers per second, one frame at a time; a
drain thread reads the status frames (acks). The syslog receiver and the OTLP collector (logs and
traces) run in another process (not counted). Measured over a fixed window (the feed plus ``--tail``
seconds, so the worker's fixed per-second costs count at this rate): the process's CPU
(``time.process_time``) minus the feeder's and the drain thread's own CPU
(``pthread_getcpuclockid``), i.e. the worker's CPU in all its threads, in µs per event; also its
main (event-loop) thread alone, and (session 28) the whole process's system CPU and minor page faults
per event (``getrusage``; the feeder's and drain thread's pipe writes and reads included) and its peak
resident size (``maxrss_mib``, the bench's prepared frames included). Rounds alternate the order of the trees; ``--same`` is an A/A (this
tree twice). ``--profile DIR``: cProfile of the worker's main thread on the thread-CPU clock, one
``.prof`` per run (whole run, warm-up and close included; compare shares). Results:
``bench/results/<--name>.{json,md}``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
_TENANTS = [f"tenant-{c}" for c in "abcdefgh"]


def make_rows(n: int, first: int = 0) -> list[list[Any]]:
    """``n`` request rows (audit.request_event.REQUEST_ROW_FIELDS) shaped like the gateway's in
    ``bench.audit_overhead`` (8 tenants, two replicas, one denial in 20), fresh ids and times."""
    rows = []
    now_ms = int(time.time() * 1000)
    for i in range(first, first + n):
        t = time.perf_counter()
        tenant = _TENANTS[i % 8]
        denied = i % 20 == 19
        rows.append([
            str(uuid.uuid4()), now_ms + i, "denied" if denied else "allowed", uuid.uuid4().hex,
            f"spiffe://demo.prefixgate.test/{tenant}/bench", "demo.prefixgate.test", tenant,
            uuid.uuid4().hex, "model_not_allowed" if denied else "allow",
            "model not in tenant allow-list" if denied else "tenant may use pool",
            "/v1/completions", "sim-model", 100, None if denied else 4, 1,
            104, 100 if denied else 104, 100, 0 if denied else 4, 0 if denied else 4, "refused" if denied else "usage",
            None, None if denied else f"r{i % 2}", "default", "cache_aware", 64, None if denied else 64,
            None if denied else 64, None if denied else 1200.0,
            t, t + 1e-4, t + 2e-4, t + 3e-4, t + 4e-4, None if denied else t + 5e-4,
            None if denied else t + 2e-3, t + 3e-3,
            403 if denied else 200, "127.0.0.1", uuid.uuid4().hex, f"{(i * 7919) % (1 << 64):016x}" * 2,
            None if denied else 1234.5, None if denied else 0.0, None, None])
    return rows


def _frames(rows: list[list[Any]], first_seq: int, spans: bool = True) -> list[bytes]:
    import orjson

    out = []
    for k, row in enumerate(rows):
        frame: dict[str, Any] = {"t": "r", "s": first_seq + k, "r": row}
        if spans:  # the span extra (only when the worker builds the request spans)
            frame["x"] = (0x1000 + first_seq + k, 1, time.time_ns(), None, None)
        out.append(orjson.dumps(frame, option=orjson.OPT_APPEND_NEWLINE))
    return out


def _thread_cpu(ident: int) -> float:
    return time.clock_gettime(time.pthread_getcpuclockid(ident))


def _child(arg: dict[str, Any]) -> dict[str, Any]:
    """Runs in the child (PYTHONPATH = the tree under test): the worker on this thread, fed (module doc)."""
    import resource

    import orjson

    work = Path(arg["work"])
    r0, w0 = os.pipe()
    r1, w1 = os.pipe()
    result_fd = os.dup(1)
    os.dup2(r0, 0)
    os.close(r0)
    os.dup2(w1, 1)
    os.close(w1)

    from audit.keys import generate_signing_key

    (work / "keys").mkdir()
    generate_signing_key(work / "keys" / "audit.key")
    config = arg["config"]  # bench.audit_feed_rounds.worker_config (the parent's tree)
    warm, n, rate = int(arg["warmup"]), int(arg["events"]), float(arg["rate"])
    spans = bool(arg.get("spans", True))
    warm_frames = _frames(make_rows(warm), 1, spans)
    frames = _frames(make_rows(n, warm), warm + 1, spans)
    state: dict[str, Any] = {"ack": 0, "ready": threading.Event(), "metrics": b"", "closed": threading.Event()}
    out: dict[str, Any] = {}
    main_ident = threading.get_ident()
    import gc

    gcs = {"on": False, "t0": 0.0, "s": 0.0, "n": [0, 0, 0]}

    def gccb(phase: str, info: dict) -> None:  # time in the cyclic GC (worker thread) inside the window
        if threading.get_ident() != main_ident or not gcs["on"]:
            return
        if phase == "start":
            gcs["t0"] = time.thread_time()
        else:
            gcs["s"] += time.thread_time() - gcs["t0"]
            gcs["n"][info["generation"]] += 1

    gc.callbacks.append(gccb)

    def drain() -> None:
        buf = b""
        while True:
            data = os.read(r1, 1 << 16)
            if not data:
                break
            lines = (buf + data).split(b"\n")
            buf = lines.pop()
            for line in lines:
                f = orjson.loads(line)
                t = f.get("t")
                if t == "status":
                    state["ack"] = f["ack"]
                    state["dropped"] = f["dropped"]
                elif t == "ready":
                    state["ready"].set()
                elif t == "metrics":
                    state["metrics"] = f["text"]
                elif t == "error":
                    out["error"] = f
                    state["ready"].set()
                elif t == "closed":
                    state["closed"].set()

    def feed(batch: list[bytes]) -> None:
        t0 = time.monotonic()
        for i, fr in enumerate(batch):
            os.write(w0, fr)
            delay = t0 + (i + 1) / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)

    def wait_ack(seq: int, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while state["ack"] < seq and time.monotonic() < end:
            time.sleep(0.01)
        return state["ack"] >= seq

    def feeder() -> None:
        me = threading.get_ident()
        drainer_ident = drainer.ident
        try:
            os.write(w0, orjson.dumps(config) + b"\n")
            state["ready"].wait(60)
            if "error" in out:
                return
            feed(warm_frames)
            wait_ack(warm, 30)
            time.sleep(1.2)  # the metrics report and the OTLP/span lingers of the warm-up
            p0, m0, f0, d0 = time.process_time(), _thread_cpu(main_ident), _thread_cpu(me), _thread_cpu(drainer_ident)
            ru0 = resource.getrusage(resource.RUSAGE_SELF)
            w_start = time.monotonic()
            gcs["on"] = True
            feed(frames)
            fed_s = time.monotonic() - w_start
            time.sleep(max(0.0, w_start + n / rate + float(arg["tail"]) - time.monotonic()))
            p1, m1, f1, d1 = time.process_time(), _thread_cpu(main_ident), _thread_cpu(me), _thread_cpu(drainer_ident)
            ru1 = resource.getrusage(resource.RUSAGE_SELF)
            gcs["on"] = False
            out.update({
                "gc_us": round(gcs["s"] * 1e6 / n, 2), "gc_n": gcs["n"],
                "acked_in_window": state["ack"] >= warm + n,
                "worker_us": round(((p1 - p0) - (f1 - f0) - (d1 - d0)) * 1e6 / n, 2),
                "main_thread_us": round((m1 - m0) * 1e6 / n, 2),
                "feeder_us": round((f1 - f0) * 1e6 / n, 2),
                "fed_s": round(fed_s, 3),
                # the whole process (the feeder and drain threads too: their system time is their writes
                # and reads of the pipes): system CPU and minor page faults per event (session 28)
                "process_sys_us": round((ru1.ru_stime - ru0.ru_stime) * 1e6 / n, 2),
                "minflt_per_event": round((ru1.ru_minflt - ru0.ru_minflt) / n, 3),
                "maxrss_mib": round(ru1.ru_maxrss / 1024, 1),  # peak resident size (the bench's frames included)
            })
            out["all_acked"] = wait_ack(warm + n, 30)
            time.sleep(1.1)
            slow = [ln for ln in str(state["metrics"]).splitlines()
                    if ln.startswith("prefixgate_audit_slow_sends_total{") and not ln.endswith(" 0.0")]
            out["slow_sends"] = {ln.split('"')[1]: float(ln.rsplit(" ", 1)[1]) for ln in slow}
            out["dropped"] = state.get("dropped")
        finally:
            os.write(w0, b'{"t":"close","timeout":10}\n')
            os.close(w0)

    drainer = threading.Thread(target=drain, daemon=True)
    drainer.start()
    threading.Thread(target=feeder, daemon=True).start()
    from audit import worker

    prof = None
    if arg.get("profile"):
        import cProfile

        prof = cProfile.Profile(time.thread_time_ns, 1e-9)
        prof.enable()
    rc = worker.main()
    if prof is not None:
        prof.disable()
        prof.dump_stats(arg["profile"])
    state["closed"].wait(5)
    out["rc"] = rc
    os.write(result_fd, json.dumps(out).encode() + b"\n")
    return out


def _run(tree: Path, ports: tuple[int, int], args: Any, profile: str | None) -> dict[str, Any]:
    from bench.audit_feed_rounds import worker_config

    with tempfile.TemporaryDirectory(prefix="pg-aow-") as work:
        config = worker_config(Path(work), Path(work) / "keys" / "audit.key", ports, spans=True)
        if args.sinks == "overhead":  # bench.overhead's PrefixGate (sim.demo.gateway_config): chain, OCSF, spill
            config = {"jsonl": config["jsonl"] | {"checkpoint_s": 10}, "ocsf": config["ocsf"],
                      "spill": config["spill"]}
        arg = {"work": work, "config": config, "rate": args.rate,
               "events": args.events, "warmup": args.warmup, "tail": args.tail, "profile": profile,
               "spans": args.sinks == "all"}
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
        _child(json.loads(argv[1]))
        return 0
    import click

    from bench.audit_feed_rounds import alternate_rounds, feed_trees, paired_medians
    from sim.click_options import ClickOptions

    ap = ClickOptions(description=__doc__.splitlines()[0])
    ap.option("--baseline", type=click.Path(path_type=Path, file_okay=False), default=None)
    ap.option("--same", is_flag=True, help="A/A: this tree twice per round")
    ap.option("--rate", type=float, default=1000.0, help="answers per second")
    ap.option("--events", type=int, default=6000, help="events in each measured window")
    ap.option("--warmup", type=int, default=500)
    ap.option("--tail", type=float, default=1.0, help="seconds after the feed inside the window")
    ap.option("--rounds", type=int, default=6)
    ap.option("--sinks", type=click.Choice(["all", "overhead"]), default="all",
              help="all: bench.audit_overhead's \"on\" sinks and spans; overhead: bench.overhead's (JSONL chain, "
                   "OCSF file, spill)")
    ap.option("--profile", type=click.Path(path_type=Path, file_okay=False), default=None)
    ap.option("--name", default="audit_overhead_worker")
    ap.option("--out", type=click.Path(path_type=Path), default=RESULTS)
    args = ap.parse(argv)
    trees = feed_trees(REPO, args.baseline, args.same)

    def run(name: str, tree: Path, ports: tuple[int, int], i: int) -> dict[str, Any]:
        prof = None
        if args.profile:
            args.profile.mkdir(parents=True, exist_ok=True)
            prof = str(args.profile.resolve() / f"{name}-{i}.prof")
        return _run(tree, ports, args, prof)

    rows = alternate_rounds(trees, args.rounds, run)
    names = list(trees)
    med, diff = paired_medians(rows, names, ("worker_us", "main_thread_us"), args.rounds, digits=2)
    lower = {t: sum(1 for i in range(args.rounds)
                    if next(r["worker_us"] for r in rows if r["tree"] == names[0] and r["round"] == i)
                    < next(r["worker_us"] for r in rows if r["tree"] == t and r["round"] == i)) for t in names[1:]}
    result = {"bench": "audit_overhead_worker", "sinks": args.sinks, "rate": args.rate, "events": args.events, "tail_s": args.tail,
              "baseline": str(args.baseline) if args.baseline else None, "median": med,
              "median_round_difference_vs_this": diff, "rounds_this_lower": lower, "runs": rows,
              "load_end": os.getloadavg(), "cpus": os.cpu_count()}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    md = [f"# Audit worker CPU per event, fed as bench.audit_overhead's \"on\" gateway ({args.rate:g}/s, "
          f"{args.events} events + {args.tail:g} s per window, {args.rounds} rounds, sinks {args.sinks})", "",
          f"Load average at the end: {tuple(round(x, 1) for x in os.getloadavg())}.", "",
          "| tree | worker µs/event, all threads (median) | event-loop thread µs/event |", "|---|---:|---:|",
          *[f"| {t} | {v['worker_us']} | {v['main_thread_us']} |" for t, v in med.items()], "",
          *[f"Median per-round difference {t} − {names[0]}: worker {v['worker_us']:+.2f}, main thread "
            f"{v['main_thread_us']:+.2f} µs/event; {names[0]} lower in {lower[t]} of {args.rounds} rounds."
            for t, v in diff.items()], "",
          "| round | tree | worker µs | main thread µs | process system µs | minor faults/event | acked in window "
          "| dropped | slow sends |",
          "|---|---|---:|---:|---:|---:|---|---|---|",
          *[f"| {r['round']} | {r['tree']} | {r['worker_us']} | {r['main_thread_us']} | {r.get('process_sys_us', '')} "
            f"| {r.get('minflt_per_event', '')} | {r['acked_in_window']} "
            f"| {r['dropped']} | {r['slow_sends'] or ''} |" for r in rows], ""]
    (args.out / f"{args.name}.md").write_text("\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
