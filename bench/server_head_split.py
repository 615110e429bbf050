"""The server head of a sequential request, split into its parts, this tree vs another (not a test).

``python -m bench.server_head_split --baseline DIR [--rounds 4] [--requests 300]``

Issue 14, session 15. bench.critical_path reports the *server head* as one wall figure: from the
first ``data_received`` of a request's bytes on the guarded httptools protocol to the request's
arrival at ``InferenceRoutes._serve``. This bench splits it, in the same serving process setup
(two ``prefixgate serve`` processes with the :mod:`bench.stage_timer` configuration, this tree and
``--baseline``, ``--rounds`` alternating rounds of ``--requests`` sequential requests each), by
wrapping three methods with clock reads (the same wrapper code in both trees):

* ``reads``: ``data_received`` calls from the first byte to the arrival (1: the head and body in one
  read);
* ``recv_cpu`` / ``recv_wall``: thread CPU / wall inside those calls (parse, guards, scope, task made);
* ``gap_cpu`` / ``gap_wall``: from the return of the last such call to the start of uvicorn's
  ``RequestResponseCycle.run_asgi`` (the event loop's step to the request's task, other callbacks);
* ``asgi_cpu``: from ``run_asgi``'s start to ``_serve`` (uvicorn's ASGI call, the routes, the framing
  guard's ``open``);
* ``head_wall`` / ``head_cpu``: first byte to ``_serve``.

Figures: medians over the rounds of each round's median, µs. Results: ``bench/results/<name>.{json,md}``.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from bench import sampled_serve
from bench.overhead import WARMUP, _Body, _second_config, sequential
from bench.sampled_serve import collect, options, serve_sampled

_WALL = time.perf_counter_ns
_CPU = time.thread_time_ns
KEYS = ("reads", "recv_cpu", "recv_wall", "gap_cpu", "gap_wall", "asgi_cpu", "head_cpu", "head_wall")


def _install() -> dict[str, list[int]]:
    from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

    from gateway.http_guard import GuardedHttpToolsProtocol
    from gateway.inference_asgi import InferenceRoutes

    samples: dict[str, list[int]] = {k: [] for k in KEYS}
    st: dict[str, Any] = {"first": None, "reads": 0, "recv_cpu": 0, "recv_wall": 0, "last_exit": None, "asgi": None}
    arrived, run_asgi, serve = GuardedHttpToolsProtocol.data_received, RequestResponseCycle.run_asgi, InferenceRoutes._serve

    def timed_arrival(self: Any, data: bytes) -> None:
        w0, c0 = _WALL(), _CPU()
        if st["first"] is None:
            st["first"] = (w0, c0)
        arrived(self, data)
        w1, c1 = _WALL(), _CPU()
        st["reads"] += 1
        st["recv_cpu"] += c1 - c0
        st["recv_wall"] += w1 - w0
        st["last_exit"] = (w1, c1)

    async def timed_run_asgi(self: Any, app: Any) -> None:
        st["asgi"] = (_WALL(), _CPU())
        await run_asgi(self, app)

    async def timed_serve(self: Any, framed: Any, send: Any, endpoint: str) -> None:
        w, c = _WALL(), _CPU()
        first, last, asgi = st["first"], st["last_exit"], st["asgi"]
        if first is not None and last is not None and asgi is not None:
            samples["reads"].append(st["reads"] * 1000)  # x1000: reported /1000 like the ns figures
            samples["recv_cpu"].append(st["recv_cpu"])
            samples["recv_wall"].append(st["recv_wall"])
            samples["gap_cpu"].append(asgi[1] - last[1])
            samples["gap_wall"].append(asgi[0] - last[0])
            samples["asgi_cpu"].append(c - asgi[1])
            samples["head_cpu"].append(c - first[1])
            samples["head_wall"].append(w - first[0])
        st.update(first=None, reads=0, recv_cpu=0, recv_wall=0, last_exit=None, asgi=None)
        await serve(self, framed, send, endpoint)

    GuardedHttpToolsProtocol.data_received = timed_arrival  # type: ignore[method-assign]
    RequestResponseCycle.run_asgi = timed_run_asgi  # type: ignore[method-assign]
    InferenceRoutes._serve = timed_serve  # type: ignore[method-assign]
    return samples


async def run(baseline: Path | None, requests: int, rounds: int) -> dict[str, Any]:
    """The measurement (module doc); returns the result document."""
    import yaml

    from bench.overhead import _spawn
    from sim.demo import ClusterSpec, DemoPaths, bearer_headers, gateway_config, prepare_identity, start_cluster_proc
    from sim.procs import free_port, stop_process

    here = Path(__file__).resolve().parent.parent
    trees = {"this": here} if baseline is None else {"this": here, "baseline": baseline}
    if baseline is not None:
        for own in (Path(__file__), Path(sampled_serve.__file__)):  # the same child code in both trees
            shutil.copy(own, baseline / "bench" / own.name)
    paths = DemoPaths.under(Path(tempfile.mkdtemp(prefix="pg-head-split-")))
    issuer = prepare_identity(paths)
    cluster, replicas = await start_cluster_proc(ClusterSpec(replicas=1, time_scale=1e6, decode_s_per_token=0.0),
                                                 paths)
    procs: dict[str, Any] = {}
    per: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    try:
        cfg = gateway_config("cache_aware", replicas, ["tenant-a"], paths, listen_port=free_port(),
                             admin_port=free_port())
        urls, outs = {}, {}
        for name, tree in trees.items():
            doc = _second_config(cfg, paths, name)
            doc["policy"]["dir"] = str(tree / "rego")
            cfg_path = paths.work / f"{name}.yaml"
            cfg_path.write_text(yaml.safe_dump(doc, sort_keys=False))
            outs[name] = paths.work / f"{name}-samples.json"
            procs[name], base = await _spawn(name, ["bench.server_head_split", "--child", str(cfg_path),
                                                    "--samples-out", str(outs[name])], paths, doc["listen"]["port"],
                                             "/readyz", tree=tree)
            urls[name] = base + "/v1/completions"
        headers = {"Content-Type": "application/json", **dict(bearer_headers(issuer, ["tenant-a"])("tenant-a"))}
        bodies = _Body(False)
        for name in urls:
            await sequential(urls[name], headers, WARMUP * 4, bodies)
        for r in range(rounds):
            order = list(trees) if r % 2 == 0 else list(reversed(trees))
            for name in order:
                os.kill(procs[name].pid, signal.SIGUSR1)
                await asyncio.sleep(0.2)
                seq = await sequential(urls[name], headers, requests, bodies)
                s = await collect(procs[name].pid, outs[name])
                row = {k: statistics.median(v) / 1000 if v else 0.0 for k, v in s.items()}
                row["client_p50_us"] = seq["p50_ms"] * 1000
                row["n"] = len(s["head_wall"])
                per[name].append(row)
                print(name, {k: round(v, 1) for k, v in row.items()}, flush=True)
    finally:
        for p in procs.values():
            stop_process(p)
        stop_process(cluster)
        shutil.rmtree(paths.work, ignore_errors=True)
    keys = [*KEYS, "client_p50_us"]
    med = {name: {k: round(statistics.median(r[k] for r in rows), 1) for k in keys} for name, rows in per.items()}
    return {"benchmark": "server_head_split", "baseline": str(baseline), "requests_per_round": requests,
            "rounds": rounds, "medians_us": med, "per_round": per}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    ap = options("bench.server_head_split", __doc__ or "", requests=300, rounds=4)
    ap.option("--baseline", type=click.Path(path_type=Path), default=None)
    args = ap.parse(argv)
    if args.child:
        serve_sampled("bench.server_head_split", args.child, args.samples_out, _install)
        return 0
    import uvloop

    doc = uvloop.run(run(args.baseline, args.requests, args.rounds))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = [f"# Server head of a sequential request, split (`python -m bench.server_head_split`, baseline "
             f"{args.baseline})", "",
             f"{args.rounds} rounds of {args.requests} sequential requests per tree, alternating; µs (reads: count), "
             "median of the rounds' medians.", "",
             "| tree | reads | recv CPU | recv wall | gap CPU | gap wall | ASGI→_serve CPU | head CPU | head wall | "
             "client p50 |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, m in doc["medians_us"].items():
        lines.append(f"| {name} | {m['reads']} | {m['recv_cpu']} | {m['recv_wall']} | {m['gap_cpu']} | "
                     f"{m['gap_wall']} | {m['asgi_cpu']} | {m['head_cpu']} | {m['head_wall']} | {m['client_p50_us']} |")
    (args.out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
