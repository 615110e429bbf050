"""Where a request's time goes: PrefixGate beside direct, SGLang's router and a bare passthrough (not a test).

``python -m bench.overhead [--runs 3] [--sequential 500] [--clients 64] [--seconds 8]``
(issue 14). One run on this machine, everything on loopback:

* **the replica**: one simulated replica (``python -m sim.cluster``, time
  scale 10^6 and no decode time: it answers at once);
* **direct**: the load generator straight to that replica;
* **smg**: SGLang's router, ``smg`` 1.13.0 (Shepherd Model Gateway, the
  current release of ``sglang-router``; ``python -m smg.launch_router
  --worker-urls URL --policy cache_aware``), started by
  :func:`sim.bench.start_sglang_router`;
* **passthrough**: a feature-less Starlette app on PrefixGate's own stack
  (the event loop :func:`gateway.server.run_serving` picks, the uvicorn
  settings of :func:`gateway.server.uvicorn_config`, the upstream session of
  :func:`gateway.proxy.make_session`) that forwards the body bytes to the
  replica and the answer back: the floor of that stack;
* **prefixgate**: ``prefixgate serve`` (``python -m gateway.cli serve``) with
  the demo configuration of :func:`sim.demo.gateway_config`: JWT-SVID
  authentication, tenant HMAC prefix chain, embedded OPA, ``cache_aware``
  routing, the audit trail (signed JSONL hash chain + OCSF file, with the
  audit worker process), otherwise the default configuration, one process.

Workload per target and run: 50 warm-up requests, then ``--sequential``
(500) sequential requests on one keep-alive connection (latency p50/p90/p99
in ms; added p50 = target p50 minus direct p50 *of the same run*), then
``--clients`` (64) closed-loop clients for ``--seconds`` (8 s): peak rate =
successful answers per second. Non-streaming completions (``--stream`` for
SSE), 64-word prompts unique per request, ``max_tokens`` 1. Targets are
interleaved within a run (the order rotates from run to run) and every
headline figure is the median over ``--runs`` (3) runs. CPU per request of
each target's processes (psutil, user + system, all threads and children)
is read around each phase.

Then one **profiled** PrefixGate process (same configuration, its own audit
directory) runs the sequential phase under :mod:`cProfile` (thread CPU time
as the clock), switched on and off by signals around exactly those
requests. Stage CPU (µs per request) is the cumulative time of each stage's
functions (:data:`STAGES`); loop-invoked callbacks of aiohttp (upstream
response parsing), of the audit package and of OpenTelemetry are added to
their stage; the event loop's own frames are one row, and the remainder —
uvicorn, Starlette, the framing guard and the pipeline's own glue — is the
"HTTP server" row. The profiler inflates call-heavy code, so the table also
gives every row scaled by (unprofiled CPU per request / profiled CPU per
request) of the same process and phase. The gateway's own audit timings
(``latency`` of each audit event: authentication, policy, route, first
byte, total; wall ms) are the medians over the first run's sequential
phase.

Results: ``bench/results/overhead.{json,md}``. The machine has 2 cores shared
by the load generator, the replica, the router under test and anything else
running: absolute figures are noisy; ratios within one run less so. The
whole run takes about 3 minutes (``--runs 3``).
"""

from __future__ import annotations

import asyncio
import cProfile
import json
import os
import pstats
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click

from sim.click_options import ClickOptions

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
TARGET_NAMES = ("direct", "smg", "passthrough", "prefixgate")
WARMUP = 50

#: Stage -> functions whose cumulative CPU is that stage's ((file suffix, function name) pairs).
STAGES: dict[str, tuple[tuple[str, str], ...]] = {
    "authentication": (("gateway/authn.py", "authenticate"),),
    "parse and validation": (("gateway/request.py", "read_body"), ("gateway/request.py", "parse_inference_request")),
    "tokenize": (("gateway/admission.py", "prompt_tokens"), ("gateway/admission.py", "check_prompt")),
    "HMAC chain": (("gateway/prefix_keys.py", "prefix_chains"), ("gateway/prefix_keys.py", "prefix_fingerprint")),
    "policy": (("gateway/pep.py", "decide"), ("gateway/admission.py", "clamp_max_tokens"),
               ("gateway/pep.py", "allowed_candidates")),
    "route": (("gateway/replicas.py", "candidates"), ("routing/router.py", "route")),
    "upstream client": (("gateway/proxy.py", "open_upstream"), ("gateway/proxy.py", "read_chunk"),
                        ("gateway/upstream.py", "answered")),
    "SSE relay": (("gateway/sse.py", "feed"), ("gateway/sse.py", "finish")),
    "audit event": (("gateway/recording.py", "record"),),
    "spans": (("gateway/auditing.py", "start_span"), ("gateway/auditing.py", "inject_trace_headers")),
}
#: Functions nested in another stage's function but belonging to this stage: (stage, parent stage, function).
_NESTED = (("spans", "audit event", ("gateway/auditing.py", "_end_spans")),)
#: Loop-invoked callbacks, by file, added to a stage.
_CALLBACK_STAGE = (("/aiohttp/", "upstream client"), ("/audit/", "audit event"), ("/opentelemetry/", "spans"))


# ------------------------------------------------------------------ children: passthrough, profiled gateway
def passthrough_app(upstream: str) -> Any:
    """A feature-less Starlette app forwarding ``POST /v1/*`` bodies to ``upstream`` (and ``GET /healthz``).

    It uses PrefixGate's upstream session (:func:`gateway.proxy.make_session`)
    and nothing else: no authentication, parsing, policy, routing or audit.
    """
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route

    from gateway.proxy import make_session

    state: dict[str, Any] = {}

    async def forward(request: Request) -> Response:
        body = await request.body()
        session = state.get("session")
        if session is None:  # created in the serving loop, once
            session = state["session"] = make_session(256, 5.0, 30.0)
        resp = await session.post(upstream + request.url.path, data=body,
                                           headers={"Content-Type": "application/json"})
        if resp.content_type == "text/event-stream":
            async def relay() -> Any:
                try:
                    async for chunk in resp.content.iter_any():
                        yield chunk
                finally:
                    resp.release()
            return StreamingResponse(relay(), status_code=resp.status, media_type=resp.content_type)
        data = await resp.read()
        resp.release()
        return Response(data, status_code=resp.status, media_type=resp.content_type)

    async def healthz(request: Request) -> Response:
        return Response(b"ok")

    return Starlette(routes=[Route("/v1/completions", forward, methods=["POST"]),
                             Route("/v1/chat/completions", forward, methods=["POST"]),
                             Route("/healthz", healthz, methods=["GET"])])


async def _serve_passthrough(upstream: str, port: int) -> None:
    from gateway.server import GatewayServer, uvicorn_config

    server = GatewayServer(uvicorn_config(passthrough_app(upstream), "127.0.0.1", port))
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, lambda: setattr(server, "should_exit", True))
    await server.serve()


def _serve_profiled(config_file: str, profile_out: str) -> None:
    """``prefixgate serve`` with a profiler: SIGUSR1 starts it, SIGUSR2 stops it and writes ``profile_out``."""
    from gateway.config import load_config
    from gateway.server import serve
    from policy import reexec_with_go_gc

    reexec_with_go_gc(["-m", "bench.overhead", *sys.argv[1:]])  # as `prefixgate serve` does
    prof = cProfile.Profile(time.thread_time)  # CPU time: idle waits and preemption do not count

    def start(*_: Any) -> None:
        prof.enable()

    def stop(*_: Any) -> None:
        prof.disable()
        prof.dump_stats(profile_out + ".tmp")
        os.replace(profile_out + ".tmp", profile_out)

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    _run(serve(load_config(config_file), config_path=config_file))


def _run(coro: Any) -> Any:
    """Run ``coro`` the way ``prefixgate serve`` runs the gateway."""
    from gateway.server import run_serving

    return run_serving(coro)


# ------------------------------------------------------------------ load
def _prompt(n: int) -> str:
    return " ".join(f"w{n}x{j}" for j in range(64))


class _Body:
    """Request bodies: 64 words unique per request, ``max_tokens`` 1."""

    def __init__(self, stream: bool) -> None:
        self.n = 0
        self.stream = stream

    def __call__(self) -> bytes:
        self.n += 1
        doc: dict[str, Any] = {"model": "sim-model", "prompt": _prompt(self.n), "max_tokens": 1}
        if self.stream:
            doc["stream"] = True
        return json.dumps(doc).encode()


async def _one(session: Any, url: str, headers: Mapping[str, str], body: bytes) -> bool:
    async with session.post(url, data=body, headers=headers) as resp:
        await resp.read()
        return resp.status == 200


async def sequential(url: str, headers: Mapping[str, str], n: int, bodies: _Body) -> dict[str, Any]:
    """``n`` requests one after the other on one keep-alive connection; latencies in ms."""
    import aiohttp

    lat: list[float] = []
    errors = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session:
        for _ in range(n):
            body = bodies()
            t = time.perf_counter()
            ok = await _one(session, url, headers, body)
            if ok:
                lat.append((time.perf_counter() - t) * 1000.0)
            else:
                errors += 1
    return {"n": n, "errors": errors, **_percentiles(lat)}


async def closed_loop(url: str, headers: Mapping[str, str], clients: int, seconds: float,
                      bodies: _Body) -> dict[str, Any]:
    """``clients`` closed-loop clients for ``seconds``: successful answers per second."""
    import aiohttp

    ok = errors = 0
    stop_at = time.monotonic() + seconds

    async def client(session: Any) -> None:
        nonlocal ok, errors
        while time.monotonic() < stop_at:
            try:
                if await _one(session, url, headers, bodies()):
                    ok += 1
                else:
                    errors += 1
            except aiohttp.ClientError:
                errors += 1

    t0 = time.monotonic()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as session:
        await asyncio.gather(*(client(session) for _ in range(clients)))
    wall = time.monotonic() - t0
    return {"ok": ok, "errors": errors, "wall_s": round(wall, 3), "rps": round(ok / wall, 1)}


def _percentiles(lat: Sequence[float]) -> dict[str, float | None]:
    from sim.report import percentile

    return {f"p{q}_ms": (None if not lat else round(percentile(list(lat), q), 3)) for q in (50, 90, 99)}


# ------------------------------------------------------------------ CPU accounting
class _Cpu:
    """CPU seconds (user + system, all threads) of a process and (``children``) its descendants, via psutil."""

    def __init__(self, pid: int, children: bool = True) -> None:
        import psutil

        self.proc = psutil.Process(pid)
        self.children = children

    def seconds(self) -> float:
        import psutil

        total = 0.0
        for p in [self.proc, *(self.proc.children(recursive=True) if self.children else ())]:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
        return total


async def measured(cpu: _Cpu | None, n: int, work: Any) -> tuple[dict[str, Any], float | None]:
    """Await ``work`` and return its result and the CPU µs per request of ``cpu`` meanwhile."""
    before = cpu.seconds() if cpu is not None else 0.0
    res = await work
    used = cpu.seconds() - before if cpu is not None else None
    return res, (None if used is None or not n else round(used * 1e6 / n, 1))


# ------------------------------------------------------------------ profile → stages
def _match(func: tuple[str, int, str], key: tuple[str, str]) -> bool:
    return func[2] == key[1] and func[0].replace(os.sep, "/").endswith(key[0])


def _is_loop(func: tuple[str, int, str]) -> bool:
    """An event-loop frame: asyncio's Python loop, or a C method of uvloop / the C task."""
    name = func[0].replace(os.sep, "/")
    return "/asyncio/" in name or (name == "~" and any(m in func[2] for m in ("uvloop", "_asyncio", "Context")))


def stage_cpu(stats: pstats.Stats, requests: int) -> dict[str, float]:
    """Per-request CPU µs of each stage from a profile of ``requests`` requests (see module doc)."""
    raw: dict[tuple[str, int, str], Any] = stats.stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in raw.values())  # every function's own time = all profiled time
    out = {name: 0.0 for name in STAGES}
    for func, (_cc, _nc, _tt, ct, _callers) in raw.items():
        for name, keys in STAGES.items():
            if any(_match(func, k) for k in keys):
                out[name] += ct
    for stage, parent, key in _NESTED:
        nested = sum(v[3] for f, v in raw.items() if _match(f, key))
        out[stage] += nested
        out[parent] -= nested
    loop_self = 0.0
    for func, (_cc, _nc, tt, ct, callers) in raw.items():
        if _is_loop(func):
            loop_self += tt
            continue
        entry = ct if not callers else sum(e[3] for c, e in callers.items() if _is_loop(c))
        name = func[0].replace(os.sep, "/")
        for marker, stage in _CALLBACK_STAGE:
            if marker in name:
                out[stage] += entry
    out["event loop"] = loop_self
    out["HTTP server (uvicorn, Starlette, framing guard, pipeline glue)"] = total - sum(out.values())
    out["total"] = total
    return {k: round(v * 1e6 / requests, 1) for k, v in out.items()}


def audit_timings(jsonl_dir: Path, skip: int, take: int) -> dict[str, float | None]:
    """Medians (ms) of the audit events' ``latency`` fields, events ``skip`` .. ``skip + take`` in file order."""
    lats: list[dict[str, Any]] = []
    for f in sorted(jsonl_dir.glob("*.jsonl")):
        for line in f.read_text().splitlines():
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            lat = _find_latency(doc)
            if lat is not None:
                lats.append(lat)
    lats = lats[skip:skip + take]
    keys = ("auth_ms", "parse_ms", "keys_ms", "policy_ms", "route_ms", "first_byte_ms", "total_ms")
    return {k: (round(statistics.median(v), 3) if (v := [x[k] for x in lats if x.get(k) is not None]) else None)
            for k in keys} | {"events": len(lats)}


def _find_latency(doc: Any) -> dict[str, Any] | None:
    if isinstance(doc, dict):
        if isinstance(doc.get("latency"), dict):
            return doc["latency"]
        for v in doc.values():
            found = _find_latency(v)
            if found is not None:
                return found
    return None


# ------------------------------------------------------------------ orchestration
async def _spawn(name: str, args: Sequence[str], paths: Any, port: int, probe: str, *,
                 tree: Path = REPO) -> tuple[Any, str]:
    """Start ``python -m ARGS`` (from source ``tree``) and wait until ``GET probe`` on ``port`` is 200."""
    from sim.procs import python_module_cmd, start_process, stop_process, wait_for_url

    proc = start_process(name, python_module_cmd(*args), paths.logs, cwd=tree,
                         env=None if tree == REPO else {"PYTHONPATH": str(tree)})
    base = f"http://127.0.0.1:{port}"
    try:
        await wait_for_url(base + probe, timeout_s=30.0, proc=proc)
    except BaseException:
        stop_process(proc)
        raise
    return proc, base


async def _start_passthrough(upstream: str, paths: Any) -> tuple[Any, str]:
    from sim.procs import free_port

    port = free_port()
    return await _spawn("passthrough", ["bench.overhead", "--passthrough", upstream, "--port", str(port)],
                        paths, port, "/healthz")


def apply_settings(doc: dict[str, Any], settings: Sequence[str]) -> None:
    """Set ``KEY=VALUE`` pairs in a configuration document, in place.

    ``KEY`` is a dotted path (``routing.policy.calibrate``); missing sections are
    created; ``VALUE`` is read as YAML (``false``, ``64``, ``null``). Raises
    ``ValueError`` for a pair without ``=`` or an empty key part.
    """
    import yaml

    for item in settings:
        key, sep, raw = item.partition("=")
        parts = key.split(".")
        if not sep or not all(parts):
            raise ValueError(f"--baseline-set {item!r}: expected KEY=VALUE with a dotted KEY")
        node = doc
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = yaml.safe_load(raw)


def _second_config(cfg: Mapping[str, Any], paths: Any, name: str) -> dict[str, Any]:
    """``cfg`` for a second gateway beside the first: its own ports and audit directory."""
    from sim.procs import free_port

    doc = json.loads(json.dumps(cfg))
    doc["listen"]["port"] = free_port()
    doc["admin"]["port"] = free_port()
    prof_dir = paths.work / f"{name}-audit"
    doc["audit"]["jsonl"]["dir"] = str(prof_dir / "jsonl")
    doc["audit"]["ocsf"]["file"] = str(prof_dir / "ocsf.jsonl")
    doc["audit"]["spill"]["dir"] = str(prof_dir / "spill")
    return doc


async def _start_baseline(tree: Path, cfg: Mapping[str, Any], paths: Any) -> tuple[Any, str]:
    """``prefixgate serve`` from another source tree (``--baseline``), e.g. an export of main."""
    import yaml

    cfg_path = paths.work / "baseline.yaml"
    cfg_path.write_text(yaml.safe_dump(dict(cfg), sort_keys=False))
    return await _spawn("baseline", ["gateway.cli", "serve", "--config", str(cfg_path)], paths,
                        cfg["listen"]["port"], "/readyz", tree=tree)


async def _profile(cfg: Mapping[str, Any], paths: Any, headers: Mapping[str, str], n: int, bodies: _Body,
                   log: Callable[[str], None]) -> dict[str, Any]:
    """Run the sequential phase against a profiled gateway; returns stage CPU (raw and scaled)."""
    import yaml

    from sim.procs import stop_process

    doc = _second_config(cfg, paths, "profiled")
    cfg_path = paths.work / "profiled.yaml"
    cfg_path.write_text(yaml.safe_dump(doc, sort_keys=False))
    out = paths.work / "gateway.prof"
    proc, base = await _spawn("profiled", ["bench.overhead", "--profiled-gateway", str(cfg_path),
                                           "--profile-out", str(out)], paths, doc["listen"]["port"], "/readyz")
    url = base + "/v1/completions"
    try:
        cpu = _Cpu(proc.pid, children=False)  # the profile covers the gateway process, not the audit worker
        await sequential(url, headers, WARMUP, bodies)
        plain, plain_cpu = await measured(cpu, n, sequential(url, headers, n, bodies))
        os.kill(proc.pid, signal.SIGUSR1)
        await asyncio.sleep(0.2)  # the handler runs at the gateway's next bytecode; nothing else is in flight
        profiled, prof_cpu = await measured(cpu, n, sequential(url, headers, n, bodies))
        os.kill(proc.pid, signal.SIGUSR2)
        deadline = time.monotonic() + 30
        while not out.exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
    finally:
        stop_process(proc)
    stages = stage_cpu(pstats.Stats(str(out)), n)
    scale = (plain_cpu or 0.0) / prof_cpu if prof_cpu else float("nan")
    log(f"  profiled gateway: p50 {plain['p50_ms']} ms unprofiled, {profiled['p50_ms']} ms profiled; "
        f"CPU/request {plain_cpu} µs unprofiled, {prof_cpu} µs profiled")
    return {"requests": n, "cpu_us_unprofiled": plain_cpu, "cpu_us_profiled": prof_cpu, "scale": round(scale, 3),
            "p50_ms_unprofiled": plain["p50_ms"], "p50_ms_profiled": profiled["p50_ms"],
            "stages_us_profiled": stages,
            "stages_us_scaled": {k: round(v * scale, 1) for k, v in stages.items()}}


async def run_bench(args: SimpleNamespace, log: Callable[[str], None] = print) -> dict[str, Any]:
    """The whole benchmark (see module doc); returns the result document."""
    from bench.harness import start_demo_stack
    from sim.bench import start_sglang_router
    from sim.demo import ClusterSpec
    from sim.procs import stop_process

    t_start = time.monotonic()
    stack = await start_demo_stack(Path(tempfile.mkdtemp(prefix="pg-overhead-")),
                                   ClusterSpec(replicas=1, time_scale=1e6, decode_s_per_token=0.0))
    paths, cluster, replicas = stack.paths, stack.cluster, stack.replicas
    bodies = _Body(args.stream)
    procs: list[Any] = []
    try:
        direct_url = replicas[0]["url"]
        smg, smg_url = await start_sglang_router("cache_aware", [direct_url], paths)
        procs.append(smg)
        pt, pt_url = await _start_passthrough(direct_url, paths)
        procs.append(pt)
        cfg = stack.gateway_config(["tenant-a"])
        pg, pg_url = await stack.start_gateway("prefixgate", cfg)
        procs.append(pg)
        if args.baseline:
            base_cfg = _second_config(cfg, paths, "baseline")
            base_cfg["policy"]["dir"] = str(args.baseline / "rego")
            apply_settings(base_cfg, args.baseline_set)
            bl, bl_url = await _start_baseline(args.baseline, base_cfg, paths)
            procs.append(bl)
        auth = dict(stack.headers_for(["tenant-a"])("tenant-a"))
        plain = {"Content-Type": "application/json"}
        targets = {
            "direct": (direct_url, plain, _Cpu(cluster.pid)),
            "smg": (smg_url, plain, _Cpu(smg.pid)),
            "passthrough": (pt_url, plain, _Cpu(pt.pid)),
            "prefixgate": (pg_url, {**plain, **auth}, _Cpu(pg.pid)),
        }
        if args.baseline:
            targets["baseline"] = (bl_url, {**plain, **auth}, _Cpu(bl.pid))
        names = list(targets)
        runs: list[dict[str, Any]] = []
        for run in range(args.runs):
            k = run % len(names)
            order = names[k:] + names[:k]
            row: dict[str, Any] = {}
            for name in order:
                base, headers, cpu = targets[name]
                url = base + "/v1/completions"
                await sequential(url, headers, WARMUP, bodies)
                seq, seq_cpu = await measured(cpu, args.sequential, sequential(url, headers, args.sequential, bodies))
                peak = await closed_loop(url, headers, args.clients, args.seconds, bodies)
                row[name] = {"sequential": seq, "sequential_cpu_us": seq_cpu, "peak": peak}
                log(f"run {run + 1}/{args.runs} {name:12s} p50 {seq['p50_ms']:.3f} p90 {seq['p90_ms']:.3f} "
                    f"p99 {seq['p99_ms']:.3f} ms, CPU {seq_cpu} µs/req; peak {peak['rps']:.0f} req/s "
                    f"(errors {seq['errors']}+{peak['errors']})")
            runs.append(row)
        timings = audit_timings(paths.audit_dir / "jsonl", WARMUP, args.sequential)
        profile = None
        if not args.no_profile:
            profile = await _profile(cfg, paths, {**plain, **auth}, args.sequential, bodies, log)
    finally:
        for p in procs:
            stop_process(p)
        stop_process(cluster)
        if not args.keep_workdir:
            shutil.rmtree(paths.work, ignore_errors=True)
    return {"benchmark": "overhead", "args": {k: (str(v) if isinstance(v, Path) else v)
                                              for k, v in vars(args).items() if k != "out"},
            "cpus": os.cpu_count(), "python": sys.version.split()[0], "wall_s": round(time.monotonic() - t_start, 1),
            "summary": summarize(runs, names), "runs": runs, "audit_timings_ms": timings, "profile": profile}


def summarize(runs: Sequence[Mapping[str, Any]], names: Sequence[str] = TARGET_NAMES) -> dict[str, dict[str, float | None]]:
    """Medians over runs per target: p50/p90/p99, added p50 over direct and peak ratio to smg (same run)."""
    out: dict[str, dict[str, float | None]] = {}

    def med(values: list[float | None]) -> float | None:
        vals = [v for v in values if v is not None]
        return round(statistics.median(vals), 3) if vals else None

    for name in names:
        rows = [r[name] for r in runs if name in r]
        out[name] = {
            **{k: med([r["sequential"][k] for r in rows]) for k in ("p50_ms", "p90_ms", "p99_ms")},
            "added_p50_ms": med([r[name]["sequential"]["p50_ms"] - r["direct"]["sequential"]["p50_ms"]
                                 for r in runs if name in r]),
            "peak_rps": med([r["peak"]["rps"] for r in rows]),
            "peak_vs_smg": med([r[name]["peak"]["rps"] / r["smg"]["peak"]["rps"] for r in runs
                                if r["smg"]["peak"]["rps"]]),
            "cpu_us_per_request": med([r["sequential_cpu_us"] for r in rows]),
            "errors": sum(r["sequential"]["errors"] + r["peak"]["errors"] for r in rows),
        }
    return out


def to_markdown(doc: Mapping[str, Any]) -> str:
    """The result document as markdown tables."""
    a = doc["args"]
    lines = [
        "# Per-request overhead: direct, smg, passthrough, PrefixGate (`python -m bench.overhead`)", "",
        f"{a['runs']} runs (median), {a['sequential']} sequential requests then {a['clients']} closed-loop clients "
        f"for {a['seconds']:g} s per target and run; 64-word prompts, max_tokens 1, "
        f"{'streaming' if a['stream'] else 'plain'} answers; {doc['cpus']} CPUs shared by everything, "
        f"Python {doc['python']}; {doc['wall_s']} s wall.", "",
        "| target | p50 ms | p90 ms | p99 ms | added p50 ms | peak req/s | peak / smg | CPU µs/req (sequential) | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def f(v: Any, fmt: str = ".3f") -> str:
        return "-" if v is None else format(v, fmt)

    for name, s in doc["summary"].items():
        lines.append(f"| {name} | {f(s['p50_ms'])} | {f(s['p90_ms'])} | {f(s['p99_ms'])} | {f(s['added_p50_ms'])} | "
                     f"{f(s['peak_rps'], '.0f')} | {f(s['peak_vs_smg'], '.2f')} | {f(s['cpu_us_per_request'], '.0f')} | "
                     f"{s['errors']} |")
    t = doc["audit_timings_ms"]
    lines += ["", "PrefixGate's own audit timings (median wall ms, first run's sequential phase, "
              f"{t.get('events')} events): authentication {t.get('auth_ms')}, parse {t.get('parse_ms')}, "
              f"prefix keys {t.get('keys_ms')}, policy {t.get('policy_ms')}, route {t.get('route_ms')}, "
              f"first byte {t.get('first_byte_ms')}, total {t.get('total_ms')}."]
    p = doc.get("profile")
    if p:
        lines += ["", f"Stage CPU of PrefixGate (µs per request; cProfile over {p['requests']} sequential requests; "
                  f"gateway process (without the audit worker) CPU {p['cpu_us_unprofiled']} µs/request unprofiled, {p['cpu_us_profiled']} profiled: "
                  f"scale {p['scale']}):", "",
                  "| stage | µs/request (profiled) | µs/request (scaled) |", "|---|---:|---:|"]
        for k, v in p["stages_us_profiled"].items():
            lines.append(f"| {k} | {v:.1f} | {p['stages_us_scaled'][k]:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point (also the passthrough and profiled-gateway children)."""
    ap = ClickOptions(prog="python -m bench.overhead", description=__doc__.splitlines()[0])
    ap.option("--runs", type=int, default=3)
    ap.option("--sequential", type=int, default=500)
    ap.option("--clients", type=int, default=64)
    ap.option("--seconds", type=float, default=8.0)
    ap.option("--stream", is_flag=True, help="SSE answers instead of plain JSON")
    ap.option("--no-profile", is_flag=True, help="skip the profiled stage breakdown")
    ap.option("--baseline", type=click.Path(path_type=Path), help="also run `prefixgate serve` from this source tree "
              "(e.g. `git archive main | tar -x -C DIR`) as target 'baseline', interleaved")
    ap.option("--baseline-set", multiple=True, default=[], metavar="KEY=VALUE",
              help="a configuration value of the baseline only (dotted key, YAML value; repeatable), "
              "e.g. --baseline /path/to/this/tree --baseline-set flow.enabled=false: the cost of a feature")
    ap.option("--keep-workdir", is_flag=True, help="keep configs, logs, audit files and the profile")
    ap.option("--out", type=click.Path(path_type=Path), default=RESULTS)
    ap.option("--name", default="overhead", help="result file stem")
    ap.option("--passthrough", hidden=True)
    ap.option("--port", type=int, hidden=True)
    ap.option("--profiled-gateway", hidden=True)
    ap.option("--profile-out", hidden=True)
    args = ap.parse(argv)
    if args.passthrough:
        _run(_serve_passthrough(args.passthrough, args.port))
        return 0
    if args.profiled_gateway:
        _serve_profiled(args.profiled_gateway, args.profile_out)
        return 0
    import uvloop

    doc = uvloop.run(run_bench(args))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    md = to_markdown(doc)
    (args.out / f"{args.name}.md").write_text(md)
    print(md, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
