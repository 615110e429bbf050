"""Where the time goes in one grid cell: per-process CPU and run-queue wait, arrivals, SSE events (not a test).

``python -m bench.azure_cell [--workload azure-conv+sys] [--rows 500] [--time-scale 8] [--runs 1]
[--routers prefixgate,smg] [--bin-ms 100] [--nice-cluster N] [--name azure-s23-cell]`` (session 23,
issue 14's second bullet). The grid (:mod:`sim.grid`) reports TTFT per router; this runs the same cell
(same rows, same simulated replicas: :func:`sim.grid.workload_rows`, :class:`sim.grid.Cell`) and
records, for each router run:

* **CPU and run-queue wait per process** over the run: the router (its process and descendants: the
  gateway's audit worker), the replica cluster (``sim.cluster``, 6 replicas on one event loop) and the
  load generator (this process: aiohttp client parsing every SSE event), from the scheduler's own
  nanosecond counters (``/proc/PID/task/TID/schedstat``: time on a CPU, time runnable but waiting for
  one). A process that waits for a CPU while runnable is starved by the others: that wait is the
  direct sign of a saturated 2-core box, which CPU time alone does not show.
* a timeline in ``--bin-ms`` bins: arrivals, each process's CPU share of one core and run-queue wait;
* the wall arrival rate, SSE events relayed per second (from each answer's completion tokens: one
  event for the first token, one per 16 after, one usage event, ``[DONE]``), the client's lateness;
* TTFT split (wall ms): the replica's own queue + prefill (``/sim/stats``: mean per prefill), and for
  PrefixGate the audit trail's stages (arrival → routed, arrival → the replica's first byte); the
  rest of the client's TTFT is outside them (connect and HTTP parse before the app, relay of the first
  event, the client's own loop).

``--nice-cluster N``: run the replica cluster at nice N (a replica with its own hardware does not share
the gateway's cores: the variant shows how much of the cell is contention). Results:
``bench/results/<name>.md`` and ``.json``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click

from sim.click_options import ClickOptions
from sim.demo import (DemoPaths, bearer_headers, gateway_config, prepare_identity, run_target, start_cluster_proc,
                      start_gateway)
from sim.grid import GRID_WORKLOADS, Cell, start_smg_router, workload_rows
from sim.procs import free_port, python_module_cmd, start_process, stop_process, wait_for_url
from sim.replay import ReplayConfig
from sim.report import reset_replicas

RESULTS = Path(__file__).resolve().parent / "results"
CHUNK_TOKENS = 16


def _pids(pid: int, children: bool) -> list[int]:
    import psutil

    out = [pid]
    if children:
        try:
            out += [c.pid for c in psutil.Process(pid).children(recursive=True)]
        except psutil.Error:
            pass
    return out


def schedstat_ns(pids: Sequence[int]) -> tuple[int, int]:
    """(ns on a CPU, ns runnable but waiting for a CPU) summed over every thread of ``pids``
    (``/proc/PID/task/TID/schedstat``; a thread or process gone counts 0)."""
    run = wait = 0
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                    a, b, _ = f.read().split()
                run += int(a)
                wait += int(b)
            except (OSError, ValueError):
                pass
    return run, wait


class Sampler:
    """A thread sampling :func:`schedstat_ns` of named process groups every ``bin_s`` seconds.

    ``groups``: name -> (pid, with descendants). ``samples``: (monotonic s, {name: (run ns, wait ns)}).
    """

    def __init__(self, groups: Mapping[str, tuple[int, bool]], bin_s: float,
                 probes: Mapping[str, str] | None = None) -> None:
        self.groups = dict(groups)
        self.bin_s = bin_s
        self.samples: list[tuple[float, dict[str, tuple[int, int]]]] = []
        #: name -> URL of a liveness route answered on that process's event loop; per bin one GET's wall ms
        self.probes = dict(probes or {})
        self.probe_ms: dict[str, list[tuple[float, float]]] = {k: [] for k in self.probes}
        self._conns: dict[str, Any] = {}
        self._stop = threading.Event()
        self._pids = {k: _pids(p, c) for k, (p, c) in self.groups.items()}
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _take(self) -> None:
        self.samples.append((time.monotonic(), {k: schedstat_ns(p) for k, p in self._pids.items()}))
        for name, url in self.probes.items():
            self._probe(name, url)

    def _probe(self, name: str, url: str) -> None:
        import http.client
        from urllib.parse import urlsplit

        u = urlsplit(url)
        conn = self._conns.get(name)
        if conn is None:
            conn = self._conns[name] = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
        t = time.monotonic()
        try:
            conn.request("GET", u.path)
            conn.getresponse().read()
        except (OSError, http.client.HTTPException):
            conn.close()
            self._conns.pop(name, None)
            return
        self.probe_ms[name].append((t, (time.monotonic() - t) * 1e3))

    def _run(self) -> None:
        self._take()
        while not self._stop.wait(self.bin_s):
            self._take()
        self._take()

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        for conn in self._conns.values():
            conn.close()

    def probe_summary(self) -> dict[str, dict[str, float | None]]:
        """Per probe: p50, p90 and max of the liveness GET's wall ms (the target loop's lag plus a round trip)."""
        out = {}
        for k, v in self.probe_ms.items():
            ms = [x for _, x in v]
            out[k] = {"n": len(ms), "p50": _pct(ms, 50), "p90": _pct(ms, 90), "max": max(ms) if ms else None}
        return out

    def totals_ms(self) -> dict[str, dict[str, float]]:
        """Per group: ``cpu_ms`` and ``runq_wait_ms`` between the first and the last sample."""
        (_, a), (_, b) = self.samples[0], self.samples[-1]
        return {k: {"cpu_ms": (b[k][0] - a[k][0]) / 1e6, "runq_wait_ms": (b[k][1] - a[k][1]) / 1e6} for k in a}

    def timeline(self, t0: float) -> list[dict[str, Any]]:
        """Per bin: start (s after ``t0``), per group the CPU share of one core and the run-queue wait (ms)."""
        out = []
        for (ta, a), (tb, b) in zip(self.samples, self.samples[1:]):
            dt = max(tb - ta, 1e-9)
            row: dict[str, Any] = {"t_s": round(ta - t0, 3), "dt_s": round(dt, 3)}
            for k in a:
                row[f"{k}_cpu"] = round((b[k][0] - a[k][0]) / 1e9 / dt, 3)
                row[f"{k}_wait_ms"] = round((b[k][1] - a[k][1]) / 1e6, 1)
            out.append(row)
        return out


async def loop_lag(samples: list[float], period_s: float = 0.005) -> None:
    """Append to ``samples`` how late (ms) each ``period_s`` sleep of this event loop woke (until cancelled)."""
    loop = asyncio.get_running_loop()
    while True:
        t = loop.time()
        await asyncio.sleep(period_s)
        samples.append((loop.time() - t - period_s) * 1e3)


def sse_events(completion_tokens: int | None) -> int:
    """SSE events of one streamed answer of ``completion_tokens`` (the replicas' framing: one event for
    the first token, one per 16 after, the usage event and ``[DONE]``); 0 for an unknown count."""
    if not completion_tokens:
        return 0
    return 1 + -(-(completion_tokens - 1) // CHUNK_TOKENS) + 2


def _pct(xs: Sequence[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


def _find_latency(doc: Any, depth: int = 0) -> dict[str, Any] | None:
    """The ``latency`` object of an audit record (at its top or nested in the chain record)."""
    if not isinstance(doc, dict) or depth > 3:
        return None
    if isinstance(doc.get("latency"), dict):
        return doc["latency"]
    for v in doc.values():
        if (got := _find_latency(v, depth + 1)) is not None:
            return got
    return None


def audit_stages(audit_dir: Path) -> dict[str, Any]:
    """Medians and means (ms) of the gateway's audit latencies over every request event in ``audit_dir``
    (the JSONL trail: ``latency.*``); empty without a trail."""
    stages: dict[str, list[float]] = {}
    for path in sorted(audit_dir.rglob("*.jsonl")):
        if "ocsf" in path.name:
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            lat = _find_latency(doc)
            if isinstance(lat, dict):
                for k, v in lat.items():
                    if isinstance(v, (int, float)):
                        stages.setdefault(k, []).append(float(v))
    return {k: {"n": len(v), "p50": round(statistics.median(v), 3), "mean": round(statistics.fmean(v), 3),
                "p90": round(_pct(v, 90) or 0, 3)} for k, v in sorted(stages.items())}


def audit_rows(audit_dir: Path) -> dict[str, dict[str, Any]]:
    """request_id -> {time_ms (epoch ms at emit), latency} of every request event in the JSONL trail."""
    out: dict[str, dict[str, Any]] = {}

    def walk(doc: Any, depth: int = 0) -> None:
        if not isinstance(doc, dict) or depth > 3:
            return
        if isinstance(doc.get("request_id"), str) and isinstance(doc.get("latency"), dict):
            out[doc["request_id"]] = {"time_ms": doc.get("time_ms"), "latency": doc["latency"]}
            return
        for v in doc.values():
            walk(v, depth + 1)

    for path in sorted(audit_dir.rglob("*.jsonl")):
        if "ocsf" in path.name:
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                walk(json.loads(line))
            except ValueError:
                continue
    return out


def client_split(client: Sequence[Mapping[str, Any]], audit: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Per request joined on ``X-Request-Id``: before the app (client send -> the gateway's arrival stamp,
    from the gateway's emit time minus its total), the gateway's own arrival -> replica first byte, and after
    it (-> the client's first content event); p50/p90 ms. Wall clocks of one host, ms resolution."""
    pre, gw, post, head_to_first, pre_new, pre_reused = [], [], [], [], [], []
    for c in client:
        a = audit.get(c.get("request_id") or "")
        lat = (a or {}).get("latency") or {}
        if not a or a.get("time_ms") is None or lat.get("total_ms") is None or lat.get("first_byte_ms") is None:
            continue
        arrival = a["time_ms"] - lat["total_ms"]
        p = arrival - c["send_wall_ms"]
        pre.append(p)
        (pre_new if "conn_start_ms" in c else pre_reused).append(p)
        c["before_app_ms"], c["app_first_byte_ms"], c["app_total_ms"] = p, lat["first_byte_ms"], lat["total_ms"]
        c["auth_ms"] = lat.get("auth_ms")
        gw.append(lat["first_byte_ms"])
        post.append(c["ttft_ms"] - p - lat["first_byte_ms"])
        head_to_first.append(c["first_ms"] - c["head_ms"])

    def q(xs: list[float]) -> dict[str, float | None]:
        return {"p50": _pct(xs, 50), "p90": _pct(xs, 90), "mean": round(statistics.fmean(xs), 2) if xs else None}

    return {"n": len(pre), "new_connections": len(pre_new), "before_app_ms": q(pre),
            "before_app_new_connection_ms": q(pre_new), "before_app_kept_alive_ms": q(pre_reused), "app_to_first_byte_ms": q(gw), "after_first_byte_ms": q(post),
            "client_head_to_first_ms": q(head_to_first)}


async def timed_replay(base: str, reqs: Sequence[Any], tenants: Sequence[str], scale: float,
                       headers_for: Any, salt_for: Any, cap: int | None) -> list[dict[str, Any]]:
    """The replay of :func:`sim.replay.replay` (same bodies, open loop) that also notes per request its send
    time (wall ms), the answer head's and the first content event's times (ms after the send) and
    ``X-Request-Id``."""
    import aiohttp

    from sim.replay import ReplayConfig as _Cfg, _body

    cfg = _Cfg(base_url=base, time_scale=scale, max_tokens_cap=cap)
    out: list[dict[str, Any]] = []
    conn = aiohttp.TCPConnector(limit=512, limit_per_host=512)
    tc = aiohttp.TraceConfig()

    def stamp(name: str) -> Any:
        async def on(session: Any, ctx: Any, params: Any) -> None:
            rec = ctx.trace_request_ctx
            if isinstance(rec, dict) and name not in rec:
                rec[name] = (time.monotonic() - rec["_t"]) * 1e3
        return on

    tc.on_connection_create_start.append(stamp("conn_start_ms"))
    tc.on_connection_create_end.append(stamp("conn_end_ms"))
    tc.on_connection_reuseconn.append(stamp("reused_ms"))
    tc.on_connection_queued_start.append(stamp("queued_ms"))
    tc.on_request_headers_sent.append(stamp("headers_sent_ms"))
    tc.on_request_chunk_sent.append(stamp("body_sent_ms"))
    t00 = reqs[0].timestamp

    async def one(session: aiohttp.ClientSession, r: Any, tenant: str, t0: float) -> None:
        delay = t0 + (r.timestamp - t00) / scale - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        body = _body(r, cfg, salt_for(tenant) if salt_for else None)
        headers = dict(headers_for(tenant)) if headers_for else {}
        t = time.monotonic()
        rec: dict[str, Any] = {"send_wall_ms": time.time() * 1e3, "_t": t}
        async with session.post(f"{base}/v1/completions", json=body, headers=headers,
                                trace_request_ctx=rec) as resp:
            rec["head_ms"] = (time.monotonic() - t) * 1e3
            rec["request_id"] = resp.headers.get("X-Request-Id")
            async for raw in resp.content:
                if "first_ms" not in rec and raw.startswith(b"data: {") and b'"text":"' in raw \
                        and b'"text":""' not in raw:
                    rec["first_ms"] = (time.monotonic() - t) * 1e3
            rec["e2e_ms"] = (time.monotonic() - t) * 1e3
        rec.setdefault("first_ms", rec["e2e_ms"])
        rec["ttft_ms"] = rec["first_ms"]
        del rec["_t"]
        out.append(rec)

    async with aiohttp.ClientSession(connector=conn, trace_configs=[tc]) as session:
        t0 = time.monotonic() + 0.05
        await asyncio.gather(*(one(session, r, t, t0) for r, t in zip(reqs, tenants)), return_exceptions=True)
    return out


def _replica_means(stats: Sequence[Mapping[str, Any]], scale: float) -> dict[str, float]:
    n = sum(s.get("prefills", 0) for s in stats) or 1
    return {"queue_ms": round(sum(s.get("queue_wait_s", 0.0) for s in stats) / n / scale * 1e3, 2),
            "prefill_ms": round(sum(s.get("prefill_busy_s", 0.0) for s in stats) / n / scale * 1e3, 2)}


async def one_run(router: str, cell: Cell, args: SimpleNamespace, reqs: Sequence[Any], tenants: Sequence[str],
                  paths: DemoPaths, issuer: Any, run: int) -> dict[str, Any]:
    """One router's replay of the cell on a fresh cluster; every figure of the module doc."""
    spec = cell.spec(args.replicas)
    cluster, replicas = await start_cluster_proc(spec, paths)
    if args.nice_cluster:
        os.setpriority(os.PRIO_PROCESS, cluster.pid, args.nice_cluster)
    urls = [r["url"] for r in replicas]
    audit = paths.audit_dir
    shutil.rmtree(audit, ignore_errors=True)
    audit.mkdir(parents=True, exist_ok=True)
    names = sorted(set(tenants))
    try:
        if router == "smg":
            proc, base = await start_smg_router(urls, paths)
        else:
            gcfg = gateway_config("cache_aware", replicas, names, paths, listen_port=free_port(),
                                  admin_port=free_port(), block_size=spec.block_size,
                                  index_capacity_blocks=spec.capacity_blocks)
            tree = args.trees.get(router)
            proc, base = (await start_gateway("gateway-cache_aware", gcfg, paths) if tree is None
                          else await _start_tree_gateway(router, tree, gcfg, paths))
        rcfg = ReplayConfig(base_url="", time_scale=spec.time_scale, seed=args.seed + run,
                            max_tokens_cap=args.max_tokens_cap or None,
                            total_timeout_s=6 * reqs[-1].timestamp / spec.time_scale + 180)
        groups = {"router": (proc.pid, True), "cluster": (cluster.pid, True), "loadgen": (os.getpid(), False)}
        probes = {"router": f"{base}/health" if router == "smg" else f"{base}/healthz", "cluster": f"{urls[0]}/health"}
        lag: list[float] = []
        try:
            await asyncio.sleep(0.3)
            t0 = time.monotonic()
            lag_task = asyncio.ensure_future(loop_lag(lag))
            hdrs = bearer_headers(issuer, names) if router != "smg" else None
            salt = (lambda t: t) if router == "smg" else None
            timed: list[dict[str, Any]] = []
            with Sampler(groups, args.bin_ms / 1e3, probes) as sampler:
                if args.timed:
                    await reset_replicas(urls)
                    timed = await timed_replay(base, reqs, tenants, spec.time_scale, hdrs, salt,
                                               args.max_tokens_cap or None)
                else:
                    summary, result = await run_target(router, base, urls, reqs, tenants, rcfg, None,
                                                       headers_for=hdrs, salt_for=salt, settle_s=0.0)
            wall = time.monotonic() - t0
            lag_task.cancel()
        finally:
            stop_process(proc)
        stats = await _stats(urls)
    finally:
        stop_process(cluster)
    scale = spec.time_scale
    if args.timed:
        split = client_split(timed, audit_rows(audit)) if router != "smg" else {}
        ttft_ms = [r["ttft_ms"] for r in timed]
        events = -1
        ok_n, errors, hit, late = len(timed), {"missing": len(reqs) - len(timed)}, None, []
        ttft_trace = {}
    else:
        split = {}
        ok = result.ok
        ttft_ms = [r.ttft_s / scale * 1e3 for r in ok if r.ttft_s is not None]
        events = sum(sse_events(r.completion_tokens) for r in ok)
        ok_n, errors, hit, late = len(ok), result.errors_by_kind(), summary.hit_rate, [r.late_s / scale * 1e3 for r in ok]
        ttft_trace = {"p50": summary.ttft_p50, "p90": summary.ttft_p90, "p99": summary.ttft_p99}
    span = reqs[-1].timestamp / scale
    arrivals = [r.timestamp / scale for r in reqs]
    timeline = sampler.timeline(t0 + 0.05)
    for row in timeline:
        row["arrivals"] = sum(1 for a in arrivals if row["t_s"] <= a < row["t_s"] + row["dt_s"])
    return {
        "router": router, "run": run, "wall_s": round(wall, 2), "arrival_span_s": round(span, 3),
        "arrival_rps": round(len(reqs) / span, 1), "ok": ok_n, "errors": errors,
        "sse_events": events, "sse_events_per_s_of_run": round(events / wall, 1),
        "hit_rate": hit, "ttft_trace_s": ttft_trace, "client_split": split,
        "ttft_wall_ms": {"p50": _pct(ttft_ms, 50), "p90": _pct(ttft_ms, 90), "p99": _pct(ttft_ms, 99),
                         "mean": round(statistics.fmean(ttft_ms), 2) if ttft_ms else None},
        "client_late_ms": {"p50": _pct(late, 50), "p99": _pct(late, 99)},
        "replica_wall_ms": _replica_means(stats, scale),
        "cpu": sampler.totals_ms(), "timeline": timeline,
        "probe_ms": sampler.probe_summary(),
        "loadgen_lag_ms": {"p50": _pct(lag, 50), "p90": _pct(lag, 90), "max": max(lag) if lag else None},
        "audit": audit_stages(audit) if router != "smg" else {},
        "client_records": timed if args.keep_records else [],
    }


async def _start_tree_gateway(label: str, tree: str, cfg: Mapping[str, Any], paths: DemoPaths) -> Any:
    """``prefixgate serve`` of the source tree ``tree`` (its packages first on ``PYTHONPATH``) with ``cfg``."""
    import yaml

    cfg_path = paths.work / f"gateway-{label}.yaml"
    cfg_path.write_text(yaml.safe_dump(dict(cfg), sort_keys=False), encoding="utf-8")
    proc = start_process(f"gateway-{label}", python_module_cmd("gateway.cli", "serve", "--config", str(cfg_path)),
                         paths.logs, env={"PYTHONPATH": tree}, cwd=tree)
    base = f"http://127.0.0.1:{cfg['listen']['port']}"
    try:
        await wait_for_url(f"{base}/readyz", timeout_s=30.0, proc=proc)
    except BaseException:
        stop_process(proc)
        raise
    return proc, base


async def _stats(urls: Sequence[str]) -> list[dict[str, Any]]:
    import aiohttp

    async with aiohttp.ClientSession() as s:
        out = []
        for u in urls:
            async with s.get(f"{u}/sim/stats") as r:
                out.append(await r.json())
        return out


def to_markdown(doc: Mapping[str, Any]) -> str:
    """The summary table and, per run, a compact timeline."""
    m = doc["meta"]
    lines = [f"# One grid cell, where the time goes (`python -m bench.azure_cell`), {m['name']}", "",
             f"workload={m['workload']} rows={m['rows']} time scale={m['time_scale']} load={m['load']} "
             f"replicas={m['replicas']} nice(cluster)={m['nice_cluster']} max_tokens cap={m.get('max_tokens_cap') or '-'} "
             f"trees={m.get('trees') or '-'} load average at the end {m['loadavg_end']}; CPU and run-queue wait from "
             "/proc/PID/task/*/schedstat over the replay (router: process + descendants; loadgen: this process).",
             "", "| router | run | arrivals/s (wall) | SSE ev/s | TTFT wall ms p50/p90/p99 | replica queue+prefill ms (mean) "
             "| router CPU ms | router runq wait ms | cluster CPU ms | cluster runq wait ms | loadgen CPU ms "
             "| loadgen runq wait ms | run wall s | hit | errors |", "|" + "---|" * 15]
    for r in doc["runs"]:
        c, t, rep = r["cpu"], r["ttft_wall_ms"], r["replica_wall_ms"]
        lines.append(
            f"| {r['router']} | {r['run']} | {r['arrival_rps']} | {r['sse_events_per_s_of_run']} "
            f"| {t['p50']:.0f}/{t['p90']:.0f}/{t['p99']:.0f} | {rep['queue_ms']}+{rep['prefill_ms']} "
            f"| {c['router']['cpu_ms']:.0f} | {c['router']['runq_wait_ms']:.0f} | {c['cluster']['cpu_ms']:.0f} "
            f"| {c['cluster']['runq_wait_ms']:.0f} | {c['loadgen']['cpu_ms']:.0f} | {c['loadgen']['runq_wait_ms']:.0f} "
            f"| {r['wall_s']} | {r['hit_rate'] or 0:.3f} | {sum(r['errors'].values())} |")
    lines += ["", "Event-loop lag (ms): the load generator's 5 ms sleeps (how late they woke); one liveness GET per bin "
              "on the router's and on replica 0's loop (a round trip: that loop's lag plus the request's own work). "
              "Gateway stages from its audit trail (p50 ms, arrival at the app = 0).", "",
              "| router | run | loadgen lag p50/p90/max | router GET p50/p90/max | replica GET p50/p90/max "
              "| auth (incl. send-order yields) p50 | first byte p50 | client TTFT p50 |", "|" + "---|" * 8]

    def trio(d: Mapping[str, Any] | None) -> str:
        if not d or d.get("p50") is None:
            return "-"
        return f"{d['p50']:.1f}/{d['p90']:.1f}/{d['max']:.1f}"

    for r in doc["runs"]:
        a = r.get("audit") or {}
        pr = r.get("probe_ms") or {}
        lines.append(f"| {r['router']} | {r['run']} | {trio(r.get('loadgen_lag_ms'))} | {trio(pr.get('router'))} "
                     f"| {trio(pr.get('cluster'))} | {a.get('auth_ms', {}).get('p50', '-')} "
                     f"| {a.get('first_byte_ms', {}).get('p50', '-')} | {r['ttft_wall_ms']['p50']:.1f} |")
    for r in doc["runs"]:
        sp = r.get("client_split") or {}
        if sp.get("n"):
            lines += ["", f"{r['router']} run {r['run']}, {sp['n']} requests joined on X-Request-Id (ms p50/p90/mean): "
                      + f"({sp.get('new_connections')} on new connections): "
                      + "; ".join(f"{k} {v['p50']:.1f}/{v['p90']:.1f}/{v['mean']}" for k, v in sp.items()
                                  if isinstance(v, dict) and v.get("p50") is not None)]
    for r in doc["runs"]:
        if r["audit"]:
            a = r["audit"]
            keys = [k for k in ("auth_ms", "parse_ms", "keys_ms", "policy_ms", "route_ms", "first_byte_ms",
                                "total_ms") if k in a]
            lines += ["", f"PrefixGate run {r['run']} audit latencies (ms, arrival at the app = 0): "
                      + ", ".join(f"{k} p50 {a[k]['p50']} mean {a[k]['mean']} p90 {a[k]['p90']}" for k in keys)]
    for r in doc["runs"]:
        lines += ["", f"Timeline {r['router']} run {r['run']} (bins of {m['bin_ms']} ms: arrivals; CPU share "
                  "of one core router/cluster/loadgen; run-queue wait ms router/cluster/loadgen)", "",
                  "| t s | arrivals | router | cluster | loadgen | wait router | wait cluster | wait loadgen |",
                  "|" + "---|" * 8]
        for b in r["timeline"]:
            lines.append(f"| {b['t_s']} | {b['arrivals']} | {b['router_cpu']} | {b['cluster_cpu']} "
                         f"| {b['loadgen_cpu']} | {b['router_wait_ms']} | {b['cluster_wait_ms']} "
                         f"| {b['loadgen_wait_ms']} |")
    return "\n".join(lines) + "\n"


def _parse(argv: Sequence[str] | None) -> SimpleNamespace:
    ap = ClickOptions(prog="python -m bench.azure_cell", description=__doc__.splitlines()[0])
    ap.option("--workload", type=click.Choice([w for w in GRID_WORKLOADS if w != "mooncake"]),
              default="azure-conv+sys")
    ap.option("--rows", type=int, default=500)
    ap.option("--time-scale", type=float, default=8.0)
    ap.option("--load", type=float, default=0.7)
    ap.option("--replicas", type=int, default=6)
    ap.option("--runs", type=int, default=1)
    ap.option("--seed", type=int, default=0)
    ap.option("--routers", default="prefixgate,smg")
    ap.option("--bin-ms", type=float, default=100.0)
    ap.option("--nice-cluster", type=int, default=0)
    ap.option("--max-tokens-cap", type=int, default=0, help="cap every answer's max_tokens (0: the rows' own)")
    ap.option("--keep-records", is_flag=True, help="--timed: keep every request's record in the JSON")
    ap.option("--timed", is_flag=True, help="own replay noting X-Request-Id: TTFT split joined with the audit trail")
    ap.option("--tree", "trees", multiple=True, help="LABEL=DIR: a router LABEL running prefixgate from DIR")
    ap.option("--name", default="azure-s23-cell")
    return ap.parse(argv)


async def run(args: SimpleNamespace) -> dict[str, Any]:
    """Every run of every router (interleaved); the JSON document of :func:`to_markdown`."""
    cell = Cell(f"time scale {args.time_scale:g}", time_scale=args.time_scale)
    wl = SimpleNamespace(workload=args.workload, seed=args.seed, rows=args.rows, load=args.load,
                         replicas=args.replicas, trace=None)
    reqs, tenants = workload_rows(wl)
    work = Path(tempfile.mkdtemp(prefix="prefixgate-azcell-"))
    paths = DemoPaths.under(work)
    issuer = prepare_identity(paths)
    runs = []
    try:
        for run_i in range(args.runs):
            for router in [r.strip() for r in args.routers.split(",") if r.strip()]:
                res = await one_run(router, cell, args, reqs, tenants or ["tenant-a"] * len(reqs), paths, issuer,
                                    run_i)
                c = res["cpu"]
                print(f"{router:10s} run {run_i}: TTFT wall ms {res['ttft_wall_ms']} router CPU "
                      f"{c['router']['cpu_ms']:.0f} wait {c['router']['runq_wait_ms']:.0f}; cluster "
                      f"{c['cluster']['cpu_ms']:.0f} wait {c['cluster']['runq_wait_ms']:.0f}; loadgen "
                      f"{c['loadgen']['cpu_ms']:.0f} wait {c['loadgen']['runq_wait_ms']:.0f}", flush=True)
                runs.append(res)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    meta = {k: getattr(args, k) for k in ("workload", "rows", "time_scale", "load", "replicas", "runs", "seed",
                                          "bin_ms", "nice_cluster", "max_tokens_cap", "timed", "name")}
    meta["trees"] = args.trees
    meta["loadavg_end"] = os.getloadavg()
    return {"meta": meta, "runs": runs}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; writes ``bench/results/<name>.{md,json}``."""
    args = _parse(argv)
    args.trees = dict(t.split("=", 1) for t in args.trees)
    doc = asyncio.run(run(args))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(doc, separators=(",", ":")) + "\n", encoding="utf-8")
    md = to_markdown(doc)
    (RESULTS / f"{args.name}.md").write_text(md, encoding="utf-8")
    print(md.split("\nTimeline")[0], file=sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
