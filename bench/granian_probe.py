"""Is a Rust HTTP server a faster edge? (session 20, issue 14; an experiment, not a test.)

The feature-less passthrough app of :mod:`bench.overhead` (Starlette, PrefixGate's upstream session) on
PrefixGate's stack (uvicorn + httptools + uvloop) and on granian (a Rust HTTP server with an ASGI bridge;
single-threaded runtime, uvloop, asyncio or Rust tasks), beside direct: sequential rounds of ``requests``
(300) requests, targets alternated, order reversed every other round; medians over ``rounds`` (6).

granian is not a project dependency: install it beside the venv first, e.g.
``.venv/bin/pip install --target /tmp/granian-pkgs granian``, then
``PYTHONPATH=. .venv/bin/python -m bench.granian_probe [rounds] [requests] [granian-path]``
(default granian-path /tmp/granian-pkgs). Result of session 20: bench/results/granian-probe-s20.md.
"""
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

from bench.harness import start_demo_stack
from bench.overhead import _Body, _Cpu, _start_passthrough, measured, sequential
from sim.demo import ClusterSpec
from sim.procs import free_port, start_process, stop_process, wait_for_url


REPO = Path(__file__).resolve().parent.parent
_APP = ("import os\nfrom bench.overhead import passthrough_app\n"
        "app = passthrough_app(os.environ['PT_UPSTREAM'])\n")


async def main(rounds: int, n: int, granian_path: str) -> None:
    """Start the replica, both passthroughs and direct; print each target's medians (see module doc)."""
    app_dir = tempfile.mkdtemp(prefix="granian-app-")
    Path(app_dir, "granian_pt.py").write_text(_APP, encoding="utf-8")
    stack = await start_demo_stack(Path(tempfile.mkdtemp(prefix="gprobe-")),
                                   ClusterSpec(replicas=1, time_scale=1e6, decode_s_per_token=0.0))
    direct = stack.replicas[0]["url"]
    procs = []
    try:
        uv, uv_base = await _start_passthrough(direct, stack.paths)
        procs.append(uv)
        variants = {}
        for label, extra in (("granian-st", ["--runtime-mode", "st"]), ("granian-rust-task", ["--runtime-mode", "st", "--task-impl", "rust"])):
            port = free_port()
            cmd = [sys.executable, "-m", "granian", "--interface", "asgi", "--host", "127.0.0.1", "--port", str(port),
                   "--workers", "1", "--runtime-threads", "1", "--loop", "uvloop", "--http", "1", "--no-ws",
                   "--log-level", "warning", *extra, "granian_pt:app"]
            env = {"PYTHONPATH": f"{app_dir}:{REPO}:{granian_path}", "PT_UPSTREAM": direct}
            try:
                p = start_process(label, cmd, stack.paths.logs, cwd=Path(app_dir), env=env)
                await wait_for_url(f"http://127.0.0.1:{port}/healthz", timeout_s=30.0, proc=p)
            except Exception as exc:  # an option this granian lacks: report and go on
                print(label, "failed to start:", exc)
                continue
            procs.append(p)
            variants[label] = (f"http://127.0.0.1:{port}", _Cpu(p.pid))
        targets = {"direct": (direct, _Cpu(stack.cluster.pid)), "uvicorn": (uv_base, _Cpu(uv.pid)), **variants}
        bodies = _Body(False)
        plain = {"Content-Type": "application/json"}
        res = {k: {"p50": [], "cpu": []} for k in targets}
        for name, (base, _) in targets.items():  # warm-up
            await sequential(base + "/v1/completions", plain, 50, bodies)
        for r in range(rounds):
            order = list(targets) if r % 2 == 0 else list(targets)[::-1]
            for name in order:
                base, cpu = targets[name]
                out, cpu_us = await measured(cpu, n, sequential(base + "/v1/completions", plain, n, bodies))
                res[name]["p50"].append(out["p50_ms"])
                res[name]["cpu"].append(cpu_us)
                assert out["errors"] == 0, (name, out)
        d = statistics.median(res["direct"]["p50"])
        print(f"{rounds} rounds x {n} sequential requests, medians; added = p50 - direct p50")
        for name, v in res.items():
            p50 = statistics.median(v["p50"])
            print(f"{name:18s} p50 {p50:.3f} ms  added {p50 - d:.3f} ms  CPU {statistics.median(v['cpu']):.0f} us/req"
                  f"  (p50 per round {v['p50']})")
    finally:
        for p in procs:
            stop_process(p)
        stack.stop()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 6, int(sys.argv[2]) if len(sys.argv) > 2 else 300,
                     sys.argv[3] if len(sys.argv) > 3 else "/tmp/granian-pkgs"))
