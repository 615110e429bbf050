"""Where a serving gateway's CPU goes, by CPU-time stack samples, beside the passthrough's (not a test).

``python -m bench.cpu_sampled [--requests 15000] [--targets prefixgate,passthrough] [--name NAME]``

Issue 14, session 13. :mod:`bench.overhead`'s profiled stage table runs the gateway under cProfile
(thread CPU as the clock; every Python call inflated, then scaled back as a whole) and puts whatever is
not one of its named stages in one remainder row, "HTTP server (uvicorn, Starlette, framing guard,
pipeline glue)". This benchmark samples instead: each target (``prefixgate serve`` with the
configuration of :mod:`bench.overhead`, one simulated replica that answers at once; the feature-less
passthrough of :func:`bench.overhead.passthrough_app`) runs in a child of this module that arms
``ITIMER_PROF`` (process CPU, user + system: kernel time of a ``write`` counts where it was called)
for ``--requests`` sequential requests on one keep-alive connection and records the Python stack at
each ``SIGPROF`` (:func:`on_sample`; one sample per ~4-6 ms of CPU on this kernel, so use >= 10000
requests). No call is slowed between samples; the sampled process's CPU per request is within the
machine's noise of an unsampled one.

Caveat (read the rows with it): CPython runs a signal handler at its next check (a call's return, a
function's entry, a loop's back edge), so time spent in C without Python frames (the event loop's
own work, a socket ``recv`` before a ``data_received`` callback) lands on the first Python frame that
runs next, often a ``def`` line (the leaf rows print the line). Buckets of whole subtrees are
reliable; single leaf lines are not.

Buckets of the gateway's samples (:func:`bucket`): **server** (the protocol, head/body/upgrade guards,
transports and loop callbacks outside the ASGI app: the passthrough runs the same guarded protocol),
**upstream callbacks** (the replica connection's parser callbacks and other loop callbacks), **app
entry** (the ASGI task's frames before the inference routes' ``_serve``: framing guard), **answer
send** (uvicorn's ``send`` and the transports below it), **stages** (every call the pipeline makes,
named by its first frame outside the glue), **end before the last part** (the request's end, record
and audit hand-off), **after the last part** (the deferred ends: giving back, metrics, calibration)
and **glue** (samples whose leaf is in the inference routes, the pipeline's own lines, client I/O,
recording, the answer object or Starlette's ``Request``; a dataclass ``__init__`` counts with the stage
that calls it, or as its own stage when the glue does). Results: ``bench/results/<name>.{json,md}``.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from sim.click_options import ClickOptions

__all__ = ["bucket", "main", "on_sample"]

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
#: files of the HTTP server path (shared with the passthrough) and of the pipeline's glue
SERVER = ("uvicorn/", "gateway/http_guard.py", "gateway/head_guard.py", "gateway/head_scan.py",
          "gateway/head_fields.py", "gateway/upgrade_guard.py", "gateway/body_guard.py", "gateway/lingering.py",
          "gateway/coalesce.py", "gateway/send_buffer.py", "gateway/read_deadline.py", "asyncio/", "Runner.run")
GLUE = ("gateway/inference_asgi.py", "gateway/framing.py", "gateway/pipeline.py", "gateway/client_io.py",
        "gateway/recording.py", "gateway/pipeline_answer.py", "gateway/send_order.py", "gateway/write_stall.py",
        "gateway/body_budget.py", "starlette/", "gateway/held.py")

_samples: collections.Counter[str] = collections.Counter()
_labels: dict[Any, str] = {}


def _label(code: Any) -> str:
    s = _labels.get(code)
    if s is None:
        fn = code.co_filename
        for cut in ("site-packages/", str(REPO) + "/", "lib/python3."):
            i = fn.find(cut)
            if i >= 0:
                fn = fn[i + len(cut):].split("/", 1)[-1] if cut == "lib/python3." else fn[i + len(cut):]
                break
        s = _labels[code] = f"{code.co_qualname} ({fn})"
    return s


def on_sample(signum: int, frame: Any) -> None:
    """``SIGPROF`` handler: count the current stack, root first, ``;``-joined ``qualname (file)``
    frames, the leaf with its line (``qualname (file:line)``)."""
    if frame is None:
        return
    stack = [_label(frame.f_code)[:-1] + f":{frame.f_lineno})"]
    f = frame.f_back
    while f is not None:
        stack.append(_label(f.f_code))
        f = f.f_back
    _samples[";".join(reversed(stack))] += 1


def _child(out: str, target: str, args: Sequence[str]) -> None:
    """Serve ``target`` (``gateway CONFIG`` or ``passthrough UPSTREAM PORT``); SIGUSR1 starts the
    sampling, SIGUSR2 stops it and writes the counts (``stack count`` lines) to ``out``."""

    def start(*_: Any) -> None:
        _samples.clear()
        signal.setitimer(signal.ITIMER_PROF, 0.0005, 0.0005)

    def stop(*_: Any) -> None:
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
        Path(out + ".tmp").write_text("".join(f"{k} {v}\n" for k, v in _samples.items()))
        os.replace(out + ".tmp", out)

    signal.signal(signal.SIGPROF, on_sample)
    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    if target == "gateway":
        from gateway.config import load_config
        from gateway.server import run_serving, serve

        run_serving(serve(load_config(args[0]), config_path=args[0]))
    else:
        from bench.overhead import _run, _serve_passthrough

        _run(_serve_passthrough(args[0], int(args[1])))


def bucket(stack: Sequence[str]) -> str:
    """The bucket of one gateway sample (module doc); ``stack`` root first. A stage is named by its
    first frame below the inference routes that is not glue."""
    leaf = stack[-1]
    serve = next((i for i, f in enumerate(stack) if f.startswith("InferenceRoutes._serve ")), None)
    if serve is None:
        if any("run_asgi" in f for f in stack):
            return "app entry (framing guard)"
        if any(s in leaf for s in SERVER):
            return "server (protocol, guards, transports, loop)"
        return "upstream and other loop callbacks"
    before_last = any("before_last_part" in f for f in stack)
    if any(f.startswith("_run (gateway/inference_asgi.py") for f in stack) and not before_last:
        return "after the last part (deferred ends)"
    if any("RequestResponseCycle.send" in f for f in stack):
        return "answer send"
    if before_last:
        return "end, record, audit hand-off (before the last part)"
    if any(g in leaf for g in GLUE):
        return "glue"
    for f in stack[serve:]:
        if not any(g in f for g in GLUE):
            return "stage: " + f.split(" (")[0]
    return "glue"


def summarize(rows: dict[str, int], cpu_us: float, gateway: bool) -> dict[str, Any]:
    """Per-bucket sample share and µs per request (share x ``cpu_us``), top 40 leaves."""
    total = sum(rows.values()) or 1
    buckets: collections.Counter[str] = collections.Counter()
    leaves: collections.Counter[str] = collections.Counter()
    for key, n in rows.items():
        stack = key.split(";")
        if gateway:
            b = bucket(stack)
            buckets["stages" if b.startswith("stage: ") else b] += n
            if b.startswith("stage: "):
                buckets[b] += n
        elif any("RequestResponseCycle.send" in f for f in stack):
            buckets["answer send"] += n
        elif any("run_asgi" in f for f in stack):
            buckets["app (Starlette, forward, upstream client)"] += n
        else:
            buckets["server and loop callbacks"] += n
        leaves[stack[-1]] += n
    return {"samples": total, "cpu_us_per_request": cpu_us,
            "buckets": {k: {"share": round(v / total, 4), "us": round(v / total * cpu_us, 1)}
                        for k, v in buckets.most_common()},
            "leaves": {k: round(v / total * cpu_us, 1) for k, v in leaves.most_common(40)}}


async def run(targets: Sequence[str], requests: int, work: Path) -> dict[str, Any]:
    """Start the replica and each target, sample ``requests`` sequential requests of each."""
    import yaml

    from bench.harness import start_demo_stack
    from bench.overhead import _Body, _Cpu, _second_config, sequential
    from sim.demo import ClusterSpec
    from sim.procs import free_port, stop_process, wait_for_url

    stack = await start_demo_stack(work, ClusterSpec(replicas=1, time_scale=1e6, decode_s_per_token=0.0))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"GOGC": "400", "PYTHONPATH": str(REPO)}
    bodies, out = _Body(False), {}
    try:
        auth = dict(stack.headers_for(["tenant-a"])("tenant-a"))
        for name in targets:
            samples = work / f"{name}.samples"
            if name == "passthrough":
                port, hdr = free_port(), {"Content-Type": "application/json"}
                argv, probe = ["passthrough", stack.replicas[0]["url"], str(port)], "/healthz"
            else:
                doc = _second_config(stack.gateway_config(["tenant-a"]), stack.paths, name)
                (work / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
                port, hdr = doc["listen"]["port"], {"Content-Type": "application/json", **auth}
                argv, probe = ["gateway", str(work / f"{name}.yaml")], "/readyz"
            proc = subprocess.Popen([sys.executable, "-m", "bench.cpu_sampled", "--child", str(samples), *argv],
                                    cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                base = f"http://127.0.0.1:{port}"
                await wait_for_url(base + probe, timeout_s=60.0)
                await sequential(base + "/v1/completions", hdr, 300, bodies)
                cpu = _Cpu(proc.pid, children=False)
                os.kill(proc.pid, signal.SIGUSR1)
                c0 = cpu.seconds()
                seq = await sequential(base + "/v1/completions", hdr, requests, bodies)
                cpu_us = (cpu.seconds() - c0) / requests * 1e6
                os.kill(proc.pid, signal.SIGUSR2)
                deadline = time.monotonic() + 30
                while not samples.exists() and time.monotonic() < deadline:
                    await asyncio.sleep(0.1)
                rows = {}
                for line in samples.read_text().splitlines():
                    key, _, n = line.rpartition(" ")
                    rows[key] = int(n)
                out[name] = {"p50_ms": seq["p50_ms"], "errors": seq["errors"],
                             **summarize(rows, round(cpu_us, 1), name != "passthrough")}
            finally:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
    finally:
        stop_process(stack.cluster)
    return {"benchmark": "cpu_sampled", "requests": requests, "loadavg": os.getloadavg(), "targets": out}


def to_markdown(doc: dict[str, Any], name: str) -> str:
    """The result as a Markdown page."""
    lines = [f"# Gateway CPU by CPU-time samples (`python -m bench.cpu_sampled`), {name}", "",
             f"{doc['requests']} sequential requests per target; load average at the end {doc['loadavg'][0]:.1f}. "
             "µs = the bucket's share of the samples x the process's CPU per request while sampled "
             "(module doc: C time lands on the next Python frame).", ""]
    for target, t in doc["targets"].items():
        lines += [f"## {target}: {t['cpu_us_per_request']} µs/request, p50 {t['p50_ms']} ms, {t['samples']} samples", "",
                  "| bucket | share | µs/request |", "|---|---:|---:|"]
        stages = [k for k in t["buckets"] if k.startswith("stage: ")]
        lines += [f"| {k} | {v['share'] * 100:.1f} % | {v['us']} |" for k, v in t["buckets"].items()
                  if not k.startswith("stage: ") or k in stages[:15]]
        lines += ["", "Top leaves (µs/request): " + "; ".join(f"`{k}` {v}" for k, v in list(t["leaves"].items())[:15]), ""]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point (also the sampled children)."""
    ap = ClickOptions(prog="python -m bench.cpu_sampled", description=__doc__.splitlines()[0])
    ap.option("--requests", type=int, default=15000)
    ap.option("--targets", default="prefixgate,passthrough")
    ap.option("--out", type=click.Path(path_type=Path), default=RESULTS)
    ap.option("--name", default="cpu_sampled")
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:  # --child SAMPLES_FILE gateway CONFIG | passthrough UPSTREAM PORT
        _child(argv[1], argv[2], argv[3:])
        return 0
    args = ap.parse(argv)
    doc = asyncio.run(run(args.targets.split(","), args.requests, Path(tempfile.mkdtemp(prefix="pg-cpu-sampled-"))))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    md = to_markdown(doc, args.name)
    (args.out / f"{args.name}.md").write_text(md)
    print(md, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
