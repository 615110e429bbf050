"""Client CPU per upstream request for HTTP client libraries (not a test).

``python -m bench.upstream_clients [--clients aiohttp,prefixgate,...] [--python PY] [--rounds 9] [--requests 1000]``

What the gateway's upstream call costs the gateway's own CPU, per client
library: a raw loopback keep-alive server (uvloop + httptools, a fixed 190 B
JSON answer with ``Content-Length``) pinned to one CPU, each client in its
own process pinned to another, on uvloop, sequential ``POST`` (~300 B JSON
body, the gateway's headers) + full read on one kept-alive connection; the
figure is the client process's CPU (user + system, all its threads, so a
Rust runtime thread counts) per request, best of ``--rounds`` rounds of
``--requests``, after 200 warm-up requests. ``--python`` runs the clients
with another interpreter (a throwaway venv holding the candidate libraries;
it needs ``uvloop``, ``httptools`` and ``click``, and this tree on
``PYTHONPATH``, which this script sets). A client whose library is missing
is reported as such. Session 6 figures: docs/architecture.md, "Upstream
client"; docs/benchmarks.md, "Session 6: upstream client".

Session 8: client ``gateway`` is the gateway's own upstream half as the
pipeline runs it (``open_upstream`` inside ``unless_client_leaves``, then
``plain_response``: first-byte budget, answer checked as a JSON object,
usage read, the client's ``Response`` built; the breaker verdict a no-op
stub); ``prefixgate`` is the pool alone (the passthrough's upstream call),
``bare`` the floor. ``--baseline DIR`` runs each client from this tree and
from ``DIR`` (e.g. ``git archive main | tar -x -C DIR``), alternating for
``--ab-rounds`` rounds (one process per round and tree; this script, that
tree's packages), and reports the median CPU per tree and the median
per-round difference (``--name``: ``bench/results/upstream_clients-NAME.{json,md}``).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from sim.click_options import ClickOptions

REPO = Path(__file__).resolve().parents[1]
CLIENTS = ("bare", "prefixgate", "gateway", "aiohttp", "pyreqwest", "rnet", "aiosonic", "httpcore", "niquests")
ANSWER = (b'{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant",'
          b'"content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":64,"completion_tokens":1,'
          b'"total_tokens":65}}')
BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "w " * 64}], "max_tokens": 1}).encode()
HEADERS = {"X-Request-Id": "0123456789abcdef", "Content-Type": "application/json", "Accept-Encoding": "identity"}

One = Callable[[], Awaitable[None]]


def serve(port_file: Path) -> None:
    """The raw replica: answers every request with :data:`ANSWER`; writes its port to ``port_file``."""
    import httptools
    import uvloop

    resp = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\nX-Instance-Id: i1\r\n\r\n"
            % len(ANSWER) + ANSWER)

    class Proto(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            self.t, self.p = transport, httptools.HttpRequestParser(self)

        def data_received(self, data: bytes) -> None:
            self.p.feed_data(data)

        def on_message_complete(self) -> None:
            self.t.write(resp)

    async def main() -> None:
        srv = await asyncio.get_running_loop().create_server(Proto, "127.0.0.1", 0)
        port_file.write_text(str(srv.sockets[0].getsockname()[1]))
        await asyncio.Event().wait()

    uvloop.run(main())


async def _client(name: str, url: str) -> tuple[One, Callable[[], Any]]:
    """(one request + full read, close) for client ``name``; ImportError when its library is missing."""
    if name == "prefixgate":
        from gateway.upstream_pool import UpstreamPool

        pool = UpstreamPool(256, 5.0)

        async def one() -> None:
            r = await pool.request("POST", url, BODY, HEADERS)
            parts = []
            while c := await r.read_chunk():
                parts.append(c)
            r.close()
            assert r.status == 200 and parts
        return one, pool.close
    if name == "gateway":  # the gateway's upstream half: open_upstream (in unless_client_leaves) + plain_response
        from gateway.client_io import LOSS_KEY, ConnectionLoss, unless_client_leaves
        from gateway.held import Held
        from gateway.pipeline_answer import plain_response
        from gateway.proxy import make_session, open_upstream
        from gateway.record import RequestRecord

        gpool = make_session(256, 5.0, 30.0)
        body = json.loads(BODY)
        rec = RequestRecord(request_id="0123456789abcdef0123456789abcdef", endpoint="/v1/chat/completions",
                            client_addr="127.0.0.1", t0=0.0)
        trace = "00-0123456789abcdef0123456789abcdef-0123456789abcdef-01"

        class _Req:  # the guarded listener's scope: a ConnectionLoss per connection
            scope = {LOSS_KEY: ConnectionLoss()}

        class _Attempt:  # the breaker attempt's verdicts (gateway/replicas.py): not this path's cost
            retry = True

            def succeeded(self) -> None:
                pass

            def release(self) -> None:
                pass

        req, attempt = _Req(), _Attempt()

        async def one() -> None:
            held = Held()
            held.attempt = attempt  # type: ignore[assignment]
            headers = {"X-Request-Id": rec.request_id, "traceparent": trace}
            held.up = await unless_client_leaves(req, open_upstream(gpool, url, body, headers, 30.0))  # type: ignore[arg-type]
            resp = await plain_response(req, rec, held, 30.0, None)  # type: ignore[arg-type]
            held.end_attempt()
            assert resp.status_code == 200 and held.usage
        return one, gpool.close
    if name == "bare":
        import httptools

        loop = asyncio.get_running_loop()

        class C(asyncio.Protocol):
            parts: list[bytes]
            fut: asyncio.Future[bytes]
            p: Any

            def data_received(self, d: bytes) -> None:
                self.p.feed_data(d)

            def on_body(self, b: bytes) -> None:
                self.parts.append(b)

            def on_message_complete(self) -> None:
                self.fut.set_result(b"".join(self.parts))

        host, port = url.split("//")[1].split("/")[0].split(":")
        t, c = await loop.create_connection(C, host, int(port))
        head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                + b"".join(k.encode() + b": " + v.encode() + b"\r\n" for k, v in HEADERS.items()))

        async def one() -> None:
            c.parts, c.fut, c.p = [], loop.create_future(), httptools.HttpResponseParser(c)
            t.write(head + b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY)
            assert await c.fut and c.p.get_status_code() == 200
        return one, t.close
    if name == "aiohttp":
        import aiohttp

        s = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256), auto_decompress=False,
                                  timeout=aiohttp.ClientTimeout(total=None, connect=5))

        async def one() -> None:
            r = await s.post(url, data=BODY, headers=HEADERS, allow_redirects=False)
            assert await r.read() and r.status == 200
        return one, s.close
    if name == "pyreqwest":
        from datetime import timedelta

        from pyreqwest.client import ClientBuilder

        cl = ClientBuilder().max_connections(256).connect_timeout(timedelta(seconds=5)).http1_only().build()

        async def one() -> None:
            r = await cl.post(url).headers(HEADERS).body_bytes(BODY).build().send()
            assert await r.bytes() and r.status == 200
        return one, cl.close
    if name == "rnet":
        import rnet

        rc = rnet.Client()

        async def one() -> None:
            r = await rc.post(url, body=BODY, headers=HEADERS)
            assert await r.bytes()
        return one, lambda: None
    if name == "aiosonic":
        import aiosonic

        ac = aiosonic.HTTPClient()

        async def one() -> None:
            r = await ac.post(url, data=BODY, headers=HEADERS)
            assert await r.content() and r.status_code == 200
        return one, lambda: None
    if name == "httpcore":
        import httpcore

        hp = httpcore.AsyncConnectionPool(max_connections=256)

        async def one() -> None:
            r = await hp.request("POST", url, headers=list(HEADERS.items()), content=BODY)
            assert r.status == 200 and r.content
        return one, hp.aclose
    if name == "niquests":
        import niquests

        ns = niquests.AsyncSession()

        async def one() -> None:
            r = await ns.post(url, data=BODY, headers=HEADERS)
            assert r.status_code == 200 and r.content
        return one, ns.close
    raise ValueError(f"unknown client {name!r}")


def measure(name: str, port: int, rounds: int, requests: int) -> dict[str, Any]:
    """Run client ``name`` in this process: {client, cpu_us, wall_us} (best of ``rounds``) or {client, error}."""
    import uvloop

    async def run() -> dict[str, Any]:
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        try:
            one, close = await _client(name, url)
        except ImportError as exc:
            return {"client": name, "error": f"not installed ({exc.name})"}
        for _ in range(200):
            await one()
        cpu = wall = float("inf")
        for _ in range(rounds):
            c0, w0 = time.process_time(), time.perf_counter()
            for _ in range(requests):
                await one()
            cpu = min(cpu, (time.process_time() - c0) / requests * 1e6)
            wall = min(wall, (time.perf_counter() - w0) / requests * 1e6)
        done = close()
        if asyncio.iscoroutine(done):
            await done
        return {"client": name, "cpu_us": round(cpu, 1), "wall_us": round(wall, 1)}

    return uvloop.run(run())


def _pin(cpu: int | None) -> list[str]:
    return ["taskset", "-c", str(cpu)] if cpu is not None and os.cpu_count() and os.cpu_count() > 1 else []


def _measure_in(tree: Path, name: str, python: str, port: str, rounds: int, requests: int,
                pin: bool) -> dict[str, Any]:
    """One client process with ``tree`` first on ``PYTHONPATH`` (this script runs from this tree)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run([*_pin(0 if pin else None), python, str(REPO / "bench" / "upstream_clients.py"),
                           "--client", name, "--port", port, "--rounds", str(rounds), "--requests", str(requests)],
                          env=env, capture_output=True, text=True, timeout=600)
    lines = proc.stdout.strip().splitlines()
    return json.loads(lines[-1]) if proc.returncode == 0 and lines else {
        "client": name, "error": (proc.stderr.strip().splitlines() or ["failed"])[-1]}


def _with_server(python: str, pin: bool, work: Callable[[str], Any]) -> Any:
    """Start the raw replica (last CPU), run ``work(port)``, stop the replica."""
    ncpu = os.cpu_count() or 1
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    port_file = REPO / "bench" / "results" / f".upstream_clients.{os.getpid()}.port"
    port_file.parent.mkdir(parents=True, exist_ok=True)
    port_file.unlink(missing_ok=True)
    server = subprocess.Popen([*_pin(ncpu - 1 if pin else None), python, "-m", "bench.upstream_clients",
                               "--serve", str(port_file)], env=env)
    try:
        deadline = time.monotonic() + 20
        while not port_file.exists() or not port_file.read_text():
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("the raw replica did not start")
            time.sleep(0.05)
        return work(port_file.read_text())
    finally:
        server.terminate()
        server.wait(10)
        port_file.unlink(missing_ok=True)


def run_ab(clients: Sequence[str], baseline: Path, python: str, ab_rounds: int, rounds: int, requests: int,
           pin: bool, name: str | None) -> dict[str, Any]:
    """Each client from this tree and from ``baseline``, alternating (A B, B A, ...) for ``ab_rounds``;
    per client the median CPU µs/request of each tree and the median per-round difference (this − baseline).
    Written to ``bench/results/upstream_clients-<name>.{json,md}`` when ``name`` is given."""
    trees = {"this": REPO, "baseline": baseline}
    per: dict[str, dict[str, list[float]]] = {c: {"this": [], "baseline": []} for c in clients}
    walls: dict[str, dict[str, list[float]]] = {c: {"this": [], "baseline": []} for c in clients}

    def work(port: str) -> None:
        for r in range(ab_rounds):
            for c in clients:
                for t in (("this", "baseline") if r % 2 == 0 else ("baseline", "this")):
                    res = _measure_in(trees[t], c, python, port, rounds, requests, pin)
                    if "error" in res:
                        raise RuntimeError(f"{c} ({t}): {res['error']}")
                    per[c][t].append(res["cpu_us"])
                    walls[c][t].append(res["wall_us"])
            print(json.dumps({"round": r, **{c: {t: v[-1] for t, v in per[c].items()} for c in clients}}), flush=True)

    _with_server(python, pin, work)
    summary = {}
    for c in clients:
        a, b = per[c]["this"], per[c]["baseline"]
        diffs = [x - y for x, y in zip(a, b)]
        summary[c] = {"this_median": round(statistics.median(a), 1), "baseline_median": round(statistics.median(b), 1),
                      "diff_median": round(statistics.median(diffs), 1), "lower_rounds": sum(d < 0 for d in diffs),
                      "this_wall_median": round(statistics.median(walls[c]["this"]), 1),
                      "baseline_wall_median": round(statistics.median(walls[c]["baseline"]), 1),
                      "this": a, "baseline": b}
    doc = {"baseline": str(baseline), "ab_rounds": ab_rounds, "rounds": rounds, "requests": requests,
           "load_1min": os.getloadavg()[0], "clients": summary}
    if name:
        out = REPO / "bench" / "results" / f"upstream_clients-{name}"
        out.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
        lines = [f"# Upstream client CPU, this tree vs `{baseline}` (`python -m bench.upstream_clients --baseline`)", "",
                 f"{ab_rounds} alternating rounds; per round and tree one process, best of {rounds} x {requests} "
                 f"sequential requests, client CPU µs/request (user + system); load (1 min) at the end "
                 f"{doc['load_1min']:.1f}.", "",
                 "| client | this (median) | baseline (median) | median per-round difference | rounds lower | "
                 "wall µs this / baseline (median of bests) |",
                 "|---|---:|---:|---:|---:|---:|"]
        for c, v in summary.items():
            lines.append(f"| {c} | {v['this_median']} | {v['baseline_median']} | {v['diff_median']:+} | "
                         f"{v['lower_rounds']} of {ab_rounds} | {v['this_wall_median']} / {v['baseline_wall_median']} |")
        out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return doc


def run_all(clients: Sequence[str], python: str, rounds: int, requests: int, pin: bool) -> list[dict[str, Any]]:
    """Start the server (last CPU), then each client in turn (CPU 0); returns one result per client."""
    def work(port: str) -> list[dict[str, Any]]:
        out = []
        for name in clients:
            res = _measure_in(REPO, name, python, port, rounds, requests, pin)
            print(json.dumps(res), flush=True)
            out.append(res)
        return out

    return _with_server(python, pin, work)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    ap = ClickOptions(prog="python -m bench.upstream_clients", description=__doc__.splitlines()[0])
    ap.option("--clients", default=",".join(CLIENTS), help="comma-separated, from: " + ", ".join(CLIENTS))
    ap.option("--python", default=sys.executable, help="interpreter that runs the server and the clients")
    ap.option("--rounds", type=int, default=9)
    ap.option("--requests", type=int, default=1000)
    ap.option("--no-pin", is_flag=True, help="do not pin server and clients to CPUs")
    ap.option("--baseline", default=None, help="A/B: also run each client from this source tree, alternating")
    ap.option("--ab-rounds", type=int, default=6, help="A/B: alternating rounds")
    ap.option("--name", default=None, help="A/B: results to bench/results/upstream_clients-NAME.{json,md}")
    ap.option("--serve", default=None, help="(internal) run the raw replica, port written to this file")
    ap.option("--client", default=None, help="(internal) measure this client in this process")
    ap.option("--port", type=int, default=0, help="(internal) the raw replica's port")
    args = ap.parse(argv)
    if args.serve:
        serve(Path(args.serve))
        return 0
    if args.client:
        print(json.dumps(measure(args.client, args.port, args.rounds, args.requests)))
        return 0
    names = [c for c in args.clients.split(",") if c]
    for n in names:
        if n not in CLIENTS:
            raise SystemExit(f"unknown client {n!r}")
    if args.baseline:
        doc = run_ab(names, Path(args.baseline), args.python, args.ab_rounds, args.rounds, args.requests,
                     not args.no_pin, args.name)
        for c, v in doc["clients"].items():
            print(json.dumps({"client": c, **{k: v[k] for k in ("this_median", "baseline_median", "diff_median",
                                                                "lower_rounds")}}))
        return 0
    run_all(names, args.python, args.rounds, args.requests, not args.no_pin)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
