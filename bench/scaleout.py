"""Scale-out benchmark (issue 16): three gateway instances behind a round-robin client against one.

``python -m bench.scaleout [--rows 500] [--rounds 3]`` starts, on loopback only:
a real ``redis-server`` (no persistence), ``python -m sim.cluster`` with 6
simulated replicas at time scale 8, and gateway processes
(``python -m gateway.cli serve --config ...``, as sim/demo.py does), then:

1. **Comparison**, interleaved rounds (the order of the three set-ups rotates
   each round; median over rounds): ``one`` = one instance (``state.backend:
   memory``); ``shared`` = 3 instances on one Redis (``state.backend:
   redis``), the client sends request ``i`` to instance ``i % 3``;
   ``independent`` = 3 instances with ``memory`` (sharing off), same client.
   Each run replays the first ``--rows`` Mooncake rows (3 tenants by
   conversation), cache_aware routing; hit rate is token-weighted from the
   replicas' counters, TTFT in trace seconds from the client.
2. **Key rotation**: ``shared`` run; half way, ``POST
   /admin/tenants/<busiest tenant>/rotate-key`` on instance 1; the delay until
   instances 2 and 3 hold the new version (their ``tenancy.state_file``,
   polled every 2 ms; the state file is written when the version is adopted)
   and the client hit rate over the trace minute before and after, beside the
   same two minutes of the comparison's ``shared`` runs (no rotation; the
   trace's hit rate grows as the caches warm, so before/after alone says little).
   With ``--modes ...,rotate`` a rotation run is also one of the comparison's
   interleaved set-ups, so each round has a ``shared`` run without and a
   ``rotate`` run with the rotation: per round, the minute after minus the
   same minute of that round's ``shared`` run, and the same for the minute
   *before* (identical set-ups up to then: the window's noise floor), median
   over rounds.
3. **SIGKILL**: ``shared`` run; half way, SIGKILL instance 3's process group
   (gateway and its audit worker, as a container kill); the others' errors
   after it, the time until instance 1's
   ``prefixgate_shared_routing_instances`` reads 2 (instance 3's load is
   dropped at that moment, docs/scale-out.md) against ``state.lease_ttl_s``,
   and instance 3's audit chain verified (``audit verify`` per chain) and
   its inference events counted against the requests it completed; then
   instance 3 is started again on the same directories (its audit worker
   recovers what the spool holds and the chain lacks, docs/audit.md) and
   stopped, and the chains are verified again: every request instance 3
   answered 200 must have a 200 inference event in its chain (matched per
   tenant, prompt and output tokens).
4. **Redis restart**: ``shared`` run (``on_unavailable: fail_closed``); at
   one sixth the busiest tenant's key is rotated on instance 1; at
   one third, Redis is stopped, restarted empty 2 s (wall) later on the same
   port; answers by kind while it is down, the time from the restart to each
   instance's next 200, ``/readyz`` and ``prefixgate_state_available`` of
   every instance afterwards (no instance restarted), and the rotated key
   version in every instance's state file and in the emptied Redis at the end
   (re-published, never rolled back).

Writes ``bench/results/scaleout.{json,md}``. Timing figures come from a
shared 2-core machine (load generator, replicas, Redis and every gateway on
the same cores) and are noisy; the hit rate is not a timing figure.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import click

from audit.keys import load_public_key
from audit.verify_instances import verify_instances
from sim.bounds import compute_bounds, tenant_names
from sim.click_options import ClickOptions
from bench.harness import DemoStack, start_demo_stack
from bench.soak import count_audit_events
from sim.demo import TRUST_DOMAIN, ClusterSpec, DemoPaths
from sim.procs import ManagedProcess, stop_process
from sim.redis_server import REDIS_SERVER, RedisServer
from sim.replay import ReplayConfig, ReplayResult, replay
from sim.report import fetch_replica_stats, percentile, reset_replicas, summarize
from sim.trace import DEFAULT_TRACE_PATH, TraceRequest, assign_tenants, load_mooncake

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO_ROOT / "bench" / "results"
OPERATOR = f"spiffe://{TRUST_DOMAIN}/ops/admin"
MODES = ("one", "shared", "independent")
LEASE_TTL_S = 10.0


@dataclasses.dataclass
class Instance:
    """One started gateway: its process, public and admin base URLs, key-state file and audit directory."""

    proc: ManagedProcess
    base: str
    admin: str
    state_file: Path
    audit_dir: Path
    cfg: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Setup:
    """What every run shares: paths, identity, replicas (the stack), the trace rows and their tenants."""

    stack: DemoStack
    reqs: list[TraceRequest]
    names: list[str]
    tenants: list[str]
    rcfg: ReplayConfig
    redis: RedisServer
    bounds: Any
    runs: int = 0
    prefix: str = ""
    #: per comparison run: client hit rate in the trace minute before / after the middle (no rotation)
    windows: dict[str, list[tuple[float | None, float | None]]] = dataclasses.field(default_factory=dict)

    @property
    def paths(self) -> DemoPaths:
        """The stack's demo files."""
        return self.stack.paths

    @property
    def issuer(self) -> Any:
        """The stack's token issuer."""
        return self.stack.issuer

    @property
    def replicas(self) -> list[dict[str, str]]:
        """The stack's replicas ``[{replica_id, url}]``."""
        return self.stack.replicas


async def start_instances(s: Setup, mode: str, n: int, tag: str, **state: Any) -> list[Instance]:
    """Start ``n`` gateways for ``mode`` (``shared``: one fresh Redis key prefix per run)."""
    s.runs += 1
    prefix = s.prefix = f"pgb{s.runs}:"
    out: list[tuple[dict[str, Any], Path, Path]] = []
    for i in range(n):
        own = s.paths.work / f"{tag}-{s.runs}" / f"inst{i}"
        own.mkdir(parents=True, exist_ok=True)
        cfg = s.stack.gateway_config(s.names)
        cfg["tenancy"]["state_file"] = str(own / "keystate.json")
        cfg["tenancy"]["operators"] = [OPERATOR]
        cfg["audit"]["jsonl"]["dir"] = str(own / "audit")
        cfg["audit"]["ocsf"]["file"] = str(own / "ocsf.jsonl")
        cfg["audit"]["spill"]["dir"] = str(own / "spill")
        cfg["audit"]["instance"] = f"bench/{tag}/i{i}"
        if mode == "shared":
            cfg["state"] = {"backend": "redis", "url": s.redis.url, "key_prefix": prefix,
                            "lease_ttl_s": LEASE_TTL_S, **state}
        out.append((cfg, own / "keystate.json", own / "audit"))
    procs = await asyncio.gather(*(s.stack.start_gateway(f"gw-{tag}-{s.runs}-{i}", cfg, timeout_s=90)
                                   for i, (cfg, _, _) in enumerate(out)), return_exceptions=True)
    started = [p for p in procs if not isinstance(p, BaseException)]
    if len(started) != n:
        for proc, _ in started:
            stop_process(proc)
        raise next(p for p in procs if isinstance(p, BaseException))
    return [Instance(proc, base, f"http://127.0.0.1:{cfg['admin']['port']}", sf, ad, cfg)
            for (proc, base), (cfg, sf, ad) in zip(started, out)]


def stop_instances(insts: list[Instance]) -> None:
    """Stop every gateway still running (SIGTERM, then SIGKILL)."""
    for inst in insts:
        stop_process(inst.proc, timeout_s=15)


async def replay_through(s: Setup, insts: list[Instance]) -> ReplayResult:
    """Reset the replicas and replay the rows round robin over ``insts``."""
    await reset_replicas([r["url"] for r in s.replicas])
    return await replay(s.reqs, s.rcfg, s.tenants, headers_for=s.stack.headers_for(s.names),
                        base_urls=[i.base for i in insts])


async def summary_of(s: Setup, label: str, result: ReplayResult) -> dict[str, Any]:
    """Replica-counter hit rate, client TTFT percentiles (trace s), errors."""
    await asyncio.sleep(0.3)
    stats = await fetch_replica_stats([r["url"] for r in s.replicas])
    summ = summarize(label, result, stats, s.bounds)
    return {"hit_rate": summ.hit_rate, "client_hit_rate": result.client_hit_rate(), "ttft_p50": summ.ttft_p50,
            "ttft_p90": summ.ttft_p90, "ttft_p99": summ.ttft_p99, "requests": summ.requests, "ok": summ.ok,
            "errors": summ.errors, "wall_s": round(result.wall_s, 1),
            "late_p99_s": percentile([r.late_s for r in result.records], 99)}


async def comparison(s: Setup, rounds: int, log: Any, modes: tuple[str, ...] = MODES) -> dict[str, Any]:
    """Interleaved rounds of ``modes`` (one / shared / independent, and ``rotate``: a shared run with
    the key rotation half way); per-run figures and medians."""
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    rotations: list[dict[str, Any]] = []
    mid = (s.reqs[-1].timestamp - s.reqs[0].timestamp) / 2
    for r in range(rounds):
        order = modes[r % len(modes):] + modes[:r % len(modes)]
        for mode in order:
            if mode == "rotate":
                rot = await rotation(s, log, compare=False)
                rotations.append(rot)
                fig = rot["run"]
            else:
                insts = await start_instances(s, mode, 1 if mode == "one" else 3, mode)
                try:
                    result = await replay_through(s, insts)
                finally:
                    stop_instances(insts)
                fig = await summary_of(s, mode, result)
                fig["hit_minute_before_middle"] = _window_hit(result, mid - 60, mid)
                fig["hit_minute_after_middle"] = _window_hit(result, mid, mid + 60)
                busiest = max(s.names, key=s.tenants.count)  # the tenant a rotation run rotates
                fig["tenant_hit_minute_before_middle"] = _window_hit(result, mid - 60, mid, busiest)
                fig["tenant_hit_minute_after_middle"] = _window_hit(result, mid, mid + 60, busiest)
            s.windows.setdefault(mode, []).append((fig["hit_minute_before_middle"], fig["hit_minute_after_middle"]))
            runs[mode].append(fig)
            log(f"round {r + 1} {mode:11s} hit {fig['hit_rate']:.4f} TTFT p50 {fig['ttft_p50']:.3f} "
                f"p90 {fig['ttft_p90']:.3f} p99 {fig['ttft_p99']:.3f} errors {fig['errors']} minute before/after "
                f"middle {fig['hit_minute_before_middle']} / {fig['hit_minute_after_middle']}")
    med = {m: {k: statistics.median(x[k] for x in runs[m]) for k in ("hit_rate", "ttft_p50", "ttft_p90", "ttft_p99")}
           for m in modes}
    out: dict[str, Any] = {"runs": runs, "median": med}
    one = med.get("one")
    for m in ("shared", "independent"):
        if one is not None and m in med:
            out[f"{m}_vs_one"] = {"hit_rate_diff": med[m]["hit_rate"] - one["hit_rate"],
                                  "ttft_p50_ratio": med[m]["ttft_p50"] / one["ttft_p50"]}
    if rotations and "shared" in runs:
        out["rotation_rounds"] = rotation_rounds(runs["shared"], runs["rotate"], rotations)
        log(f"rotation rounds: {json.dumps(out['rotation_rounds'])}")
    return out


def rotation_rounds(shared: list[dict[str, Any]], rotate: list[dict[str, Any]],
                    rotations: list[dict[str, Any]]) -> dict[str, Any]:
    """Per round: the rotation run's minute after (before) the middle minus the same minute of that
    round's shared run without a rotation; medians. The minute *before* compares two identical set-ups
    (the rotation comes later): its spread is the window's noise floor."""
    def diff(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else round(a - b, 4)

    after = [diff(r["hit_minute_after_middle"], n["hit_minute_after_middle"]) for r, n in zip(rotate, shared)]
    before = [diff(r["hit_minute_before_middle"], n["hit_minute_before_middle"]) for r, n in zip(rotate, shared)]
    own = [diff(r["hit_minute_after_middle"], r["hit_minute_before_middle"]) for r in rotate]
    own_norot = [diff(n["hit_minute_after_middle"], n["hit_minute_before_middle"]) for n in shared]
    t_after = [diff(r.get("tenant_hit_minute_after_middle"), n.get("tenant_hit_minute_after_middle"))
               for r, n in zip(rotate, shared)]
    t_before = [diff(r.get("tenant_hit_minute_before_middle"), n.get("tenant_hit_minute_before_middle"))
                for r, n in zip(rotate, shared)]

    def med(xs: list[float | None]) -> float | None:
        vals = [x for x in xs if x is not None]
        return round(statistics.median(vals), 4) if vals else None

    return {"after_minus_shared_after": after, "median_after_minus_shared_after": med(after),
            "before_minus_shared_before": before, "median_before_minus_shared_before": med(before),
            "rotation_after_minus_before": own, "median_rotation_after_minus_before": med(own),
            "shared_after_minus_before": own_norot, "median_shared_after_minus_before": med(own_norot),
            "tenant_hit_minute_before_after": [(r.get("tenant_hit_minute_before"), r.get("tenant_hit_minute_after"))
                                               for r in rotations],
            "shared_tenant_hit_minute_before_after": [(n.get("tenant_hit_minute_before_middle"),
                                                       n.get("tenant_hit_minute_after_middle")) for n in shared],
            "tenant_after_minus_shared_tenant_after": t_after, "median_tenant_after": med(t_after),
            "tenant_before_minus_shared_tenant_before": t_before, "median_tenant_before": med(t_before),
            "seen_after_answer_ms": [r.get("seen_after_answer") for r in rotations]}


def _window_hit(result: ReplayResult, lo: float, hi: float, tenant: str | None = None) -> float | None:
    """Client hit rate of requests scheduled in [lo, hi) trace seconds (optionally one tenant's)."""
    rows = [r for r in result.ok if lo <= r.scheduled_s < hi and r.prompt_tokens and r.cached_tokens is not None
            and (tenant is None or r.tenant == tenant)]
    total = sum(r.prompt_tokens or 0 for r in rows)
    return sum(r.cached_tokens or 0 for r in rows) / total if total else None


def _key_version(path: Path, tenant: str) -> int:
    try:
        return int(json.loads(path.read_text())["tenants"][tenant]["key_version"])
    except (OSError, ValueError, KeyError, TypeError):
        return 1


async def rotation(s: Setup, log: Any, compare: bool = True) -> dict[str, Any]:
    """Rotate the busiest tenant's key on instance 1 half way; delay until 2 and 3 hold it; hit rate around it
    (``compare``: beside the same minutes of the comparison's shared runs)."""
    tenant = max(s.names, key=s.tenants.count)
    span = s.reqs[-1].timestamp - s.reqs[0].timestamp
    at_trace = span / 2
    insts = await start_instances(s, "shared", 3, "rotate")
    token = s.issuer.mint(OPERATOR, "prefixgate-admin", 600)
    try:
        task = asyncio.create_task(replay_through(s, insts))
        await asyncio.sleep(at_trace / s.rcfg.time_scale)
        seen: dict[int, float] = {}
        async with aiohttp.ClientSession() as http:
            t_sent = time.monotonic()
            async with http.post(f"{insts[0].admin}/admin/tenants/{tenant}/rotate-key",
                                 headers={"Authorization": f"Bearer {token}"}) as resp:
                status, body = resp.status, await resp.json()
            t_answer = time.monotonic()
            while len(seen) < 2 and time.monotonic() - t_answer < 10:
                for k in (1, 2):
                    if k not in seen and _key_version(insts[k].state_file, tenant) >= 2:
                        seen[k] = time.monotonic()
                await asyncio.sleep(0.002)
        result = await task
    finally:
        stop_instances(insts)
    fig = await summary_of(s, "rotate", result)
    fig["hit_minute_before_middle"] = _window_hit(result, at_trace - 60, at_trace)
    fig["hit_minute_after_middle"] = _window_hit(result, at_trace, at_trace + 60)
    fig["tenant_hit_minute_before_middle"] = _window_hit(result, at_trace - 60, at_trace, tenant)
    fig["tenant_hit_minute_after_middle"] = _window_hit(result, at_trace, at_trace + 60, tenant)
    delays = {f"instance{k + 1}_ms": round((t - t_answer) * 1000, 1) for k, t in seen.items()}
    out = {"tenant": tenant, "admin_status": status, "new_version": body.get("key_version", body),
           "at_trace_s": at_trace, "admin_call_ms": round((t_answer - t_sent) * 1000, 1),
           "seen_after_answer": delays, "not_seen_within_10s": [k + 1 for k in (1, 2) if k not in seen],
           "hit_minute_before": _window_hit(result, at_trace - 60, at_trace),
           "hit_minute_after": _window_hit(result, at_trace, at_trace + 60),
           "tenant_hit_minute_before": _window_hit(result, at_trace - 60, at_trace, tenant),
           "tenant_hit_minute_after": _window_hit(result, at_trace, at_trace + 60, tenant), "run": fig}
    base = [w for w in s.windows.get("shared", []) if None not in w]
    if base and compare:  # the trace warms up: compare with the same minutes of the shared runs without a rotation
        out["no_rotation_shared_runs_minute_before"] = statistics.median(b for b, _ in base)
        out["no_rotation_shared_runs_minute_after"] = statistics.median(a for _, a in base)
        if out["hit_minute_after"] is not None:
            out["after_minus_no_rotation_after"] = out["hit_minute_after"] - out["no_rotation_shared_runs_minute_after"]
    log(f"rotation: {json.dumps({k: v for k, v in out.items() if k != 'run'})}")
    return out


async def _metric(http: aiohttp.ClientSession, s: Setup, inst: Instance, name: str) -> float | None:
    """One sample of ``inst``'s ``/admin/metrics`` (as an operator: the shared-state figures are
    operators-only, R3-5), None when it does not answer."""
    headers = {"Authorization": f"Bearer {s.issuer.mint(OPERATOR, 'prefixgate-admin', 60)}"}
    try:
        async with http.get(f"{inst.admin}/admin/metrics", headers=headers,
                            timeout=aiohttp.ClientTimeout(total=2)) as resp:
            text = await resp.text()
    except (aiohttp.ClientError, TimeoutError):
        return None
    for line in text.splitlines():
        if line.startswith((name + " ", name + "{")):
            return float(line.rsplit(" ", 1)[1])
    return None


def _inference_events(audit_dir: Path) -> int:
    """Inference event records in the audit chain in ``audit_dir`` (repeats of an event id counted)."""
    events, repeats, _, _ = count_audit_events(audit_dir)
    return len(events) + repeats


async def sigkill(s: Setup, log: Any) -> dict[str, Any]:
    """SIGKILL instance 3 half way; the others' errors after; time until its load leaves instance 1's view."""
    span = s.reqs[-1].timestamp - s.reqs[0].timestamp
    at_trace = span / 2
    insts = await start_instances(s, "shared", 3, "kill")
    expired_after: float | None = None
    try:
        task = asyncio.create_task(replay_through(s, insts))
        await asyncio.sleep(at_trace / s.rcfg.time_scale)
        async with aiohttp.ClientSession() as http:
            # the gauge counts the *other* instances whose load instance 1 holds: 2 before the kill
            t_wait = time.monotonic()
            while (before := await _metric(http, s, insts[0], "prefixgate_shared_routing_instances")) != 2 \
                    and time.monotonic() - t_wait < 2 * LEASE_TTL_S:
                await asyncio.sleep(0.05)
            os.killpg(insts[2].proc.popen.pid, signal.SIGKILL)
            t_kill = time.monotonic()
            at_trace = (t_kill - t_wait) * s.rcfg.time_scale + at_trace
            while time.monotonic() - t_kill < 3 * LEASE_TTL_S:
                if await _metric(http, s, insts[0], "prefixgate_shared_routing_instances") == 1:
                    expired_after = time.monotonic() - t_kill
                    break
                await asyncio.sleep(0.05)
        result = await task
    finally:
        stop_instances(insts)
    fig = await summary_of(s, "kill", result)
    events_before_restart = _inference_events(insts[2].audit_dir)
    # start instance 3 again on the same directories: its audit worker recovers the spool before ready
    t_restart = time.monotonic()
    proc, _ = await s.stack.start_gateway(f"gw-kill-{s.runs}-2-restarted", insts[2].cfg, timeout_s=90)
    ready_after = time.monotonic() - t_restart
    stop_process(proc, timeout_s=30)  # SIGTERM: drain, seal the chain
    kill_trace = at_trace
    after = [r for r in result.records if r.scheduled_s >= kill_trace + 1.0]
    others = [r for r in after if r.target != 2]
    completed_by_3 = [r for r in result.ok if r.target == 2]
    pub = s.paths.signing_key.with_name(s.paths.signing_key.name + ".pub")
    rep = verify_instances([i.audit_dir for i in insts], load_public_key(pub))
    chains = {c.label: {"status": c.report.status, "records": c.report.records,
                        "problems": [f"{p.kind}: {p.detail}" for p in c.report.problems]} for c in rep.chains}
    events, _, _, _ = count_audit_events(insts[2].audit_dir)
    acked = [r for r in completed_by_3 if r.status == 200]
    coverage = _acknowledged_coverage(acked, events)
    out = {"lease_ttl_s": LEASE_TTL_S, "instances_seen_before": before,
           "load_dropped_after_s": None if expired_after is None else round(expired_after, 2),
           "others_after_kill": {"requests": len(others), "ok": sum(r.error is None for r in others),
                                 "errors": dict(ReplayResult(others, 1, 0, "", 0).errors_by_kind())},
           "killed_after_kill": {"requests": len(after) - len(others),
                                 "errors": dict(ReplayResult([r for r in after if r.target == 2], 1, 0, "", 0)
                                                .errors_by_kind())},
           "killed_instance_completed_ok": len(completed_by_3),
           "killed_instance_inference_events_before_restart": events_before_restart,
           "killed_instance_inference_events": _inference_events(insts[2].audit_dir),
           "restarted_ready_after_s": round(ready_after, 2), "acknowledged_coverage": coverage,
           "audit_chains": chains, "run": fig}
    log(f"sigkill: {json.dumps({k: v for k, v in out.items() if k != 'run'})}")
    return out


def _acknowledged_coverage(acked: list[Any], events: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Every acknowledged (200) request of an instance against the 200 inference events of its chain:
    matched one to one on (tenant, prompt tokens, output tokens), else on the tenant alone; what stays
    unmatched is missing from the chain."""
    from collections import Counter

    ok_events = [e for e in events.values() if e.get("status_code") == 200]
    exact = Counter((e.get("tenant"), e.get("prompt_tokens"), e.get("output_tokens")) for e in ok_events)
    loose: Counter[Any] = Counter()
    missing_exact = 0
    for r in acked:
        k = (r.tenant, r.prompt_tokens, r.completion_tokens)
        if exact[k] > 0:
            exact[k] -= 1
        else:
            missing_exact += 1
            loose[r.tenant] += 1
    spare = Counter()
    for (tenant, _, _), n in exact.items():
        spare[tenant] += n
    missing = sum(max(0, n - spare[t]) for t, n in loose.items())
    return {"acknowledged": len(acked), "events_200": len(ok_events), "unmatched_exact": missing_exact,
            "missing": missing}


async def redis_restart(s: Setup, log: Any) -> dict[str, Any]:
    """Stop Redis at one third of the run, restart it empty 2 s later; answers meanwhile, recovery per instance."""
    span = s.reqs[-1].timestamp - s.reqs[0].timestamp
    insts = await start_instances(s, "shared", 3, "redis")
    tenant = max(s.names, key=s.tenants.count)
    token = s.issuer.mint(OPERATOR, "prefixgate-admin", 600)
    try:
        task = asyncio.create_task(replay_through(s, insts))
        t0 = time.monotonic()
        await asyncio.sleep(span / 6 / s.rcfg.time_scale)
        # a rotation before the restart must not be rolled back
        async with aiohttp.ClientSession() as http, http.post(
                f"{insts[0].admin}/admin/tenants/{tenant}/rotate-key",
                headers={"Authorization": f"Bearer {token}"}) as resp:
            rotate_status = resp.status
        await asyncio.sleep(max(0.0, span / 3 / s.rcfg.time_scale - (time.monotonic() - t0)))
        versions_before = [_key_version(i.state_file, tenant) for i in insts]
        s.redis.stop()
        down_trace = (time.monotonic() - t0) * s.rcfg.time_scale
        await asyncio.sleep(2.0)
        s.redis.start()
        up_trace = (time.monotonic() - t0) * s.rcfg.time_scale
        result = await task
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(s.redis.url)
        try:
            record = await client.hget(f"{s.prefix}keys:tenants", tenant)
        finally:
            await client.aclose()
        versions_after = [_key_version(i.state_file, tenant) for i in insts]
        async with aiohttp.ClientSession() as http:
            ready = []
            for i in insts:
                async with http.get(f"{i.base}/readyz") as resp:
                    ready.append(resp.status)
            avail = [await _metric(http, s, i, "prefixgate_state_available") for i in insts]
    finally:
        stop_instances(insts)
    fig = await summary_of(s, "redis", result)
    during = [r for r in result.records if down_trace <= r.scheduled_s < up_trace]
    recovery = {}
    for k in range(3):
        ok_after = [r.scheduled_s for r in result.ok if r.target == k and r.scheduled_s >= up_trace]
        recovery[f"instance{k + 1}_first_ok_after_restart_trace_s"] = (
            round(min(ok_after) - up_trace, 2) if ok_after else None)
    late = [r for r in result.records if r.scheduled_s >= up_trace + 2 * s.rcfg.time_scale]
    out = {"down_trace_s": round(down_trace, 1), "up_trace_s": round(up_trace, 1),
           "during_outage": {"requests": len(during), "ok": sum(r.error is None for r in during),
                             "errors": ReplayResult(during, 1, 0, "", 0).errors_by_kind()},
           "recovery": recovery,
           "after_2s_wall": {"requests": len(late), "ok": sum(r.error is None for r in late),
                             "errors": ReplayResult(late, 1, 0, "", 0).errors_by_kind()},
           "readyz_after": ready, "state_available_after": avail,
           "rotation_before_restart": {"tenant": tenant, "admin_status": rotate_status,
                                       "key_version_per_instance_before_restart": versions_before,
                                       "key_version_per_instance_at_end": versions_after,
                                       "redis_record_version_at_end": (int(record.split(b":")[0]) if record
                                                                        else None)},
           "hit_before": _window_hit(result, 0, down_trace), "hit_after": _window_hit(result, up_trace + 16, span + 1),
           "run": fig}
    log(f"redis restart: {json.dumps({k: v for k, v in out.items() if k != 'run'})}")
    return out


def to_markdown(doc: dict[str, Any]) -> str:
    """The results as a Markdown page."""
    m = doc["meta"]
    lines = [(f"# Scale-out benchmark (issue 16): 3 instances vs 1 (`python -m bench.scaleout "
             f"--rows {m['rows']} --rounds {m['rounds']}`)"), "",
             (f"First {m['rows']} Mooncake rows ({m['trace_span_s']:.0f} trace s), {m['tenants']} tenants, "
             f"{m['replicas']} simulated replicas, time scale {m['time_scale']:g}, cache_aware, round-robin client "
             f"over the instances; median of {m['rounds']} interleaved rounds. {m['machine']}"), ""]
    c = doc.get("comparison")
    if c:
        lines += ["| set-up | hit rate | TTFT p50 (s) | TTFT p90 (s) | TTFT p99 (s) | runs (hit) |", "|---|---|---|---|---|---|"]
        for mode in c["median"]:
            md = c["median"][mode]
            per = ", ".join(f"{x['hit_rate']:.4f}" for x in c["runs"][mode])
            lines.append(f"| {mode} | {md['hit_rate']:.4f} | {md['ttft_p50']:.3f} | {md['ttft_p90']:.3f} | "
                         f"{md['ttft_p99']:.3f} | {per} |")
        sv, iv = c.get("shared_vs_one"), c.get("independent_vs_one")
        if sv and iv:
            lines += ["", (f"shared vs one: hit rate {sv['hit_rate_diff']:+.4f} (target within 0.01), TTFT p50 "
                          f"x{sv['ttft_p50_ratio']:.3f} (target within 10 %); independent (sharing off) vs one: hit "
                          f"rate {iv['hit_rate_diff']:+.4f}, TTFT p50 x{iv['ttft_p50_ratio']:.3f}."), ""]
        if c.get("rotation_rounds"):
            lines += ["## Key rotation, interleaved rounds", "", "```json",
                      json.dumps(c["rotation_rounds"], indent=1, sort_keys=True), "```", ""]
    for key, title in (("rotation", "Key rotation on instance 1"), ("sigkill", "SIGKILL of instance 3"),
                       ("redis_restart", "Redis restarted (empty) mid-run")):
        if key in doc:
            body = {k: v for k, v in doc[key].items() if k != "run"}
            lines += [f"## {title}", "", "```json", json.dumps(body, indent=1, sort_keys=True), "```", ""]
    return "\n".join(lines)


async def run(args: SimpleNamespace, log: Any = print) -> dict[str, Any]:
    """Run the phases selected by ``args`` and return the results document."""
    work = Path(tempfile.mkdtemp(prefix="prefixgate-scaleout-"))
    spec = ClusterSpec(replicas=6, time_scale=args.time_scale)
    reqs = load_mooncake(args.trace, args.rows)
    names = tenant_names(3)
    tenants = assign_tenants(reqs, names, 0)
    bounds = compute_bounds(reqs, replicas=spec.replicas, capacity_blocks=spec.capacity_blocks,
                            block_size=spec.block_size, tenants=names, seed=0)
    (work / "redis").mkdir(parents=True, exist_ok=True)
    redis = RedisServer(REDIS_SERVER or "/usr/bin/redis-server", work / "redis").start()
    stack = await start_demo_stack(work, spec)
    span = reqs[-1].timestamp - reqs[0].timestamp
    rcfg = ReplayConfig(base_url="", time_scale=spec.time_scale, total_timeout_s=span / spec.time_scale * 3 + 60)
    s = Setup(stack, reqs, names, tenants, rcfg, redis, bounds)
    doc: dict[str, Any] = {"meta": {
        "rows": len(reqs), "trace_span_s": span, "tenants": len(names), "replicas": spec.replicas,
        "time_scale": spec.time_scale, "rounds": args.rounds, "lease_ttl_s": LEASE_TTL_S,
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True,  # noqa: ASYNC221
                                 text=True, check=False).stdout.strip(),
        "machine": "2-core machine shared with other jobs (load generator, replicas, Redis and every gateway on "
                   "the same cores): timing figures are noisy."}}
    try:
        if args.rounds > 0:
            doc["comparison"] = await comparison(s, args.rounds, log, getattr(args, "modes", MODES))
        for phase, fn in (("rotation", rotation), ("sigkill", sigkill), ("redis_restart", redis_restart)):
            if phase in args.phases:
                doc[phase] = await fn(s, log)
    finally:
        stack.stop()
        redis.stop()
        if args.keep_workdir:
            log(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return doc


def main() -> None:
    """``python -m bench.scaleout``: run and write ``bench/results/<name>.{json,md}``."""
    ap = ClickOptions(prog="python -m bench.scaleout", description=__doc__.split("\n")[0])
    ap.option("--trace", type=click.Path(path_type=Path), default=DEFAULT_TRACE_PATH)
    ap.option("--rows", type=int, default=500)
    ap.option("--rounds", type=int, default=3)
    ap.option("--time-scale", type=float, default=8.0)
    ap.option("--phases", default="rotation,sigkill,redis_restart")
    ap.option("--modes", default="one,shared,independent",
              help="comparison set-ups, interleaved: one, shared, independent, rotate (a shared run with the key "
                   "rotation; needs shared)")
    ap.option("--name", default="scaleout")
    ap.option("--keep-workdir", is_flag=True)
    args = ap.parse()
    args.phases = [p for p in args.phases.split(",") if p]
    args.modes = tuple(m for m in args.modes.split(",") if m)
    doc = asyncio.run(run(args))
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / f"{args.name}.json").write_text(json.dumps(doc, indent=1, sort_keys=True, default=str))
    (RESULTS_DIR / f"{args.name}.md").write_text(to_markdown(doc))
    print(to_markdown(doc))


if __name__ == "__main__":
    main()
