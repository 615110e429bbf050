"""In-process CPU of one upstream answer on a kept-alive :class:`gateway.upstream_conn.UpstreamConnection` (not a test).

``python -m bench.upstream_conn_micro --baseline DIR [--aa DIR] [--rounds 6] [--requests 5000]``

Session 14 (issue 14): what the replica connection's own Python costs per request, without sockets:
``send`` (the write goes to a transport that drops it), ``data_received`` of a whole answer (status
line, six header fields as the simulated replica sends them, a 190-byte JSON body) in one piece,
``wait_head``, ``read_chunk`` to the end and ``close``, on one connection, on uvloop. Each figure
is the best of 15 passes of ``--requests`` answers in thread CPU µs per answer; each tree runs in
its own process, the trees interleaved (this, baseline, A/A copy) for ``--rounds`` rounds; the
medians and the per-round differences are printed and written to
``bench/results/upstream_conn_micro-<name>.{json,md}``. A warm loop: compare within one run only.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from bench.harness import replica_answer
from bench._tree_rounds import code_child, interleaved, one_figure, one_figure_rows
from sim.click_options import ClickOptions

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"

ANSWER = (b'{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant",'
          b'"content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":64,"completion_tokens":1,'
          b'"total_tokens":65}}')
#: the whole answer handed to ``data_received`` (six header fields)
RESP = replica_answer(ANSWER, "X-Request-Id: r", content_type="application/json", server="Python/3.11 aiohttp/3.9")

_CHILD = r'''
import asyncio, sys, time
sys.path.insert(0, TREE)
import uvloop
from gateway.upstream_conn import UpstreamConnection
class T:
    def write(self, d): pass
    def is_closing(self): return False
    def abort(self): pass
    def get_extra_info(self, n, d=None): return d
    def get_write_buffer_size(self): return 0
async def main():
    loop = asyncio.get_running_loop()
    conn = UpstreamConnection(lambda c: None, lambda c: None, loop)
    conn.connection_made(T())
    best = 1e9
    for _ in range(15):
        t0 = time.thread_time_ns()
        for _ in range(REQUESTS):
            r = conn.send(b"x", "r")
            conn.data_received(RESP)
            await r.wait_head()
            while await r.read_chunk():
                pass
            r.close()
        best = min(best, (time.thread_time_ns() - t0) / REQUESTS / 1000)
    print(best)
uvloop.run(main())
'''


def one(tree: Path, requests: int) -> float:
    """Best-of-15 µs per answer on the code of ``tree``."""
    return float(code_child(_CHILD, tree, {"TREE": str(tree), "REQUESTS": requests, "RESP": RESP}))


def run(trees: dict[str, Path], rounds: int, requests: int) -> dict[str, Any]:
    """Interleaved rounds over ``trees`` (label -> source tree); returns the result document."""
    runs, _ = interleaved(trees, rounds, lambda tree: one(Path(tree), requests), order="fixed",
                          describe=lambda v: f"{v:.2f}", sep=", ")
    med, diffs = one_figure(runs)
    return {"trees": {k: str(v) for k, v in trees.items()}, "rounds": rounds, "requests": requests, "runs": runs,
            "median_us": med, "this_minus_median_us": diffs}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    ap = ClickOptions(prog="python -m bench.upstream_conn_micro", description=__doc__.splitlines()[0])
    ap.option("--baseline", type=click.Path(path_type=Path), required=True)
    ap.option("--aa", type=click.Path(path_type=Path), default=None, help="a copy of this tree (A/A noise)")
    ap.option("--rounds", type=int, default=6)
    ap.option("--requests", type=int, default=5000)
    ap.option("--out", type=click.Path(path_type=Path), default=RESULTS)
    ap.option("--name", default="upstream_conn_micro")
    args = ap.parse(argv)
    trees = {"this": REPO, "baseline": args.baseline.resolve(), **({"aa": args.aa.resolve()} if args.aa else {})}
    doc = run(trees, args.rounds, args.requests)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = [f"# Upstream connection CPU per answer, in process (`python -m bench.upstream_conn_micro`), {args.name}",
             "", f"{doc['rounds']} interleaved rounds, best of 15 x {doc['requests']} answers each; thread CPU "
             "µs/answer (warm loop).", "",
             *one_figure_rows(doc["trees"], doc["runs"], doc["median_us"], doc["this_minus_median_us"])]
    (args.out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
