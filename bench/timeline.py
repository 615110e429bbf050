"""Wall timeline of back-to-back sequential requests: PrefixGate beside the passthrough (not a test).

``python -m bench.timeline [--requests 400] [--rounds 4] [--targets direct,passthrough,prefixgate] [--name N]``

Issue 14, session 27 (defer27). Where, in wall time, a sequential client's latency goes, and whether the
work a gateway does after writing answer N still runs when request N+1 is sent. Children are wrapper entry
points (bench only; nothing on the product path changes): ``prefixgate serve`` on bench.overhead's
configuration (the demo configuration: JWT-SVID, HMAC chain, embedded OPA, cache-aware routing, JSONL +
OCSF audit in the audit worker) and bench.overhead's feature-less passthrough on the same uvicorn stack.
Each stamps ``time.perf_counter_ns`` (CLOCK_MONOTONIC: one clock for every process of the machine) at

* ``arrive``: the start of the ``data_received`` call in which the parser began the request's message;
* ``task``: the ASGI task's first step (uvicorn's ``RequestResponseCycle.run_asgi``);
* ``app``: PrefixGate's inference routes (``InferenceRoutes._serve``); the passthrough: = ``task``;
* ``t0``, ``t_end``: PrefixGate's request record stamps (the audit event's ``total_ms`` is ``t_end - t0``);
* ``up_written``: ``UpstreamConnection.send`` returned; ``up_first``: the replica answer's first
  ``data_received``;
* ``handed_off``: ``Recorder.hand_off`` returned (the audit events in the worker's pipe, before the last part);
* ``written``: the answer's last write returned (``flush_answer`` in ``on_response_complete``);
* ``serve_end`` (PrefixGate: ``_serve`` returned, its after-answer work done), ``cycle_end`` (``run_asgi``
  returned), ``loop_free`` (the task's done callback: the loop's next round), with the thread CPU at
  ``written`` and ``loop_free``.

Stamps made in a request's ASGI task go to that request's record (a context variable), so N's tail never
lands in N+1's. The parent (aiohttp, one keep-alive connection, as bench.overhead's sequential phase; an
aiohttp trace hook adds ``c_sent``, the body handed to the transport) stamps ``c_start`` and ``c_end`` and
the client thread's CPU; records are aligned by index and a gateway ``arrive`` outside its client request
raises. Per round (``--requests`` per target, targets alternating order): medians of the spans between
stamps; the share of requests whose client had the whole answer before the gateway ran again after its
write (it was preempted at the write); the share of N+1 sent (``c_sent``) before N was done (``loop_free``,
or N+1's ``arrive`` when that came first) and by how much (N's tail on N+1's latency). Reported: the median
of the rounds' figures. ``prefixgate-aa`` is a second, identical gateway (an A/A); ``prefixgate-defer`` is a
sizing variant, not a design: its after-answer work (everything ``_serve`` runs after the last part, releases
included) runs after the next request's upstream write or on a 5 ms timer, an upper bound of what deferring
that work can give;
``prefixgate-nice``: the gateway's child processes (the audit worker) reniced to 10 by the parent.
Results: ``bench/results/<name>.{json,md}``.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import click

from bench.overhead import REPO, WARMUP, _Body, _second_config
from bench.sampled_serve import collect, options, sample_handlers

_WALL = time.perf_counter_ns
_CPU = time.thread_time_ns


_REC: ContextVar[dict[str, int] | None] = ContextVar("timeline_rec", default=None)


class _Stamps:
    """The stamps of every request. A record starts when the parser begins a message (its ``arrive``:
    the start of the ``data_received`` call that began it); stamps made in the request's ASGI task go
    to the task's record (a context variable), so request N's tail never lands in N+1's record."""

    def __init__(self) -> None:
        self.cur: dict[str, int] | None = None
        self.t_data = 0  # the current data_received call's start
        self.samples: dict[str, list[dict[str, int]]] = {"requests": []}

    def begin(self) -> None:
        self.cur = {"arrive": self.t_data}
        self.samples["requests"].append(self.cur)

    def stamp(self, name: str) -> None:
        rec = _REC.get() or self.cur
        if rec is not None and name not in rec:
            rec[name] = _WALL()


def _install(defer_tail: bool = False) -> _Stamps:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

    import gateway.http_guard as http_guard
    from gateway.http_guard import GuardedHttpToolsProtocol
    from gateway.upstream_conn import UpstreamConnection

    st = _Stamps()
    arrived, begin, run_asgi = (GuardedHttpToolsProtocol.data_received, HttpToolsProtocol.on_message_begin,
                                RequestResponseCycle.run_asgi)
    up_send, up_received, flush = UpstreamConnection.send, UpstreamConnection.data_received, http_guard.flush_answer

    def timed_arrival(self: Any, data: bytes) -> None:
        st.t_data = _WALL()
        arrived(self, data)

    def timed_begin(self: Any) -> None:
        st.begin()
        begin(self)

    async def timed_run_asgi(self: Any, app: Any) -> None:
        rec = st.cur
        _REC.set(rec)
        st.stamp("task")
        task = asyncio.current_task()

        def free(_: Any) -> None:
            if rec is not None:
                rec["loop_free"], rec["cpu_free"] = _WALL(), _CPU()

        if task is not None:
            task.add_done_callback(free)
        try:
            await run_asgi(self, app)
        finally:
            st.stamp("cycle_end")

    deferred: list[tuple[Any, int, int]] = []  # sizing variant only (module doc): N's tail, run later
    timer: list[Any] = []

    def drain() -> None:
        for handle in timer:
            handle.cancel()
        timer.clear()
        while deferred:
            pending, start, stop = deferred.pop(0)
            run_pending(pending, start, stop)

    def timed_up_send(self: Any, *a: Any, **k: Any) -> Any:
        out = up_send(self, *a, **k)
        st.stamp("up_written")
        if deferred:  # the previous request's tail: in this request's replica wait
            asyncio.get_running_loop().call_soon(drain)
        return out

    def timed_up_received(self: Any, data: bytes) -> None:
        rec = st.cur  # a loop callback: the connection's context is not the request's
        if rec is not None and "up_written" in rec and "up_first" not in rec:
            rec["up_first"] = _WALL()
        up_received(self, data)

    def timed_flush(transport: Any) -> None:
        flush(transport)
        rec = _REC.get()
        if rec is not None and "written" not in rec:
            rec["written"], rec["cpu_written"] = _WALL(), _CPU()

    GuardedHttpToolsProtocol.data_received = timed_arrival  # type: ignore[method-assign]
    HttpToolsProtocol.on_message_begin = timed_begin  # type: ignore[method-assign]
    RequestResponseCycle.run_asgi = timed_run_asgi  # type: ignore[method-assign]
    UpstreamConnection.send = timed_up_send  # type: ignore[method-assign]
    UpstreamConnection.data_received = timed_up_received  # type: ignore[method-assign]
    http_guard.flush_answer = timed_flush
    try:
        from gateway.inference_asgi import InferenceRoutes
    except ImportError:
        return st
    serve = InferenceRoutes._serve

    async def timed_serve(self: Any, framed: Any, send: Any, endpoint: str) -> None:
        st.stamp("app")
        try:
            await serve(self, framed, send, endpoint)
        finally:
            st.stamp("serve_end")

    InferenceRoutes._serve = timed_serve  # type: ignore[method-assign]
    from gateway.pipeline import InferencePipeline
    from gateway.recording import Recorder

    end, hand_off = InferencePipeline._end, Recorder.hand_off

    def timed_end(self: Any, rec: Any, held: Any) -> None:
        end(self, rec, held)
        r = _REC.get()
        if r is not None and "t0" not in r and getattr(rec, "t_end", None) is not None:
            r["t0"], r["t_end"] = int(rec.t0 * 1e9), int(rec.t_end * 1e9)  # perf_counter: the same clock

    def timed_hand_off(self: Any) -> None:
        hand_off(self)
        st.stamp("handed_off")

    InferencePipeline._end = timed_end  # type: ignore[method-assign]
    Recorder.hand_off = timed_hand_off  # type: ignore[method-assign]
    if defer_tail:
        import gateway.inference_asgi as inference_asgi

        run_pending = inference_asgi._run

        def run_or_defer(pending: Any, start: int, stop: int) -> int:
            rec = _REC.get()
            if rec is None or "written" not in rec or start >= stop:
                return run_pending(pending, start, stop)
            deferred.append((pending, start, stop))
            if not timer:
                timer.append(asyncio.get_running_loop().call_later(0.005, drain))
            return stop

        inference_asgi._run = run_or_defer
    return st


def _child(kind: str, arg: str, port: int, out_file: str) -> None:
    """Serve PrefixGate (``kind`` "gateway", ``arg`` its config file) or the passthrough (``arg`` the
    replica's URL, on ``port``) with the stamps installed; SIGUSR1 clears, SIGUSR2 writes them."""
    from gateway.server import run_serving
    from policy import reexec_with_go_gc

    reexec_with_go_gc(["-m", "bench.timeline", *sys.argv[1:]])
    clear, dump = sample_handlers(_install(defer_tail=kind == "gateway-defer").samples, out_file)
    signal.signal(signal.SIGUSR1, clear)
    signal.signal(signal.SIGUSR2, dump)
    if kind.startswith("gateway"):
        from gateway.config import load_config
        from gateway.server import serve

        run_serving(serve(load_config(arg), config_path=arg))
    else:
        from bench.overhead import _serve_passthrough

        run_serving(_serve_passthrough(arg, port))


async def _client(url: str, headers: Mapping[str, str], n: int, bodies: _Body) -> list[dict[str, int]]:
    """``n`` sequential requests on one keep-alive connection: per request ``c_start``, ``c_sent`` (aiohttp's
    ``on_request_chunk_sent``: the body handed to the transport), ``c_end`` (body read), wall ns, the
    client thread's CPU ns at each (``cpu_start``, ``cpu_sent``, ``cpu_end``) and ``ok``."""
    import aiohttp

    out: list[dict[str, int]] = []
    cur: dict[str, int] = {}

    async def sent(*_: Any) -> None:
        if "c_sent" not in cur:
            cur["c_sent"], cur["cpu_sent"] = _WALL(), _CPU()

    trace = aiohttp.TraceConfig()
    trace.on_request_chunk_sent.append(sent)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1), trace_configs=[trace]) as session:
        for _ in range(n):
            body = bodies()
            cur = {"cpu_start": _CPU(), "c_start": _WALL()}
            async with session.post(url, data=body, headers=headers) as resp:
                await resp.read()
                ok = resp.status == 200
            cur["c_end"], cur["cpu_end"], cur["ok"] = _WALL(), _CPU(), int(ok)
            out.append(cur)
    return out


_SPANS = (
    ("client send (c_start → body handed to the transport)", "c_start", "c_sent"),
    ("hop to the gateway (→ arrive)", "c_sent", "arrive"),
    ("send hop (c_start → arrive)", "c_start", "arrive"),
    ("server head", "arrive", "task"),
    ("task → app", "task", "app"),
    ("app → t0", "app", "t0"),
    ("pipeline pre", "app", "up_written"),
    ("replica", "up_written", "up_first"),
    ("answer path", "up_first", "written"),
    ("up_first → t_end", "up_first", "t_end"),
    ("t_end → audit handed off", "t_end", "handed_off"),
    ("audit handed off → written", "handed_off", "written"),
    ("pipeline window t0 → t_end (audit total_ms)", "t0", "t_end"),
    ("answer hop + client read", "written", "c_end"),
    ("busy: written → serve end", "written", "serve_end"),
    ("busy: written → cycle end", "written", "cycle_end"),
    ("busy: written → loop free", "written", "loop_free"),
)


def analyse(client: Sequence[Mapping[str, int]], reqs: Sequence[Mapping[str, int]]) -> dict[str, float]:
    """Medians (µs) of one round's spans (module doc), from the client's stamps and the gateway's
    (index-aligned: request i of both; raises RuntimeError when a gateway stamp falls outside its
    client request); keys as in :data:`_SPANS` plus the client's CPU and the next-request figures.
    ``reqs`` empty (direct): the client's figures only."""
    n = len(client) if not reqs else min(len(client), len(reqs))
    rows = []
    for i in range(n):
        r = {**(reqs[i] if reqs else {}), **client[i]}
        if reqs and not (r["c_start"] <= r["arrive"] <= r["c_end"]):
            raise RuntimeError(f"request {i}: gateway stamps do not fall inside the client's request")
        if reqs:
            r.setdefault("app", r.get("task", r["arrive"]))
        rows.append(r)
    if os.environ.get("TIMELINE_DUMP"):
        with open(os.environ["TIMELINE_DUMP"], "a") as f:
            f.write(json.dumps(rows) + "\n")
    lat = sorted(r["c_end"] - r["c_start"] for r in rows)
    out: dict[str, float] = {"n": float(n), "client latency": _med(lat),
                             "client latency p90": round(lat[int(0.9 * (n - 1))] / 1000, 1) if n else 0.0}
    for name, a, b in _SPANS:
        vals = [r[b] - r[a] for r in rows if a in r and b in r]
        if vals:
            out[name] = _med(vals)
    outside = [(r["c_end"] - r["c_start"]) - (r["t_end"] - r["t0"]) for r in rows if "t_end" in r]
    if outside:
        out["client latency − (t0 → t_end)"] = _med(outside)
    if reqs:  # the client read the whole answer before the gateway ran again after its write (it was preempted)
        out["share: client done before the gateway resumed after its write"] = round(
            sum(1 for r in rows if "written" in r and r["c_end"] < r["written"]) / n, 3)
    out["client CPU: send"] = _med([r["cpu_sent"] - r["cpu_start"] for r in rows if "cpu_sent" in r])
    out["client CPU: sent → body read"] = _med([r["cpu_end"] - r["cpu_sent"] for r in rows if "cpu_sent" in r])
    out["client CPU: turnaround"] = _med([rows[i + 1]["cpu_start"] - rows[i]["cpu_end"] for i in range(n - 1)])
    out["client turnaround c_end → next c_start"] = _med([rows[i + 1]["c_start"] - rows[i]["c_end"]
                                                          for i in range(n - 1)])
    if not reqs:
        return out
    cpu = [r["cpu_free"] - r["cpu_written"] for r in rows if "cpu_free" in r and "cpu_written" in r]
    if cpu:
        out["busy CPU: written → loop free"] = _med(cpu)
    pairs = [(rows[i], rows[i + 1]) for i in range(n - 1) if "loop_free" in rows[i] and "c_sent" in rows[i + 1]]
    # N+1's body was handed to the kernel before the gateway was done with N: N's tail sits on N+1's latency
    # N's done callback may run after N+1's data_received when N+1's bytes were there at the loop's next poll:
    # the gateway was done with N by the time it read N+1 at the latest
    late = [min(a["loop_free"], b["arrive"]) - b["c_sent"] for a, b in pairs]
    out["share of N+1 sent while busy with N"] = round(sum(1 for d in late if d > 0) / len(late), 3) if late else 0.0
    out["N+1 sent → N's loop free (when > 0)"] = _med([d for d in late if d > 0])
    out["N's loop free → N+1 sent"] = _med([-d for d in late])
    # what a perfect deferral of N's tail could give N+1 at most, per request on average (µs)
    out["mean of max(0, N's loop free − N+1 sent)"] = round(sum(max(0, d) for d in late) / len(late) / 1000, 1
                                                           ) if late else 0.0
    return out


def _med(vals: Sequence[int]) -> float:
    return round(statistics.median(vals) / 1000, 1) if vals else 0.0


async def run(requests: int, rounds: int, targets: Sequence[str] = ("direct", "passthrough", "prefixgate")
              ) -> dict[str, Any]:
    """The measurement (module doc); returns the result document."""
    import yaml

    from bench.harness import start_demo_stack
    from bench.overhead import _spawn
    from sim.demo import ClusterSpec
    from sim.procs import free_port, stop_process

    work = Path(tempfile.mkdtemp(prefix="pg-timeline-"))
    stack = await start_demo_stack(work,
                                   ClusterSpec(replicas=1, time_scale=1e6, decode_s_per_token=0.0))
    paths, replicas = stack.paths, stack.replicas
    direct = replicas[0]["url"]
    procs: dict[str, Any] = {}
    outs: dict[str, Path] = {}
    per: dict[str, list[dict[str, float]]] = {name: [] for name in targets}
    loads: list[str] = []
    try:
        urls = {"direct": direct + "/v1/completions"}
        for name in [t for t in targets if t.startswith("prefixgate")]:
            doc = _second_config(stack.gateway_config(["tenant-a"]), paths, name)
            cfg_path = paths.work / f"{name}.yaml"
            cfg_path.write_text(yaml.safe_dump(doc, sort_keys=False))
            outs[name] = paths.work / f"{name}-samples.json"
            kind = "gateway-defer" if name == "prefixgate-defer" else "gateway"
            procs[name], base = await _spawn(
                name, ["bench.timeline", "--child", kind, "--child-arg", str(cfg_path), "--samples-out",
                       str(outs[name])], paths, doc["listen"]["port"], "/readyz")
            urls[name] = base + "/v1/completions"
            if name == "prefixgate-nice":  # sizing variant: the gateway's children (the audit worker) at nice 10
                kids = Path(f"/proc/{procs[name].pid}/task/{procs[name].pid}/children").read_text().split()
                for kid in kids:
                    os.setpriority(os.PRIO_PROCESS, int(kid), 10)
        if "passthrough" in targets:
            port = free_port()
            outs["passthrough"] = paths.work / "passthrough-samples.json"
            procs["passthrough"], pbase = await _spawn(
                "passthrough", ["bench.timeline", "--child", "passthrough", "--child-arg", direct, "--port", str(port),
                                "--samples-out", str(outs["passthrough"])], paths, port, "/healthz")
            urls["passthrough"] = pbase + "/v1/completions"
        plain = {"Content-Type": "application/json"}
        auth = {**plain, **dict(stack.headers_for(["tenant-a"])("tenant-a"))}
        headers = {name: auth if name.startswith("prefixgate") else plain for name in targets}
        bodies = _Body(False)
        for name in targets:
            await _client(urls[name], headers[name], WARMUP * 2, bodies)
        for r in range(rounds):
            order = list(per) if r % 2 == 0 else list(per)[::-1]
            for name in order:
                if name in procs:
                    os.kill(procs[name].pid, signal.SIGUSR1)
                    await asyncio.sleep(0.2)
                load = Path("/proc/loadavg").read_text().split()[0]
                client = await _client(urls[name], headers[name], requests, bodies)
                reqs = (await collect(procs[name].pid, outs[name]))["requests"] if name in procs else []
                row = analyse(client, reqs)
                row["errors"] = float(sum(1 for c in client if not c["ok"]))
                row["load"] = float(load)
                loads.append(load)
                per[name].append(row)
                print(name, row, flush=True)
    finally:
        for p in procs.values():
            stop_process(p)
        stack.stop()
        shutil.rmtree(work, ignore_errors=True)
    keys = sorted({k for rows in per.values() for row in rows for k in row}, key=_key_order)
    med = {name: {k: round(statistics.median(row[k] for row in rows if k in row), 3)
                  for k in keys if any(k in row for row in rows)} for name, rows in per.items()}
    return {"benchmark": "timeline", "tree": str(REPO), "requests_per_round": requests, "rounds": rounds,
            "loadavg_1min": loads, "medians_us": med, "per_round": per}


def _key_order(k: str) -> int:
    order = ["client latency", "client latency p90", *(s[0] for s in _SPANS), "client latency − (t0 → t_end)",
             "share: client done before the gateway resumed after its write", "busy CPU: written → loop free",
             "client CPU: send", "client CPU: sent → body read", "client CPU: turnaround",
             "client turnaround c_end → next c_start", "share of N+1 sent while busy with N",
             "N+1 sent → N's loop free (when > 0)", "N's loop free → N+1 sent",
             "mean of max(0, N's loop free − N+1 sent)", "n", "errors", "load"]
    return order.index(k) if k in order else len(order)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    ap = options("bench.timeline", __doc__ or "", requests=400, rounds=4)
    ap.option("--child-arg", hidden=True)
    ap.option("--port", type=int, default=0, hidden=True)
    ap.option("--targets", default="direct,passthrough,prefixgate",
              help="comma-separated: direct, passthrough, prefixgate, prefixgate-aa (a second, identical process), "
                   "prefixgate-defer and prefixgate-nice (sizing variants, module doc)")
    args = ap.parse(argv)
    if args.child:
        _child(args.child, args.child_arg, args.port, args.samples_out)
        return 0
    import uvloop

    doc = uvloop.run(run(args.requests, args.rounds, args.targets.split(",")))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    names = list(doc["medians_us"])
    keys = sorted({k for m in doc["medians_us"].values() for k in m}, key=_key_order)
    lines = [f"# Wall timeline of sequential requests (`python -m bench.timeline --requests {args.requests} "
             f"--rounds {args.rounds}`)", "",
             f"Tree {REPO}; µs, median over the rounds of each round's median; 1-min load average per measured "
             f"phase: {', '.join(doc['loadavg_1min'])}.", "",
             "| span | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for k in keys:
        lines.append(f"| {k} | " + " | ".join(str(doc["medians_us"][n].get(k, "")) for n in names) + " |")
    per = doc["per_round"]
    for other in ("prefixgate-defer", "prefixgate-aa", "prefixgate-nice"):
        if "prefixgate" in per and other in per:
            d = [round(b["client latency"] - a["client latency"], 1) for a, b in zip(per["prefixgate"], per[other])]
            lines += ["", f"Client latency (round median), {other} − prefixgate per round (µs): {d}; median "
                      f"{round(statistics.median(d), 1)}, mean {round(statistics.mean(d), 1)}."]
    (args.out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
