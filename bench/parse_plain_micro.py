"""Micro-benchmark: thread CPU of :func:`gateway.request.parse_inference_request` on the plain bodies
(session 21, S21-newcomer-5: the strict-number keyword on the parse must not cost the plain request).

``python -m bench.parse_plain_micro --trees A --trees B --trees C [--rounds 5] [--calls 20000]`` runs each tree in its own
process (``PYTHONPATH=<tree>``), interleaved, ``--rounds`` times; each run is the best of 5 passes of
``--calls`` parses (``time.thread_time_ns``) per body, in ns per parse. Bodies: ``bench.loadgen``'s chat
and completion shape (64 words, ``max_tokens`` 1), which orjson decodes (the fast path). Prints the
medians and the spread (max - min over rounds) per tree and body as a Markdown table. A benchmark, not
a test: the figures depend on the machine and its load.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

import click

WORDS = " ".join(f"w{i}" for i in range(64))
BODIES = {
    "chat": (json.dumps({"model": "sim-model", "messages": [{"role": "user", "content": WORDS}], "max_tokens": 1})
             .encode(), "chat"),
    "completions": (json.dumps({"model": "sim-model", "prompt": WORDS, "max_tokens": 1}).encode(), "completions"),
}


def _child(calls: int) -> dict[str, float]:
    """ns per parse (best of 5 passes of ``calls``) per body, in this process's tree."""
    from gateway.request import parse_inference_request
    out = {}
    for name, (raw, endpoint) in BODIES.items():
        best = None
        for _ in range(5):
            t0 = time.thread_time_ns()
            for _ in range(calls):
                parse_inference_request(raw, endpoint, 32, max_messages=64, max_batch_prompts=16,  # type: ignore[arg-type]
                                        max_json_items=100_000)
            dt = (time.thread_time_ns() - t0) / calls
            best = dt if best is None else min(best, dt)
        out[name] = best
    return out


@click.command()
@click.option("--trees", multiple=True, required=True, help="Source trees to compare (repeat the option).")
@click.option("--rounds", type=int, default=5, show_default=True)
@click.option("--calls", type=int, default=20000, show_default=True)
@click.option("--child", is_flag=True, hidden=True)
def main(trees: tuple[str, ...], rounds: int, calls: int, child: bool) -> None:
    """Thread CPU per plain-body parse, per tree (module doc)."""
    if child:
        print(json.dumps(_child(calls)))
        return
    runs: dict[str, list[dict[str, float]]] = {t: [] for t in trees}
    for _ in range(rounds):
        for tree in trees:
            env = {**os.environ, "PYTHONPATH": tree}
            res = subprocess.run([sys.executable, "-m", "bench.parse_plain_micro", "--child", "--trees", tree,
                                  "--calls", str(calls)], env=env, cwd=tree, capture_output=True, text=True,
                                 check=True)
            runs[tree].append(json.loads(res.stdout))
    print("| tree | body | median ns/parse | spread (max-min) |\n|---|---|---|---|")
    for tree, rs in runs.items():
        for body in BODIES:
            vals = [r[body] for r in rs]
            print(f"| {tree} | {body} | {statistics.median(vals):.0f} | {max(vals) - min(vals):.0f} |")


if __name__ == "__main__":
    main()
