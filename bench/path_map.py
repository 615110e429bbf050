"""Thread-CPU map of a sequential request's critical path, stage by stage, in a serving gateway (not a test).

``python -m bench.path_map [--requests 1000] [--rounds 3] [--out DIR] [--name NAME]``

Issue 14, session 12. :mod:`bench.critical_path` gives the two windows of the gateway's work on the
client's latency (arrival → upstream write, the replica's answer → the last part's send) and the
work off them; this one splits them, in thread CPU (``time.thread_time_ns``: what other processes
take from a shared machine is left out, unlike wall time). One ``prefixgate serve`` (the
:mod:`bench.stage_timer` configuration: JWT-SVID, HMAC chain, embedded OPA, JSONL + OCSF audit,
flow control) is started by a child entry point that marks the thread CPU

* at every ``time.perf_counter()`` the pipeline (``gateway.pipeline``) reads: the request record's
  stamps (``t0``, ``t_auth``, ``t_parsed``, ``t_keys``, ``t_decided``, ``t_route``, ``t_first_byte``,
  ``t_end`` and the deadline's reads), named by their source line;
* at the upstream write's return (``UpstreamConnection.send``) and the answer's first bytes
  (``UpstreamConnection.data_received``, first call after the send);
* at the return of the calls that bring the answer back to the pipeline (:data:`RETURNS`);
* around the request's end (``InferencePipeline._end``) and the audit hand-off (``Recorder.hand_off``),
  both run before the last body part;
* at the last body part's ``send`` return and at the end of the request's step (the work after it).

Each mark is the CPU since the request's arrival at the inference routes (``InferenceRoutes._serve``);
a stage is the difference between consecutive marks. Reported per stage: the median over the rounds
of each round's median, in µs. Results: ``bench/results/<name>.{json,md}``.
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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.overhead import REPO, WARMUP, _Body, _second_config, sequential
from bench.sampled_serve import collect, options, serve_sampled

_CPU = time.thread_time_ns


class _Marks:
    """The request in progress (sequential load: one at a time): its arrival CPU and its marks."""

    def __init__(self) -> None:
        self.t_in: int | None = None
        self.marks: list[tuple[str, int]] = []
        self.sent = False
        self.answered = False
        self.samples: dict[str, list[int]] = {}

    def mark(self, name: str) -> None:
        if self.t_in is not None:
            self.marks.append((name, _CPU() - self.t_in))

    def close(self) -> None:
        """The request's step ended: its stages (consecutive marks) into the samples."""
        prev_name, prev = "arrival", 0
        seen: set[str] = set()
        for name, at in self.marks:
            key = f"{prev_name} -> {name}"
            if key not in seen:  # a stage counted once per request
                seen.add(key)
                self.samples.setdefault(key, []).append(at - prev)
            prev_name, prev = name, at
        self.t_in, self.marks, self.sent, self.answered = None, [], False, False


def _line_names() -> dict[int, str]:
    """Source line of ``gateway/pipeline.py`` -> the record stamp it sets (``rec.t_auth = ...``), or ``Lnn``."""
    import re

    import gateway.pipeline as gp

    out = {}
    for n, line in enumerate(Path(gp.__file__).read_text().splitlines(), start=1):
        m = re.search(r"\b(t0|rec\.t_\w+)\s*=", line)
        out[n] = m.group(1).replace("rec.", "") if m else f"pipeline:{n}"
    return out


#: (module, attribute path) of the functions marked when they return (the answer's way back to the pipeline)
RETURNS: tuple[tuple[str, str], ...] = (
    ("gateway.upstream_conn", "UpstreamConnection._end_of_answer"),
    ("gateway.upstream_response", "UpstreamResponse.wait_head"),
    ("gateway.upstream_pool", "UpstreamPool.request"),
    ("gateway.pipeline", "open_upstream"),
    ("gateway.pipeline", "plain_response"),
    ("gateway.held", "Held.run_prep"),
    ("gateway.pipeline", "InferencePipeline._prepare"),
)


def _mark_return(marks: _Marks, mod_name: str, path: str) -> None:
    import functools
    import importlib
    import inspect

    owner: Any = importlib.import_module(mod_name)
    *parents, attr = path.split(".")
    for p in parents:
        owner = getattr(owner, p)
    fn = getattr(owner, attr)
    label = f"{path.rsplit('.', 1)[-1]} returned"
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def timed_async(*a: Any, **k: Any) -> Any:
            try:
                return await fn(*a, **k)
            finally:
                marks.mark(label)
        setattr(owner, attr, timed_async)
    else:
        @functools.wraps(fn)
        def timed(*a: Any, **k: Any) -> Any:
            try:
                return fn(*a, **k)
            finally:
                marks.mark(label)
        setattr(owner, attr, timed)


def _install() -> dict[str, list[int]]:
    import gateway.pipeline as gp
    from gateway.inference_asgi import InferenceRoutes
    from gateway.pipeline import InferencePipeline
    from gateway.recording import Recorder
    from gateway.upstream_conn import UpstreamConnection

    marks = _Marks()
    names = _line_names()
    real_time = time

    class _Clock:
        """The pipeline's ``time`` module: its ``perf_counter`` marks the CPU (named by the caller's line)."""

        def __getattr__(self, attr: str) -> Any:
            return getattr(real_time, attr)

        @staticmethod
        def perf_counter() -> float:
            marks.mark(names.get(sys._getframe(1).f_lineno, "pipeline"))
            return real_time.perf_counter()

    gp.time = _Clock()  # type: ignore[assignment]
    serve, up_send, received = InferenceRoutes._serve, UpstreamConnection.send, UpstreamConnection.data_received
    end, hand_off = InferencePipeline._end, Recorder.hand_off

    async def timed_serve(self: Any, framed: Any, send: Any, endpoint: str) -> None:
        marks.t_in, marks.marks = _CPU(), []

        async def timed_send(message: Any) -> None:
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                marks.mark("last part sent")

        try:
            await serve(self, framed, timed_send, endpoint)
        finally:
            marks.mark("step end")
            marks.close()

    def timed_up_send(self: Any, *a: Any, **k: Any) -> Any:
        out = up_send(self, *a, **k)
        marks.mark("upstream written")
        marks.sent = True
        return out

    def timed_received(self: Any, data: bytes) -> None:
        if marks.sent and not marks.answered:
            marks.answered = True
            marks.mark("answer bytes")
        received(self, data)

    def timed_end(self: Any, rec: Any, held: Any) -> None:
        marks.mark("end start")
        try:
            end(self, rec, held)
        finally:
            marks.mark("end done")

    def timed_hand_off(self: Any) -> None:
        marks.mark("hand-off start")
        try:
            hand_off(self)
        finally:
            marks.mark("hand-off done")

    for mod_name, path in RETURNS:  # marked when they return (a coroutine: when its await ends)
        _mark_return(marks, mod_name, path)
    InferenceRoutes._serve = timed_serve  # type: ignore[method-assign]
    UpstreamConnection.send = timed_up_send  # type: ignore[method-assign]
    UpstreamConnection.data_received = timed_received  # type: ignore[method-assign]
    InferencePipeline._end = timed_end  # type: ignore[method-assign]
    Recorder.hand_off = timed_hand_off  # type: ignore[method-assign]
    return marks.samples


async def run(requests: int, rounds: int) -> dict[str, Any]:
    """The measurement (module doc); returns the result document."""
    import yaml

    from bench.overhead import _spawn
    from sim.demo import ClusterSpec, DemoPaths, bearer_headers, gateway_config, prepare_identity, start_cluster_proc
    from sim.procs import free_port, stop_process

    paths = DemoPaths.under(Path(tempfile.mkdtemp(prefix="pg-path-map-")))
    issuer = prepare_identity(paths)
    cluster, replicas = await start_cluster_proc(ClusterSpec(replicas=1, time_scale=1e6, decode_s_per_token=0.0),
                                                 paths)
    proc = None
    per_round: list[dict[str, list[int]]] = []
    try:
        cfg = gateway_config("cache_aware", replicas, ["tenant-a"], paths, listen_port=free_port(),
                             admin_port=free_port())
        doc = _second_config(cfg, paths, "mapped")
        cfg_path = paths.work / "mapped.yaml"
        cfg_path.write_text(yaml.safe_dump(doc, sort_keys=False))
        out = paths.work / "samples.json"
        proc, base = await _spawn("mapped", ["bench.path_map", "--child", str(cfg_path), "--samples-out", str(out)],
                                  paths, doc["listen"]["port"], "/readyz")
        headers = {"Content-Type": "application/json", **dict(bearer_headers(issuer, ["tenant-a"])("tenant-a"))}
        bodies = _Body(False)
        url = base + "/v1/completions"
        await sequential(url, headers, WARMUP * 4, bodies)
        for _ in range(rounds):
            os.kill(proc.pid, signal.SIGUSR1)
            await asyncio.sleep(0.2)
            await sequential(url, headers, requests, bodies)
            per_round.append(await collect(proc.pid, out))
    finally:
        if proc is not None:
            stop_process(proc)
        stop_process(cluster)
        shutil.rmtree(paths.work, ignore_errors=True)
    stages: dict[str, dict[str, float]] = {}
    names = [n for n in per_round[0] if any(r.get(n) for r in per_round)]
    for name in names:
        rows = [r[name] for r in per_round if r.get(name)]
        stages[name] = {"per_request": round(sum(len(r) for r in rows) / (requests * len(per_round)), 2),
                        "median_us": round(statistics.median(statistics.median(r) for r in rows) / 1000, 1)}
    return {"benchmark": "path_map", "requests_per_round": requests, "rounds": rounds, "stages": stages}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    ap = options("bench.path_map", __doc__ or "", requests=1000, rounds=3)
    args = ap.parse(argv)
    if args.child:
        serve_sampled("bench.path_map", args.child, args.samples_out, _install)
        return 0
    import uvloop

    doc = uvloop.run(run(args.requests, args.rounds))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = [f"# Thread-CPU map of the critical path (`python -m bench.path_map`, tree {REPO})", "",
             f"{args.rounds} rounds of {args.requests} sequential requests; thread CPU µs per stage (consecutive "
             "marks), median of the rounds' medians; stages seen in fewer than all requests are rarer paths.", "",
             "| stage | per request | median µs |", "|---|---:|---:|"]
    for name, row in doc["stages"].items():
        lines.append(f"| {name} | {row['per_request']} | {row['median_us']} |")
    (args.out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
