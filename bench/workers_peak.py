"""Peak rate of ``prefixgate serve`` with 1 process and with ``--workers N`` (issue 16; not a test).

``python -m bench.workers_peak [--redis-url URL] [--workers 2] [--rounds 2] [--clients 32[,64]] [--seconds 8]
[--load-generator python|wrk|python,wrk] [--targets memory,redis1,redisN] [--replica sim|lean|sim,lean]
[--baseline DIR] [--label TEXT]``

Targets, each a real ``prefixgate serve`` process tree with the demo
configuration (:func:`sim.demo.gateway_config`: JWT-SVID, embedded OPA,
``cache_aware``, JSONL + OCSF audit in the audit worker process) in front of
two simulated replicas (``python -m sim.cluster`` in its own process, time
scale 10^6, no decode time):

- ``memory x1``: ``state.backend: memory``, one process (today's default);
- ``redis x1``: ``state.backend: redis`` on ``--redis-url``, one process;
- ``redis xN``: the same with ``--workers N``.

Replica fixture (``--replica``, default ``sim,lean``: every target in front
of each, interleaved in every round): ``sim`` the simulated replicas above
(aiohttp, KV-cache model; about 230 µs of CPU per request, session 6);
``lean`` :mod:`bench.lean_replica` (two replicas in one process, asyncio
``Protocol`` + ``httptools``: the same OpenAI shapes and ``prompt_tokens``,
no cache model, ``cached_tokens`` 0), whose targets are named ``... [lean]``.
The lean fixture leaves more of the shared cores to the gateway; it changes
nothing in the gateway or its configuration, and the results file says
which fixture each row had.

Without ``--redis-url`` the bench starts its own ``redis-server``
(:class:`sim.redis_server.RedisServer`). The tenant has a request rate and a
concurrency limit high enough never to refuse, so every request runs the
shared-limit scripts. Load: ``--clients`` closed-loop clients (or wrk
connections) for ``--seconds`` per target and load generator
(:func:`bench.loadgen.peak`, 64-word prompts, ``max_tokens`` 1; session 11: a
comma-separated ``--clients 32,64`` measures every target at each count and
credits each target with its best, its peak over offered concurrency, so one
process and N processes get the same counts and neither is judged at a
concurrency that underloads it; ``peaks`` and ``peak_ratios`` in the result),
after 1 s of
unmeasured warm-up with the same generator; targets interleaved (rotated per
round), generators alternated per round, median over ``--rounds``. The load
generator, the replicas and Redis run on the same machine as the gateway and
take CPU from it: the result gives, beside every figure, the cores used by
the load generator (``python``: this process, which runs nothing else
meanwhile; ``wrk``: the wrk child), by the gateway's process tree and by the
replicas over the measured window.

Redis beside every figure (the Redis targets): ``redis cores``, the
redis-server process's CPU over the measured window (``/proc/<pid>/stat``
through psutil, the pid from ``INFO server``; None when Redis is not on
this host), ``cmds/req`` (``INFO commandstats`` calls, all commands, over
requests answered) and ``reads/req`` (``INFO stats``
``total_reads_processed``: the server's socket reads, about one per client
round trip, a pipeline being one), plus each command's calls per request in
the JSON; session 11: the server's execution time per request of the scripts
(``EVALSHA``, the commands they call included) and of the routing stream
(``XADD`` + ``XREAD``), from ``INFO commandstats`` ``usec``. Background traffic (lease renewal, routing snapshots) is included.

``--baseline DIR`` (another source tree, e.g. ``git worktree add`` or
``git archive BASE | tar -x -C DIR``): the Redis targets are also run from
that tree (``@base``), interleaved with this tree's in every round, for an
A/B in one run on a shared machine. ``--targets`` picks a subset.

Also per target: the serve processes' cores apart from the rest of the tree
(audit worker, span exporter) and each serve process's own cores
(``worker_cores``: with ``--workers`` the kernel may hand most of the load
generator's connections to one worker, and such a run measures one worker;
``worker_conns``: the connections each holds one second into the window), their
CPU µs per answered request, their context switches per answered request
(``serve_wakeups_per_req``: voluntary, the event loop went idle and was woken;
``serve_preempted_per_req``: involuntary, another process took the core), and the
ceiling ``cpus x serve / (serve + rest)`` that everything else on the
machine puts on ``xN / x1``, the rest split into audit worker, replicas,
redis-server and load generator (:func:`bench.workers_peak_calc.cpu_per_request`).

Results: ``bench/results/<--out>.{json,md}`` (default ``workers_peak``).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml

from bench import loadgen
from bench.harness import start_demo_stack, write_json_and_markdown
from bench.workers_peak_calc import client_counts, cpu_per_request, peak_ratios, peaks, serve_growth
from bench.workers_peak_md import markdown as _markdown
from bench.overhead import _Cpu
from sim.click_options import ClickOptions
from sim.demo import ClusterSpec, DemoPaths
from sim.procs import free_port, python_module_cmd, start_process, stop_process, wait_for_json_file, wait_for_url


class _RedisStats:
    """Counters of one redis-server: command calls (``INFO commandstats``), socket reads
    (``INFO stats`` ``total_reads_processed``) and the process's CPU seconds (psutil on the pid of
    ``INFO server``; None when that pid is not on this host)."""

    def __init__(self, url: str) -> None:
        import redis

        self.client = redis.Redis.from_url(url)
        self.cpu: _Cpu | None = None
        try:
            pid = int(self.client.info("server")["process_id"])
            self.cpu = _Cpu(pid, children=False)
            self.cpu.seconds()
        except Exception:  # noqa: BLE001 - remote Redis: no CPU figure
            self.cpu = None

    def sample(self) -> dict[str, Any]:
        stats = self.client.info("commandstats")
        calls = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}
        usec = {k.removeprefix("cmdstat_"): int(v.get("usec", 0)) for k, v in stats.items()}
        return {"calls": calls, "usec": usec, "reads": int(self.client.info("stats")["total_reads_processed"]),
                "cpu_s": None if self.cpu is None else self.cpu.seconds()}

    @staticmethod
    def per_request(a: dict[str, Any], b: dict[str, Any], requests: int, wall: float) -> dict[str, Any]:
        n = max(1, requests)
        calls = {k: round((v - a["calls"].get(k, 0)) / n, 3) for k, v in b["calls"].items()
                 if v - a["calls"].get(k, 0) > 0 and k not in ("info",)}
        # session 11: the server's own execution time per request (INFO commandstats usec): EVALSHA's
        # includes the commands its script calls (counted again under their own names), so "scripts" is
        # the Lua side in full; the rest of redis-server's CPU is socket I/O and its event loop
        usec = {k: (v - a["usec"].get(k, 0)) / n for k, v in b["usec"].items() if k != "info"}
        timing = {"redis_scripts_us_per_req": round(usec.get("evalsha", 0.0) + usec.get("eval", 0.0), 2),
                  "redis_stream_us_per_req": round(usec.get("xadd", 0.0) + usec.get("xread", 0.0), 2)}
        return {**timing, "redis_cores": None if b["cpu_s"] is None else round((b["cpu_s"] - a["cpu_s"]) / wall, 3),
                "redis_cmds_per_req": round(sum(calls.values()), 3),
                "redis_reads_per_req": round((b["reads"] - a["reads"] - 2) / n, 3), "redis_calls_per_req": calls}


class _TreeCpu(_Cpu):
    """:class:`bench.overhead._Cpu` of a ``prefixgate serve`` tree, also split: ``serve_seconds`` the
    gateway processes (command line ``gateway.cli``: the one process, or the parent and its workers),
    the rest (audit worker, span exporter) being ``seconds() - serve_seconds()``."""

    def serve_seconds(self) -> float:
        return sum(self.per_serve().values())

    def switches(self) -> tuple[int, int]:
        """Context switches of the gateway processes (voluntary: the process blocked, i.e. its event
        loop went idle and was woken; involuntary: preempted by another runnable process)."""
        import psutil

        v = i = 0
        for p in [self.proc, *self.proc.children(recursive=True)]:
            try:
                if "gateway.cli" in " ".join(p.cmdline()):
                    c = p.num_ctx_switches()
                    v, i = v + c.voluntary, i + c.involuntary
            except psutil.Error:
                pass
        return v, i

    def conns(self, port: int) -> list[int]:
        """Client connections each gateway process holds on ``port`` now (busiest first; the kernel's
        ``SO_REUSEPORT`` hash of each connection picks its worker), processes holding none left out."""
        import psutil

        out = []
        for p in [self.proc, *self.proc.children(recursive=True)]:
            try:
                if "gateway.cli" in " ".join(p.cmdline()):
                    out.append(sum(1 for c in p.net_connections("tcp")
                                   if c.laddr and c.laddr.port == port and c.status == psutil.CONN_ESTABLISHED))
            except psutil.Error:
                pass
        return sorted((n for n in out if n), reverse=True)

    def per_serve(self) -> dict[int, float]:
        """CPU seconds of each gateway process (pid -> seconds): the parent of ``--workers`` idles, so
        the split shows how the kernel spread the load generator's connections over the workers."""
        import psutil

        out: dict[int, float] = {}
        for p in [self.proc, *self.proc.children(recursive=True)]:
            try:
                if "gateway.cli" in " ".join(p.cmdline()):
                    t = p.cpu_times()
                    out[p.pid] = t.user + t.system
            except psutil.Error:
                pass
        return out


async def _measure(generator: str, url: str, headers: Any, clients: int, seconds: float,
                   gateway: _TreeCpu, replicas: _Cpu, redis: _RedisStats | None) -> dict[str, Any]:
    """One warm-up second, then the measured peak with the gateway's, the replicas' and Redis's cores
    (and Redis commands and reads per request) beside it."""
    bodies = loadgen._Body(False)
    await loadgen.peak(generator, url, headers, clients, 1.0, bodies)  # warm-up: connections, pools, caches
    r_before = redis.sample() if redis is not None else None
    g0, s0, r0, t0 = gateway.seconds(), gateway.serve_seconds(), replicas.seconds(), time.monotonic()
    w0, x0 = gateway.per_serve(), gateway.switches()
    run = asyncio.ensure_future(loadgen.peak(generator, url, headers, clients, seconds, bodies))
    await asyncio.sleep(min(1.0, seconds / 2))  # mid-window: the load generator's connections are open
    conns = await asyncio.to_thread(gateway.conns, int(url.split(":")[2].split("/")[0]))
    res = await run
    wall = time.monotonic() - t0
    w1, x1 = gateway.per_serve(), gateway.switches()
    out = {**{k: v for k, v in res.items() if k != "wrk"}, "gateway_cores": round((gateway.seconds() - g0) / wall, 3),
           "serve_cores": round((gateway.serve_seconds() - s0) / wall, 3),
           "replica_cores": round((replicas.seconds() - r0) / wall, 3),
           # each gateway process's cores, busiest first (the --workers parent's ~0 dropped)
           "worker_cores": sorted((round((w1[k] - w0.get(k, 0.0)) / wall, 3) for k in w1
                                   if (w1[k] - w0.get(k, 0.0)) / wall >= 0.02), reverse=True),
           "worker_conns": conns}
    out["serve_us_per_req"] = round(out["serve_cores"] * wall * 1e6 / max(1, int(res["ok"])), 1)
    # session 10: serve processes' wakeups (voluntary switches) and preemptions per answered request
    out["serve_wakeups_per_req"], out["serve_preempted_per_req"] = (
        round((b - a) / max(1, int(res["ok"])), 3) for a, b in zip(x0, x1))
    if redis is not None and r_before is not None:
        out |= _RedisStats.per_request(r_before, redis.sample(), int(res["ok"]) + int(res["errors"]), wall)
    return out


async def _target(name: str, cfg: dict[str, Any], workers: int, paths: DemoPaths, headers: Any,
                  a: SimpleNamespace, generators: list[tuple[str, str, int]], replicas: _Cpu,
                  redis: _RedisStats | None, tree: Path | None = None) -> dict[str, dict[str, Any]]:
    doc = json.loads(json.dumps(cfg))
    doc["listen"]["port"], doc["admin"]["port"] = free_port(), free_port()
    audit = paths.work / f"audit-{name.replace(' ', '_')}"
    doc["audit"]["jsonl"]["dir"] = str(audit / "jsonl")
    doc["audit"]["ocsf"]["file"] = str(audit / "ocsf.jsonl")
    doc["audit"]["spill"]["dir"] = str(audit / "spill")
    path = paths.work / f"{name.replace(' ', '_')}.yaml"
    path.write_text(yaml.safe_dump(doc))
    args = ["serve", "--config", str(path)] + (["--workers", str(workers)] if workers > 1 else [])
    env = None if tree is None else {"PYTHONPATH": str(tree)}
    proc = start_process(name.replace(" ", "_").replace("@", ""), python_module_cmd("gateway.cli", *args), paths.logs,
                         env=env, cwd=tree)
    base = f"http://127.0.0.1:{doc['listen']['port']}"
    try:
        await wait_for_url(f"{base}/readyz", timeout_s=60, proc=proc)
        gateway = _TreeCpu(proc.pid)
        return {key: await _measure(g, f"{base}/v1/completions", headers, clients, a.seconds, gateway, replicas,
                                    redis if cfg["state"]["backend"] == "redis" else None)
                for key, g, clients in generators}
    finally:
        stop_process(proc, timeout_s=30)


async def run(a: SimpleNamespace) -> dict[str, Any]:
    """Run the rounds of ``a`` (see module doc); returns the result document."""
    from sim.redis_server import REDIS_SERVER, RedisServer

    base_generators = [g for g in a.load_generator.split(",") if g]
    for g in base_generators:
        loadgen.require_generator(g)
    counts = client_counts(a.clients)
    # session 11: each (generator, client count) is measured on every target; with one count the
    # result keys are the generators' names as before, with several "<generator> c<count>"
    generators = [(g if len(counts) == 1 else f"{g} c{n}", g, n) for g in base_generators for n in counts]
    work = Path(tempfile.mkdtemp(prefix="prefixgate-workers-peak-", dir=a.work))
    redis = None
    if not a.redis_url:
        (work / "redis").mkdir(parents=True, exist_ok=True)
        redis = RedisServer(REDIS_SERVER or "/usr/bin/redis-server", work / "redis").start()
    redis_url = a.redis_url or redis.url  # type: ignore[union-attr]
    stack = await start_demo_stack(work, ClusterSpec(replicas=2, time_scale=1e6, decode_s_per_token=0.0))
    lean = None
    headers = {"Content-Type": "application/json", **dict(stack.headers_for(["tenant-a"])("tenant-a"))}
    fixtures: dict[str, tuple[str, list[dict[str, str]], _Cpu]] = {}
    try:
        for kind in [k for k in a.replica.split(",") if k]:
            if kind == "sim":
                fixtures[kind] = ("", stack.replicas, _Cpu(stack.cluster.pid))
            elif kind == "lean":
                ready = work / "lean-ready.json"
                lean = start_process("lean_replica", python_module_cmd("bench.lean_replica", "--replicas", "2",
                                                                       "--ready-file", str(ready)), stack.paths.logs)
                fixtures[kind] = (" [lean]", list(await wait_for_json_file(ready, proc=lean)), _Cpu(lean.pid))
            else:
                raise SystemExit(f"error: --replica: unknown fixture {kind!r} (sim, lean)")
    except BaseException:
        stack.stop()
        if lean is not None:
            stop_process(lean)
        raise
    redis_state = {"backend": "redis", "url": redis_url, "key_prefix": "pgpeak:"}
    all_targets: dict[str, list[tuple[Any, ...]]] = {"memory": [], "redis1": [], "redisN": []}
    for suffix, reps, cpu in fixtures.values():
        base = stack.gateway_config(["tenant-a"])
        base["replicas"] = [{"id": r["replica_id"], "url": r["url"], "pool": "default", "labels": {}} for r in reps]
        base["tenancy"]["tenants"][0].update(rate_rps=1e6, rate_burst=1e6, max_concurrency=10_000)
        all_targets["memory"].append((f"memory x1{suffix}", {**base, "state": {"backend": "memory"}}, 1, None, cpu))
        all_targets["redis1"].append((f"redis x1{suffix}", {**base, "state": redis_state}, 1, None, cpu))
        all_targets["redisN"].append((f"redis x{a.workers}{suffix}", {**base, "state": redis_state}, a.workers,
                                      None, cpu))
        if a.baseline:
            tree = Path(a.baseline).resolve()
            all_targets["redis1"].append((f"redis x1 @base{suffix}", {**base, "state": redis_state}, 1, tree, cpu))
            all_targets["redisN"].append((f"redis x{a.workers} @base{suffix}", {**base, "state": redis_state},
                                          a.workers, tree, cpu))
    targets = [t for k in a.targets.split(",") if k for t in all_targets[k]]
    rstats = _RedisStats(redis_url)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {g[0]: {t[0]: [] for t in targets} for g in generators}
    try:
        for r in range(a.rounds):
            gens = generators[r % len(generators):] + generators[:r % len(generators)]
            k = r % len(targets)
            for name, cfg, workers, tree, replicas in targets[k:] + targets[:k]:
                res = await _target(name, cfg, workers, stack.paths, headers, a, gens, replicas, rstats, tree)
                for g, x in res.items():
                    runs[g][name].append(x)
                    extra = (f", redis {x['redis_cores']} cores, {x['redis_cmds_per_req']} cmds/req, "
                             f"{x['redis_reads_per_req']} reads/req" if "redis_cores" in x else "")
                    print(f"round {r + 1} {name:15s} {g:9s} {x['rps']:.0f} req/s, load generator {x['loadgen_cores']} "
                          f"cores, gateway {x['gateway_cores']} (serve {x['serve_cores']}, "
                          f"{x['serve_us_per_req']} µs/req, {x['serve_wakeups_per_req']} wakeups and "
                          f"{x['serve_preempted_per_req']} preemptions/req; per process {x['worker_cores']}, "
                          f"connections {x['worker_conns']}), "
                          f"replicas {x['replica_cores']}{extra}, "
                          f"errors {x['errors']}", flush=True)
    finally:
        stack.stop()
        if lean is not None:
            stop_process(lean)
        if redis is not None:
            redis.stop()

    def med(xs: list[dict[str, Any]], key: str) -> float | None:
        vals = [x[key] for x in xs if x.get(key) is not None]
        return round(statistics.median(vals), 3) if vals else None

    keys = ("rps", "loadgen_cores", "gateway_cores", "serve_cores", "serve_us_per_req", "replica_cores",
            "redis_cores", "redis_cmds_per_req", "redis_reads_per_req", "redis_scripts_us_per_req",
            "redis_stream_us_per_req", "serve_wakeups_per_req",
            "serve_preempted_per_req")
    summary = {g: {name: {k: med(xs, k) for k in keys}
                   | {"errors": sum(x["errors"] for x in xs)} for name, xs in per.items()} for g, per in runs.items()}
    ratios: dict[str, dict[str, float]] = {}
    for g, s in summary.items():
        for fix in ("", " [lean]"):
            for suffix in ("", " @base"):
                one, many = s.get(f"redis x1{suffix}{fix}"), s.get(f"redis x{a.workers}{suffix}{fix}")
                if one and many and one["rps"]:
                    ratios.setdefault(g, {})[f"redis x{a.workers}{suffix}{fix} / redis x1{suffix}{fix}"] = round(
                        many["rps"] / one["rps"], 3)
                mem = s.get(f"memory x1{fix}")
                if mem and many and mem["rps"]:
                    ratios.setdefault(g, {})[f"redis x{a.workers}{suffix}{fix} / memory x1{fix}"] = round(
                        many["rps"] / mem["rps"], 3)
    best = peaks(summary, generators)
    cpu = cpu_per_request(summary)
    return {"label": a.label, "runs": runs, "summary": summary, "cpu_per_request": cpu,
            "serve_growth": serve_growth(cpu, a.workers),
            "clients": counts, "seconds": a.seconds, "rounds": a.rounds, "workers": a.workers,
            "generators": [g[0] for g in generators], "baseline": a.baseline, "ratios": ratios,
            "peaks": best, "peak_ratios": peak_ratios(best, a.workers) if len(counts) > 1 else {},
            "loadavg": os.getloadavg(), "cpus": os.cpu_count()}



def main() -> None:
    """``python -m bench.workers_peak``: run and write ``<--out>.{json,md}``."""
    ap = ClickOptions(prog="python -m bench.workers_peak", description=__doc__.splitlines()[0])
    ap.option("--redis-url", default=None, help="default: start a redis-server of our own")
    ap.option("--workers", type=int, default=2)
    ap.option("--rounds", type=int, default=2)
    ap.option("--clients", default="32",
              help="closed-loop clients (wrk connections); a comma-separated list (32,64) measures every target "
                   "at each and also reports each target's peak over them")
    ap.option("--seconds", type=float, default=8.0)
    ap.option("--load-generator", default="python",
              help="python, wrk, or a comma-separated list (python,wrk): each target measured with each")
    ap.option("--targets", default="memory,redis1,redisN",
              help="comma-separated subset of memory, redis1 (one process), redisN (--workers)")
    ap.option("--replica", default="sim,lean",
              help="replica fixture(s): sim (sim.cluster), lean (bench.lean_replica), or sim,lean (both, interleaved)")
    ap.option("--baseline", default=None, help="another source tree: its Redis targets run beside this tree's")
    ap.option("--label", default="Machine: not stated.", help="a line saying where it ran (quiet or shared machine)")
    ap.option("--work", default=None, help="parent of the work directory (default: the system's temp dir)")
    ap.option("--out", default="bench/results/workers_peak")
    a = ap.parse()
    client_counts(a.clients)  # refuses a bad --clients before anything starts
    try:
        for g in a.load_generator.split(","):
            loadgen.require_generator(g)
    except (loadgen.WrkMissingError, ValueError) as e:
        raise SystemExit(f"error: {e}") from None
    r = asyncio.run(run(a))
    write_json_and_markdown(a.out, r, _markdown(r))


if __name__ == "__main__":
    main()
