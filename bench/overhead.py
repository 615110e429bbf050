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
* **passthrough-native**, **prefixgate-native** (session 22; only when named in ``--targets``): the
  passthrough app and PrefixGate's public app (same configuration) under :mod:`bench.native_front`, an
  optimistic uvloop + httptools front without uvicorn's ASGI cycle and without the protocol guards (a
  lower bound of a native front, not a design; no admin listener).

Workload per target and run: 50 warm-up requests, then ``--sequential``
(500) sequential requests on one keep-alive connection (latency p50/p90/p99
in ms; added p50 = target p50 minus direct p50 *of the same run*), then
``--peak-warmup`` (1 s) of unmeasured load and ``--clients`` (64) closed-loop
clients for ``--seconds`` (8 s): peak rate = successful answers per second,
with ``--load-generator`` ``python`` (aiohttp in this process) or ``wrk``
(:mod:`bench.loadgen`; the generator's own cores are reported beside the
rate). Non-streaming completions (``--stream`` for SSE), 64-word prompts
unique per request, ``max_tokens`` 1. Every headline figure is the median
over ``--runs`` (3) runs. CPU per request of each target's processes
(the scheduler's ns count, :mod:`bench.sched_cpu`; all threads and children) is read around each phase.

Fairness (an A/A run, the same tree in both gateway slots, favoured one slot
by 7-38 % in session 3): every run starts fresh processes of every target but
the replica, every gateway slot by the same path (:func:`_start_slot`), in a
start order drawn for run 1 (``--seed``) and reversed in runs 2 and 3 of
every 4; targets are measured in the order of :func:`run_order`; each phase
is cut into ``--slices`` (4) slices measured target after target
(:func:`measure_run`), each after the targets are idle (:func:`settle`).
With ``--baseline`` the result has a slot check (:func:`slot_check`), with the slots'
differences paired run by run (compare slots with those: the table's medians are each target's own).
The ``prefixgate`` slot runs from this repository as it is on disk (its ``__pycache__``, ``.git``, the
editable install's ``prefixgate.egg-info``), ``--baseline`` from an export; ``--this-export`` starts
``prefixgate`` from an export of HEAD instead (session 28, S28-lead-1: no per-request cost of the
repository start was found, ``bench.tree_start_aa``; the flag makes the two slots' trees alike).

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
whole run takes about 3.5 minutes (``--runs 3``; a minute more with ``--baseline``).
"""

from __future__ import annotations

import asyncio
import cProfile
import json
import os
import pstats
import random
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

from bench import loadgen
from bench.harness import profiled_window
from bench.loadgen import GENERATORS, _Body, _one
from bench.sched_cpu import SchedCpu
from sim.click_options import ClickOptions

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
TARGET_NAMES = ("direct", "smg", "passthrough", "floor", "prefixgate")
#: measured only when named in ``--targets``: the passthrough and PrefixGate apps under bench/native_front.py
NATIVE_TARGETS = ("passthrough-native", "prefixgate-native")
WARMUP = 50

#: Stage -> functions whose cumulative CPU is that stage's ((file suffix, function name) pairs).
STAGES: dict[str, tuple[tuple[str, str], ...]] = {
    "authentication": (("gateway/authn.py", "authenticate"),),
    "parse and validation": (("gateway/request.py", "read_body"), ("gateway/request.py", "parse_inference_request")),
    "tokenize": (("gateway/admission.py", "prompt_tokens"), ("gateway/admission.py", "check_prompt")),
    "HMAC chain": (("gateway/prefix_keys.py", "prefix_chains"), ("gateway/prefix_keys.py", "prefix_fingerprint")),
    "policy": (("gateway/pep.py", "decide"), ("gateway/admission_answers.py", "clamp_output"),  # both clamps (session 19)
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
_CALLBACK_STAGE = (("/aiohttp/", "upstream client"), ("/gateway/upstream_conn.py", "upstream client"),
                   ("/audit/", "audit event"), ("/opentelemetry/", "spans"))


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
        resp = await session.request("POST", upstream + request.url.path, body,
                                     {"Content-Type": "application/json"})
        media = resp.headers.get("content-type", "application/octet-stream").split(";")[0]
        if media == "text/event-stream":
            async def relay() -> Any:
                try:
                    while chunk := await resp.read_chunk():
                        yield chunk
                finally:
                    resp.close()
            return StreamingResponse(relay(), status_code=resp.status, media_type=media)
        parts = []
        while chunk := await resp.read_chunk():
            parts.append(chunk)
        resp.close()
        return Response(b"".join(parts), status_code=resp.status, media_type=media)

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
async def _sequential_raw(url: str, headers: Mapping[str, str], n: int, bodies: _Body) -> tuple[list[float], int]:
    """``n`` requests one after the other on one keep-alive connection: (latencies of the 200s in ms, errors)."""
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
    return lat, errors


async def sequential(url: str, headers: Mapping[str, str], n: int, bodies: _Body) -> dict[str, Any]:
    """``n`` requests one after the other on one keep-alive connection; latencies in ms."""
    lat, errors = await _sequential_raw(url, headers, n, bodies)
    return {"n": n, "errors": errors, **_percentiles(lat)}


def _percentiles(lat: Sequence[float]) -> dict[str, float | None]:
    from sim.report import percentile

    return {f"p{q}_ms": (None if not lat else round(percentile(list(lat), q), 3)) for q in (50, 90, 99)}


# ------------------------------------------------------------------ CPU accounting
#: CPU seconds of a target's processes (all threads, and children): the scheduler's ns count (session 23,
#: S22-native-1; psutil's 10 ms ticks before). The name stays: other benches import it from here.
_Cpu = SchedCpu


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
                 tree: Path = REPO, python: str | None = None) -> tuple[Any, str]:
    """Start ``python -m ARGS`` (from source ``tree``; on interpreter ``python``, default this one)
    and wait until ``GET probe`` on ``port`` is 200."""
    from sim.procs import python_module_cmd, start_process, stop_process, wait_for_url

    cmd = python_module_cmd(*args)
    if python is not None:
        cmd[0] = python
    proc = start_process(name, cmd, paths.logs, cwd=tree, env={"PYTHONPATH": str(tree)})
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


async def _start_floor(upstream: str, paths: Any) -> tuple[Any, str]:
    from sim.procs import free_port

    port = free_port()
    return await _spawn("floor", ["bench.floor_proxy", "--upstream", upstream, "--port", str(port)],
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
    # issue 14 measures the default configuration: answers lose cached_tokens (review R12-1, session 12;
    # the demo config relays it for its clients), and a baseline tree from before session 12 refuses the key
    doc["tenancy"].pop("usage_cached_tokens", None)
    doc["listen"]["port"] = free_port()
    doc["admin"]["port"] = free_port()
    prof_dir = paths.work / f"{name}-audit"
    doc["audit"]["jsonl"]["dir"] = str(prof_dir / "jsonl")
    doc["audit"]["ocsf"]["file"] = str(prof_dir / "ocsf.jsonl")
    doc["audit"]["spill"]["dir"] = str(prof_dir / "spill")
    return doc


def export_tree(repo: Path, dest: Path, commit: str = "HEAD") -> Path:
    """Write ``commit``'s tracked files of the git repository ``repo`` into ``dest`` (created; must not
    hold files) as ``git archive COMMIT | tar -x -C DEST`` does, and return ``dest``: no ``__pycache__``,
    untracked or ignored file and no uncommitted change (commit them first). Raises ``RuntimeError``
    (git's or tar's stderr) when either fails, e.g. ``repo`` is not a git work tree."""
    import subprocess

    dest.mkdir(parents=True, exist_ok=True)
    if any(dest.iterdir()):
        raise RuntimeError(f"export_tree: {dest} is not empty")
    archive = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", commit], capture_output=True,
                             check=False)
    if archive.returncode:
        raise RuntimeError(f"git archive {commit} in {repo}: {archive.stderr.decode(errors='replace')[-2000:]}")
    untar = subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, capture_output=True, check=False)
    if untar.returncode:
        raise RuntimeError(f"tar -x -C {dest}: {untar.stderr.decode(errors='replace')[-2000:]}")
    return dest


def slot_trees(repo: Path, baseline: Path | None, this_export: Path | None) -> dict[str, Path]:
    """The source tree of each PrefixGate slot: ``prefixgate`` -> ``repo`` (this repository, as it is on
    disk), or, with ``this_export`` (an empty or absent directory), an export of ``repo``'s HEAD written
    there (:func:`export_tree`), so that it is started from a tree made the way a ``--baseline`` export is
    (``--this-export``; S28-lead-1); ``baseline`` -> ``baseline`` when given."""
    trees = {"prefixgate": export_tree(repo, this_export) if this_export is not None else repo}
    if baseline is not None:
        trees["baseline"] = baseline
    return trees


async def _start_slot(name: str, tree: Path, cfg: Mapping[str, Any], paths: Any,
                      python: str | None = None) -> tuple[Any, str]:
    """``prefixgate serve`` from source ``tree`` on ``cfg`` (its own ports and audit directory) and
    interpreter ``python`` (None: this one): the one start path of every PrefixGate slot
    (``prefixgate``, ``baseline``), so that no slot differs from another in how it was started."""
    import yaml

    cfg_path = paths.work / f"{name}.yaml"
    cfg_path.write_text(yaml.safe_dump(dict(cfg), sort_keys=False))
    return await _spawn(name, ["gateway.cli", "serve", "--config", str(cfg_path)], paths,
                        cfg["listen"]["port"], "/readyz", tree=tree, python=python)


def run_order(names: Sequence[str], run: int) -> list[str]:
    """The target order of run ``run`` (0-based): ``names`` rotated by ``run // 2``, reversed in odd runs.

    Rotation alone keeps neighbours in the same order in every run (``prefixgate`` was always
    measured just before ``baseline``); runs 2k and 2k+1 use one order and its reverse, so every
    pair of targets is measured in both orders over any two such runs."""
    k = (run // 2) % len(names)
    order = list(names[k:]) + list(names[:k])
    return order[::-1] if run % 2 else order


async def settle(cpus: Sequence[_Cpu], *, idle_cores: float = 0.15, window_s: float = 0.25,
                 max_s: float = 5.0) -> float:
    """Wait until the processes of ``cpus`` together use under ``idle_cores`` cores over a
    ``window_s`` window (e.g. an audit worker still writing the previous peak's events), at most
    ``max_s`` seconds; returns the seconds waited."""
    t0 = time.monotonic()
    while True:
        before = sum(c.seconds() for c in cpus)
        await asyncio.sleep(window_s)
        used = sum(c.seconds() for c in cpus) - before
        waited = time.monotonic() - t0
        if used / window_s < idle_cores or waited >= max_s:
            return round(waited, 2)


async def _profile(cfg: Mapping[str, Any], paths: Any, headers: Mapping[str, str], n: int, bodies: _Body,
                   log: Callable[[str], None], tree: Path = REPO) -> dict[str, Any]:
    """Run the sequential phase against a profiled gateway started from ``tree`` (the ``prefixgate``
    slot's); returns stage CPU (raw and scaled)."""
    import yaml

    from sim.procs import stop_process

    doc = _second_config(cfg, paths, "profiled")
    doc["policy"]["dir"] = str(tree / "rego")
    cfg_path = paths.work / "profiled.yaml"
    cfg_path.write_text(yaml.safe_dump(doc, sort_keys=False))
    out = paths.work / "gateway.prof"
    proc, base = await _spawn("profiled", ["bench.overhead", "--profiled-gateway", str(cfg_path),
                                           "--profile-out", str(out)], paths, doc["listen"]["port"], "/readyz",
                             tree=tree)
    url = base + "/v1/completions"
    try:
        cpu = _Cpu(proc.pid, children=False)  # the profile covers the gateway process, not the audit worker
        await sequential(url, headers, WARMUP, bodies)
        plain, plain_cpu = await measured(cpu, n, sequential(url, headers, n, bodies))
        profiled, prof_cpu = await profiled_window(proc.pid, out, measured(cpu, n, sequential(url, headers, n, bodies)))
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


async def measure_run(targets: Mapping[str, tuple[str, Mapping[str, str], _Cpu]], order: Sequence[str],
                      args: SimpleNamespace, bodies: _Body) -> dict[str, dict[str, Any]]:
    """One run's measurements of ``targets`` (name -> (base URL, headers, CPU of its processes)).

    Sequential phase: ``WARMUP`` requests per target, then ``args.sequential`` requests cut into
    ``args.slices`` slices measured target after target (``order``, reversed in odd slices), so
    that a slow minute of the shared machine hits every target alike. Peak phase likewise:
    ``args.peak_warmup`` s of unmeasured load per target, then ``args.seconds`` cut into slices.
    Every slice waits until all targets are idle (:func:`settle`). Returns name ->
    ``{sequential, sequential_cpu_us, peak, settle_s}``; ``peak`` pools the slices (``rps`` =
    answers / summed wall; ``loadgen_cores`` likewise) and lists ``slices_rps``."""
    every_cpu = [t[2] for t in targets.values()]
    slices = max(1, args.slices)
    out: dict[str, dict[str, Any]] = {n: {"settle_s": 0.0} for n in order}
    lat: dict[str, list[float]] = {n: [] for n in order}
    errs = dict.fromkeys(order, 0)
    cpu_s = dict.fromkeys(order, 0.0)
    for name in order:
        await sequential(targets[name][0] + "/v1/completions", targets[name][1], WARMUP, bodies)
    for sl in range(slices):
        n = args.sequential // slices + (1 if sl < args.sequential % slices else 0)
        for name in (order if sl % 2 == 0 else order[::-1]):
            base, headers, cpu = targets[name]
            out[name]["settle_s"] += await settle(every_cpu)
            before = cpu.seconds()
            got, e = await _sequential_raw(base + "/v1/completions", headers, n, bodies)
            cpu_s[name] += cpu.seconds() - before
            lat[name] += got
            errs[name] += e
    for name in order:
        out[name]["sequential"] = {"n": args.sequential, "errors": errs[name], **_percentiles(lat[name])}
        out[name]["sequential_cpu_us"] = round(cpu_s[name] * 1e6 / args.sequential, 1) if args.sequential else None
        if args.peak_warmup > 0:
            url = targets[name][0] + "/v1/completions"
            await loadgen.peak(args.load_generator, url, targets[name][1], args.clients, args.peak_warmup, bodies,
                               wrk_threads=args.wrk_threads)
    parts: dict[str, list[dict[str, Any]]] = {n: [] for n in order}
    for sl in range(slices):
        for name in (order if sl % 2 == 0 else order[::-1]):
            base, headers, _ = targets[name]
            out[name]["settle_s"] += await settle(every_cpu)
            parts[name].append(await loadgen.peak(args.load_generator, base + "/v1/completions", headers,
                                                  args.clients, args.seconds / slices, bodies,
                                                  wrk_threads=args.wrk_threads))
    for name in order:
        ps = parts[name]
        wall = sum(p["wall_s"] for p in ps)
        ok = sum(p["ok"] for p in ps)
        out[name]["peak"] = {"ok": ok, "errors": sum(p["errors"] for p in ps), "wall_s": round(wall, 3),
                             "rps": round(ok / wall, 1) if wall else 0.0,
                             "loadgen_cpu_s": round(sum(p["loadgen_cpu_s"] for p in ps), 3),
                             "loadgen_cores": round(sum(p["loadgen_cpu_s"] for p in ps) / wall, 3) if wall else None,
                             "slices_rps": [p["rps"] for p in ps],
                             **({"latency_ms": [p["latency_ms"] for p in ps]} if "latency_ms" in ps[0] else {})}
        out[name]["settle_s"] = round(out[name]["settle_s"], 2)
    return out


async def run_bench(args: SimpleNamespace, log: Callable[[str], None] = print) -> dict[str, Any]:
    """The whole benchmark (see module doc); returns the result document."""
    from bench.harness import start_demo_stack
    from sim.bench import start_sglang_router
    from sim.demo import ClusterSpec
    from sim.procs import stop_process

    t_start = time.monotonic()
    load_start = os.getloadavg()
    stack = await start_demo_stack(Path(tempfile.mkdtemp(prefix="pg-overhead-")),
                                   ClusterSpec(replicas=1, time_scale=1e6, decode_s_per_token=0.0))
    paths, cluster, replicas = stack.paths, stack.cluster, stack.replicas
    bodies = _Body(args.stream)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    rng = random.Random(seed)
    try:
        direct_url = replicas[0]["url"]
        cfg = stack.gateway_config(["tenant-a"])
        auth = dict(stack.headers_for(["tenant-a"])("tenant-a"))
        plain = {"Content-Type": "application/json"}
        trees = slot_trees(REPO, args.baseline, paths.work / "this-export" if args.this_export else None)
        every_name = [*TARGET_NAMES, *(["baseline"] if args.baseline else [])]
        names = [n for n in [*every_name, *NATIVE_TARGETS] if (not args.targets and n in every_name)
                 or n in args.targets.split(",")]
        started_names = [n for n in names if n != "direct"]
        rng.shuffle(started_names)  # the first run's start order is drawn (and recorded)
        first_audit: Path | None = None

        async def start(name: str, run: int) -> tuple[Any, str]:
            nonlocal first_audit
            if name == "smg":
                return await start_sglang_router("cache_aware", [direct_url], paths)
            if name == "passthrough":
                return await _start_passthrough(direct_url, paths)
            if name == "floor":
                return await _start_floor(direct_url, paths)
            doc = _second_config(cfg, paths, f"{name}-{run}")  # own ports and audit directory per slot and run
            if name in NATIVE_TARGETS:
                from bench.native_front import start_target

                return await start_target(name, run, direct_url, doc, paths)
            doc["policy"]["dir"] = str(trees[name] / "rego")  # every PrefixGate slot: its own tree's policy
            if name == "baseline":
                apply_settings(doc, args.baseline_set)
            if name == "prefixgate" and first_audit is None:
                first_audit = Path(doc["audit"]["jsonl"]["dir"])
            python = args.baseline_python if name == "baseline" else None
            return await _start_slot(f"{name}-{run}", trees[name], doc, paths, python)

        runs: list[dict[str, Any]] = []
        for run in range(args.runs):
            order = run_order(names, run)
            starts = started_names[::-1] if run % 4 in (1, 2) else list(started_names)
            row: dict[str, Any] = {"order": order, "start_order": starts}
            live: dict[str, tuple[Any, str]] = {}
            try:
                for name in starts:  # fresh processes every run: no slot keeps one process's luck
                    live[name] = await start(name, run)
                targets = {"direct": (direct_url, plain, _Cpu(cluster.pid)),
                           **{n: (base, {**plain, **auth} if n in trees or n == "prefixgate-native" else plain, _Cpu(proc.pid))
                              for n, (proc, base) in live.items()}}
                row.update(await measure_run(targets, order, args, bodies))
                for name in order:
                    seq, seq_cpu, pk = row[name]["sequential"], row[name]["sequential_cpu_us"], row[name]["peak"]
                    log(f"run {run + 1}/{args.runs} {name:12s} p50 {seq['p50_ms']:.3f} p90 {seq['p90_ms']:.3f} "
                        f"p99 {seq['p99_ms']:.3f} ms, CPU {seq_cpu} µs/req; peak {pk['rps']:.0f} req/s "
                        f"(slices {pk['slices_rps']}; errors {seq['errors']}+{pk['errors']}; "
                        f"load generator {pk['loadgen_cores']} cores)")
            finally:
                for proc, _ in live.values():
                    stop_process(proc)
            runs.append(row)
        timings = (audit_timings(first_audit, WARMUP, args.sequential) if first_audit
                   else {"events": 0})
        profile = None
        if not args.no_profile:
            profile = await _profile(cfg, paths, {**plain, **auth}, args.sequential, bodies, log,
                                     tree=trees["prefixgate"])
    finally:
        stop_process(cluster)
        if not args.keep_workdir:
            shutil.rmtree(paths.work, ignore_errors=True)
    return {"benchmark": "overhead", "args": {k: (str(v) if isinstance(v, Path) else v)
                                              for k, v in vars(args).items() if k != "out"},
            "cpus": os.cpu_count(), "python": sys.version.split()[0],
            "python_executable": os.path.realpath(sys.executable), "wall_s": round(time.monotonic() - t_start, 1),
            "this_tree": str(trees["prefixgate"]), "seed": seed, "loadavg": {"start": load_start, "end": os.getloadavg()}, "summary": summarize(runs, names),
            "slot_check": slot_check(runs) if args.baseline else None,
            "runs": runs, "audit_timings_ms": timings, "profile": profile}


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
                                 for r in runs if name in r and "direct" in r]),
            "peak_rps": med([r["peak"]["rps"] for r in rows]),
            "peak_vs_smg": med([r[name]["peak"]["rps"] / r["smg"]["peak"]["rps"] for r in runs
                                if name in r and "smg" in r and r["smg"]["peak"]["rps"]]),
            "cpu_us_per_request": med([r["sequential_cpu_us"] for r in rows]),
            "loadgen_cores": med([r["peak"].get("loadgen_cores") for r in rows]),
            "errors": sum(r["sequential"]["errors"] + r["peak"]["errors"] for r in rows),
        }
    return out


def slot_check(runs: Sequence[Mapping[str, Any]], a: str = "prefixgate", b: str = "baseline") -> dict[str, Any]:
    """Slot ``b`` over slot ``a`` per run (peak rate ``b/a``, p50 ``b/a``) and whether ``b`` was
    measured after ``a`` in that run (``runs[i]["order"]``; unknown in older result files).

    With the same tree in both slots (an A/A run) every ratio should be 1: ``peak_spread`` (max
    minus min of the peak ratios) and ``peak_ratio_median`` say how far the bench is from that;
    ``peak_ratio_b_second`` / ``peak_ratio_b_first`` (medians) show a measurement-order effect.

    Paired per run (session 28, S28-lead-1): ``p50_diff_ms`` (``b`` p50 minus ``a`` p50, ms) and ``cpu_diff_us``
    (``b`` minus ``a`` sequential CPU, µs per request; None without ``sequential_cpu_us``), their medians
    ``p50_diff_ms_median`` / ``cpu_diff_us_median`` and ``cpu_b_higher_runs`` (runs where ``b`` used more
    CPU). Compare slots with these: :func:`summarize` takes each target's median over runs on its own, so
    with run-to-run swings larger than the slots' difference the two medians can come from different runs
    (session 28's repository run: prefixgate 768 against baseline 671 µs from independent medians;
    paired, prefixgate minus baseline, -46, -23 and +96 µs in its three runs)."""
    rows = []
    for r in runs:
        if a not in r or b not in r:
            continue
        order, starts = r.get("order"), r.get("start_order")
        rows.append({"b_started_second": None if not starts else starts.index(b) > starts.index(a),
                     "peak_ratio": round(r[b]["peak"]["rps"] / r[a]["peak"]["rps"], 3) if r[a]["peak"]["rps"] else None,
                     "p50_ratio": round(r[b]["sequential"]["p50_ms"] / r[a]["sequential"]["p50_ms"], 3),
                     "p50_diff_ms": round(r[b]["sequential"]["p50_ms"] - r[a]["sequential"]["p50_ms"], 3),
                     "cpu_diff_us": (None if r[a].get("sequential_cpu_us") is None
                                     or r[b].get("sequential_cpu_us") is None
                                     else round(r[b]["sequential_cpu_us"] - r[a]["sequential_cpu_us"], 1)),
                     "b_second": None if order is None else order.index(b) > order.index(a)})
    peaks = [x["peak_ratio"] for x in rows if x["peak_ratio"] is not None]

    def med(vals: list[float]) -> float | None:
        return round(statistics.median(vals), 3) if vals else None

    return {"slots": [a, b], "runs": rows, "peak_ratio_median": med(peaks),
            "peak_spread": round(max(peaks) - min(peaks), 3) if peaks else None,
            "p50_ratio_median": med([x["p50_ratio"] for x in rows]),
            "p50_diff_ms_median": med([x["p50_diff_ms"] for x in rows]),
            "cpu_diff_us_median": med([x["cpu_diff_us"] for x in rows if x["cpu_diff_us"] is not None]),
            "cpu_b_higher_runs": sum(1 for x in rows if x["cpu_diff_us"] is not None and x["cpu_diff_us"] > 0),
            "peak_ratio_b_second": med([x["peak_ratio"] for x in rows if x["b_second"] and x["peak_ratio"]]),
            "peak_ratio_b_first": med([x["peak_ratio"] for x in rows if x["b_second"] is False and x["peak_ratio"]]),
            "peak_ratio_b_started_second": med([x["peak_ratio"] for x in rows if x["b_started_second"] and x["peak_ratio"]]),
            "peak_ratio_b_started_first": med([x["peak_ratio"] for x in rows
                                               if x["b_started_second"] is False and x["peak_ratio"]])}


def to_markdown(doc: Mapping[str, Any]) -> str:
    """The result document as markdown tables."""
    a = doc["args"]
    lines = [
        "# Per-request overhead: direct, smg, passthrough, floor, PrefixGate (`python -m bench.overhead`)", "",
        f"{a['runs']} runs (median), {a['sequential']} sequential requests then {a['clients']} closed-loop clients "
        f"for {a['seconds']:g} s per target and run; 64-word prompts, max_tokens 1, "
        f"{'streaming' if a['stream'] else 'plain'} answers; {doc['cpus']} CPUs shared by everything, "
        f"Python {doc['python']} ({doc.get('python_executable', '?')}; every Python target runs on it); "
        f"{doc['wall_s']} s wall"
        + (f"; the baseline slot on {a['baseline_python']}" if a.get("baseline_python") else "")
        + (f"; load average (1 min) {doc['loadavg']['start'][0]:.1f} at the start, {doc['loadavg']['end'][0]:.1f} at "
           f"the end" if doc.get("loadavg") else "") + ".", "",
        f"Peak phase load generator: {a.get('load_generator', 'python')}"
        + (f" ({a.get('wrk_threads', 1)} thread(s))" if a.get("load_generator") == "wrk" else " (in the bench process)")
        + f", on the same cores; its own CPU during the peak phase is the 'load gen cores' column (1.00 = a whole core). "
        f"Fairness: every run starts fresh processes of every target but the replica (same start path for every "
        f"gateway slot; start order drawn for run 1, seed {doc.get('seed')}, reversed in runs 2 and 3 of every 4); "
        f"targets measured in an order rotated every two runs and reversed in odd runs; the sequential phase of all "
        f"targets, then the peak phase of all, each cut into {a.get('slices', 1)} slice(s) measured target after "
        f"target (order reversed in odd slices); every slice waits until every target is idle; each peak phase has "
        f"{a.get('peak_warmup', 0):g} s of unmeasured warm-up with the same load.", "",
        "| target | p50 ms | p90 ms | p99 ms | added p50 ms | peak req/s | peak / smg | load gen cores | CPU µs/req (sequential; target's processes, all threads + children, scheduler ns) | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def f(v: Any, fmt: str = ".3f") -> str:
        return "-" if v is None else format(v, fmt)

    for name, s in doc["summary"].items():
        lines.append(f"| {name} | {f(s['p50_ms'])} | {f(s['p90_ms'])} | {f(s['p99_ms'])} | {f(s['added_p50_ms'])} | "
                     f"{f(s['peak_rps'], '.0f')} | {f(s['peak_vs_smg'], '.2f')} | {f(s.get('loadgen_cores'), '.2f')} | "
                     f"{f(s['cpu_us_per_request'], '.0f')} | "
                     f"{s['errors']} |")
    c = doc.get("slot_check")
    if c:
        per_run = "; ".join(f"{x['peak_ratio']} (baseline measured {'second' if x['b_second'] else 'first'}, "
                            f"started {'second' if x.get('b_started_second') else 'first'})" for x in c["runs"])
        lines += ["", f"Slot check, baseline / prefixgate per run (an A/A check when both are the same tree: "
                  f"every ratio should be 1.00): peak {per_run}; median {c['peak_ratio_median']}, spread "
                  f"(max - min) {c['peak_spread']}; measured second {c['peak_ratio_b_second']}, measured first "
                  f"{c['peak_ratio_b_first']}; started second {c.get('peak_ratio_b_started_second')}, started first "
                  f"{c.get('peak_ratio_b_started_first')}; p50 ratio median {c['p50_ratio_median']}."]
        if "cpu_diff_us_median" in c:
            lines += ["", "Paired per run, baseline minus prefixgate (compare the slots with these, not with the "
                      "table's medians, which are taken over runs for each target on its own): p50 "
                      + ", ".join(f"{x['p50_diff_ms']:+.3f}" for x in c["runs"])
                      + f" ms (median {c['p50_diff_ms_median']}); sequential CPU "
                      + ", ".join("-" if x["cpu_diff_us"] is None else f"{x['cpu_diff_us']:+.1f}" for x in c["runs"])
                      + f" µs/req (median {c['cpu_diff_us_median']}; baseline higher in {c['cpu_b_higher_runs']} "
                      f"of {len(c['runs'])} runs); prefixgate slot started from {doc.get('this_tree', '?')}."]
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
    ap.option("--this-export", is_flag=True, help="start the prefixgate slot (and the profiled gateway) from an "
              "export of this repository's HEAD (git archive, in the work directory) instead of the repository "
              "itself: both PrefixGate slots from trees made alike (uncommitted changes are not measured)")
    ap.option("--baseline-python", default=None, metavar="PATH",
              help="run the baseline slot on this interpreter (e.g. another venv's bin/python: the interpreter's "
              "own cost, every other target on this one)")
    ap.option("--baseline-set", multiple=True, default=[], metavar="KEY=VALUE",
              help="a configuration value of the baseline only (dotted key, YAML value; repeatable), "
              "e.g. --baseline /path/to/this/tree --baseline-set flow.enabled=false: the cost of a feature")
    ap.option("--load-generator", type=click.Choice(GENERATORS), default="python",
              help="peak phase: python (aiohttp, in the bench process) or wrk (Debian's C wrk; must be installed)")
    ap.option("--wrk-threads", type=int, default=1, help="wrk threads (--load-generator wrk)")
    ap.option("--slices", type=int, default=4, help="cut each target's sequential and peak phase into this many "
              "slices, measured target after target (noise of a shared machine hits every target alike)")
    ap.option("--peak-warmup", type=float, default=1.0, help="unmeasured seconds of the same load before each peak")
    ap.option("--targets", default="", help="comma-separated subset of the targets to measure (default: all but "
              "passthrough-native and prefixgate-native, bench/native_front.py), e.g. prefixgate,baseline for a quick "
              "A/A check")
    ap.option("--seed", type=int, default=None, help="draws the gateway slots' start order (default: random, recorded)")
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
    try:
        loadgen.require_generator(args.load_generator)
    except loadgen.WrkMissingError as e:
        raise SystemExit(f"error: {e}") from None
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
