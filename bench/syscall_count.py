"""System calls per served sequential request: PrefixGate (this tree and others) beside the passthrough (not a test).

``python -m bench.syscall_count [--baseline DIR ...] [--passthrough] [--requests 1000] [--name NAME]``

Issue 14, session 31 (helper cut31). :mod:`bench.call_windows` counts the Python and C calls of a served request;
this counts the system calls of its event-loop thread, the other thing that is spent per request and that no Python
profiler shows. Each tree's ``prefixgate serve`` (the configuration of :mod:`bench.overhead`: JWT-SVID, HMAC chain,
embedded OPA, JSONL + OCSF audit in the worker process; one simulated replica that answers at once) is started in a
child (``PYTHONPATH`` = the tree), warmed with 300 sequential requests, then ``strace -c`` is attached to its main
thread (the event loop; ``-p PID`` without ``-f``: not the audit worker, not other threads) for ``--requests``
sequential requests on one keep-alive connection. ``--passthrough``: the same for :mod:`bench.overhead`'s
feature-less passthrough on the same server stack. Counts read no clock (strace slows each call, so its times are
not reported); they move by a few hundredths per request between runs (timers, periodic checks). Needs ``strace``
and the right to trace one's own children (root here). Results: ``bench/results/<name>.{json,md}``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from sim.click_options import ClickOptions

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
WARM = 300


def parse_strace_c(text: str) -> dict[str, int]:
    """``strace -c``'s summary table as syscall name -> calls (the ``total`` row left out)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[0].replace(".", "", 1).isdigit() and parts[-1] != "total":
            out[parts[-1]] = int(parts[3])
    return out


async def count_target(label: str, tree: Path, requests: int, work: Path, passthrough: bool = False) -> dict[str, Any]:
    """Serve ``tree``'s gateway (or the passthrough) and count the main thread's system calls of ``requests``
    sequential requests; returns ``{"target", "tree", "errors", "per_request": {syscall: calls / request}}``."""
    import yaml

    from bench.harness import start_demo_stack
    from bench.overhead import _Body, _second_config, sequential
    from sim.demo import ClusterSpec
    from sim.procs import free_port, stop_process, wait_for_url

    stack = await start_demo_stack(work, ClusterSpec(replicas=1, time_scale=1e6, decode_s_per_token=0.0))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(tree)}
    try:
        doc = _second_config(stack.gateway_config(["tenant-a"]), stack.paths, "sys")
        hdr = {"Content-Type": "application/json", **dict(stack.headers_for(["tenant-a"])("tenant-a"))}
        if passthrough:
            port, ready = free_port(), "/healthz"
            cmd = [sys.executable, "-m", "bench.overhead", "--passthrough", doc["replicas"][0]["url"], "--port", str(port)]
        else:
            port, ready = doc["listen"]["port"], "/readyz"
            cfg = work / "gw.yaml"
            cfg.write_text(yaml.safe_dump(doc, sort_keys=False))
            cmd = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(cfg)]
        proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL,
                                stderr=(work / f"{label}.err").open("wb"))
        try:
            base = f"http://127.0.0.1:{port}"
            await wait_for_url(base + ready, timeout_s=60.0)
            await sequential(base + "/v1/completions", hdr, WARM, _Body(False))
            out = work / f"{label}.strace"
            tracer = subprocess.Popen(["strace", "-c", "-p", str(proc.pid), "-o", str(out)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            await asyncio.sleep(1.0)  # attached (strace prints nothing on stdout to wait for)
            seq = await sequential(base + "/v1/completions", hdr, requests, _Body(False))
            tracer.send_signal(signal.SIGINT)
            tracer.wait(timeout=30)
            counts = parse_strace_c(out.read_text())
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    finally:
        stop_process(stack.cluster)
    return {"target": label, "tree": str(tree), "errors": seq["errors"],
            "per_request": {k: round(v / requests, 3) for k, v in sorted(counts.items(), key=lambda kv: -kv[1])}}


def to_markdown(docs: list[dict[str, Any]], name: str, requests: int) -> str:
    """One column per target, one row per system call (those at 0.01 per request or more somewhere)."""
    calls = sorted({k for d in docs for k, v in d["per_request"].items() if v >= 0.01},
                   key=lambda k: -max(d["per_request"].get(k, 0.0) for d in docs))
    lines = [f"# System calls per served sequential request (`python -m bench.syscall_count`), {name}", "",
             f"{requests} sequential requests per target after {WARM} unmeasured; `strace -c` on the event-loop "
             "thread only; calls per request.", "",
             "| syscall | " + " | ".join(f"{d['target']} (`{d['tree']}`)" for d in docs) + " |",
             "|---|" + "---:|" * len(docs)]
    lines += [f"| {k} | " + " | ".join(f"{d['per_request'].get(k, 0.0):.2f}" for d in docs) + " |" for k in calls]
    lines.append("| **total** | " + " | ".join(f"**{sum(d['per_request'].values()):.2f}**" for d in docs) + " |")
    lines.append("| errors | " + " | ".join(str(d["errors"]) for d in docs) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    ap = ClickOptions(prog="python -m bench.syscall_count", description=__doc__.splitlines()[0])
    ap.option("--baseline", multiple=True, type=click.Path(path_type=Path))
    ap.option("--passthrough", is_flag=True, help="also the feature-less passthrough on the same stack")
    ap.option("--requests", type=int, default=1000)
    ap.option("--out", type=click.Path(path_type=Path), default=RESULTS)
    ap.option("--name", default="syscall_count")
    args = ap.parse(list(sys.argv[1:] if argv is None else argv))
    targets = [("prefixgate", REPO, False), *((f"baseline{i + 1}", t.resolve(), False)
                                                for i, t in enumerate(args.baseline))]
    if args.passthrough:
        targets.append(("passthrough", REPO, True))
    docs = [asyncio.run(count_target(label, tree, args.requests, Path(tempfile.mkdtemp(prefix="pg-sys-")), pt))
            for label, tree, pt in targets]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(docs, indent=2) + "\n")
    md = to_markdown(docs, args.name, args.requests)
    (args.out / f"{args.name}.md").write_text(md)
    print(md, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
