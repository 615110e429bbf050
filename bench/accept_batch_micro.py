"""How fast a busy event loop accepts a burst of connections: uvloop, uvloop + batch accept, asyncio (not a test).

``python -m bench.accept_batch_micro [--connections 200] [--busy-ms 5] [--rounds 3]`` (session 23,
bench/results/azure-s23-accept.md). A server on a fresh loop whose every iteration runs ``--busy-ms`` ms
of CPU (a callback that re-schedules itself: the saturated gateway relaying a burst of streams); a
thread opens ``--connections`` TCP connections to it at once (each handshake completes in the kernel
before the server accepts it) and sends one byte on each. Per variant: the wall ms from the burst to
the last ``connection_made`` and to the last byte received, and the loop iterations that took. The
variants: ``uvloop`` (libuv >= 1.45: one accept per loop iteration), ``batch`` (this tree's
:class:`gateway.accept_batch.BatchAcceptLoop`) and ``asyncio`` (the standard loop: up to ``backlog``
accepts per wake-up).
"""

from __future__ import annotations

import asyncio
import json
import socket
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import uvloop

from gateway.accept_batch import BatchAcceptLoop
from sim.click_options import ClickOptions

RESULTS = Path(__file__).resolve().parent / "results"
VARIANTS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "uvloop": uvloop.new_event_loop, "batch": BatchAcceptLoop, "asyncio": asyncio.new_event_loop}


async def _burst(n: int, busy_s: float) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    made: list[float] = []
    got: list[float] = []
    iterations = 0
    stop = False

    class Proto(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            made.append(time.perf_counter())
            self.transport = transport

        def data_received(self, data: bytes) -> None:
            got.append(time.perf_counter())
            self.transport.close()  # type: ignore[attr-defined]

    def burn() -> None:
        nonlocal iterations
        iterations += 1
        end = time.perf_counter() + busy_s
        while time.perf_counter() < end:
            pass
        if not stop:
            loop.call_soon(burn)

    server = await loop.create_server(Proto, "127.0.0.1", 0, backlog=2048)
    port = server.sockets[0].getsockname()[1]
    loop.call_soon(burn)
    socks: list[socket.socket] = []
    t0 = [0.0]

    def client() -> None:
        t0[0] = time.perf_counter()
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"x")
            socks.append(s)

    th = threading.Thread(target=client)
    start_iter = iterations
    th.start()
    while len(got) < n:
        await asyncio.sleep(0)
    stop = True
    th.join()
    for s in socks:
        s.close()
    server.close()
    await server.wait_closed()
    return {"accept_all_ms": (max(made) - t0[0]) * 1e3, "bytes_all_ms": (max(got) - t0[0]) * 1e3,
            "iterations": iterations - start_iter}


def run(connections: int, busy_ms: float, rounds: int) -> dict[str, Any]:
    """Every variant, ``rounds`` interleaved rounds; the per-variant medians and every round."""
    rows: dict[str, list[dict[str, float]]] = {k: [] for k in VARIANTS}
    for _ in range(rounds):
        for name, factory in VARIANTS.items():
            with asyncio.Runner(loop_factory=factory) as runner:
                rows[name].append(runner.run(_burst(connections, busy_ms / 1e3)))
    med = {k: {f: statistics.median(r[f] for r in v) for f in v[0]} for k, v in rows.items()}
    return {"connections": connections, "busy_ms": busy_ms, "rounds": rounds, "median": med, "rounds_data": rows}


def to_markdown(doc: dict[str, Any]) -> str:
    """The medians as a table."""
    lines = [f"# A burst of {doc['connections']} connections to a loop busy {doc['busy_ms']} ms per iteration "
             f"(`python -m bench.accept_batch_micro`), median of {doc['rounds']} rounds", "",
             "| loop | ms to accept all | ms to read one byte from each | loop iterations meanwhile |", "|---|---:|---:|---:|"]
    for k, v in doc["median"].items():
        lines.append(f"| {k} | {v['accept_all_ms']:.1f} | {v['bytes_all_ms']:.1f} | {v['iterations']:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; writes ``bench/results/<name>.{md,json}``."""
    ap = ClickOptions(prog="python -m bench.accept_batch_micro", description=__doc__.splitlines()[0])
    ap.option("--connections", type=int, default=200)
    ap.option("--busy-ms", type=float, default=5.0)
    ap.option("--rounds", type=int, default=3)
    ap.option("--name", default="azure-s23-accept")
    ap.option("--no-write", is_flag=True)
    args = ap.parse(argv)
    doc = run(args.connections, args.busy_ms, args.rounds)
    md = to_markdown(doc)
    if not args.no_write:
        (RESULTS / f"{args.name}.json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
        (RESULTS / f"{args.name}.md").write_text(md, encoding="utf-8")
    sys.stdout.write(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


