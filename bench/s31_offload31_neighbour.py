"""Session 31 (offload31): another tenant's latency, and the readiness probe's, while tenant B sends heavy bodies.

:mod:`bench.s30_attack30_neighbour`'s stack (a demo gateway with the default limits in front of 2 simulated replicas
that answer at once, loopback), with B's body chosen by name among that bench's candidates and the two ~100 ms
pattern schemas of :mod:`bench.s31_offload31_loop_hold` (each request a pattern no earlier one counted: S30-review30-3,
refused 400 after its count, charged to B's CPU budget). ``--rounds`` rounds of the phases ``alone`` and one per
``--b-body``, in rotating order, ``--phase-s`` seconds each: tenant A's closed-loop sender of a plain chat (p50, p99,
max ms), a ``/readyz`` poller (p99, max ms), and ``--b-senders`` closed-loop senders of B's body in a process of their
own (statuses counted; a 429 waits 10 ms). Run it from each tree to compare (the gateway is the bench's own tree).

Usage: ``python -m bench.s31_offload31_neighbour [--rounds 3] [--phase-s 4] [--b-senders 4]
[--b-body "pattern 400 literals" ...] [--out STEM]``.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp

from bench.harness import loadavg_text, start_demo_stack, write_json_and_markdown
from bench.s30_attack30_neighbour import PATH, _SPAWN, _chat, _pct, _send
from sim.click_options import ClickOptions
from sim.demo import ClusterSpec
from sim.procs import stop_process


def _b_child(url: str, hdr: dict[str, str], body: str, start: float, seconds: float, senders: int,
             queue: Any) -> None:
    """B's ``senders`` closed-loop senders of the body named ``body`` (a fresh one per request) from wall time
    ``start`` for ``seconds`` (a child process); puts B's status counts on ``queue``."""
    from bench.s31_offload31_loop_hold import bodies

    make = bodies()[body]

    async def one(stop: float, s: aiohttp.ClientSession, statuses: Counter[int]) -> None:
        while time.perf_counter() < stop:
            status, _ = await _send(s, url, hdr, make())
            statuses[status] += 1
            if status == 429:
                await asyncio.sleep(0.01)

    async def go() -> dict[int, int]:
        statuses: Counter[int] = Counter()
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                         timeout=aiohttp.ClientTimeout(total=60)) as s:
            await asyncio.sleep(max(0.0, start - time.time()))
            stop = time.perf_counter() + seconds
            await asyncio.gather(*(one(stop, s, statuses) for _ in range(senders)))
        return dict(statuses)

    queue.put(asyncio.run(go()))


async def _a(stop: float, s: aiohttp.ClientSession, url: str, hdr: dict[str, str], body: bytes | None,
             lat: list[float], statuses: Counter[int]) -> None:
    """A closed-loop sender of ``body`` to ``url`` (None: a GET); its latencies of 200 answers."""
    while time.perf_counter() < stop:
        t = time.perf_counter()
        if body is None:
            async with s.get(url) as r:
                await r.read()
                status = r.status
        else:
            status, _ = await _send(s, url, hdr, body)
        statuses[status] += 1
        if status == 200:
            lat.append(time.perf_counter() - t)


async def run(args: SimpleNamespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="s31-neighbour-"))
    stack = await start_demo_stack(work, ClusterSpec(replicas=2, time_scale=1e6, decode_s_per_token=0.0))
    doc: dict[str, Any] = {"benchmark": "s31_offload31_neighbour", "tree": str(Path(__file__).resolve().parents[1]),
                           "args": vars(args), "rounds": []}
    try:
        proc, base = await stack.start_gateway("gw", stack.gateway_config(["tenant-a", "tenant-b"]))
        url = base + PATH
        headers = stack.headers_for(["tenant-a", "tenant-b"])
        hdr = {t: {"Content-Type": "application/json", **headers(t)} for t in ("tenant-a", "tenant-b")}
        plain = json.dumps(_chat("What is the capital of France? Answer in one word.")).encode()
        phases = ["alone", *args.b_body]
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                         timeout=aiohttp.ClientTimeout(total=60)) as s:
            for _ in range(50):
                await _send(s, url, hdr["tenant-a"], plain)
            for r in range(args.rounds):
                for phase in phases[r % len(phases):] + phases[:r % len(phases)]:
                    lat: list[float] = []
                    ready: list[float] = []
                    sa: Counter[int] = Counter()
                    sr: Counter[int] = Counter()
                    start = time.time() + 1.0
                    child = None
                    if phase != "alone":
                        queue: Any = _SPAWN.Queue()
                        child = _SPAWN.Process(target=_b_child, args=(url, hdr["tenant-b"], phase, start,
                                                                      args.phase_s, args.b_senders, queue))
                        child.start()
                    await asyncio.sleep(max(0.0, start - time.time()))
                    stop = time.perf_counter() + args.phase_s
                    await asyncio.gather(_a(stop, s, url, hdr["tenant-a"], plain, lat, sa),
                                         _a(stop, s, base + "/readyz", {}, None, ready, sr))
                    sb = {}
                    if child is not None:
                        sb = queue.get(timeout=60)
                        child.join(timeout=30)
                    row = {"round": r, "phase": phase, "a_n": len(lat), "a_p50_ms": round(_pct(lat, 0.5), 2),
                           "a_p99_ms": round(_pct(lat, 0.99), 2), "a_max_ms": round(max(lat, default=0) * 1e3, 2),
                           "ready_p99_ms": round(_pct(ready, 0.99), 2),
                           "ready_max_ms": round(max(ready, default=0) * 1e3, 2),
                           "a_statuses": dict(sa), "b_statuses": sb, "loadavg": os.getloadavg()}
                    doc["rounds"].append(row)
                    print(json.dumps(row), flush=True)
        stop_process(proc)
    finally:
        stack.stop()
    for phase in ["alone", *args.b_body]:
        rows = [r for r in doc["rounds"] if r["phase"] == phase]
        doc[phase] = {k: statistics.median(r[k] for r in rows) for k in
                      ("a_p50_ms", "a_p99_ms", "a_max_ms", "ready_p99_ms", "ready_max_ms")}
    return doc


def to_markdown(doc: dict[str, Any]) -> str:
    lines = [f"Tree `{doc['tree']}`; B: {doc['args']['b_senders']} closed-loop senders.", "",
             "| round | phase | A requests | A p50 ms | A p99 ms | A max ms | /readyz p99 ms | /readyz max ms | "
             "B statuses | load |", "|---:|---|---:|---:|---:|---:|---:|---:|---|---|"]
    lines += [f"| {r['round']} | {r['phase']} | {r['a_n']} | {r['a_p50_ms']} | {r['a_p99_ms']} | {r['a_max_ms']} | "
              f"{r['ready_p99_ms']} | {r['ready_max_ms']} | {r['b_statuses']} | {loadavg_text(r['loadavg'])} |"
              for r in doc["rounds"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = ClickOptions(description=__doc__.splitlines()[0])
    p.option("--rounds", type=int, default=3)
    p.option("--phase-s", type=float, default=4.0)
    p.option("--b-senders", type=int, default=4)
    p.option("--b-body", multiple=True, default=("pattern 400 literals",))
    p.option("--out", default="")
    args = p.parse()
    doc = asyncio.run(run(args))
    md = to_markdown(doc)
    if args.out:
        write_json_and_markdown(args.out, doc, md)
    else:
        print(md)


if __name__ == "__main__":
    main()
