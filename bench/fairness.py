"""Benchmark: flow control (issue 17) — a heavy tenant must not take a light one's time to first token.

``python -m bench.fairness [--phase-s S] [--runs N] [--models fifo,chunked] [--out FILE]``

Loopback only, bounded (about ``N x (12 x S + 70)`` seconds with both replica models; ``--runs``
3 by default: every figure is the field-wise median of the runs). One simulated
replica (``python -m sim.cluster``, a separate process) per replica model: ``fifo`` (one prefill
at a time) and ``chunked`` (concurrent prefills share the rate). The gateway runs in a child
process of its own (uvicorn on loopback), the clients in this one; each phase starts a fresh
gateway, so a phase with flow control and one without are measured against the same replica side
by side.

Workload (WordTokenizer: one word = one gateway token = one simulator token; the simulator
stands one simulator token for 16 real tokens of prefill work):

* tenant A: 16 concurrent streams in a loop, each a LONG prompt of ``--long-words`` (500)
  unique words (no prefix reuse), ``max_tokens`` 8;
* tenant B: one short request per second (``--b-rps``), 20 unique words, ``max_tokens`` 8.

Phases per replica model: ``b_alone`` (B only), ``a_alone_noflow`` (A only, flow control off:
raw capacity), ``ab_noflow`` (A and B, flow control off: today's behaviour), ``ab_flow`` (A
and B, flow control on), and for ``chunked`` ``ab_flow_two_long`` (as ``ab_flow`` with a bound
of two long prompts + one short: does a looser bound give A its capacity back?). Reported: B's TTFT p50/p99 (first SSE event at the client), A's
uncached prompt tokens served per second, A's share = A in ``ab_flow`` / A in
``a_alone_noflow``. Flow control bounds: one replica, ``replica_max_queued_prefill_tokens`` =
one long prompt + one short prompt (520), ``replica_max_running_requests`` 64.

Weights (fifo only): tiers ``gold`` (weight 2) and ``standard`` (1), each 16 concurrent streams
of 200-word prompts, flow control on: service in tokens (prompt + output) per tenant over the
phase, and its ratio (target 2:1 within 10 %).

Flood (fifo only): tenant F sends 8 concurrent streams (100-word prompts; ``f_within_limit``),
then 64 (``flood``), with ``tenant_max_queued_requests`` 8; B as above. Reported: F's 429s,
B's p99 in the flood against F within its limit and against ``b_alone``.

Results go to ``bench/results/fairness.json`` and ``.md`` (or ``--out``). The machine may be
shared: the figures are noisy; the ratios measured within one run are what to read.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import platform
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp

from sim.click_options import ClickOptions
from sim.cluster import spawn_cluster
from sim.spiffe_issuer import DemoIssuer

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "bench" / "results" / "fairness.json"
TD = "bench.fairness.test"
OPERATOR = f"spiffe://{TD}/ops/admin"
_words = itertools.count()


def _prompt(n: int) -> str:
    """``n`` words never used before in this run (no prefix reuse)."""
    return " ".join(f"u{next(_words)}" for _ in range(n))


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return round(s[min(len(s) - 1, int(q * len(s)))] * 1000.0, 1)


def _config(tmp: Path, url: str, issuer: DemoIssuer, flow: dict[str, Any], tiers: dict[str, float]) -> dict[str, Any]:
    secret = tmp / "master.key"
    if not secret.exists():
        secret.write_text(secrets.token_hex(32))
        os.chmod(secret, 0o600)
    bundle = tmp / "bundle.json"
    issuer.write_bundle(bundle)
    tenants = [{"id": t, "spiffe_ids": [f"spiffe://{TD}/{t}/"], "models": ["sim-model"], "pools": ["default"],
                "tier": tier, "max_output_tokens": 64}
               for t, tier in (("a", "standard"), ("b", "standard"), ("gold", "premium"), ("std", "standard"),
                               ("f", "standard"))]
    return {
        "listen": {"host": "127.0.0.1", "port": 0}, "admin": {"host": "127.0.0.1", "port": 0},
        "replicas": [{"id": "r0", "url": url}],
        "routing": {"policy": "cache_aware", "block_size": 16},
        "health": {"interval_s": 1.0},
        "tenancy": {"master_secret_file": str(secret), "master_secret_env": None, "tenants": tenants,
                    "tier_weights": tiers, "operators": [OPERATOR]},
        "identity": {"trust_domains": {TD: {"bundle_file": str(bundle)}}},
        "policy": {"mode": "embedded", "dir": str(ROOT / "rego")},
        "upstream": {"total_timeout_s": 120, "first_byte_timeout_s": 60},
        "flow": flow,
        "audit": {},
    }


async def _serve(config_file: str, ready_file: str) -> None:
    """Child process: one gateway (public and admin listeners, no audit sinks) until SIGTERM; their
    ports go to ``ready_file``."""
    from bench.harness import serve_public, serve_until_sigterm
    from gateway.auditing import AuditHub
    from gateway.build import build
    from gateway.config import load_config

    comps = build(load_config(config_file), audit=AuditHub(None))
    await comps.start()
    server, task, port = await serve_public(comps)
    admin, admin_task, admin_port = await serve_public(comps, admin=True)
    Path(ready_file).write_text(json.dumps({"port": port, "admin_port": admin_port}))
    await serve_until_sigterm(server, task)
    admin.should_exit = True
    await admin_task
    await comps.stop()


class _Gateway:
    """A gateway child process (``--serve``) for one phase."""

    def __init__(self, tmp: Path, cfg: dict[str, Any], operator_token: str) -> None:
        self.tmp, self.cfg, self.operator_token = tmp, cfg, operator_token
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = self.admin_url = ""

    async def __aenter__(self) -> _Gateway:
        import yaml

        name = f"gw{next(_words)}"
        cfg_file = self.tmp / f"{name}.yaml"
        cfg_file.write_text(yaml.safe_dump(self.cfg))
        ready = self.tmp / f"{name}.ready"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
        log = open(self.tmp / f"{name}.log", "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.fairness", "--serve", str(cfg_file),
                                      "--ready-file", str(ready)], cwd=str(ROOT), env=env, stdout=log,
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while not ready.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                raise RuntimeError(f"gateway did not start: {(self.tmp / f'{name}.log').read_text()[-2000:]}")
            await asyncio.sleep(0.05)
        ports = json.loads(ready.read_text())
        self.url, self.admin_url = (f"http://127.0.0.1:{ports[k]}" for k in ("port", "admin_port"))
        return self

    async def metric(self, session: aiohttp.ClientSession, name: str) -> float | None:
        """One sample of the gateway's ``/admin/metrics`` (as an operator: queue figures are
        operators-only, R3-5)."""
        async with session.get(self.admin_url + "/admin/metrics",
                               headers={"Authorization": f"Bearer {self.operator_token}"}) as r:
            for line in (await r.text()).splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
        return None

    async def __aexit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()


async def _one(session: aiohttp.ClientSession, url: str, token: str, words: int, max_tokens: int) -> tuple[int, float | None, int]:
    """One streamed completion: (status, TTFT s or None, prompt + output tokens served)."""
    body = {"model": "sim-model", "prompt": _prompt(words), "max_tokens": max_tokens, "stream": True}
    t0 = time.perf_counter()
    ttft = None
    async with session.post(url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {token}"}) as r:
        if r.status != 200:
            await r.read()
            return r.status, None, 0
        async for _chunk in r.content.iter_any():
            if ttft is None:
                ttft = time.perf_counter() - t0
    return 200, ttft, words + max_tokens


async def _loop(stop: float, session: aiohttp.ClientSession, url: str, token: str, words: int, max_tokens: int,
                served: list[tuple[float, int]], statuses: list[int]) -> None:
    while time.perf_counter() < stop:
        try:
            status, _, n = await _one(session, url, token, words, max_tokens)
        except (aiohttp.ClientError, asyncio.TimeoutError):
            status, n = 599, 0
        statuses.append(status)
        if n:
            served.append((time.perf_counter(), n))
        if status == 429:
            await asyncio.sleep(0.05)


async def _paced(stop: float, session: aiohttp.ClientSession, url: str, token: str, rps: float, words: int,
                 ttfts: list[float], statuses: list[int]) -> None:
    tasks = []

    async def fire() -> None:
        status, ttft, _ = await _one(session, url, token, words, 8)
        statuses.append(status)
        if ttft is not None:
            ttfts.append(ttft)

    next_t = time.perf_counter()
    while next_t < stop:
        await asyncio.sleep(max(0.0, next_t - time.perf_counter()))
        tasks.append(asyncio.ensure_future(fire()))
        next_t += 1.0 / rps
    await asyncio.gather(*tasks, return_exceptions=True)


async def _phase(tmp: Path, replica_url: str, issuer: DemoIssuer, flow: dict[str, Any], seconds: float, *,
                 heavy: list[tuple[str, int, int]], b_rps: float | None, b_words: int = 20,
                 tiers: dict[str, float] | None = None) -> dict[str, Any]:
    """Run one phase; ``heavy``: (tenant, concurrent streams, prompt words) looping senders."""
    cfg = _config(tmp, replica_url, issuer, flow, tiers or {})
    async with _Gateway(tmp, cfg, issuer.mint(OPERATOR, "prefixgate-admin", ttl_s=600)) as g:
        tokens = {t: issuer.mint(f"spiffe://{TD}/{t}/app", "prefixgate", ttl_s=600) for t in ("a", "b", "gold", "std", "f")}
        conn = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=120)) as s:
            warm = time.perf_counter() + 2.0  # let the heavy senders saturate the replica first
            stop = warm + seconds
            served = {t: [] for t, _, _ in heavy}
            statuses: dict[str, list[int]] = {t: [] for t, _, _ in heavy}
            tasks = [asyncio.ensure_future(_loop(stop, s, g.url, tokens[t], w, 8, served[t], statuses[t]))
                     for t, n, w in heavy for _ in range(n)]
            ttfts: list[float] = []
            b_status: list[int] = []
            if b_rps:
                await asyncio.sleep(max(0.0, warm - time.perf_counter()) if heavy else 0.0)
                await _paced(stop, s, g.url, tokens["b"], b_rps, b_words, ttfts, b_status)
            await asyncio.gather(*tasks, return_exceptions=True)
            queue_waits = await g.metric(s, "prefixgate_flow_queue_wait_seconds_count")
    span = seconds
    out: dict[str, Any] = {"seconds": seconds}
    for t in served:
        toks = sum(n for ts, n in served[t] if warm <= ts <= stop)
        out[t] = {"tokens_per_s": round(toks / span, 1), "requests": len(served[t]),
                  "status_429": statuses[t].count(429), "other_errors": sum(1 for x in statuses[t] if x not in (200, 429))}
    if b_rps:
        out["b"] = {"ttft_p50_ms": _pct(ttfts, 0.5), "ttft_p99_ms": _pct(ttfts, 0.99), "samples": len(ttfts),
                    "errors": sum(1 for x in b_status if x != 200)}
    out["released_by_flow_control"] = queue_waits
    return out


FLOW_ON = {"enabled": True, "replica_max_queued_prefill_tokens": 520, "replica_max_running_requests": 64,
           "shed_loop_lag_s": None}
FLOW_OFF = {"enabled": False, "shed_loop_lag_s": None}


async def _main(args: SimpleNamespace) -> dict[str, Any]:
    issuer = DemoIssuer(TD)
    doc: dict[str, Any] = {"host": {"platform": platform.platform(), "cpus": os.cpu_count(),
                                    "loadavg_start": os.getloadavg()},
                           "settings": {"phase_s": args.phase_s, "long_words": args.long_words, "b_rps": args.b_rps,
                                        "time_scale": args.time_scale, "flow_on": FLOW_ON}}
    with tempfile.TemporaryDirectory(prefix="pg-fair-") as d:
        tmp = Path(d)
        for model in args.models:
            with spawn_cluster(1, time_scale=args.time_scale, replica_model=model, stream_chunk_tokens=4) as cp:
                url = cp.urls[0]
                res: dict[str, Any] = {}
                A = [("a", 16, args.long_words)]
                res["b_alone"] = await _phase(tmp, url, issuer, FLOW_ON, args.phase_s, heavy=[], b_rps=args.b_rps)
                res["a_alone_noflow"] = await _phase(tmp, url, issuer, FLOW_OFF, args.phase_s, heavy=A, b_rps=None)
                res["ab_noflow"] = await _phase(tmp, url, issuer, FLOW_OFF, args.phase_s, heavy=A, b_rps=args.b_rps)
                res["ab_flow"] = await _phase(tmp, url, issuer, FLOW_ON, args.phase_s, heavy=A, b_rps=args.b_rps)
                if model == "chunked":  # issue 17 item 3: a bound of two long prompts (+ one short)
                    two = dict(FLOW_ON, replica_max_queued_prefill_tokens=2 * args.long_words + 20)
                    res["ab_flow_two_long"] = await _phase(tmp, url, issuer, two, args.phase_s, heavy=A,
                                                           b_rps=args.b_rps)
                cap = res["a_alone_noflow"]["a"]["tokens_per_s"] or 1
                res["a_share_of_capacity"] = round(res["ab_flow"]["a"]["tokens_per_s"] / cap, 3)
                base50 = res["b_alone"]["b"]["ttft_p50_ms"] or 1
                res["b_p50_vs_alone"] = round((res["ab_flow"]["b"]["ttft_p50_ms"] or 0) / base50, 3)
                if "ab_flow_two_long" in res:
                    t = res["ab_flow_two_long"]
                    t["a_share_of_capacity"] = round(t["a"]["tokens_per_s"] / cap, 3)
                    t["b_p50_vs_alone"] = round((t["b"]["ttft_p50_ms"] or 0) / base50, 3)
                # one residual of A's prefill: (overhead + words x token_scale / rate) / time_scale
                res["a_prefill_ms"] = round((0.005 + args.long_words * 16 / 10000) / args.time_scale * 1000, 1)
                if model == "fifo":
                    res["weights_2_1"] = await _phase(
                        tmp, url, issuer, FLOW_ON, args.phase_s, heavy=[("gold", 16, 200), ("std", 16, 200)],
                        b_rps=None, tiers={"premium": 2.0, "standard": 1.0})
                    w = res["weights_2_1"]
                    w["service_ratio"] = round(w["gold"]["tokens_per_s"] / max(1e-9, w["std"]["tokens_per_s"]), 3)
                    flood = dict(FLOW_ON, tenant_max_queued_requests=8)
                    res["f_within_limit"] = await _phase(tmp, url, issuer, flood, args.phase_s,
                                                         heavy=[("f", 8, 100)], b_rps=args.b_rps)
                    res["flood"] = await _phase(tmp, url, issuer, flood, args.phase_s, heavy=[("f", 64, 100)],
                                                b_rps=args.b_rps)
                    base99 = res["b_alone"]["b"]["ttft_p99_ms"] or 1
                    within99 = res["f_within_limit"]["b"]["ttft_p99_ms"] or 1
                    res["flood"]["b_p99_vs_alone"] = round((res["flood"]["b"]["ttft_p99_ms"] or 0) / base99, 2)
                    res["flood"]["b_p99_vs_f_within_limit"] = round((res["flood"]["b"]["ttft_p99_ms"] or 0) / within99, 2)
                doc[model] = res
    doc["host"]["loadavg_end"] = os.getloadavg()
    return doc


def _median_doc(docs: list[Any]) -> Any:
    """Field-wise median of runs' result documents (numbers: the median; dicts: per key present in
    every run; anything else: the first run's value)."""
    first = docs[0]
    if all(isinstance(d, (int, float)) and not isinstance(d, bool) for d in docs):
        return statistics.median(docs)
    if all(isinstance(d, dict) for d in docs):
        return {k: _median_doc([d[k] for d in docs]) for k in first if all(k in d for d in docs)}
    return first


def to_markdown(doc: dict[str, Any]) -> str:
    """The results as a Markdown section (docs/fairness.md copies it)."""
    lines = ["| replica model | phase | B TTFT p50 ms | B TTFT p99 ms | A tokens/s |", "|---|---|---|---|---|"]
    for model in ("fifo", "chunked"):
        r = doc.get(model)
        if not r:
            continue
        for ph in ("b_alone", "a_alone_noflow", "ab_noflow", "ab_flow", "ab_flow_two_long"):
            if ph not in r:
                continue
            p = r[ph]
            b, a = p.get("b", {}), p.get("a", {})
            lines.append(f"| {model} | {ph} | {b.get('ttft_p50_ms', '')} | {b.get('ttft_p99_ms', '')} | "
                         f"{a.get('tokens_per_s', '')} |")
    for model in ("fifo", "chunked"):
        r = doc.get(model)
        if r:
            lines.append("")
            lines.append(f"{model}: A's prefill of one long prompt = {r['a_prefill_ms']} ms; A's share of capacity "
                         f"with flow control = {r['a_share_of_capacity']}; B p50 with flow control / alone = "
                         f"{r.get('b_p50_vs_alone')}")
            if "ab_flow_two_long" in r:
                t = r["ab_flow_two_long"]
                lines.append(f"{model}, bound of two long prompts: A's share = {t['a_share_of_capacity']}; "
                             f"B p50 / alone = {t['b_p50_vs_alone']}")
    f = doc.get("fifo", {})
    if "weights_2_1" in f:
        w = f["weights_2_1"]
        lines.append(f"\nweights 2:1: gold {w['gold']['tokens_per_s']} tokens/s, standard {w['std']['tokens_per_s']} "
                     f"tokens/s, ratio {w['service_ratio']}")
    if "flood" in f:
        fl = f["flood"]
        wl = f["f_within_limit"]
        lines.append(f"\nF within its queue limit (8 concurrent): B p50/p99 {wl['b']['ttft_p50_ms']}/{wl['b']['ttft_p99_ms']} ms, "
                     f"F {wl['f']['status_429']} x 429")
        lines.append(f"\nflood (64 concurrent, queue limit 8): F got {fl['f']['status_429']} x 429 "
                     f"({fl['f']['requests']} served); B p50/p99 {fl['b']['ttft_p50_ms']}/{fl['b']['ttft_p99_ms']} ms = "
                     f"{fl['b_p99_vs_f_within_limit']} x (F within limit), {fl['b_p99_vs_alone']} x alone")
    lines.append(f"\nhost: {doc['host']['cpus']} CPUs, load average {doc['host']['loadavg_start']} -> "
                 f"{doc['host']['loadavg_end']} (shared machine)")
    if doc.get("runs"):
        lines.append(f"\nfield-wise median of {doc['runs']} runs (every run in the .json under ``each_run``)")
    return "\n".join(lines) + "\n"


def main() -> None:
    """Run the benchmark and write ``--out`` (.json) and its .md."""
    ap = ClickOptions(description=__doc__.splitlines()[0])
    ap.option("--phase-s", type=float, default=15.0)
    ap.option("--long-words", type=int, default=500)
    ap.option("--b-rps", type=float, default=1.0)
    ap.option("--time-scale", type=float, default=4.0)
    ap.option("--models", default="fifo,chunked")
    ap.option("--out", default=str(DEFAULT_OUT))
    ap.option("--runs", type=int, default=3, help="runs; figures are field-wise medians")
    ap.option("--serve", hidden=True)
    ap.option("--ready-file", hidden=True)
    args = ap.parse()
    if args.serve:
        asyncio.run(_serve(args.serve, args.ready_file))
        return
    args.models = [m for m in args.models.split(",") if m]
    each = [asyncio.run(_main(args)) for _ in range(args.runs)]
    doc = _median_doc(each) if len(each) > 1 else each[0]
    if len(each) > 1:
        doc["runs"], doc["each_run"] = len(each), each
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    out.with_suffix(".md").write_text(to_markdown(doc))
    print(to_markdown(doc))


if __name__ == "__main__":
    main()
