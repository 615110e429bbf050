"""In-process CPU of a streamed answer's relay, per stream and per SSE event (issue 14, session 24, helper relay;
not a test).

``python -m bench.relay_micro --tree NAME=DIR [--tree ...] [--events 1,32] [--streams 300] [--rounds 8]``

Each tree's :func:`gateway.pipeline_answer.stream_response` relays streams of N sim-shaped SSE events (the
completions deltas of ``sim.replica``, 16 words each, ``usage: null``, a finish event, the usage event and
``[DONE]``; ``drop_cached`` on, as for the bench's tenant) under the inference routes' send chain as that
tree builds it (:class:`gateway.write_stall.StallBoundedSend` with default limits around the routes'
``send_one``; ``body_send`` where the tree has it), ASGI 2.3 with a :class:`gateway.client_io.ConnectionLoss`
in the scope. The upstream answer is a real :class:`gateway.upstream_response.UpstreamResponse`: each event
arrives by a loop callback once the previous one was sent (one upstream read and one wait per event, as in
``bench.stream_cost`` with 1 ms between events); the server's ``send`` is an ``async def`` that returns
(uvicorn's send and the socket are left out: the same in every tree).

Every tree runs in a child process of its own (``PYTHONPATH=DIR``), rounds interleaved; per round, per N: the
best of 5 passes of ``--streams`` streams (thread CPU µs per stream); per round the per-event slope over N.
Name one tree twice (``this`` and ``aa``) for the A/A. Results: ``bench/results/<name>.md`` and ``.json``.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click

RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results"


def _events(n: int) -> list[bytes]:
    """The reads of one stream of ``n`` events (one event a read; usage and ``[DONE]`` in the last)."""
    words = "lorem ipsum dolor sit amet consectetur adipiscing elit".split()
    out = []
    for i in range(n):
        text = "".join(" " + words[(16 * i + k) % len(words)] for k in range(1 if i == 0 else 16))
        finish = "length" if i == n - 1 else None
        out.append(("data: " + json.dumps({"id": "cmpl-0123456789abcdef01234567", "object": "text_completion",
                                           "created": 1796337203, "model": "sim-model", "choices": [
                                               {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
                                           "usage": None}, separators=(",", ":")) + "\n\n").encode())
    usage = {"prompt_tokens": 70, "completion_tokens": 1 + 16 * (n - 1), "total_tokens": 71 + 16 * (n - 1),
             "prompt_tokens_details": {"cached_tokens": 0}}
    out.append(("data: " + json.dumps({"id": "cmpl-0123456789abcdef01234567", "object": "text_completion",
                                       "created": 1796337203, "model": "sim-model", "choices": [], "usage": usage},
                                      separators=(",", ":")) + "\n\ndata: [DONE]\n\n").encode())
    return out


async def _child(events: list[int], streams: int) -> dict[int, float]:
    """In the child: best-of-5 thread CPU µs per stream for each N (this process's ``gateway``)."""
    from gateway.client_io import LOSS_KEY, ConnectionLoss
    from gateway.config_http import LimitsConfig
    from gateway.inference_asgi import _sender
    from gateway.pipeline_answer import stream_response
    from gateway.proxy import UpstreamStream
    from gateway.upstream_response import UpstreamResponse
    from gateway.write_stall import StallBoundedSend

    loop = asyncio.get_running_loop()
    limits = LimitsConfig()
    body_send = "body_send" in inspect.signature(StallBoundedSend.for_limits).parameters

    class _Conn:
        def resume(self) -> None:
            pass

        def abort(self) -> None:
            pass

    async def receive() -> Any:
        await loop.create_future()

    async def one(reads: list[bytes]) -> None:
        resp = UpstreamResponse(_Conn(), loop)
        resp.status, resp._head_seen = 200, True
        up = UpstreamStream(resp, reads[0], None)
        held = SimpleNamespace(up=up, attempt=SimpleNamespace(succeeded=lambda: None), cpu=SimpleNamespace(budget=None),
                               drop_cached=True, started=False, progress=None, usage=None, relayed=None)
        rec = SimpleNamespace(outcome=None, status=None, error_code=None, relayed_output=None, request_id="r-1")
        req = SimpleNamespace(include_usage=False, dropped=(0, ""))
        response = stream_response(req, rec, held, 30.0, SimpleNamespace(failed=lambda *a: None),  # type: ignore[arg-type]
                                   lambda: None)
        rest = iter(reads[1:])

        def arrive() -> None:
            piece = next(rest, None)
            if piece is None:
                resp._finish()
            else:
                resp._feed(piece)

        async def server_send(message: Any) -> None:
            if message["type"] == "http.response.body" and message.get("more_body"):
                loop.call_soon(arrive)  # the next event arrives once this one is out (the relay then waits)

        framed = SimpleNamespace(complete=True)
        routes_send = _sender(framed, server_send, lambda: None)  # type: ignore[arg-type]
        bounded = (StallBoundedSend.for_limits(routes_send, limits, server_send) if body_send
                   else StallBoundedSend.for_limits(routes_send, limits))
        scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, LOSS_KEY: ConnectionLoss()}
        try:
            await response(scope, receive, bounded)
        finally:
            bounded.close()
            up.close()

    out: dict[int, float] = {}
    for n in events:
        reads = _events(n)
        for _ in range(20):
            await one(reads)
        best = float("inf")
        for _ in range(5):
            t0 = time.thread_time()
            for _ in range(streams):
                await one(reads)
            best = min(best, (time.thread_time() - t0) * 1e6 / streams)
        out[n] = best
    return out


def _slope(xs: list[int], ys: list[float]) -> float:
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


@click.command()
@click.option("--tree", "trees", multiple=True, required=True, help="NAME=DIR: a source tree (repeatable)")
@click.option("--events", default="1,32", show_default=True)
@click.option("--streams", default=300, show_default=True)
@click.option("--rounds", default=8, show_default=True)
@click.option("--name", default="relay-micro", show_default=True)
@click.option("--child", is_flag=True, hidden=True)
def main(trees: tuple[str, ...], events: str, streams: int, rounds: int, name: str, child: bool) -> None:
    """The relay's in-process CPU per stream and per SSE event, per source tree (module doc)."""
    evs = [int(x) for x in events.split(",")]
    if child:
        print(json.dumps(asyncio.run(_child(evs, streams))))
        return
    # here, not at the top: the child runs this file with another tree's ``bench`` first on its path
    from bench._tree_rounds import child_json, interleaved

    named = [t.partition("=")[::2] for t in trees]

    def measure(tree: str | Path) -> dict[int, float]:
        got = child_json([sys.executable, __file__, "--child", "--events", events, "--streams", str(streams),
                          "--tree", "x=x"], tree)
        return {int(k): v for k, v in got.items()}

    rows, _ = interleaved(named, rounds, measure, describe=lambda got: "/".join(f"{got[e]:.1f}" for e in evs))
    summary = {}
    for n, _ in named:
        per_round = [round(_slope(evs, [r[e] for e in evs]), 3) for r in rows[n]]
        summary[n] = {"per_stream_us": {e: round(statistics.median(r[e] for r in rows[n]), 1) for e in evs},
                      "per_event_us": round(statistics.median(per_round), 3), "per_event_rounds": per_round}
    doc = {"benchmark": "relay_micro", "args": {"trees": list(trees), "events": events, "streams": streams,
                                                "rounds": rounds}, "python": sys.version.split()[0],
           "loadavg_end": os.getloadavg(), "summary": summary, "rows": rows}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(doc, indent=1))
    lines = [f"# Relay in process: thread CPU per stream and per SSE event (`python -m bench.relay_micro`), {name}", "",
             f"{rounds} interleaved rounds; per round and N the best of 5 passes of {streams} streams (child process per "
             f"tree); events {events}; Python {doc['python']}; load average at the end "
             f"{doc['loadavg_end'][0]:.1f}.", "",
             "| tree | " + " | ".join(f"µs/stream, {e} ev" for e in evs) + " | per event µs (median of rounds) | rounds |",
             "|---|" + "---:|" * (len(evs) + 2)]
    for n, _ in named:
        s = summary[n]
        lines.append(f"| {n} | " + " | ".join(str(s["per_stream_us"][e]) for e in evs)
                     + f" | {s['per_event_us']} | {', '.join(str(x) for x in s['per_event_rounds'])} |")
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
