"""The gateway's own critical path of a sequential request, this tree vs another (not a test).

``python -m bench.critical_path --baseline DIR [--rounds 6] [--requests 400]``

Issue 14, session 10. In the sequential benchmark the gateway's CPU is idle while the replica
works; only two windows of its work are on the client's latency: from the request's arrival at
the inference routes (``InferenceRoutes._serve``) to the upstream request's write
(``UpstreamConnection.send`` returned), and from the replica's answer arriving
(``UpstreamConnection.data_received``, first call after the send) to the return of the answer's
last body part's ``send``. Work moved into the replica wait, or after the last part, leaves
these windows. Two ``prefixgate serve`` processes (this tree, ``--baseline``) run the
:mod:`bench.stage_timer` configuration (JWT-SVID, HMAC chain, embedded OPA, JSONL + OCSF audit),
each started by a child entry point that wraps those four methods with clock reads (the same
wrapper code in both trees: this file is copied into the baseline tree's ``bench/`` when
missing); ``--rounds`` times, ``--requests`` sequential requests to one then the other
(alternating which goes first). Reported per tree: medians over the rounds of each round's
median of ``pre`` (arrival → send), ``post`` (answer → last part sent) and their sum, in wall
µs and in thread-CPU µs (``time.thread_time_ns``: preemption by other processes excluded), and the
thread CPU of the work off those windows: ``Held.run_prep`` where the tree has it (the replica
wait) and the request's work after its last part's send returned (the same step). Session 12: also
that work's wall time, the wall time from the last part's send to the next request's first bytes
being read by the server (a sequential client's next request: when it is shorter than the tail,
the tail delayed it) and from those bytes to the arrival mark (the server's parse and task start).
The arrival mark is after the HTTP server's parse (the same code in both trees).
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
from bench.overhead import REPO, WARMUP, _Body, _second_config, sequential
from bench.sampled_serve import collect, options, serve_sampled

_WALL = time.perf_counter_ns
_CPU = time.thread_time_ns


class _Marks:
    """The marks of the request in progress (sequential load: one at a time) and the samples."""

    def __init__(self) -> None:
        self.t_in: tuple[int, int] | None = None
        self.t_sent: tuple[int, int] | None = None
        self.t_head: tuple[int, int] | None = None
        self.t_done: int | None = None
        self.t_arrive: int | None = None  # session 12: the request's first bytes at the server (wall)
        self.done_wall: int | None = None  # the previous request's last part sent (wall)
        self.samples: dict[str, list[int]] = {k: [] for k in ("pre_wall", "pre_cpu", "post_wall", "post_cpu",
                                                               "wait_wall", "prep_cpu", "tail_cpu", "tail_wall",
                                                               "gap_wall", "head_wall")}

    def done(self) -> None:
        now = (_WALL(), _CPU())
        self.t_done = now[1]
        self.done_wall = now[0]
        if self.t_in and self.t_sent and self.t_head:
            s = self.samples
            s["pre_wall"].append(self.t_sent[0] - self.t_in[0])
            s["pre_cpu"].append(self.t_sent[1] - self.t_in[1])
            s["post_wall"].append(now[0] - self.t_head[0])
            s["post_cpu"].append(now[1] - self.t_head[1])
            s["wait_wall"].append(self.t_head[0] - self.t_sent[0])
        self.t_in = self.t_sent = self.t_head = None


def _install() -> _Marks:
    from gateway.inference_asgi import InferenceRoutes
    from gateway.upstream_conn import UpstreamConnection

    marks = _Marks()
    serve, up_send, received = InferenceRoutes._serve, UpstreamConnection.send, UpstreamConnection.data_received

    async def timed_serve(self: Any, framed: Any, send: Any, endpoint: str) -> None:
        marks.t_in = (_WALL(), _CPU())
        marks.t_sent = marks.t_head = None
        if marks.t_arrive is not None:  # session 12: server parse and task start; the client's gap before
            marks.samples["head_wall"].append(marks.t_in[0] - marks.t_arrive)
            if marks.done_wall is not None:
                marks.samples["gap_wall"].append(marks.t_arrive - marks.done_wall)
        marks.t_arrive = None

        async def timed_send(message: Any) -> None:
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                marks.done()

        marks.t_done = None
        await serve(self, framed, timed_send, endpoint)
        if marks.t_done is not None:  # the work after the last part's send, in the same step
            marks.samples["tail_cpu"].append(_CPU() - marks.t_done)
            if marks.done_wall is not None:
                marks.samples["tail_wall"].append(_WALL() - marks.done_wall)

    def timed_up_send(self: Any, *a: Any, **k: Any) -> Any:
        out = up_send(self, *a, **k)
        marks.t_sent = (_WALL(), _CPU())
        return out

    def timed_received(self: Any, data: bytes) -> None:
        if marks.t_sent is not None and marks.t_head is None:
            marks.t_head = (_WALL(), _CPU())
        received(self, data)

    try:  # this tree's work in the replica wait (session 10; absent from older trees)
        from gateway.held import Held
        run_prep = Held.run_prep
    except (ImportError, AttributeError):
        run_prep = None
    if run_prep is not None:
        def timed_prep(self: Any) -> None:
            if self.prep is None:
                return
            t = _CPU()
            run_prep(self)
            marks.samples["prep_cpu"].append(_CPU() - t)

        Held.run_prep = timed_prep  # type: ignore[method-assign]
    try:  # session 12: the request's first bytes at the server (absent from older trees: no gap figures)
        from gateway.http_guard import GuardedHttpToolsProtocol
        arrived = GuardedHttpToolsProtocol.data_received
    except (ImportError, AttributeError):
        arrived = None
    if arrived is not None:
        def timed_arrival(self: Any, data: bytes) -> None:
            if marks.t_arrive is None and marks.t_in is None:
                marks.t_arrive = _WALL()
            arrived(self, data)

        GuardedHttpToolsProtocol.data_received = timed_arrival  # type: ignore[method-assign]
    InferenceRoutes._serve = timed_serve  # type: ignore[method-assign]
    UpstreamConnection.send = timed_up_send  # type: ignore[method-assign]
    UpstreamConnection.data_received = timed_received  # type: ignore[method-assign]
    return marks


def paired_rounds(per: dict[str, list[dict[str, float]]], keys: Sequence[str]) -> dict[str, Any]:
    """Round by round ``this`` minus ``baseline`` (µs; the two trees' rows of the same round, ``per[name][i]``):
    per key the median of those differences (``median_us``) and the rounds where ``this`` was higher
    (``this_higher``), over ``rounds`` paired rounds. Session 28 (S28-lead-1): compare the trees with these; the
    difference of the two trees' medians over rounds, with per-round swings of ±100 µs, moved by 10-25 µs
    between runs of identical trees."""
    pairs = list(zip(per["this"], per["baseline"], strict=False))
    out: dict[str, Any] = {"rounds": len(pairs), "median_us": {}, "this_higher": {}}
    for k in keys:
        diffs = [a[k] - b[k] for a, b in pairs]
        out["median_us"][k] = round(statistics.median(diffs), 1) if diffs else None
        out["this_higher"][k] = sum(1 for d in diffs if d > 0)
    return out


async def run(baseline: Path, requests: int, rounds: int) -> dict[str, Any]:
    """The measurement (module doc); returns the result document."""
    import yaml

    from bench.overhead import _spawn
    from sim.demo import ClusterSpec, DemoPaths, bearer_headers, gateway_config, prepare_identity, start_cluster_proc
    from sim.procs import free_port, stop_process

    for own in (Path(__file__), Path(sampled_serve.__file__)):  # the same child code in both trees
        if not (baseline / "bench" / own.name).exists():
            shutil.copy(own, baseline / "bench" / own.name)
    paths = DemoPaths.under(Path(tempfile.mkdtemp(prefix="pg-critical-path-")))
    issuer = prepare_identity(paths)
    cluster, replicas = await start_cluster_proc(ClusterSpec(replicas=1, time_scale=1e6, decode_s_per_token=0.0),
                                                 paths)
    procs: dict[str, Any] = {}
    per: dict[str, list[dict[str, float]]] = {"this": [], "baseline": []}
    try:
        cfg = gateway_config("cache_aware", replicas, ["tenant-a"], paths, listen_port=free_port(),
                             admin_port=free_port())
        urls, outs = {}, {}
        for name, tree in (("this", REPO), ("baseline", baseline)):
            doc = _second_config(cfg, paths, name)
            doc["policy"]["dir"] = str(tree / "rego")
            cfg_path = paths.work / f"{name}.yaml"
            cfg_path.write_text(yaml.safe_dump(doc, sort_keys=False))
            outs[name] = paths.work / f"{name}-samples.json"
            procs[name], base = await _spawn(name, ["bench.critical_path", "--child", str(cfg_path), "--samples-out",
                                                    str(outs[name])], paths, doc["listen"]["port"], "/readyz",
                                             tree=tree)
            urls[name] = base + "/v1/completions"
        headers = {"Content-Type": "application/json", **dict(bearer_headers(issuer, ["tenant-a"])("tenant-a"))}
        bodies = _Body(False)
        for name in urls:
            await sequential(urls[name], headers, WARMUP * 4, bodies)
        for r in range(rounds):
            order = ["this", "baseline"] if r % 2 == 0 else ["baseline", "this"]
            for name in order:
                os.kill(procs[name].pid, signal.SIGUSR1)
                await asyncio.sleep(0.2)
                seq = await sequential(urls[name], headers, requests, bodies)
                s = await collect(procs[name].pid, outs[name])
                row = {k: statistics.median(v) / 1000 if v else 0.0 for k, v in s.items()}
                row["total_wall"] = row["pre_wall"] + row["post_wall"]
                row["total_cpu"] = row["pre_cpu"] + row["post_cpu"]
                row["client_p50_us"] = seq["p50_ms"] * 1000
                row["n"] = len(s["pre_wall"])
                per[name].append(row)
                print(name, {k: round(v, 1) for k, v in row.items()}, flush=True)
    finally:
        for p in procs.values():
            stop_process(p)
        stop_process(cluster)
        shutil.rmtree(paths.work, ignore_errors=True)
    keys = ["pre_wall", "pre_cpu", "post_wall", "post_cpu", "total_wall", "total_cpu", "wait_wall", "prep_cpu",
            "tail_cpu", "tail_wall", "gap_wall", "head_wall", "client_p50_us"]
    med = {name: {k: round(statistics.median(r[k] for r in rows), 1) for k in keys} for name, rows in per.items()}
    return {"benchmark": "critical_path", "baseline": str(baseline), "requests_per_round": requests,
            "rounds": rounds, "medians_us": med, "paired": paired_rounds(per, keys), "per_round": per}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    ap = options("bench.critical_path", __doc__ or "", requests=400, rounds=6)
    ap.option("--baseline", type=click.Path(path_type=Path))
    args = ap.parse(argv)
    if args.child:
        serve_sampled("bench.critical_path", args.child, args.samples_out, lambda: _install().samples)
        return 0
    import uvloop

    doc = uvloop.run(run(args.baseline, args.requests, args.rounds))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = [f"# Gateway critical path, sequential (`python -m bench.critical_path`, tree {REPO}, "
             f"baseline {args.baseline})", "",
             f"{args.rounds} rounds of {args.requests} sequential requests per tree, alternating; µs, median of "
             "the rounds' medians.", "",
             "| tree | pre wall | pre CPU | post wall | post CPU | total wall | total CPU | replica wait | "
             "CPU in the wait | CPU after the last part | its wall | next arrival | server head | client p50 |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, m in doc["medians_us"].items():
        lines.append(f"| {name} | {m['pre_wall']} | {m['pre_cpu']} | {m['post_wall']} | {m['post_cpu']} | "
                     f"{m['total_wall']} | {m['total_cpu']} | {m['wait_wall']} | {m['prep_cpu']} | {m['tail_cpu']} | "
                     f"{m['tail_wall']} | {m['gap_wall']} | {m['head_wall']} | {m['client_p50_us']} |")
    pr = doc["paired"]
    lines += ["", f"Paired by round, this minus baseline (median of the {pr['rounds']} rounds' differences; rounds "
              "where this was higher): " + "; ".join(f"{k} {pr['median_us'][k]:+.1f} µs ({pr['this_higher'][k]})"
                                                  for k in ("pre_cpu", "post_cpu", "total_cpu", "total_wall",
                                                            "client_p50_us"))
              + ". Compare the trees with these, not with the difference of the rows above (S28-lead-1)."]
    (args.out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
