"""In-process CPU of one plain answer's upstream half, this tree vs others (not a test).

``python -m bench.answer_micro --baseline DIR [--aa DIR] [--rounds 6] [--requests 3000] [--name answer_micro]``

Issue 14, session 15. What the answer path's own Python costs per request without sockets and without the
machine's noise: ``unless_client_leaves`` (the guarded listener's path: a
:class:`gateway.client_io.ConnectionLoss` in the scope) around ``open_upstream`` on a real
:class:`gateway.upstream_pool.UpstreamPool` whose connection (one, kept alive) writes into a transport
that answers at once, in the next loop step, with the simulated replica's plain answer (status line, seven
header fields, the 250-byte JSON body with ``usage.prompt_tokens_details``), then ``whole_body``, the
answer's parse (``json_fast.loads_answer``) and ``close``: the upstream send, the answer's parse by llhttp,
the wake-up and the ``post`` steps up to the answer's bytes. The transport comes from an event loop
(uvloop's) whose ``create_connection`` is the only thing replaced (a public method). Each figure is the
best of 15 passes of ``--requests`` answers in thread CPU µs per answer; each tree in its own process, the
trees interleaved (this, baseline, A/A copy) for ``--rounds`` rounds; medians and per-round differences
are written to ``bench/results/<name>.{json,md}``. A warm loop: compare within one run only.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from bench.harness import ANSWERING_LOOP_CHILD, replica_answer
from bench._tree_rounds import code_child, interleaved, one_figure, one_figure_rows
from sim.click_options import ClickOptions

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"

BODY = (b'{"id": "cmpl-5f1e2d3c4b5a69788796a5b4", "object": "text_completion", "created": 1764670000, '
        b'"model": "sim-model", "choices": [{"index": 0, "text": "lorem", "logprobs": null, "finish_reason": '
        b'"length"}], "usage": {"prompt_tokens": 64, "completion_tokens": 1, "total_tokens": 65, '
        b'"prompt_tokens_details": {"cached_tokens": 48}}}')
#: the simulated replica's plain answer (seven header fields), the transport's answer to each write
ANSWER = replica_answer(BODY, "X-Sim-Replica: r0", "Keep-Alive: timeout=75")

_CHILD_HEAD = r'''
import asyncio, sys, time
sys.path.insert(0, TREE)
import uvloop
from gateway import json_fast
from gateway.client_io import LOSS_KEY, ConnectionLoss, unless_client_leaves
from gateway.proxy import make_session, open_upstream
assert json_fast.__file__.startswith(TREE), json_fast.__file__
'''

#: the rest of the child, after :data:`bench.harness.ANSWERING_LOOP_CHILD`
_CHILD = r'''
class Req:
    def __init__(self): self.scope = {LOSS_KEY: ConnectionLoss()}

async def main():
    pool = make_session(8, 5.0, 30.0)
    req = Req()
    url = "http://127.0.0.1:9/v1/completions"
    body = b'{"model":"sim-model","prompt":"x","max_tokens":1}'
    best = 1e9
    for _ in range(15):
        t0 = time.thread_time_ns()
        for i in range(REQUESTS):
            up = await unless_client_leaves(req, open_upstream(pool, url, body, {"X-Request-Id": "r"}, 30.0))
            data = up.whole_body()
            json_fast.loads_answer(data)
            up.close()
        best = min(best, (time.thread_time_ns() - t0) / REQUESTS / 1000)
    await pool.close()
    print(best)
asyncio.run(main(), loop_factory=Loop) if sys.version_info >= (3, 12) else asyncio.Runner(loop_factory=Loop).run(main())
'''


def one(tree: Path, requests: int) -> float:
    """Best-of-15 µs per answer on the code of ``tree``."""
    return float(code_child(_CHILD_HEAD + f"ANSWER = {ANSWER!r}\n" + ANSWERING_LOOP_CHILD + _CHILD, tree,
                            {"TREE": str(tree), "REQUESTS": requests}))


def run(trees: dict[str, Path], rounds: int, requests: int) -> dict[str, Any]:
    """Interleaved rounds over ``trees`` (label -> source tree); returns the result document."""
    runs, _ = interleaved(trees, rounds, lambda tree: one(Path(tree), requests), order="alternate",
                          describe=lambda v: f"{v:.2f}", sep=", ")
    med, diffs = one_figure(runs)
    return {"trees": {k: str(v) for k, v in trees.items()}, "rounds": rounds, "requests": requests, "runs": runs,
            "median_us": med, "this_minus_median_us": diffs}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    ap = ClickOptions(prog="python -m bench.answer_micro", description=__doc__.splitlines()[0])
    ap.option("--baseline", type=click.Path(path_type=Path), required=True)
    ap.option("--aa", type=click.Path(path_type=Path), default=None, help="a copy of this tree (A/A noise)")
    ap.option("--rounds", type=int, default=6)
    ap.option("--requests", type=int, default=3000)
    ap.option("--out", type=click.Path(path_type=Path), default=RESULTS)
    ap.option("--name", default="answer_micro")
    args = ap.parse(argv)
    trees = {"this": REPO, "baseline": args.baseline.resolve(), **({"aa": args.aa.resolve()} if args.aa else {})}
    doc = run(trees, args.rounds, args.requests)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = [f"# Plain answer's upstream half, CPU per answer in process (`python -m bench.answer_micro`), {args.name}",
             "", f"{doc['rounds']} interleaved rounds, best of 15 x {doc['requests']} answers each; thread CPU "
             "µs/answer (warm loop).", "",
             *one_figure_rows(doc["trees"], doc["runs"], doc["median_us"], doc["this_minus_median_us"])]
    (args.out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
