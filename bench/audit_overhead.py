"""Gateway throughput with every audit sink and tracing on vs all off (not a test).

``python -m bench.audit_overhead [--rounds 4] [--seconds 4] [--concurrency 32]``
(or ``python bench/audit_overhead.py``). One run starts:

* a simulated replica cluster (``python -m sim.cluster``, 2 replicas, time
  scale 1000, so replicas answer in about a millisecond and the gateway is
  the bottleneck);
* a real ``rsyslogd`` on loopback (the helper of ``tests/audit``), and a dummy
  OTLP/HTTP collector (answers 200 to ``/v1/logs`` and ``/v1/traces``, counts
  bytes) in this process;
* two gateway processes with the same config except the audit trail
  (CPU time per role and request is read with psutil around every round:
  each gateway, the "on" gateway's audit worker and span exporter children,
  the replicas, rsyslogd, the load generator):
  **off** — :class:`gateway.auditing.AuditHub` ``(None)`` (no sinks, no
  monitor, spans to a no-op tracer) — and **on** — ``AuditHub.from_config``
  with the JSONL hash chain (1 s checkpoints), the OCSF file, CEF/TCP syslog to
  rsyslogd, OTLP logs, flood summaries, the concentration monitor, and OTLP
  tracing to the collector.

Load: closed loop, ``--concurrency`` clients, non-streaming completions of a
~100-token prompt (a shared 64-token prefix + a unique tail), ``max_tokens``
4. Rounds alternate off/on (``--rounds`` each, ``--seconds`` per round) so
both see the same machine state; throughput is successful requests per
second. Result: the ratio on/off of the summed throughput (target >= 0.8),
written to ``bench/results/<--name>.{json,md}``. ``--baseline DIR`` (another source
tree, e.g. ``git archive main | tar -x -C DIR``) adds a third gateway of that tree
with the "on" config, in the same rotation: an A/B of two trees against one "off".
Each gateway reports at exit (``gateway_exit``) its emitted events, GC time and ``kernel``: write/read
system calls, context switches, user/system CPU seconds and the CPU of its non-main threads while serving
(/proc). ``PG_BENCH_PROFILE=DIR`` also profiles each gateway's event-loop thread with cProfile on the
thread-CPU clock (``DIR/<mode>-<pid>.prof``; CPU, not wall, so preemption by the other processes is not
charged to the function that was running; inflates every call, compare shares).
"""
from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
TD = "demo.prefixgate.test"


# ------------------------------------------------------------------ gateway child
async def _serve(config_file: str, mode: str, ready_file: str) -> None:
    """Run one gateway (public listener only) until SIGTERM; write its port to ``ready_file``."""
    from bench.harness import serve_public, serve_until_sigterm
    from gateway.auditing import AuditHub
    from gateway.build import build
    from gateway.config import load_config

    cfg = load_config(config_file)
    comps = build(cfg, audit=AuditHub(None) if mode == "off" else None)
    await comps.start()
    import gc
    # time spent in the cyclic GC per generation (reported at exit)
    gcstat = {"n": [0, 0, 0], "t": [0.0, 0.0, 0.0], "t0": 0.0}

    def _gccb(phase: str, info: dict) -> None:
        if phase == "start":
            gcstat["t0"] = time.perf_counter()
        else:
            g = info["generation"]
            gcstat["n"][g] += 1
            gcstat["t"][g] += time.perf_counter() - gcstat["t0"]

    gc.callbacks.append(_gccb)
    server, task, port = await serve_public(comps, freeze=True)  # frozen as gateway.server.serve does
    Path(ready_file).write_text(json.dumps({"port": port}))
    dumper = asyncio.create_task(_dump_worker_metrics(comps.audit, ready_file + ".worker"))
    kernel0 = _kernel_counts()
    prof_dir = os.environ.get("PG_BENCH_PROFILE")  # differential profile: cProfile of the event-loop thread
    prof = None
    if prof_dir:
        import cProfile

        # thread CPU time, not wall: on a shared machine wall tottime counts preemption by the other processes
        prof = cProfile.Profile(time.thread_time_ns, 1e-9)
        prof.enable()
    await serve_until_sigterm(server, task)
    dumper.cancel()
    if prof is not None:
        prof.disable()
        prof.dump_stats(str(Path(prof_dir) / f"{mode}-{os.getpid()}.prof"))
        import psutil  # CPU seconds per thread (the event loop's and the audit/span writer threads)

        Path(prof_dir, f"{mode}-{os.getpid()}.threads.json").write_text(json.dumps(
            {str(t.id): [t.user_time, t.system_time] for t in psutil.Process().threads()}))
    kernel = {k: v - kernel0.get(k, 0) for k, v in _kernel_counts().items()}  # before stop: serving only
    dropped = comps.audit.dropped
    await comps.stop()
    Path(ready_file + ".done").write_text(json.dumps({"dropped": dropped, "emitted": comps.audit.emitted,
                                                      "gc_n": gcstat["n"], "gc_s": [round(x, 3) for x in gcstat["t"]],
                                                      "kernel": kernel}))


async def _dump_worker_metrics(hub: Any, path: str) -> None:
    """Every 0.25 s, the audit worker's last metrics report (``RemoteAuditLog.worker_metrics_text``,
    Prometheus text) to ``path``: the parent reads its slow sends and spill bytes around each round."""
    tmp = path + ".tmp"
    last = b""
    while True:
        text = getattr(getattr(hub, "log", None), "worker_metrics_text", b"")
        if text and text is not last:  # a new report only (a file write is charged to the "on" gateway's CPU)
            Path(tmp).write_bytes(text)
            os.replace(tmp, path)
            last = text
        await asyncio.sleep(0.25)


#: worker metrics read per round (``_worker_audit``): sink-labelled counters and gauges
_WORKER_METRICS = {"prefixgate_audit_slow_sends_total": "slow_sends", "prefixgate_audit_spill_bytes": "spill_bytes"}


def _worker_audit(ready_file: Path) -> dict[str, dict[str, float]]:
    """The audit worker's slow sends (counter) and spill bytes (gauge) per sink, from the file
    :func:`_dump_worker_metrics` writes beside ``ready_file`` (``{}`` without one: an "off" gateway)."""
    out: dict[str, dict[str, float]] = {}
    try:
        text = Path(str(ready_file) + ".worker").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        name, _, rest = line.partition("{")
        if name in _WORKER_METRICS and 'sink="' in rest:
            sink = rest.split('sink="', 1)[1].split('"', 1)[0]
            out.setdefault(_WORKER_METRICS[name], {})[sink] = float(line.rsplit(" ", 1)[1])
    return out


def _kernel_counts() -> dict[str, float]:
    """This process's read/write system calls, context switches (all threads), user/system CPU
    seconds, minor page faults (``minflt``, session 28) and the CPU seconds of threads other than the main one, so far (Linux /proc; ``{}``
    elsewhere): the gateway's kernel-side and off-loop cost per request."""
    import psutil

    out: dict[str, float] = {}
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            k, v = line.split(":")
            if k in ("syscr", "syscw"):
                out[k] = int(v)
        me = psutil.Process()
        cs, t = me.num_ctx_switches(), me.cpu_times()
        out.update(ctx_voluntary=cs.voluntary, ctx_involuntary=cs.involuntary, user_s=t.user, system_s=t.system)
        import resource

        out["minflt"] = resource.getrusage(resource.RUSAGE_SELF).ru_minflt  # minor page faults (session 28)
        # CPU of the threads other than the event loop's (the span writer, executors)
        out["other_threads_s"] = sum(th.user_time + th.system_time for th in me.threads() if th.id != me.pid)
    except (OSError, ValueError, psutil.Error):
        pass
    return out


# ------------------------------------------------------------------ helpers
def _process_groups(pids: dict[str, int], cluster: Any, rsyslog: Any) -> dict[str, list[Any]]:
    """psutil handles per role: each gateway (``pids``: mode -> pid), the children of the
    "on" ones (the audit worker, the span exporter; suffixed ``_base`` for the baseline
    tree's), the replicas, rsyslogd, and this process (load generator and the dummy OTLP collector)."""
    import psutil

    def children(pid: int, marker: str) -> list[Any]:
        return [c for c in psutil.Process(pid).children(recursive=True) if marker in " ".join(c.cmdline())]

    groups = {f"gateway_{mode}": [psutil.Process(pid)] for mode, pid in pids.items()}
    for mode, suffix in (("on", ""), ("base", "_base")):
        if mode in pids:
            groups["audit_worker" + suffix] = children(pids[mode], "audit.worker")
            groups["span_exporter" + suffix] = children(pids[mode], "audit.span_exporter_proc")
    groups.update({
        "replicas": [psutil.Process(cluster.proc.pid)] if getattr(cluster, "proc", None) is not None else [],
        "rsyslogd": [psutil.Process(rsyslog.proc.pid)] if getattr(rsyslog, "proc", None) is not None else [],
        "loadgen_and_collector": [psutil.Process()],
    })
    return groups


def _cpu_times(groups: dict[str, list[Any]]) -> dict[str, float]:
    """CPU seconds (user + system, all threads) per role so far."""
    import psutil

    out = {}
    for name, procs in groups.items():
        total = 0.0
        for p in procs:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
        out[name] = total
    return out



async def _collector() -> tuple[Any, str, dict[str, int]]:
    """A dummy OTLP/HTTP collector: 200 to every POST, counting requests and bytes."""
    from aiohttp import web

    counts = {"requests": 0, "bytes": 0}

    async def handle(request: web.Request) -> web.Response:
        body = await request.read()
        counts["requests"] += 1
        counts["bytes"] += len(body)
        return web.Response(status=200, content_type="application/x-protobuf", body=b"")

    app = web.Application()
    app.router.add_post("/v1/logs", handle)
    app.router.add_post("/v1/traces", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}", counts


def _config(work: Path, urls: list[str], bundle: Path, audit: dict[str, Any], tracing: dict[str, Any]) -> dict[str, Any]:
    secret = work / "master.key"
    if not secret.exists():
        secret.write_bytes(secrets.token_hex(32).encode())
        os.chmod(secret, 0o600)
    return {
        "listen": {"host": "127.0.0.1", "port": 0},
        "admin": None,
        "routing": {"policy": "cache_aware", "block_size": 16},
        "replicas": [{"id": f"r{i}", "url": u, "pool": "default"} for i, u in enumerate(urls)],
        "health": {"interval_s": 1.0, "timeout_s": 1.0},
        "tenancy": {"master_secret_file": str(secret), "master_secret_env": None,
                    "tenants": [{"id": "tenant-a", "spiffe_ids": [f"spiffe://{TD}/tenant-a/"],
                                 "models": ["sim-model"], "pools": ["default"]}]},
        "identity": {"audience": "prefixgate", "trust_domains": {TD: {"bundle_file": str(bundle)}}},
        "policy": {"mode": "embedded", "dir": str(REPO / "rego"), "timeout_s": 1.0},
        "audit": audit,
        "tracing": tracing,
    }


def _start_gateway(work: Path, name: str, cfg: dict[str, Any], mode: str,
                   tree: Path = REPO) -> tuple[subprocess.Popen[bytes], str]:
    """One gateway child of ``tree`` (this source tree, or ``--baseline``'s) serving ``cfg``."""
    import yaml

    cfg_file = work / f"{name}.yaml"
    cfg_file.write_text(yaml.safe_dump(cfg))
    ready = work / f"{name}.ready"
    env = dict(os.environ, PYTHONPATH=str(tree))
    # this tree's bench script serves every tree's gateway (PYTHONPATH: that tree's packages), so the
    # baseline's gateway also reports its audit worker's metrics per round (_dump_worker_metrics)
    proc = subprocess.Popen([sys.executable, str(REPO / "bench" / "audit_overhead.py"), "--serve", str(cfg_file),
                             "--mode", mode, "--ready-file", str(ready)], cwd=str(tree), env=env,
                            stdout=open(work / f"{name}.log", "ab"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"gateway {name} did not start: {(work / f'{name}.log').read_text()[-2000:]}")
        time.sleep(0.05)
    return proc, f"http://127.0.0.1:{json.loads(ready.read_text())['port']}"


async def _round(url: str, token: str, seconds: float, concurrency: int, seq: list[int]) -> dict[str, float]:
    import aiohttp

    prefix = " ".join(f"sys{i}" for i in range(64))
    ok = err = 0
    latencies: list[float] = []
    stop_at = time.monotonic() + seconds

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal ok, err
        while time.monotonic() < stop_at:
            seq[0] += 1
            n = seq[0]
            body = {"model": "sim-model", "prompt": f"{prefix} " + " ".join(f"u{n}x{j}" for j in range(36)),
                    "max_tokens": 4}
            t = time.monotonic()
            async with session.post(url + "/v1/completions", json=body,
                                    headers={"Authorization": f"Bearer {token}"}) as resp:
                await resp.read()
                if resp.status == 200:
                    ok += 1
                    latencies.append(time.monotonic() - t)
                else:
                    err += 1

    conn = aiohttp.TCPConnector(limit=concurrency)
    t0 = time.monotonic()
    async with aiohttp.ClientSession(connector=conn) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    wall = time.monotonic() - t0
    latencies.sort()
    p50 = latencies[len(latencies) // 2] if latencies else float("nan")
    return {"ok": ok, "errors": err, "wall_s": wall, "rps": ok / wall, "p50_ms": p50 * 1000}


async def _main(args: SimpleNamespace) -> dict[str, Any]:
    sys.path.insert(0, str(REPO / "tests" / "audit"))
    from rsyslog_helper import Rsyslog

    from audit.keys import generate_signing_key
    from sim.cluster import spawn_cluster
    from sim.spiffe_issuer import DemoIssuer

    work = Path(tempfile.mkdtemp(prefix="pg-audit-bench-"))
    issuer = DemoIssuer(TD)
    bundle = work / "bundle.json"
    issuer.write_bundle(bundle)
    key = work / "keys" / "audit.key"
    key.parent.mkdir()
    generate_signing_key(key)
    (work / "rsyslog").mkdir()
    rsyslog = Rsyslog(work / "rsyslog")
    rsyslog.start()
    runner, collector, counts = await _collector()
    cluster = spawn_cluster(args.replicas, time_scale=1000.0, decode_s_per_token=0.0, stream_chunk_tokens=16)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        audit_on = {
            "jsonl": {"dir": str(work / "audit"), "signing_key_file": str(key), "checkpoint_s": 1},
            "ocsf": {"file": str(work / "ocsf.jsonl")},
            "syslog": {"host": "127.0.0.1", "port": rsyslog.port, "protocol": "tcp", "format": "cef"},
            "otlp": {"endpoint": collector + "/v1/logs"},
            "spill": {"dir": str(work / "spill")},
        }
        tracing_on = {"exporter": "otlp", "otlp_endpoint": collector + "/v1/traces"}
        if args.no_otlp:  # breakdown: durable sinks only, no OTLP logs, no tracing export
            del audit_on["otlp"]
            tracing_on = {"exporter": "none"}
        off_cfg = _config(work, cluster.urls, bundle, {}, {"exporter": "none"})
        on_cfg = _config(work, cluster.urls, bundle, audit_on, tracing_on)
        p_off, url_off = _start_gateway(work, "gw-off", off_cfg, "off")
        procs.append(p_off)
        p_on, url_on = _start_gateway(work, "gw-on", on_cfg, "on")
        procs.append(p_on)
        urls = {"off": url_off, "on": url_on}
        pids = {"off": p_off.pid, "on": p_on.pid}
        if args.baseline is not None:  # the same "on" config served by another source tree
            base_cfg = _config(work, cluster.urls, bundle, {**audit_on, "jsonl": {**audit_on["jsonl"],
                               "dir": str(work / "audit-base")}, "spill": {"dir": str(work / "spill-base")}},
                               tracing_on)
            p_base, urls["base"] = _start_gateway(work, "gw-base", base_cfg, "on", tree=args.baseline.resolve())
            procs.append(p_base)
            pids["base"] = p_base.pid
        token = issuer.mint(f"spiffe://{TD}/tenant-a/bench", "prefixgate", 3600)
        groups = _process_groups(pids, cluster, rsyslog)
        seq = [0]
        for url in urls.values():  # warm-up (policy engine, connection pools)
            await _round(url, token, 1.0, args.concurrency, seq)
        rounds: list[dict[str, Any]] = []
        modes = list(urls)
        for i in range(args.rounds):
            k = i % len(modes)  # rotate the order: every mode runs first, middle, last as often
            order = [(m, urls[m]) for m in (modes[k:] + modes[:k])[::(-1 if i % 2 else 1)]]
            for mode, url in order:
                ready = work / f"gw-{mode}.ready"
                await asyncio.sleep(1.1)  # the worker's next metrics report (one a second) is in
                w_before = _worker_audit(ready)
                before = _cpu_times(groups)
                r = await _round(url, token, args.seconds, args.concurrency, seq)
                after = _cpu_times(groups)
                await asyncio.sleep(1.1)
                w_after = _worker_audit(ready)
                # the audit worker's sends over slow_send_s in this round (their events went through the
                # spill: written, replayed) and its spill bytes after it (session 10)
                r["worker_slow_sends"] = {k: v - w_before.get("slow_sends", {}).get(k, 0.0)
                                          for k, v in w_after.get("slow_sends", {}).items()
                                          if v - w_before.get("slow_sends", {}).get(k, 0.0)}
                r["worker_spill_bytes"] = {k: v for k, v in w_after.get("spill_bytes", {}).items() if v}
                r["cpu_ms_per_request"] = {k: round((after[k] - before[k]) * 1000 / max(r["ok"], 1), 4) for k in after}
                r.update(mode=mode, round=i)
                rounds.append(r)
                print(f"round {i} {mode:3s}: {r['rps']:7.1f} req/s  p50 {r['p50_ms']:6.1f} ms  errors {r['errors']}"
                      f"  slow sends {r['worker_slow_sends']}  spill {r['worker_spill_bytes']}")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        cluster.stop()
        await runner.cleanup()
        received = len(rsyslog.lines())
        rsyslog.stop()
    done = {}
    for name in ("gw-off", "gw-on", "gw-base"):
        f = work / f"{name}.ready.done"
        done[name] = json.loads(f.read_text()) if f.exists() else None
    on_ok = sum(r["ok"] for r in rounds if r["mode"] == "on")
    off_ok = sum(r["ok"] for r in rounds if r["mode"] == "off")
    on_wall = sum(r["wall_s"] for r in rounds if r["mode"] == "on")
    off_wall = sum(r["wall_s"] for r in rounds if r["mode"] == "off")
    ratio = (on_ok / on_wall) / (off_ok / off_wall) if off_ok else float("nan")
    base = [r for r in rounds if r["mode"] == "base"]
    base_ratio = (sum(r["ok"] for r in base) / sum(r["wall_s"] for r in base)) / (off_ok / off_wall) if base else None
    cpu: dict[str, dict[str, float]] = {}
    for mode in ("off", "on", "base"):
        rs = [r for r in rounds if r["mode"] == mode and "cpu_ms_per_request" in r]
        for k in (rs[0]["cpu_ms_per_request"] if rs else {}):
            cpu.setdefault(k, {})[mode] = round(sum(r["cpu_ms_per_request"][k] for r in rs) / len(rs), 4)
    own = {"off": ("gateway_off",), "on": ("gateway_on", "audit_worker", "span_exporter"),
           "base": ("gateway_base", "audit_worker_base", "span_exporter_base")}
    total = {m: sum(v.get(m, 0.0) for k, v in cpu.items() if k in own[m] or k in ("replicas", "rsyslogd",
             "loadgen_and_collector")) for m in own if any(m in v for v in cpu.values())}
    # the machine's speed moves from round to round (shared cores): the load generator's and the replicas'
    # CPU per request (the same work in every mode, no audit code) is the yardstick of each round
    yard = {m: [r["cpu_ms_per_request"][GW[m]] / (r["cpu_ms_per_request"]["replicas"]
                                                  + r["cpu_ms_per_request"]["loadgen_and_collector"])
                for r in rounds if r["mode"] == m and "cpu_ms_per_request" in r] for m in GW}
    yard = {m: round(sum(v) / len(v), 3) for m, v in yard.items() if v}
    result = {  # cpu_ratio: off/on CPU ms per request of all the bench's processes (both cores the bound)
        "gateway_cpu_over_yardstick": yard,
        "cpu_ratio": {m: round(total["off"] / t, 3) for m, t in total.items() if m != "off" and t},
        "ratio_on_over_off": round(ratio, 3),
        "baseline": str(args.baseline) if args.baseline else None,
        "ratio_baseline_on_over_off": round(base_ratio, 3) if base_ratio is not None else None,
        "cpu_ms_per_request": cpu,
        "rps_on": round(on_ok / on_wall, 1), "rps_off": round(off_ok / off_wall, 1),
        "rounds": rounds, "concurrency": args.concurrency, "seconds_per_round": args.seconds,
        "replicas": args.replicas, "otlp": not args.no_otlp, "cpus": os.cpu_count(), "python": sys.version.split()[0],
        "rsyslog_lines_received": received, "otlp_posts": counts["requests"], "otlp_bytes": counts["bytes"],
        "gateway_exit": done,
    }
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    return result


#: the gateway process of each mode in ``cpu_ms_per_request``
GW = {"off": "gateway_off", "on": "gateway_on", "base": "gateway_base"}


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns 0 (the ratio is reported, not enforced)."""
    from sim.click_options import ClickOptions

    ap = ClickOptions(description=__doc__.split("\n\n")[0])
    ap.option("--rounds", type=int, default=4, help="rounds per mode (alternating)")
    ap.option("--seconds", type=float, default=4.0, help="seconds per round")
    ap.option("--concurrency", type=int, default=32)
    ap.option("--replicas", type=int, default=2)
    ap.option("--no-otlp", is_flag=True, help="'on' without OTLP logs and trace export (breakdown)")
    ap.option("--baseline", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="another source tree: its gateway serves the 'on' config too (mode 'base'), interleaved")
    ap.option("--name", default="audit_overhead", help="result file stem under --out")
    ap.option("--out", type=click.Path(path_type=Path), default=RESULTS)
    ap.option("--serve", hidden=True)
    ap.option("--mode", type=click.Choice(("on", "off")), hidden=True)
    ap.option("--ready-file", hidden=True)
    args = ap.parse(argv)
    if args.serve:
        asyncio.run(_serve(args.serve, args.mode, args.ready_file))
        return 0
    result = asyncio.run(_main(args))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=2))
    md = [
        "# Audit and tracing overhead (gateway throughput, all sinks on vs off)",
        "",
        f"ratio on/off: **{result['ratio_on_over_off']}** (target >= 0.8); "
        + (f"baseline tree on/off: **{result['ratio_baseline_on_over_off']}** ({result['baseline']}); "
           if result["baseline"] else "") +
        f"on {result['rps_on']} req/s, off {result['rps_off']} req/s; "
        f"{args.rounds} alternating rounds of {args.seconds:g} s per mode, concurrency {args.concurrency}, "
        f"{result['cpus']} CPUs, Python {result['python']}.",
        f"CPU-model ratio (off / on CPU per request, all processes; load-robust): {result['cpu_ratio']}.",
        "Gateway CPU per request over the yardstick's (replicas + load generator, the same work in every mode; "
        f"mean of the rounds' ratios, robust to the machine's speed moving between rounds): "
        f"{result['gateway_cpu_over_yardstick']}.",
        f"rsyslog lines received: {result['rsyslog_lines_received']}; OTLP posts: {result['otlp_posts']}; "
        f"gateway exit: {result['gateway_exit']}",
        "",
        "| round | mode | req/s | p50 ms | errors | worker slow sends | worker spill bytes after |",
        "|---|---|---|---|---|---|---|",
        *[f"| {r['round']} | {r['mode']} | {r['rps']:.1f} | {r['p50_ms']:.1f} | {r['errors']} "
          f"| {r.get('worker_slow_sends') or ''} | {r.get('worker_spill_bytes') or ''} |" for r in result["rounds"]],
        "",
        "CPU per successful request (ms, user + system, all threads; mean over the rounds of each mode):",
        "",
        "| process | off rounds | on rounds |" + (" baseline on rounds |" if result["baseline"] else ""),
        "|---|---|---|" + ("---|" if result["baseline"] else ""),
        *[f"| {k} | " + " | ".join(f"{v[m]:.3f}" for m in ("off", "on", "base") if m in v) + " |"
          for k, v in result["cpu_ms_per_request"].items()],
        "",
    ]
    (args.out / f"{args.name}.md").write_text("\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
