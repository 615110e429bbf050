"""System calls per sequential request of the gateway and the passthrough (issue 14, session 10; not a test).

``python -m bench.syscalls [--requests 300] [--targets prefixgate,passthrough] [--baseline DIR]``

Starts the stack of ``python -m bench.overhead`` (one simulated replica that answers at once,
``prefixgate serve`` with the demo configuration, the feature-less passthrough; ``--baseline DIR``
also ``prefixgate serve`` from another source tree), sends warm-up requests, then attaches
``strace -c -f -p PID`` to each target's process for ``--requests`` sequential requests on one
keep-alive connection and prints the system calls per request by name (``epoll_wait`` rounds,
``write``/``writev``/``sendto``, ``read``/``recvfrom``, ``setsockopt``, ``poll`` ...). The counts
are deterministic up to a few timer wake-ups (the gateway's periodic tasks), unlike latency on a
shared machine. Needs ``strace`` (``apt-get install strace``) and ptrace permission.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["parse_strace_summary", "main"]

_ROW = re.compile(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:(\d+)\s+)?(\w+)\s*$")


def parse_strace_summary(text: str) -> dict[str, int]:
    """``strace -c`` table text -> {syscall name: calls} (the ``total`` row left out)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        m = _ROW.match(line)
        if m and m.group(3) != "total":
            out[m.group(3)] = out.get(m.group(3), 0) + int(m.group(1))
    return out


async def _count(pid: int, url: str, headers: dict[str, str], n: int, bodies: Any, log_dir: Path) -> dict[str, int]:
    from bench.overhead import sequential

    await sequential(url, headers, 50, bodies)  # warm-up (connections, caches), not traced
    out = log_dir / f"strace-{pid}.txt"
    proc = subprocess.Popen(["strace", *(os.environ.get("STRACE_ARGS", "-c").split()), "-f", "-o", str(out), "-p", str(pid)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    await asyncio.sleep(1.0)  # strace attaches to every thread
    await sequential(url, headers, n, bodies)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=30)
    if os.environ.get("STRACE_KEEP"):  # e.g. STRACE_ARGS="-k -e trace=write" STRACE_KEEP=/tmp/trace
        shutil.copy(out, f"{os.environ['STRACE_KEEP']}-{pid}.txt")
    return parse_strace_summary(out.read_text())


async def run(args: Any) -> dict[str, dict[str, int]]:
    """Start the targets, count their system calls; {target: {syscall: calls}}."""
    from bench.harness import start_demo_stack
    from bench.loadgen import _Body
    from bench.overhead import REPO, _second_config, _start_passthrough, _start_slot
    from sim.demo import ClusterSpec
    from sim.procs import stop_process

    stack = await start_demo_stack(Path(tempfile.mkdtemp(prefix="pg-syscalls-")),
                                   ClusterSpec(replicas=1, time_scale=1e6, decode_s_per_token=0.0))
    paths, cluster = stack.paths, stack.cluster
    bodies = _Body(args.stream)
    results: dict[str, dict[str, int]] = {}
    try:
        direct = stack.replicas[0]["url"]
        cfg = stack.gateway_config(["tenant-a"])
        auth = dict(stack.headers_for(["tenant-a"])("tenant-a"))
        plain = {"Content-Type": "application/json"}
        for name in args.targets.split(","):
            if name == "passthrough":
                proc, base = await _start_passthrough(direct, paths)
                headers = plain
            else:
                tree = args.baseline if name == "baseline" else REPO
                doc = _second_config(cfg, paths, name)
                if name == "baseline":
                    doc["policy"]["dir"] = str(Path(tree) / "rego")
                proc, base = await _start_slot(name, Path(tree), doc, paths)
                headers = {**plain, **auth}
            try:
                results[name] = await _count(proc.pid, base + "/v1/completions", headers, args.requests,
                                             bodies, paths.work)
            finally:
                stop_process(proc)
    finally:
        stop_process(cluster)
        shutil.rmtree(paths.work, ignore_errors=True)
    return results


def main(argv: list[str] | None = None) -> int:
    """Entry point: print a table of system calls per request (calls / ``--requests``)."""
    from sim.click_options import ClickOptions

    ap = ClickOptions(prog="python -m bench.syscalls", description=__doc__.splitlines()[0])
    ap.option("--requests", type=int, default=300, help="sequential requests traced per target")
    ap.option("--targets", default="prefixgate,passthrough", help="comma-separated: prefixgate, passthrough, baseline")
    ap.option("--baseline", default=None, help="source tree of target 'baseline' (e.g. a copy of main)")
    ap.option("--stream", is_flag=True, help="SSE answers instead of plain JSON")
    args = ap.parse(argv)
    if shutil.which("strace") is None:
        print("strace not installed", file=sys.stderr)
        return 2
    os.environ.pop("PYTHONPATH", None)
    results = asyncio.run(run(args))
    names = sorted({k for r in results.values() for k in r}, key=lambda k: -max(r.get(k, 0) for r in results.values()))
    print(f"system calls per request ({args.requests} sequential requests)")
    print(f"{'syscall':18s}" + "".join(f"{t:>14s}" for t in results))
    for k in names:
        print(f"{k:18s}" + "".join(f"{r.get(k, 0) / args.requests:14.2f}" for r in results.values()))
    print(f"{'total':18s}" + "".join(f"{sum(r.values()) / args.requests:14.2f}" for r in results.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
