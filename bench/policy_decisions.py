"""Decision latency benchmark (not a test): ``python -m bench.policy_decisions``.

Measures p50/p99 of ``decide()`` for the shipped policy with an 8-replica
candidate set: embedded without cache, embedded with cache (all hits after
the first), and remote OPA (tests.support.opa_server as a subprocess on loopback).
Writes a table between the bench markers of docs/policy.md.
"""

from __future__ import annotations

import asyncio
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import click

from policy.cache import CachedDecisionPoint, DecisionCache
from policy.embedded import EmbeddedOpa
from policy.input import build_policy_input
from policy.remote import RemoteOpa
from sim.click_options import ClickOptions
from sim.procs import free_port

REPO = Path(__file__).resolve().parents[1]
START, END = "<!-- bench:start -->", "<!-- bench:end -->"


def sample_input() -> dict[str, Any]:
    """A realistic input: tenant-a, 8 candidates (4 default, 4 eu)."""
    cands = [
        {"id": f"r{i}", "pool": "default" if i < 4 else "eu",
         "labels": {"data_residency": "eu"} if i >= 4 else {}, "healthy": True, "load": i}
        for i in range(8)
    ]
    return build_policy_input(
        {"spiffe_id": "spiffe://prefixgate.test/ns/apps/sa/chat", "trust_domain": "prefixgate.test", "claims": {}},
        {"id": "tenant-a", "tier": "standard"},
        {"endpoint": "/v1/chat/completions", "model": "sim-model", "prompt_tokens": 512, "max_tokens": 256, "stream": True},
        cands, [], time.time(),
    )


async def measure(fn: Callable[[], Awaitable[Any]], n: int, warmup: int = 200) -> dict[str, float]:
    """p50/p99/mean of ``fn`` in microseconds over ``n`` calls."""
    for _ in range(warmup):
        await fn()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        await fn()
        ts.append((time.perf_counter() - t) * 1e6)
    ts.sort()
    return {"p50": ts[n // 2], "p99": ts[int(n * 0.99) - 1], "mean": statistics.fmean(ts)}


async def run(n: int) -> list[tuple[str, dict[str, float]]]:
    """Run the three configurations; returns (name, stats) rows."""
    inp = sample_input()
    emb = EmbeddedOpa(REPO / "rego", timeout_s=None)  # no deadline: measure, never fail
    inline = EmbeddedOpa(REPO / "rego", offload=False, timeout_s=None)
    cached = CachedDecisionPoint(emb, DecisionCache(ttl_s=60.0))
    rows = [
        ("embedded, no cache (inline, gateway default)", await measure(lambda: inline.decide(inp), n)),
        ("embedded, no cache (offload to a thread)", await measure(lambda: emb.decide(inp), n)),
        ("embedded, cache hit", await measure(lambda: cached.decide(inp), n)),
        ("thread hop only (asyncio.to_thread of a no-op)", await measure(lambda: asyncio.to_thread(int), n)),
    ]
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.opa_server", "--port", str(port), "--policy-dir", str(REPO / "rego")],
        cwd=REPO,
    )
    try:
        remote = RemoteOpa(f"http://127.0.0.1:{port}", timeout_s=2.0)
        await remote.start()
        try:
            for _ in range(100):
                if await remote.client.check_health():
                    break
                await asyncio.sleep(0.1)
            rows.append(("remote (opa_server, loopback HTTP)", await measure(lambda: remote.decide(inp), max(n // 4, 200))))
        finally:
            await remote.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    return rows


def render(rows: list[tuple[str, dict[str, float]]], n: int) -> str:
    """Markdown table of the rows."""
    lines = [
        f"Measured {time.strftime('%Y-%m-%d')} on {platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, {n} decisions per row (remote: n/4), µs:",
        "",
        "| configuration | p50 µs | p99 µs | mean µs |",
        "|---|---:|---:|---:|",
    ]
    lines += [f"| {name} | {s['p50']:.1f} | {s['p99']:.1f} | {s['mean']:.1f} |" for name, s in rows]
    return "\n".join(lines)


def write_doc(table: str, doc: Path) -> None:
    """Replace the text between the bench markers of ``doc``."""
    text = doc.read_text("utf-8")
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    doc.write_text(f"{head}{START}\n{table}\n{END}{tail}", "utf-8")


def main() -> None:
    """CLI entry (re-execs with the gateway's ``GOGC`` so the numbers match a served gateway)."""
    from policy import reexec_with_go_gc

    reexec_with_go_gc(["-m", "bench.policy_decisions", *sys.argv[1:]])
    parser = ClickOptions(description=__doc__)
    parser.option("-n", type=int, default=5000)
    parser.option("--doc", type=click.Path(path_type=Path), default=REPO / "docs" / "policy.md")
    args = parser.parse()
    rows = asyncio.run(run(args.n))
    table = render(rows, args.n)
    print(table)
    write_doc(table, args.doc)


if __name__ == "__main__":
    main()
