"""Which modules a serving gateway's requests spend their Python time and calls in (not a test).

``python -m bench.hot_modules [--requests 3000] [--name NAME]``

Session 14 (issue 14, the compiled hot path). One ``prefixgate serve`` (the configuration of
:mod:`bench.overhead`: JWT-SVID, HMAC chain, embedded OPA, JSONL + OCSF audit in the worker process)
in front of one simulated replica that answers at once, started by a child entry point that runs
:mod:`cProfile` (its clock: the thread's CPU time) around ``--requests`` sequential requests on one
keep-alive connection. Reported: the calls per request (Python functions vs C builtins, as cProfile
counts them: a mypyc-compiled function called from compiled code makes no Python call) and, per source
file of the project, its own time share and calls per request. cProfile inflates every Python call, so
read the shares as "where the Python calls are", not as µs. Results: ``bench/results/<name>.{json,md}``.
"""

from __future__ import annotations

import asyncio
import collections
import cProfile
import json
import os
import pstats
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

__all__ = ["main", "per_file"]

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
AREAS = ("gateway/", "routing/", "tenancy/", "policy/", "audit/")


def _child(out: str, config: str) -> None:
    """Serve the gateway of ``config``; SIGUSR1 starts the profile, SIGUSR2 stops it and dumps it to ``out``."""
    prof = cProfile.Profile(time.thread_time)

    def start(*_: Any) -> None:
        prof.enable()

    def stop(*_: Any) -> None:
        prof.disable()
        prof.dump_stats(out + ".tmp")
        os.replace(out + ".tmp", out)

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    from gateway.config import load_config
    from gateway.server import run_serving, serve

    run_serving(serve(load_config(config), config_path=config))


def per_file(stats_path: str, requests: int) -> dict[str, Any]:
    """Per-request calls (Python vs C) and, per project source file, own-time share and calls."""
    st = pstats.Stats(stats_path).stats  # type: ignore[attr-defined]
    files: collections.Counter[str] = collections.Counter()
    calls: collections.Counter[str] = collections.Counter()
    py = c = 0
    total_t = 0.0
    for (fn, _line, _name), (_cc, nc, tt, _ct, _callers) in st.items():
        total_t += tt
        if fn == "~":
            c += nc
            continue
        py += nc
        key = fn
        for area in AREAS:
            i = fn.rfind("/" + area)
            if i >= 0:
                key = fn[i + 1:]
                break
        else:
            key = "other: " + fn.split("site-packages/")[-1].split("lib/python3.11/")[-1].split("/")[0]
        files[key] += tt
        calls[key] += nc
    total_t = total_t or 1.0
    rows = {k: {"share": round(v / total_t, 4), "calls_per_request": round(calls[k] / requests, 1)}
            for k, v in files.most_common()}
    return {"python_calls_per_request": round(py / requests, 1), "c_calls_per_request": round(c / requests, 1),
            "files": rows}


async def run(requests: int, work: Path, name: str) -> dict[str, Any]:
    """Start the replica and the gateway child, profile ``requests`` sequential requests."""
    import yaml

    from bench.harness import start_demo_stack
    from bench.overhead import _Body, _second_config, sequential
    from sim.demo import ClusterSpec
    from sim.procs import stop_process, wait_for_url

    stack = await start_demo_stack(work, ClusterSpec(replicas=1, time_scale=1e6, decode_s_per_token=0.0))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(REPO)}
    bodies = _Body(False)
    try:
        auth = dict(stack.headers_for(["tenant-a"])("tenant-a"))
        out = work / "gw.prof"
        doc = _second_config(stack.gateway_config(["tenant-a"]), stack.paths, name)
        (work / "gw.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        port, hdr = doc["listen"]["port"], {"Content-Type": "application/json", **auth}
        proc = subprocess.Popen([sys.executable, "-m", "bench.hot_modules", "--child", str(out), str(work / "gw.yaml")],
                                cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=(work / "gw.err").open("wb"))
        try:
            base = f"http://127.0.0.1:{port}"
            await wait_for_url(base + "/readyz", timeout_s=60.0)
            await sequential(base + "/v1/completions", hdr, 300, bodies)
            os.kill(proc.pid, signal.SIGUSR1)
            seq = await sequential(base + "/v1/completions", hdr, requests, bodies)
            os.kill(proc.pid, signal.SIGUSR2)
            deadline = time.monotonic() + 30
            while not out.exists() and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            res = per_file(str(out), requests)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    finally:
        stop_process(stack.cluster)
    return {"benchmark": "hot_modules", "requests": requests, "errors": seq["errors"], **res}


def to_markdown(doc: dict[str, Any], name: str) -> str:
    """The result as a Markdown page (the 40 files with the largest own time)."""
    lines = [f"# Python time and calls by source file (`python -m bench.hot_modules`), {name}", "",
             f"{doc['requests']} sequential requests under cProfile, {doc['errors']} errors; calls per request: "
             f"{doc['python_calls_per_request']} Python, {doc['c_calls_per_request']} C.", "",
             "| file | own-time share | calls/request |", "|---|---:|---:|"]
    lines += [f"| {k} | {v['share'] * 100:.1f} % | {v['calls_per_request']} |"
              for k, v in list(doc["files"].items())[:40]]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point (also the profiled child)."""
    ap = ClickOptions(prog="python -m bench.hot_modules", description=__doc__.splitlines()[0])
    ap.option("--requests", type=int, default=3000)
    ap.option("--out", type=click.Path(path_type=Path), default=RESULTS)
    ap.option("--name", default="hot_modules")
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:  # --child PROFILE_FILE CONFIG
        _child(argv[1], argv[2])
        return 0
    args = ap.parse(argv)
    doc = asyncio.run(run(args.requests, Path(tempfile.mkdtemp(prefix="pg-hot-modules-")), args.name))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    md = to_markdown(doc, args.name)
    (args.out / f"{args.name}.md").write_text(md)
    print(md, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
