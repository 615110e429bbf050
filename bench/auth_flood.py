"""Fresh valid tokens from a source flooding the gateway with bad tokens (not a test).

``python -m bench.auth_flood [--rate 500] [--seconds 4] [--probe-rate 20]``
(issue 12, finding 1). One run (loopback only, about a minute) starts:

* a simulated replica (``python -m sim.cluster``, time scale 1000: answers in
  about a millisecond);
* two gateway processes (public listener, no audit sinks, ES256 demo issuer
  bundle in a file): **default** with the default per-source budget of failed
  signature checks, and **tight** with the pre-issue budget (20/s, burst 40),
  to show what the block does once a source exceeds its budget.

Phases, each ``--seconds`` long, all traffic from 127.0.0.1:

1. ``baseline`` (default gateway): probes only, to measure the gateway CPU
   per probe;
2. one flood per kind of bad token at ``--rate`` requests/s (open loop,
   paced, at most 128 in flight): ``malformed`` (random base64url garbage in
   three segments), ``unknown_kid`` (well-formed, signed with another key,
   random kid), ``expired`` (signed with the real key, expired by its claims an
   hour ago), ``bad_signature`` (the real kid, signed with another key). During
   each flood a probe every 1/``--probe-rate`` s sends a **freshly minted**
   valid token (never seen before, so it needs a signature check) as a
   completion request; success = HTTP 200 (target >= 99 %);
3. ``bad_signature_over_budget`` on the tight gateway: the same flood, with
   fresh-token probes and probes of one token verified before the flood.

Gateway CPU (user + system, psutil) is read around every phase; CPU per bad
token = (phase CPU - probes x baseline CPU per probe) / bad tokens answered.
Results: ``bench/results/auth_flood.{json,md}``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
TD = "demo.prefixgate.test"
SID = f"spiffe://{TD}/tenant-a/bench"
BODY = {"model": "sim-model", "prompt": "a short prompt from a workload behind a busy NAT", "max_tokens": 2}
KINDS = ("malformed", "unknown_kid", "expired", "bad_signature")


# ------------------------------------------------------------------ gateway child
async def _serve(config_file: str, ready_file: str) -> None:
    """Run one gateway (public listener, no audit sinks) until SIGTERM; write its port to ``ready_file``
    and, at exit, the verifier's counters to ``ready_file + ".done"``."""
    from bench.harness import serve_public, serve_until_sigterm
    from gateway.auditing import AuditHub
    from gateway.build import build
    from gateway.config import load_config

    cfg = load_config(config_file)
    comps = build(cfg, audit=AuditHub(None))
    await comps.start()
    server, task, port = await serve_public(comps, freeze=True)
    Path(ready_file).write_text(json.dumps({"port": port}))
    await serve_until_sigterm(server, task)
    v = comps.verifier
    await comps.stop()
    Path(ready_file + ".done").write_text(json.dumps({
        "signature_checks": v.signature_checks, "cache_hits": v.cache.hits, "cache_misses": v.cache.misses,
        "cache_entries": len(v.cache), "audit_events": comps.audit.emitted}))


def _config(work: Path, urls: list[str], bundle: Path, identity: dict[str, Any]) -> dict[str, Any]:
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
        "identity": {"audience": "prefixgate", "trust_domains": {TD: {"bundle_file": str(bundle)}}, **identity},
        "policy": {"mode": "embedded", "dir": str(REPO / "rego"), "timeout_s": 1.0},
        "audit": {},
    }


def _start_gateway(work: Path, name: str, cfg: dict[str, Any]) -> tuple[subprocess.Popen[bytes], str]:
    import yaml

    cfg_file = work / f"{name}.yaml"
    cfg_file.write_text(yaml.safe_dump(cfg))
    ready = work / f"{name}.ready"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--serve", str(cfg_file),
                             "--ready-file", str(ready)], cwd=str(REPO), env=env,
                            stdout=open(work / f"{name}.log", "ab"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"gateway {name} did not start: {(work / f'{name}.log').read_text()[-2000:]}")
        time.sleep(0.05)
    return proc, f"http://127.0.0.1:{json.loads(ready.read_text())['port']}"


def _cpu_s(proc: Any) -> float:
    t = proc.cpu_times()
    return t.user + t.system


# ------------------------------------------------------------------ tokens
def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _bad_tokens(kind: str, issuer: Any, n: int) -> list[str]:
    """``n`` distinct bad tokens of one kind (minted before the phase: the load
    generator's own CPU stays out of the measured window)."""
    from sim.spiffe_issuer import DemoIssuer

    forger = DemoIssuer(TD)
    out = []
    for i in range(n):
        if kind == "malformed":
            out.append(f"{_b64(secrets.token_bytes(24))}.{_b64(secrets.token_bytes(60))}.{_b64(secrets.token_bytes(64))}")
        elif kind == "unknown_kid":
            out.append(forger.mint(SID, "prefixgate", headers={"kid": secrets.token_urlsafe(12)}, jti=str(i)))
        elif kind == "expired":
            out.append(issuer.mint(SID, "prefixgate", ttl_s=300, now=time.time() - 3600, jti=str(i)))
        elif kind == "bad_signature":
            out.append(forger.mint(SID, "prefixgate", headers={"kid": issuer.kid}, jti=str(i)))
        else:
            raise ValueError(kind)
    return out


# ------------------------------------------------------------------ load
async def _phase(url: str, issuer: Any, bad: list[str] | None, seconds: float, rate: float, probe_rate: float,
                 gw: Any, cached_token: str | None = None) -> dict[str, Any]:
    """One phase: an open-loop flood of ``bad`` tokens at ``rate``/s (if any) and
    fresh-token probes at ``probe_rate``/s (plus probes of ``cached_token``)."""
    import aiohttp

    flood_status: Counter[int] = Counter()
    probes: list[tuple[int, float]] = []
    cached: list[tuple[int, float]] = []
    in_flight = asyncio.Semaphore(128)
    tasks: list[asyncio.Task[Any]] = []
    late = 0

    async def send_bad(session: aiohttp.ClientSession, token: str) -> None:
        try:
            async with session.post(url + "/v1/completions", json=BODY,
                                    headers={"Authorization": f"Bearer {token}"}) as resp:
                await resp.read()
                flood_status[resp.status] += 1
        except aiohttp.ClientError:
            flood_status[0] += 1
        finally:
            in_flight.release()

    async def probe(session: aiohttp.ClientSession, token: str, out: list[tuple[int, float]]) -> None:
        t = time.perf_counter()
        try:
            async with session.post(url + "/v1/completions", json=BODY,
                                    headers={"Authorization": f"Bearer {token}"}) as resp:
                await resp.read()
                out.append((resp.status, time.perf_counter() - t))
        except aiohttp.ClientError:
            out.append((0, time.perf_counter() - t))

    async def flood(session: aiohttp.ClientSession, t_end: float) -> int:
        nonlocal late
        assert bad is not None
        sent = 0
        t0 = time.perf_counter()
        while True:
            due = t0 + sent / rate
            now = time.perf_counter()
            if due >= t_end:
                return sent
            if due > now:
                await asyncio.sleep(due - now)
            if in_flight.locked():
                late += 1
            await in_flight.acquire()
            tasks.append(asyncio.ensure_future(send_bad(session, bad[sent % len(bad)])))
            sent += 1

    async def probes_loop(session: aiohttp.ClientSession, t_end: float) -> None:
        i = 0
        t0 = time.perf_counter()
        while True:
            due = t0 + i / probe_rate
            if due >= t_end:
                return
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            # freshly minted: never seen by the gateway, so it needs a signature check
            fresh = issuer.mint(SID, "prefixgate", ttl_s=300, jti=secrets.token_hex(8))
            tasks.append(asyncio.ensure_future(probe(session, fresh, probes)))
            if cached_token is not None:
                tasks.append(asyncio.ensure_future(probe(session, cached_token, cached)))
            i += 1

    conn = aiohttp.TCPConnector(limit=256)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=30)) as session:
        cpu0 = _cpu_s(gw)
        w0 = time.perf_counter()
        t_end = w0 + seconds
        jobs = [probes_loop(session, t_end)]
        if bad is not None:
            jobs.append(flood(session, t_end))
        results = await asyncio.gather(*jobs)
        await asyncio.gather(*tasks)
        wall = time.perf_counter() - w0
        cpu = _cpu_s(gw) - cpu0
    sent = results[1] if bad is not None else 0

    def summary(rows: list[tuple[int, float]]) -> dict[str, Any]:
        lat = sorted(t for s, t in rows if s == 200)
        ok = sum(1 for s, _ in rows if s == 200)
        return {"sent": len(rows), "ok": ok, "success_rate": round(ok / len(rows), 4) if rows else None,
                "statuses": dict(Counter(s for s, _ in rows)),
                "p50_ms": round(lat[len(lat) // 2] * 1000, 2) if lat else None,
                "p99_ms": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000, 2) if lat else None}

    out = {"seconds": round(wall, 2), "flood_sent": sent, "flood_rate": round(sent / wall, 1),
           "flood_statuses": dict(flood_status), "flood_late_for_slot": late,
           "gateway_cpu_s": round(cpu, 4), "probes": summary(probes)}
    if cached_token is not None:
        out["cached_probes"] = summary(cached)
    return out


async def _main(args: SimpleNamespace) -> dict[str, Any]:
    import psutil

    from sim.cluster import spawn_cluster
    from sim.spiffe_issuer import DemoIssuer

    work = Path(tempfile.mkdtemp(prefix="pg-auth-flood-"))
    issuer = DemoIssuer(TD)  # ES256, the algorithm SPIRE signs JWT-SVIDs with by default
    bundle = work / "bundle.json"
    issuer.write_bundle(bundle)
    cluster = spawn_cluster(1, time_scale=1000.0, decode_s_per_token=0.0, stream_chunk_tokens=16)
    procs: list[subprocess.Popen[bytes]] = []
    phases: dict[str, Any] = {}
    try:
        p_def, url_def = _start_gateway(work, "gw-default", _config(work, cluster.urls, bundle, {}))
        procs.append(p_def)
        p_tight, url_tight = _start_gateway(work, "gw-tight", _config(
            work, cluster.urls, bundle, {"unauthenticated_rps": 20, "unauthenticated_burst": 40}))
        procs.append(p_tight)
        gw_def, gw_tight = psutil.Process(p_def.pid), psutil.Process(p_tight.pid)
        n_tokens = int(args.rate * args.seconds) + 1
        # warm-up (policy engine, connection pools, first signature checks)
        await _phase(url_def, issuer, None, 1.0, 0, args.probe_rate, gw_def)
        await _phase(url_tight, issuer, None, 1.0, 0, args.probe_rate, gw_tight)
        phases["baseline"] = await _phase(url_def, issuer, None, args.seconds, 0, args.probe_rate, gw_def)
        base = phases["baseline"]
        cpu_per_probe = base["gateway_cpu_s"] / max(1, base["probes"]["sent"])
        base["gateway_cpu_ms_per_probe"] = round(cpu_per_probe * 1000, 3)
        print(f"baseline: probes {base['probes']}  cpu/probe {cpu_per_probe * 1000:.2f} ms")
        for kind in KINDS:
            bad = _bad_tokens(kind, issuer, min(n_tokens, 2500))
            r = await _phase(url_def, issuer, bad, args.seconds, args.rate, args.probe_rate, gw_def)
            r["gateway_cpu_ms_per_bad_token"] = round(
                max(0.0, r["gateway_cpu_s"] - cpu_per_probe * r["probes"]["sent"]) * 1000 / max(1, r["flood_sent"]), 4)
            phases[kind] = r
            print(f"{kind:14s}: flood {r['flood_rate']}/s {r['flood_statuses']}  fresh probes "
                  f"{r['probes']['ok']}/{r['probes']['sent']}  cpu/bad {r['gateway_cpu_ms_per_bad_token']} ms")
        # over budget: the pre-issue budget (20/s, burst 40) on the second gateway
        seen = issuer.mint(SID, "prefixgate", ttl_s=600, jti="verified-before-the-flood")
        await _phase(url_tight, issuer, None, 0.2, 0, 10, gw_tight, cached_token=seen)
        bad = _bad_tokens("bad_signature", issuer, min(n_tokens, 2500))
        r = await _phase(url_tight, issuer, bad, args.seconds, args.rate, args.probe_rate, gw_tight, cached_token=seen)
        r["gateway_cpu_ms_per_bad_token"] = round(
            max(0.0, r["gateway_cpu_s"] - cpu_per_probe * (r["probes"]["sent"] + r["cached_probes"]["sent"]))
            * 1000 / max(1, r["flood_sent"]), 4)
        phases["bad_signature_over_budget"] = r
        print(f"over budget   : flood {r['flood_rate']}/s {r['flood_statuses']}  fresh "
              f"{r['probes']['ok']}/{r['probes']['sent']}  cached {r['cached_probes']['ok']}/"
              f"{r['cached_probes']['sent']}  cpu/bad {r['gateway_cpu_ms_per_bad_token']} ms")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        cluster.stop()
    done = {}
    for name in ("gw-default", "gw-tight"):
        f = work / f"{name}.ready.done"
        done[name] = json.loads(f.read_text()) if f.exists() else None
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    return {"rate": args.rate, "probe_rate": args.probe_rate, "seconds_per_phase": args.seconds,
            "algorithm": "ES256", "cpus": os.cpu_count(), "python": sys.version.split()[0],
            "phases": phases, "gateway_exit": done}


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns 0 (the figures are reported, not enforced)."""
    from sim.click_options import ClickOptions

    ap = ClickOptions(description=__doc__.split("\n\n")[0])
    ap.option("--rate", type=float, default=500.0, help="bad tokens per second")
    ap.option("--seconds", type=float, default=4.0, help="seconds per phase")
    ap.option("--probe-rate", type=float, default=20.0, help="fresh valid tokens per second")
    ap.option("--out", type=click.Path(path_type=Path), default=RESULTS)
    ap.option("--serve", hidden=True)
    ap.option("--ready-file", hidden=True)
    args = ap.parse(argv)
    if args.serve:
        asyncio.run(_serve(args.serve, args.ready_file))
        return 0
    result = asyncio.run(_main(args))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "auth_flood.json").write_text(json.dumps(result, indent=2))
    ph = result["phases"]
    rows = []
    for name in (*KINDS, "bad_signature_over_budget"):
        r = ph[name]
        cached = r.get("cached_probes")
        rows.append(
            f"| {name} | {r['flood_rate']:.0f} | {r['flood_statuses']} | {r['probes']['ok']}/{r['probes']['sent']} "
            f"({100 * (r['probes']['success_rate'] or 0):.1f} %) | "
            f"{(str(cached['ok']) + '/' + str(cached['sent'])) if cached else '-'} | "
            f"{r['probes']['p50_ms']} / {r['probes']['p99_ms']} | {r['gateway_cpu_ms_per_bad_token']:.3f} |")
    md = [
        "# Fresh valid tokens during a flood of bad tokens from the same source (issue 12, finding 1)",
        "",
        f"`python -m bench.auth_flood`: {result['rate']:g} bad tokens/s per phase for {result['seconds_per_phase']:g} s "
        f"from 127.0.0.1, a freshly minted valid token (needs a signature check) every "
        f"{1 / result['probe_rate']:g} s from the same source; {result['algorithm']}, {result['cpus']} CPUs, "
        f"Python {result['python']}; gateway without audit sinks. Baseline gateway CPU per probe "
        f"(completion through a simulated replica): {ph['baseline']['gateway_cpu_ms_per_probe']} ms.",
        "Phases 1-4: default per-source budget (1000 failed signature checks/s, burst 2000). Last row: the "
        "pre-issue budget (20/s, burst 40), with probes of a token verified before the flood ('cached').",
        "",
        "| flood | bad tokens/s | flood answers | fresh tokens OK | cached token OK | fresh p50 / p99 ms "
        "| gateway CPU ms per bad token |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"Gateway counters at exit: {json.dumps(result['gateway_exit'])}",
        "",
    ]
    (args.out / "auth_flood.md").write_text("\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
