"""Micro-benchmark: gateway CPU per worst-case request before it reaches a replica (issue 12).

``python -m bench.request_cost [--reps R] [--out FILE]``

Builds a real :class:`gateway.build.Gateway` (not started: no
replica is called) and runs, on each body, the request work of
:meth:`gateway.pipeline.InferencePipeline.handle` from the body bytes to the
routing step: :func:`gateway.request.parse_inference_request` with the
tenant's bounds, the batch charge, the byte bound and the early-stopping
tokenizer (``Admission.prompt_tokens``), ``check_prompt`` and the prefix
chain. Process CPU time (``time.process_time``), milliseconds per request,
best of ``R`` repetitions. The bodies are the worst cases of issue 12
(1 MiB prompts, 30,000 messages, a 16-prompt batch, tools, floods of tiny
JSON values) for a tenant with
``max_prompt_tokens`` 100 and one with none (body cap 1 MiB, the default).

**Isolation phase** (``--isolation-s S``, default 15; 0 skips it): a real
gateway process (``python -m gateway.cli serve``, audit to JSONL and OCSF in
a worker process) in front of two simulated replicas (``python -m
sim.cluster``), all on loopback. Phase ``baseline``: tenant B (the victim)
sends a normal request (a 99-token prompt, ``max_tokens`` 16) every
``1/victim_rps`` seconds, open loop, for ``S`` seconds. Phase ``attack``: the
same, while tenant A sends the worst-case bodies above in turn at exactly its
request quota (``rate_rps`` 5, ``max_prompt_tokens`` 100,
``max_concurrency`` 16, token buckets of 2,000/s). Reported: B's p50 and p95
in each phase and their ratio (target: p50 ratio < 2), A's outcomes, and the
gateway process's CPU (``/proc/<pid>/stat``, user + system; the audit worker
process not included) per B request in the baseline and per worst-case
request in the attack phase (``(attack CPU - B's requests x baseline CPU per
B request) / A's requests``). Bounded: about ``2 x S + 15`` seconds.

Results go to ``bench/results/request_cost.json`` and ``.md`` (or ``--out``).
A benchmark, not a test: the numbers depend on the machine (and on what
else runs on it: report the host's load with the figures).
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import secrets
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import click

from gateway.auditing import AuditHub
from gateway.build import Gateway, build
from gateway.config import load_config
from gateway.errors import GatewayError
from gateway.request import parse_inference_request
from sim.click_options import ClickOptions

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "bench" / "results" / "request_cost.json"
MIB = 1 << 20


def _components(tmp: Path) -> Gateway:
    secret = tmp / "master.key"
    secret.write_text(secrets.token_hex(32))
    os.chmod(secret, 0o600)
    bundle = tmp / "bundle.json"
    bundle.write_text(json.dumps({"keys": []}))
    cfg = load_config(None, {
        "replicas": [{"id": "r0", "url": "http://127.0.0.1:9"}],
        "tenancy": {"master_secret_file": str(secret), "master_secret_env": None, "tenants": [
            {"id": "small", "spiffe_ids": ["spiffe://bench.test/small/"], "max_prompt_tokens": 100},
            {"id": "open", "spiffe_ids": ["spiffe://bench.test/open/"]},
        ]},
        "identity": {"trust_domains": {"bench.test": {"bundle_file": str(bundle)}}},
        "policy": {"mode": "embedded", "dir": str(ROOT / "rego")},
    })
    return build(cfg, audit=AuditHub(None))


def _bodies() -> dict[str, tuple[str, bytes]]:
    words = "word " * (MIB // 5 - 20)
    run = "a" * (MIB - 100)
    msgs = [{"role": "user", "content": "hi"}] * 30_000
    near = " ".join(f"w{i}" for i in range(99))
    tools = [{"type": "function", "function": {"name": f"f{i}", "description": "x " * 40}} for i in range(2000)]

    def dump(doc: dict[str, Any]) -> bytes:
        return json.dumps({"model": "sim-model", "max_tokens": 16, **doc}).encode()

    return {
        "1 MiB of short words": ("completions", dump({"prompt": words})),
        "1 MiB word-character run": ("completions", dump({"prompt": run})),
        "30,000 chat messages": ("chat", dump({"messages": msgs})),
        "16-prompt batch, 99 tokens each": ("completions", dump({"prompt": [near] * 16})),
        "2,000 tools (~700 KB)": ("chat", dump({"messages": [{"role": "user", "content": near}], "tools": tools})),
        "1 MiB of empty tool objects": ("chat", dump({"messages": [{"role": "user", "content": "hi"}],
                                                     "tools": [{}] * (MIB // 4)})),
        "1 MiB of empty arrays in a tool": ("chat", dump({"messages": [{"role": "user", "content": "hi"}],
                                                          "tools": [{"a": [[]] * (MIB // 4)}]})),
        "32,000 empty tool objects (just under the JSON-value cap)": (
            "chat", dump({"messages": [{"role": "user", "content": "hi"}], "tools": [{}] * 32_000})),
        "2,000 messages (under the messages ceiling)": ("chat", dump({"messages": msgs[:2000]})),
        "one 99-token prompt (baseline)": ("completions", dump({"prompt": near})),
    }


def _now(coro: Any) -> Any:
    """Run a coroutine that never suspends (admission on the in-process backend) to its result."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise RuntimeError("admission suspended: this bench needs state.backend memory")


def _one(c: Gateway, tenant: Any, endpoint: str, raw: bytes) -> str:
    """The pipeline's work on one body up to routing; returns the outcome code."""
    lease = c.limiter.admit(tenant)
    try:
        bounds = c.admission.request_bounds(tenant)
        req = parse_inference_request(raw, endpoint, c.config.limits.max_json_depth,  # type: ignore[arg-type]
                                      max_messages=bounds.max_messages, max_batch_prompts=bounds.max_batch_prompts,
                                      max_json_items=c.config.limits.max_json_items)
        _now(c.admission.admit_sequences(tenant, lease, req.sequences))
        tokens, total = c.admission.prompt_tokens(bounds, req)
        _now(c.admission.check_prompt(tenant, total, req.sequences)).settle(0, 0, "not_dispatched")
        c.keys.prefix_chains(tenant, tokens)
        return f"accepted ({total} tokens)"
    except GatewayError as err:
        return f"{err.status} {err.code}"
    finally:
        lease.release()


def _cpu_ms(fn: Callable[[], Any], reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return round(best * 1000.0, 3)


def run(reps: int) -> dict[str, Any]:
    """Measure every body for every tenant; returns the result document."""
    with tempfile.TemporaryDirectory() as d:
        c = _components(Path(d))
        rows = []
        for tid in ("small", "open"):
            tenant = c.registry.get(tid)
            for name, (endpoint, raw) in _bodies().items():
                outcome = _one(c, tenant, endpoint, raw)
                ms = _cpu_ms(lambda: _one(c, tenant, endpoint, raw), reps)
                rows.append({"tenant": tid, "max_prompt_tokens": tenant.max_prompt_tokens, "body": name,
                             "body_bytes": len(raw), "outcome": outcome, "cpu_ms": ms})
    return {"benchmark": "request_cost", "reps": reps, "python": platform.python_version(),
            "machine": platform.machine(), "rows": rows}


VICTIM_PROMPT = " ".join(f"w{i}" for i in range(99))


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    vals = sorted(values)
    return round(vals[min(len(vals) - 1, int(q * len(vals)))], 2)


async def _isolation(phase_s: float, victim_rps: float, attacker_rps: float) -> dict[str, Any]:
    """Run the isolation phases (module docstring) and return their figures."""
    from bench.soak import read_proc
    from bench.harness import start_demo_stack
    from sim.demo import ClusterSpec
    from sim.procs import stop_process

    with tempfile.TemporaryDirectory(prefix="prefixgate-isolation-") as d:
        stack = await start_demo_stack(Path(d), ClusterSpec(replicas=2, time_scale=100.0, stream_chunk_tokens=16))
        attacker, victim = "tenant-a", "tenant-b"
        headers_for = stack.headers_for([attacker, victim])
        gw = None
        try:
            cfg = stack.gateway_config([attacker, victim])
            a_cfg, b_cfg = cfg["tenancy"]["tenants"]
            a_cfg.update(rate_rps=attacker_rps, rate_burst=attacker_rps, max_prompt_tokens=100,
                         max_output_tokens=16, max_concurrency=16, prompt_tokens_per_s=2000,
                         output_tokens_per_s=2000)
            b_cfg.update(max_output_tokens=16)
            gw, base = await stack.start_gateway("gateway", cfg)
            bodies = [(name, ep, raw) for name, (ep, raw) in _bodies().items() if "baseline" not in name]
            victim_raw = json.dumps({"model": "sim-model", "prompt": VICTIM_PROMPT, "max_tokens": 16}).encode()
            conn = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(base_url=base, connector=conn,
                                             timeout=aiohttp.ClientTimeout(total=30)) as http:
                async def send(tenant: str, endpoint: str, raw: bytes) -> tuple[int, float, str]:
                    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
                    t0 = time.perf_counter()
                    headers = {**headers_for(tenant), "Content-Type": "application/json"}
                    try:
                        async with http.post(path, data=raw, headers=headers) as resp:
                            data = await resp.read()
                            code = ""
                            if resp.status != 200:
                                try:
                                    code = json.loads(data)["error"]["code"]
                                except (ValueError, KeyError, TypeError):
                                    code = "?"
                            return resp.status, (time.perf_counter() - t0) * 1000.0, code
                    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                        return 0, (time.perf_counter() - t0) * 1000.0, type(exc).__name__

                async def paced(rate: float, make: Callable[[int], Any], duration: float) -> list[Any]:
                    tasks, i, start = [], 0, time.perf_counter()
                    while (due := start + i / rate) < start + duration:
                        await asyncio.sleep(max(0.0, due - time.perf_counter()))
                        tasks.append(asyncio.ensure_future(make(i)))
                        i += 1
                    return list(await asyncio.gather(*tasks))

                def victim_req(_: int) -> Any:
                    return send(victim, "completions", victim_raw)

                def attacker_req(i: int) -> Any:
                    name, ep, raw = bodies[i % len(bodies)]
                    return send(attacker, ep, raw)

                await paced(victim_rps, victim_req, 2.0)  # warm-up (connections, caches)
                cpu0 = read_proc(gw.pid).cpu_s
                base_res = await paced(victim_rps, victim_req, phase_s)
                cpu1 = read_proc(gw.pid).cpu_s
                vict, att = await asyncio.gather(paced(victim_rps, victim_req, phase_s),
                                                 paced(attacker_rps, attacker_req, phase_s))
                cpu2 = read_proc(gw.pid).cpu_s
        finally:
            if gw is not None:
                stop_process(gw)
            stack.stop()

    def lat(res: list[tuple[int, float, str]]) -> list[float]:
        return [ms for status, ms, _ in res if status == 200]

    b_lat, v_lat = lat(base_res), lat(vict)
    cpu_base_per_b = (cpu1 - cpu0) / max(1, len(base_res))
    cpu_attack = cpu2 - cpu1
    per_attack = (cpu_attack - cpu_base_per_b * len(vict)) / max(1, len(att))
    outcomes: dict[str, int] = {}
    for status, _, code in att:
        key = f"{status} {code}".strip()
        outcomes[key] = outcomes.get(key, 0) + 1
    p50_b, p50_v = statistics.median(b_lat) if b_lat else None, statistics.median(v_lat) if v_lat else None
    return {
        "phase_s": phase_s, "victim_rps": victim_rps, "attacker_rps": attacker_rps,
        "loadavg_1m": round(os.getloadavg()[0], 2), "cpus": os.cpu_count(),
        "victim_baseline": {"sent": len(base_res), "ok": len(b_lat), "p50_ms": _pct(b_lat, 0.5),
                            "p95_ms": _pct(b_lat, 0.95)},
        "victim_attack": {"sent": len(vict), "ok": len(v_lat), "p50_ms": _pct(v_lat, 0.5),
                          "p95_ms": _pct(v_lat, 0.95)},
        "p50_ratio": round(p50_v / p50_b, 2) if p50_b and p50_v else None,
        "attacker": {"sent": len(att), "outcomes": dict(sorted(outcomes.items()))},
        "gateway_cpu_s": {"baseline": round(cpu1 - cpu0, 3), "attack": round(cpu_attack, 3)},
        "gateway_cpu_ms_per_victim_request": round(cpu_base_per_b * 1000.0, 3),
        "gateway_cpu_ms_per_worst_case_request": round(per_attack * 1000.0, 3),
        "gateway_cpu_share_attack": round(cpu_attack / phase_s, 3),
    }


def to_markdown(doc: dict[str, Any]) -> str:
    """A table of the result document."""
    lines = ["| tenant (max_prompt_tokens) | body | bytes | outcome | gateway CPU ms |",
             "|---|---|---:|---|---:|"]
    for r in doc["rows"]:
        lines.append(f"| {r['tenant']} ({r['max_prompt_tokens']}) | {r['body']} | {r['body_bytes']} | "
                     f"{r['outcome']} | {r['cpu_ms']} |")
    iso = doc.get("isolation")
    if iso:
        vb, va = iso["victim_baseline"], iso["victim_attack"]
        lines += [
            "",
            f"Isolation ({iso['phase_s']} s per phase, loopback; load average {iso['loadavg_1m']} on "
            f"{iso['cpus']} CPUs): tenant B sends {iso['victim_rps']} normal requests/s; in the attack phase "
            f"tenant A sends worst-case bodies at its quota ({iso['attacker_rps']} requests/s).",
            "",
            "| phase | B sent | B ok | B p50 ms | B p95 ms | gateway CPU s |",
            "|---|---:|---:|---:|---:|---:|",
            f"| baseline | {vb['sent']} | {vb['ok']} | {vb['p50_ms']} | {vb['p95_ms']} | "
            f"{iso['gateway_cpu_s']['baseline']} |",
            f"| attack | {va['sent']} | {va['ok']} | {va['p50_ms']} | {va['p95_ms']} | "
            f"{iso['gateway_cpu_s']['attack']} |",
            "",
            f"B's p50 ratio (attack / baseline): **{iso['p50_ratio']}** (target < 2). "
            f"Gateway CPU per B request {iso['gateway_cpu_ms_per_victim_request']} ms; "
            f"per worst-case request of A {iso['gateway_cpu_ms_per_worst_case_request']} ms. "
            f"A's outcomes: {', '.join(f'{k}: {v}' for k, v in iso['attacker']['outcomes'].items())}.",
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = ClickOptions(description=__doc__.splitlines()[0])
    ap.option("--reps", type=int, default=5)
    ap.option("--out", type=click.Path(path_type=Path), default=DEFAULT_OUT)
    ap.option("--isolation-s", type=float, default=15.0, help="seconds per isolation phase (0: skip)")
    ap.option("--victim-rps", type=float, default=10.0)
    ap.option("--attacker-rps", type=float, default=5.0)
    args = ap.parse()
    doc = run(args.reps)
    if args.isolation_s > 0:
        doc["isolation"] = asyncio.run(_isolation(args.isolation_s, args.victim_rps, args.attacker_rps))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(to_markdown(doc))
    print(to_markdown(doc), end="")


if __name__ == "__main__":
    main()
