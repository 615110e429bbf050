"""Session 30 (attack30): another tenant's latency while one tenant sends the most expensive requests the default
limits admit.

A demo gateway (:func:`sim.demo.gateway_config`: default limits, embedded OPA, JSONL + OCSF audit, ``cache_aware``)
in front of 2 simulated replicas that answer at once (``time_scale`` 1e6, no decode time), all on loopback. First a
probe: each candidate body of tenant B (a long prompt, a large ``response_format`` schema, many tools with
``tool_choice: "required"``, many messages, references) is sent ``--probe`` times in sequence; its status and the
gateway process's CPU per request (user + system, psutil) are recorded, and the candidate with the most CPU among those
answered 200 is B's body. Then ``--rounds`` rounds of three phases of ``--phase-s`` seconds in rotating order:
``alone`` (tenant A: 1 closed-loop sender of a plain chat request, ``max_tokens`` 4), ``B plain`` (A the same, plus
``--b-senders`` closed-loop senders of A's plain body as tenant B, in a process of their own) and ``B worst`` (the
same with B's body): the difference between the last two is the cost of B's choice of body, the first two the cost
of any neighbour at that concurrency (the 2-core machine also runs B's sender process). A's latency is the client's
wall time per request; B's statuses are counted (a 429 ``cpu_budget_exhausted`` is the gateway's own bound at work).
Loopback only; the load average is printed beside each figure. Markdown and JSON on stdout / ``--out`` (stem).

Usage: ``python -m bench.s30_attack30_neighbour [--rounds 3] [--phase-s 4] [--b-senders 4] [--probe 8]
[--out bench/results/s30_attack30_neighbour]``.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import psutil

from bench.harness import loadavg_text, start_demo_stack, write_json_and_markdown
from sim.click_options import ClickOptions
from sim.demo import MODEL, ClusterSpec
from sim.procs import stop_process

PATH = "/v1/chat/completions"
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau".split()


def _chat(content: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": content}], **extra}


def _text(words: int) -> str:
    return " ".join(WORDS[i % len(WORDS)] + str(i % 97) for i in range(words))


def candidates() -> dict[str, bytes]:
    """Tenant B's candidate bodies (compact JSON), each meant to sit just under a default bound."""
    out: dict[str, Any] = {}
    for words in (3000, 7000):
        out[f"prompt {words} words"] = _chat(_text(words))
    for n in (300, 600):  # more: max_regex_chars (optional properties: outlines-core's expression grows fast)
        props = {f"p{i}": {"type": "integer"} for i in range(n)}
        out[f"schema {n} properties"] = _chat("hi", response_format={"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "object", "properties": props, "required": list(props)}}})
    enums = {f"e{i}": {"enum": [f"v{i}_{j}" for j in range(40)]} for i in range(24)}  # 960 of 1000 enum values
    deep: dict[str, Any] = {"type": "string", "pattern": "^[a-z0-9_-]{1,64}$"}
    for _ in range(12):  # the body's own nesting bound (32) comes first
        deep = {"type": "object", "properties": {"d": deep}}
    out["schema enums + depth + patterns"] = _chat("hi", response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {**enums, "deep": deep, **{
            f"s{i}": {"type": "string", "pattern": "^[A-Za-z0-9._-]{1,16}$"} for i in range(40)}}}}})
    for levels in (8,):
        defs = {f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"}, {"$ref": f"#/$defs/d{i + 1}"}]}
                for i in range(levels)}
        defs[f"d{levels}"] = {"type": "object", "properties": {f"q{j}": {"type": "integer"} for j in range(6)}}
        out[f"schema doubling references x{levels}"] = _chat("hi", response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"$defs": defs, "$ref": "#/$defs/d0"}}})
    tool_props = {f"a{j}": {"type": "string", "description": "an argument"} for j in range(4)}
    for n in (32, 64, 96):
        out[f"{n} tools required"] = _chat("hi", tool_choice="required", tools=[
            {"type": "function", "function": {"name": f"f{i}", "description": "d",
                                              "parameters": {"type": "object", "properties": tool_props}}}
            for i in range(n)])
    out["800 messages"] = {"model": MODEL, "max_tokens": 4,
                           "messages": [{"role": "user", "content": f"m{i}"} for i in range(800)]}
    return {k: json.dumps(v, separators=(",", ":")).encode() for k, v in out.items()}


async def _send(s: aiohttp.ClientSession, url: str, hdr: dict[str, str], body: bytes,
                errors: dict[int, str] | None = None) -> tuple[int, float]:
    t = time.perf_counter()
    async with s.post(url, data=body, headers=hdr) as r:
        raw = await r.read()
        dt = time.perf_counter() - t
        if errors is not None and r.status != 200 and r.status not in errors:
            try:
                err = json.loads(raw)["error"]
                errors[r.status] = f"{err.get('code')}: {str(err.get('message'))[:100]}"
            except (ValueError, KeyError, TypeError):
                errors[r.status] = raw[:100].decode(errors="replace")
        return r.status, dt


def _cpu(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


async def _loop(stop: float, s: aiohttp.ClientSession, url: str, hdr: dict[str, str], body: bytes,
                lat: list[float] | None, statuses: Counter[int]) -> None:
    while time.perf_counter() < stop:
        status, dt = await _send(s, url, hdr, body)
        statuses[status] += 1
        if lat is not None and status == 200:
            lat.append(dt)
        if status == 429:
            await asyncio.sleep(0.01)


_SPAWN = multiprocessing.get_context("spawn")


def _b_child(url: str, hdr: dict[str, str], body: bytes, start: float, seconds: float, senders: int,
             queue: Any) -> None:
    """Tenant B's ``senders`` closed-loop senders of ``body`` from wall time ``start`` for ``seconds`` (a child
    process); puts B's status counts on ``queue``."""
    async def go() -> dict[int, int]:
        statuses: Counter[int] = Counter()
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                         timeout=aiohttp.ClientTimeout(total=60)) as s:
            await asyncio.sleep(max(0.0, start - time.time()))
            stop = time.perf_counter() + seconds
            await asyncio.gather(*(_loop(stop, s, url, hdr, body, None, statuses) for _ in range(senders)))
        return dict(statuses)

    queue.put(asyncio.run(go()))


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1e3 if xs else float("nan")


async def run(args: SimpleNamespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="s30-neighbour-"))
    stack = await start_demo_stack(work, ClusterSpec(replicas=2, time_scale=1e6, decode_s_per_token=0.0))
    doc: dict[str, Any] = {"benchmark": "s30_attack30_neighbour", "args": vars(args), "probe": {}, "rounds": []}
    try:
        proc, base = await stack.start_gateway("gw", stack.gateway_config(["tenant-a", "tenant-b"]))
        url = base + PATH
        headers = stack.headers_for(["tenant-a", "tenant-b"])
        hdr = {t: {"Content-Type": "application/json", **headers(t)} for t in ("tenant-a", "tenant-b")}
        plain = json.dumps(_chat("What is the capital of France? Answer in one word.")).encode()
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                         timeout=aiohttp.ClientTimeout(total=60)) as s:
            for _ in range(50):
                await _send(s, url, hdr["tenant-a"], plain)
            for name, body in candidates().items():
                statuses: Counter[int] = Counter()
                errors: dict[int, str] = {}
                c0 = _cpu(proc.pid)
                for _ in range(args.probe):
                    statuses[(await _send(s, url, hdr["tenant-b"], body, errors))[0]] += 1
                    await asyncio.sleep(0.02)  # lets the tenant's CPU budget refill (100 ms/s by default)
                cpu_ms = (_cpu(proc.pid) - c0) / args.probe * 1e3
                doc["probe"][name] = {"bytes": len(body), "statuses": dict(statuses),
                                      "gateway_cpu_ms": round(cpu_ms, 2), "errors": errors}
                print(f"probe {name}: {len(body)} B, {dict(statuses)}, {cpu_ms:.2f} ms CPU/request {errors} "
                      f"(load {loadavg_text(os.getloadavg())})", flush=True)
            admitted = {k: v for k, v in doc["probe"].items() if set(v["statuses"]) == {200}}
            worst = max(admitted, key=lambda k: admitted[k]["gateway_cpu_ms"])
            doc["b_body"] = worst
            bodies = {"B plain": plain, "B worst": candidates()[worst]}
            phases = ("alone", "B plain", "B worst")
            for r in range(args.rounds):
                for phase in phases[r % 3:] + phases[:r % 3]:  # rotating order
                    lat: list[float] = []
                    sa: Counter[int] = Counter()
                    start = time.time() + 1.0
                    child = None
                    if phase != "alone":  # B's senders in a process of their own (not A's event loop)
                        queue: Any = _SPAWN.Queue()
                        child = _SPAWN.Process(target=_b_child, args=(url, hdr["tenant-b"], bodies[phase], start,
                                                                      args.phase_s, args.b_senders, queue))
                        child.start()
                    await asyncio.sleep(max(0.0, start - time.time()))
                    c0 = _cpu(proc.pid)
                    await _loop(time.perf_counter() + args.phase_s, s, url, hdr["tenant-a"], plain, lat, sa)
                    cpu_s = _cpu(proc.pid) - c0
                    sb = {}
                    if child is not None:
                        sb = queue.get(timeout=60)
                        child.join(timeout=30)
                    row = {"round": r, "phase": phase, "a_n": len(lat), "a_p50_ms": round(_pct(lat, 0.5), 2),
                           "a_p99_ms": round(_pct(lat, 0.99), 2), "a_statuses": dict(sa), "b_statuses": sb,
                           "gateway_cpu_s": round(cpu_s, 2), "loadavg": os.getloadavg()}
                    doc["rounds"].append(row)
                    print(json.dumps(row), flush=True)
        stop_process(proc)
    finally:
        stack.stop()
    for phase in ("alone", "B plain", "B worst"):
        rows = [r for r in doc["rounds"] if r["phase"] == phase]
        if not rows:
            continue
        doc[phase] = {"a_p50_ms_median": statistics.median(r["a_p50_ms"] for r in rows),
                      "a_p99_ms_median": statistics.median(r["a_p99_ms"] for r in rows)}
    return doc


def to_markdown(doc: dict[str, Any]) -> str:
    lines = ["| B candidate | bytes | statuses | gateway CPU ms/request | refusal |", "|---|---:|---|---:|---|"]
    lines += [f"| {k} | {v['bytes']} | {v['statuses']} | {v['gateway_cpu_ms']} | "
              f"{'; '.join(v['errors'].values()).replace('|', '/')} |" for k, v in doc["probe"].items()]
    lines += ["", f"B's body: **{doc['b_body']}**, {doc['args']['b_senders']} closed-loop senders.", "",
              "| round | phase | A requests | A p50 ms | A p99 ms | B statuses | gateway CPU s | load |",
              "|---:|---|---:|---:|---:|---|---:|---|"]
    lines += [f"| {r['round']} | {r['phase']} | {r['a_n']} | {r['a_p50_ms']} | {r['a_p99_ms']} | {r['b_statuses']} | "
              f"{r['gateway_cpu_s']} | {loadavg_text(r['loadavg'])} |" for r in doc["rounds"]]
    lines += ["", "| phase | A p50 ms (median of rounds) | A p99 ms (median of rounds) |", "|---|---:|---:|"]
    lines += [f"| {k} | {doc[k]['a_p50_ms_median']} | {doc[k]['a_p99_ms_median']} |"
              for k in ("alone", "B plain", "B worst") if k in doc]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = ClickOptions(description=__doc__.splitlines()[0])
    p.option("--rounds", type=int, default=3)
    p.option("--phase-s", type=float, default=4.0)
    p.option("--b-senders", type=int, default=4)
    p.option("--probe", type=int, default=8)
    p.option("--out", default="")
    args = p.parse()
    doc = asyncio.run(run(args))
    md = to_markdown(doc)
    if args.out:
        write_json_and_markdown(args.out, doc, md)  # prints it too
    else:
        print(md)


if __name__ == "__main__":
    main()
