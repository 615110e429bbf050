"""Where the CPU of a plain answer's critical path goes, segment by segment (not a test).

``python -m bench.answer_path [--trees DIR,DIR] [--rounds 3] [--requests 300] [--name answer_path]``

Issue 14, session 15. :mod:`bench.critical_path` reports ``post``: thread CPU from the replica's answer
arriving (``UpstreamConnection.data_received``, first call after the request's send) to the return of
the answer's last body part's ``send``. This bench splits that window with more marks, each a
``time.thread_time_ns`` read in a wrapper around a function the window passes through (the same
wrappers for every tree; a mark a tree lacks is skipped, its segment merged into the next):

``recv`` (the answer's bytes parsed: ``data_received`` returned), ``resume`` (the pipeline's task
runs again: ``UpstreamPool.request`` returned), ``opened`` (``open_upstream`` returned), ``unless``
(``unless_client_leaves`` returned), ``parsed`` (the answer's JSON parse returned), ``answer`` (``plain_response`` returned), ``handle``
(``InferencePipeline.handle`` returned), ``head_sent`` (the ``http.response.start`` message's ``send``
returned), ``end`` (``InferencePipeline._end`` returned: settled, recorded), ``handed`` (the audit
hand-off returned), ``done`` (the last part's ``send`` returned).

The gateway runs the :mod:`bench.stage_timer` configuration (JWT-SVID, HMAC chain, embedded OPA,
JSONL + OCSF audit) as a ``prefixgate serve`` child per tree; ``--rounds`` times ``--requests``
sequential requests to each tree in turn. Reported per tree: the median over rounds of each segment's
per-round median (µs of thread CPU) and the median ``post`` (the whole window, same marks as
bench.critical_path). Wrapper overhead (~0.3 µs a mark) is in every figure alike.
Results: ``bench/results/<name>.{json,md}``.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import shutil
import signal
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


from bench import sampled_serve
from bench.overhead import REPO, WARMUP, _Body, _second_config, sequential
from bench.sampled_serve import collect, options, serve_sampled

_CPU = time.thread_time_ns
MARKS = ("recv", "resume", "opened", "unless", "parsed", "answer", "handle", "head_sent", "end", "handed", "done")


def _install() -> dict[str, list[int]]:
    """Wrap the window's functions with marks; returns the sample lists (segment name -> ns)."""
    import gateway.pipeline as pipeline_mod
    from gateway.inference_asgi import InferenceRoutes
    from gateway.pipeline import InferencePipeline
    from gateway.upstream_conn import UpstreamConnection
    from gateway.upstream_pool import UpstreamPool

    samples: dict[str, list[int]] = {k: [] for k in (*MARKS, "post", "send_wall", "send_cpu", "send_preempted")}
    state: dict[str, Any] = {"sent": False, "head": None, "marks": []}
    prof_out = os.environ.get("ANSWER_PATH_PROFILE")  # a cProfile (thread CPU) of the windows only
    prof = None
    if prof_out:
        import cProfile
        prof = cProfile.Profile(time.thread_time)
        signal.signal(signal.SIGHUP, lambda *_: prof.dump_stats(prof_out))

    def mark(name: str) -> None:
        if state["head"] is not None:
            state["marks"].append((name, _CPU()))

    def finish() -> None:
        if prof is not None:
            prof.disable()
        now = _CPU()
        t0 = state["head"]
        if t0 is not None:
            prev = t0
            for name, t in state["marks"]:
                samples[name].append(t - prev)
                prev = t
            samples["done"].append(now - prev)
            samples["post"].append(now - t0)
        state["head"], state["marks"], state["sent"] = None, [], False

    serve, up_send, received = InferenceRoutes._serve, UpstreamConnection.send, UpstreamConnection.data_received

    async def timed_serve(self: Any, framed: Any, send: Any, endpoint: str) -> None:
        state["head"], state["marks"], state["sent"] = None, [], False

        async def timed_send(message: Any) -> None:
            last = message["type"] == "http.response.body" and not message.get("more_body")
            await send(message)
            if last:
                finish()
            elif message["type"] == "http.response.start":
                mark("head_sent")

        await serve(self, framed, timed_send, endpoint)

    def timed_up_send(self: Any, *a: Any, **k: Any) -> Any:
        w0, c0, n0 = time.perf_counter_ns(), _CPU(), resource.getrusage(resource.RUSAGE_THREAD).ru_nivcsw
        out = up_send(self, *a, **k)
        samples["send_cpu"].append(_CPU() - c0)
        samples["send_wall"].append(time.perf_counter_ns() - w0)
        samples["send_preempted"].append(resource.getrusage(resource.RUSAGE_THREAD).ru_nivcsw - n0)
        state["sent"], state["head"], state["marks"] = True, None, []
        return out

    def timed_received(self: Any, data: bytes) -> None:
        if state["sent"] and state["head"] is None:
            state["head"] = _CPU()
            if prof is not None:
                prof.enable()
            received(self, data)
            mark("recv")
            return
        received(self, data)

    def after(obj: Any, name: str, label: str, is_async: bool, static: bool = False) -> None:
        fn = getattr(obj, name, None)
        if fn is None:
            return
        if is_async:
            async def wrapped(*a: Any, **k: Any) -> Any:
                out = await fn(*a, **k)
                mark(label)
                return out
        else:
            def wrapped(*a: Any, **k: Any) -> Any:  # type: ignore[misc]
                out = fn(*a, **k)
                mark(label)
                return out
        setattr(obj, name, staticmethod(wrapped) if static else wrapped)

    after(UpstreamPool, "request", "resume", True)
    after(pipeline_mod, "open_upstream", "opened", True)
    after(pipeline_mod, "unless_client_leaves", "unless", True)
    import gateway.json_fast as json_fast
    after(json_fast, "loads_answer", "parsed", False)
    after(pipeline_mod, "plain_response", "answer", True)
    after(InferencePipeline, "handle", "handle", True)
    after(InferencePipeline, "_end", "end", False)
    try:
        from gateway.recording import Recorder
        after(Recorder, "hand_off", "handed", False)
    except ImportError:
        pass
    InferenceRoutes._serve = timed_serve  # type: ignore[method-assign]
    UpstreamConnection.send = timed_up_send  # type: ignore[method-assign]
    UpstreamConnection.data_received = timed_received  # type: ignore[method-assign]
    return samples


async def run(trees: Sequence[Path], requests: int, rounds: int) -> dict[str, Any]:
    """The measurement (module doc); returns the result document."""
    import yaml

    from bench.overhead import _spawn
    from sim.demo import ClusterSpec, DemoPaths, bearer_headers, gateway_config, prepare_identity, start_cluster_proc
    from sim.procs import free_port, stop_process

    names = [f"t{i}:{t}" for i, t in enumerate(trees)]
    for tree in trees:  # the same child code in every tree
        for own in (Path(__file__), Path(sampled_serve.__file__)):
            if tree != REPO:
                shutil.copy(own, tree / "bench" / own.name)
    paths = DemoPaths.under(Path(tempfile.mkdtemp(prefix="pg-answer-path-")))
    issuer = prepare_identity(paths)
    cluster, replicas = await start_cluster_proc(ClusterSpec(replicas=1, time_scale=1e6, decode_s_per_token=0.0),
                                                 paths)
    procs: dict[str, Any] = {}
    per: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    try:
        cfg = gateway_config("cache_aware", replicas, ["tenant-a"], paths, listen_port=free_port(),
                             admin_port=free_port())
        urls, outs = {}, {}
        for i, (name, tree) in enumerate(zip(names, trees)):
            doc = _second_config(cfg, paths, f"t{i}")
            doc["policy"]["dir"] = str(tree / "rego")
            cfg_path = paths.work / f"t{i}.yaml"
            cfg_path.write_text(yaml.safe_dump(doc, sort_keys=False))
            outs[name] = paths.work / f"t{i}-samples.json"
            procs[name], base = await _spawn(f"t{i}", ["bench.answer_path", "--child", str(cfg_path),
                                                       "--samples-out", str(outs[name])], paths,
                                             doc["listen"]["port"], "/readyz", tree=tree)
            urls[name] = base + "/v1/completions"
        headers = {"Content-Type": "application/json", **dict(bearer_headers(issuer, ["tenant-a"])("tenant-a"))}
        bodies = _Body(False)
        for name in urls:
            await sequential(urls[name], headers, WARMUP * 4, bodies)
        for r in range(rounds):
            order = names if r % 2 == 0 else list(reversed(names))
            for name in order:
                os.kill(procs[name].pid, signal.SIGUSR1)
                await asyncio.sleep(0.2)
                await sequential(urls[name], headers, requests, bodies)
                s = await collect(procs[name].pid, outs[name])
                row = {k: statistics.median(v) / 1000 if v else 0.0 for k, v in s.items() if k != "send_preempted"}
                pre = s["send_preempted"]
                row["send_preempted_share"] = sum(1 for v in pre if v) / len(pre) if pre else 0.0
                row["n"] = len(s["post"])
                per[name].append(row)
                print(name, {k: round(v, 1) for k, v in row.items()}, flush=True)
        if os.environ.get("ANSWER_PATH_PROFILE"):
            for name in names:
                os.kill(procs[name].pid, signal.SIGHUP)
            await asyncio.sleep(1.0)
    finally:
        for p in procs.values():
            stop_process(p)
        stop_process(cluster)
        shutil.rmtree(paths.work, ignore_errors=True)
    med = {name: {k: round(statistics.median(r[k] for r in rows), 1) for k in (*MARKS, "post", "send_wall",
                                                                            "send_cpu")}
           for name, rows in per.items()}
    return {"benchmark": "answer_path", "requests_per_round": requests, "rounds": rounds, "medians_us": med,
            "per_round": per}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    ap = options("bench.answer_path", __doc__ or "", requests=300, rounds=3)
    ap.option("--trees", default=str(REPO))
    args = ap.parse(argv)
    if args.child:
        serve_sampled("bench.answer_path", args.child, args.samples_out, _install)
        return 0
    import uvloop

    trees = [Path(t).resolve() for t in args.trees.split(",")]
    doc = uvloop.run(run(trees, args.requests, args.rounds))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = [f"# Plain answer's critical path by segment (`python -m bench.answer_path`, trees {args.trees})", "",
             f"{args.rounds} rounds of {args.requests} sequential requests per tree; thread-CPU µs per request, "
             "median of the rounds' medians (a segment ends at the mark named).", "",
             "| tree | " + " | ".join(MARKS) + " | post | upstream send wall | its CPU |",
             "|---|" + "---:|" * (len(MARKS) + 3)]
    for name, m in doc["medians_us"].items():
        lines.append(f"| {name} | " + " | ".join(str(m[k]) for k in (*MARKS, "post", "send_wall", "send_cpu")) + " |")
    (args.out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
