"""Pieces every benchmark uses: the demo stack (identity, simulated replicas, gateway
processes), serving a gateway in a bench's child process, and best-of-N CPU timing
of an isolated stage or of one request through an in-process ASGI app."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

T = TypeVar("T")

if TYPE_CHECKING:  # sim.demo is imported where used: a bench child serving a gateway does not load it
    from gateway.build import Gateway
    from gateway.server import GatewayServer
    from sim.demo import ClusterSpec, DemoPaths
    from sim.procs import ManagedProcess
    from sim.replay import HeadersFor

__all__ = ["ANSWERING_LOOP_CHILD", "DEMO_GATEWAY_CHILD", "DemoStack", "asgi_post_best_cpu_ns", "best_cpu_us",
           "loadavg_text", "median_thread_cpu_us", "replica_answer", "run_child_json", "serve_public",
           "serve_until_sigterm", "profiled_window", "start_demo_stack", "write_json_and_markdown"]

#: Source text for a bench's child process (run on any tree, the baseline's too: it imports nothing of this
#: tree) defining ``Transport`` and ``Loop``: a uvloop loop whose ``create_connection`` (a public method, the
#: only thing replaced) gives a transport that answers each write, in the next loop step, with the child's
#: ``ANSWER`` bytes (:func:`replica_answer`). The child imports ``asyncio`` and ``uvloop`` and defines
#: ``ANSWER`` before it (bench/pre_path.py, bench/answer_micro.py; one copy since session 17).
ANSWERING_LOOP_CHILD = r'''
class Transport(asyncio.Transport):
    def __init__(self, proto, loop):
        super().__init__(); self.proto = proto; self.loop = loop; self.closing = False
    def write(self, data): self.loop.call_soon(self.proto.data_received, ANSWER)
    def writelines(self, parts): self.write(b"".join(parts))
    def is_closing(self): return self.closing
    def abort(self): self.closing = True
    def close(self): self.closing = True
    def get_extra_info(self, name, default=None): return default
    def get_write_buffer_size(self): return 0
    def pause_reading(self): pass
    def resume_reading(self): pass

class Loop(uvloop.Loop):
    async def create_connection(self, factory, host=None, port=None, **kw):
        proto = factory(); t = Transport(proto, self); proto.connection_made(t); return t, proto
'''


#: Source text for a bench's child process (run on any tree, as :data:`ANSWERING_LOOP_CHILD`): the serving
#: configuration of ``bench.overhead`` (:func:`sim.demo.gateway_config`, ``cache_aware``, one replica ``r0`` at
#: a closed port, tenant ``tenant-a`` without the cached-token counter) built into ``gw`` under a fresh
#: temporary directory named ``WORK_PREFIX...``; ``tok``: tenant-a's ``Bearer`` field value (bytes);
#: ``bodies``: ``N`` distinct 64-word ``/v1/completions`` bodies (bytes). The child defines ``N`` and
#: ``WORK_PREFIX`` and imports ``json``, ``tempfile``, ``Path``, ``load_config``, ``build`` and
#: ``DemoPaths, prepare_identity, gateway_config, bearer_headers`` (bench/pre_path.py, bench/front_cost.py).
DEMO_GATEWAY_CHILD = r'''
paths = DemoPaths.under(Path(tempfile.mkdtemp(prefix=WORK_PREFIX)))
issuer = prepare_identity(paths)
cfg = gateway_config("cache_aware", [{"replica_id": "r0", "url": "http://127.0.0.1:9"}], ["tenant-a"], paths,
                     listen_port=1, admin_port=2)
cfg["tenancy"].pop("usage_cached_tokens", None)
gw = build(load_config(None, cfg))
tok = bearer_headers(issuer, ["tenant-a"])("tenant-a")["Authorization"].encode()
bodies = [json.dumps({"model": "sim-model", "prompt": " ".join(f"w{n}x{j}" for j in range(64)),
                      "max_tokens": 1}).encode() for n in range(N)]
'''

def replica_answer(body: bytes, *fields: str, content_type: str = "application/json; charset=utf-8",
                   server: str = "Python/3.11 aiohttp/3.13.2") -> bytes:
    """A replica's whole HTTP/1.1 200 answer to a plain request, as the simulated replica (aiohttp) sends it:
    status line, ``Content-Type``, ``Content-Length`` (of ``body``), a fixed ``Date``, ``Server``,
    ``X-Instance-Id: i1``, then ``fields`` (``"Name: value"`` each, in order), the blank line and ``body``."""
    head = ["HTTP/1.1 200 OK", f"Content-Type: {content_type}", f"Content-Length: {len(body)}",
            "Date: Wed, 02 Dec 2026 10:00:00 GMT", f"Server: {server}", "X-Instance-Id: i1", *fields]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def run_child_json(tree: Path, code: str, *args: str) -> Any:
    """Run ``code`` (Python source) with ``args`` in a fresh interpreter on ``tree`` (``PYTHONPATH`` and working
    directory) and return the JSON document of its last line of output. Raises ``RuntimeError`` (the end of
    its stderr and stdout) when it exits non-zero."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, cwd=tree, capture_output=True, text=True,
                         check=False)
    if out.returncode:
        raise RuntimeError(out.stderr[-3000:] + out.stdout[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


@dataclass
class DemoStack:
    """What a bench's gateways stand in front of: the demo files under one work directory
    (:class:`sim.demo.DemoPaths`), the token ``issuer`` (:func:`sim.demo.prepare_identity`)
    and the simulated replicas (``python -m sim.cluster``: its process and ready document
    ``[{replica_id, url}]``). Made by :func:`start_demo_stack`; :meth:`stop` ends the replicas."""

    paths: DemoPaths
    issuer: Any
    cluster: ManagedProcess
    replicas: list[dict[str, str]]

    def gateway_config(self, tenants: Sequence[str], **kw: Any) -> dict[str, Any]:
        """The demo gateway config (:func:`sim.demo.gateway_config`, ``cache_aware``) for these
        replicas and ``tenants``, public and admin listeners on free loopback ports; ``kw`` as there."""
        from sim.demo import gateway_config
        from sim.procs import free_port

        return gateway_config("cache_aware", self.replicas, tenants, self.paths, listen_port=free_port(),
                              admin_port=free_port(), **kw)

    async def start_gateway(self, name: str, config: Mapping[str, Any],
                            timeout_s: float = 30.0) -> tuple[ManagedProcess, str]:
        """Start a gateway process on ``config`` and wait for ``/readyz`` (:func:`sim.demo.start_gateway`).

        Returns the process and its public base URL; raises :class:`sim.procs.ProcessStartError`."""
        from sim.demo import start_gateway

        return await start_gateway(name, config, self.paths, timeout_s=timeout_s)

    def headers_for(self, tenants: Sequence[str]) -> HeadersFor:
        """``headers_for(tenant)``: a JWT-SVID bearer header per tenant workload (:func:`sim.demo.bearer_headers`)."""
        from sim.demo import bearer_headers

        return bearer_headers(self.issuer, tenants)

    def stop(self) -> None:
        """Stop the replica cluster's process group (the work directory stays)."""
        from sim.procs import stop_process

        stop_process(self.cluster)


async def start_demo_stack(work: Path, spec: ClusterSpec) -> DemoStack:
    """Lay out the demo files under ``work``, write the identity (master secret, trust bundle)
    and start the simulated replicas of ``spec``.

    Raises :class:`sim.procs.ProcessStartError` when the cluster exits or is not ready in 30 s."""
    from sim.demo import DemoPaths, prepare_identity, start_cluster_proc

    paths = DemoPaths.under(work)
    issuer = prepare_identity(paths)
    cluster, replicas = await start_cluster_proc(spec, paths)
    return DemoStack(paths, issuer, cluster, replicas)


async def serve_public(gateway: Gateway, *, freeze: bool = False,
                       admin: bool = False) -> tuple[GatewayServer, asyncio.Task[None], int]:
    """Serve ``gateway``'s public app (lifecycle left to the caller) on 127.0.0.1, a free port;
    ``admin``: its admin app instead (operators only; ``/admin/metrics``).

    ``freeze``: freeze the startup objects out of the cyclic GC first, as
    :func:`gateway.server.serve` does. Returns ``(server, serving task, port)`` once it
    listens; raises RuntimeError when the server ends before it listens."""
    from gateway.app import build_admin_app, build_public_app
    from gateway.server import GatewayServer, freeze_startup_objects, uvicorn_config

    if freeze:
        freeze_startup_objects()
    app = build_admin_app(gateway) if admin else build_public_app(gateway, manage_lifecycle=False)
    server = GatewayServer(uvicorn_config(app, "127.0.0.1", 0))
    task = asyncio.ensure_future(server.serve())
    while not server.started:
        if task.done():
            raise RuntimeError("gateway failed to start")
        await asyncio.sleep(0.01)
    return server, task, server.servers[0].sockets[0].getsockname()[1]


async def serve_until_sigterm(server: GatewayServer, task: asyncio.Task[None]) -> None:
    """Wait for SIGTERM, then stop ``server`` and wait for its serving ``task`` to end."""
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    server.should_exit = True
    await task


def best_cpu_us(fn: Callable[[], None], reps: int, n: int) -> float:
    """Process CPU microseconds per operation of the fastest of ``reps`` calls of ``fn``,
    each doing ``n`` operations (the minimum is the run least disturbed by other jobs)."""
    best: int | None = None
    for _ in range(reps):
        t0 = time.process_time_ns()
        fn()
        dt = time.process_time_ns() - t0
        best = dt if best is None or dt < best else best
    return (best or 0) / n / 1000.0


def median_thread_cpu_us(fn: Callable[[], Any], n: int, runs: int = 7) -> float:
    """Thread CPU microseconds (``time.thread_time``: this thread's alone, robust to other jobs' load) per call of
    ``fn``: the median over ``runs`` runs of ``n`` calls each (sessions 29 and 30's pattern benches)."""
    per_call = []
    for _ in range(runs):
        t = time.thread_time()
        for _ in range(n):
            fn()
        per_call.append((time.thread_time() - t) / n * 1e6)
    return statistics.median(per_call)


async def asgi_post_best_cpu_ns(app: Callable[..., Awaitable[None]], body: bytes, token: str, *,
                                 warm: int, requests: int, rounds: int,
                                 path: str = "/v1/completions") -> tuple[dict[int, int], float]:
    """Drive ``app`` (an ASGI app, in process, no sockets) with one HTTP POST of ``body`` (JSON bytes) to
    ``path`` under ``Authorization: Bearer <token>``: ``warm`` calls first, then ``rounds`` rounds of
    ``requests`` calls each. Returns (response status -> count over every call, the warm ones too;
    process CPU nanoseconds per request of the fastest round, 0.0 when ``rounds`` is 0)."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
             "query_string": b"", "client": ("127.0.0.1", 5555), "server": ("127.0.0.1", 8000),
             "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode()), (b"authorization", f"Bearer {token}".encode())]}
    statuses: dict[int, int] = {}

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(msg: MutableMapping[str, Any]) -> None:
        if msg["type"] == "http.response.start":
            statuses[msg["status"]] = statuses.get(msg["status"], 0) + 1

    for _ in range(warm):
        await app(dict(scope), receive, send)
    best: int | None = None
    for _ in range(rounds):
        t0 = time.process_time_ns()
        for _ in range(requests):
            await app(dict(scope), receive, send)
        dt = time.process_time_ns() - t0
        best = dt if best is None or dt < best else best
    return statuses, (best or 0) / requests


def loadavg_text(loadavg: Sequence[float]) -> str:
    """The 1, 5 and 15 minute load averages (``os.getloadavg()``) as ``"1.2, 0.9, 0.7"``."""
    return ", ".join(f"{x:.1f}" for x in loadavg)


def write_json_and_markdown(stem: str | Path, doc: Mapping[str, Any], markdown: str) -> None:
    """Write ``<stem>.json`` (``doc``, indented by 2, newline at the end) and ``<stem>.md``
    (``markdown``), then print ``markdown``. The folder must exist; raises OSError otherwise."""
    Path(f"{stem}.json").write_text(json.dumps(doc, indent=2) + "\n")
    Path(f"{stem}.md").write_text(markdown)
    print(markdown)


async def profiled_window(pid: int, out: Path, measure: Awaitable[T]) -> T:
    """Await ``measure`` with the cProfile of the gateway ``pid`` (started as ``bench.overhead
    --profiled-gateway``) on: SIGUSR1 starts it (its handler runs at the gateway's next bytecode; wait
    0.2 s, nothing else in flight), SIGUSR2 stops it and writes ``out``, waited for up to 30 s (absent
    after that: the caller's ``pstats`` read raises). Returns what ``measure`` returned."""
    os.kill(pid, signal.SIGUSR1)
    await asyncio.sleep(0.2)
    got = await measure
    os.kill(pid, signal.SIGUSR2)
    deadline = time.monotonic() + 30
    while not out.exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    return got
