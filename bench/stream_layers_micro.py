"""In-process ceiling of a direct streamed-answer send (issue 14, session 22, helper streamdirect; not a test).

``python -m bench.stream_layers_micro [--events 1,32] [--streams 2000] [--rounds 8] [--name ...]``

What the streamed answer's response layer costs the gateway per stream and per SSE event: the
thread CPU of sending one streamed answer of N events the way :class:`gateway.inference_asgi.InferenceRoutes`
sends it today (an :class:`gateway.client_io.EndingStreamingResponse` built as
:func:`gateway.pipeline_answer.stream_response` builds it, called with the write-stall bound
(:class:`gateway.write_stall.StallBoundedSend`, default limits) around the inference routes' ``send_one``,
under ASGI 2.3 with the guarded listener's :class:`gateway.client_io.ConnectionLoss` in the scope), against
a **stub** direct send that keeps only what any direct send must do (the same bounded send, the
headers built once per stream, the connection-loss callback added and removed, the start message, one
``http.response.body`` per event, the closing part, the generator's ``aclose`` and ``on_end``) and does
nothing else: NOT behaviour-complete (no cancellation handling), a measurement of the most a direct
send could save. ``direct_merged`` also drops the ``send_one`` wrapper (its last-part check inline).

The body is an async generator yielding N pre-built 200-byte events without waiting (the upstream
read, the SSE scan and uvicorn's send are the same in every variant, so they are left out: the
server's ``send`` is an ``async def`` that returns). Each variant: best of 5 passes of ``--streams``
streams, thread CPU µs per stream; variants interleaved per round (``response`` twice: ``response``
and ``response_aa``, the A/A); per round the per-event slope over N. Results:
``bench/results/<name>.md`` and ``.json``.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import Any

import click

from gateway.client_io import LOSS_KEY, ConnectionLoss, EndingStreamingResponse, _current_task
from gateway.config_http import LimitsConfig
from gateway.inference_asgi import _sender
from gateway.write_stall import StallBoundedSend

RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results"
EVENT = b"data: " + b"x" * 192 + b"\n\n"
VARIANTS = ("response", "direct", "direct_merged", "response_aa")


class _Framed:
    complete = True


async def _server_send(message: Any) -> None:
    return None


def _scope() -> dict[str, Any]:
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, LOSS_KEY: ConnectionLoss()}


async def _receive() -> dict[str, Any]:
    await asyncio.Event().wait()
    return {"type": "http.disconnect"}


def _body(n: int, ended: list[int]) -> AsyncGenerator[bytes, None]:
    async def body() -> AsyncGenerator[bytes, None]:
        try:
            for _ in range(n):
                yield EVENT
        finally:
            ended[0] += 1
    return body()


async def _response(n: int, ended: list[int]) -> None:
    scope = _scope()
    headers = {"Cache-Control": "no-cache", "X-Request-Id": "0123456789abcdef0123456789abcdef"}
    response = EndingStreamingResponse(_body(n, ended), on_end=lambda: None, media_type="text/event-stream",
                                       headers=headers)
    bounded = StallBoundedSend.for_limits(_sender(_Framed(), _server_send, lambda: None), _LIMITS)
    try:
        await response(scope, _receive, bounded)
    finally:
        bounded.close()


async def _direct(n: int, ended: list[int], merged: bool = False) -> None:
    scope = _scope()
    rid = b"0123456789abcdef0123456789abcdef"
    raw = [(b"cache-control", b"no-cache"), (b"x-request-id", rid),
           (b"content-type", b"text/event-stream; charset=utf-8")]
    before_last: Callable[[], None] = lambda: None  # noqa: E731
    bounded = StallBoundedSend.for_limits(_server_send if merged else _sender(_Framed(), _server_send, before_last),
                                          _LIMITS)
    content = _body(n, ended)
    loss = scope[LOSS_KEY]
    task = _current_task(loss)

    def on_lost() -> None:
        task.cancel()  # type: ignore[union-attr]

    loss.add(on_lost)
    try:
        await bounded({"type": "http.response.start", "status": 200, "headers": raw})
        async for chunk in content:
            await bounded({"type": "http.response.body", "body": chunk, "more_body": True})
        if merged:
            before_last()
        await bounded({"type": "http.response.body", "body": b"", "more_body": False})
    finally:
        loss.discard(on_lost)
        bounded.close()
        await content.aclose()


_LIMITS = LimitsConfig()


async def _pass(variant: str, n: int, streams: int) -> float:
    ended = [0]
    t0 = time.thread_time_ns()
    if variant.startswith("response"):
        for _ in range(streams):
            await _response(n, ended)
    else:
        merged = variant == "direct_merged"
        for _ in range(streams):
            await _direct(n, ended, merged)
    t1 = time.thread_time_ns()
    assert ended[0] == streams
    return (t1 - t0) / 1e3 / streams


def _slope(by_n: dict[int, float]) -> float:
    ns = sorted(by_n)
    xm = statistics.fmean(ns)
    ym = statistics.fmean(by_n[k] for k in ns)
    return sum((k - xm) * (by_n[k] - ym) for k in ns) / sum((k - xm) ** 2 for k in ns)


@click.command()
@click.option("--events", default="1,32", help="events per stream (comma-separated)")
@click.option("--streams", default=2000, type=int, help="streams per pass")
@click.option("--rounds", default=8, type=int, help="interleaved rounds")
@click.option("--name", default="streamdirect-s22-ceiling", help="results file name")
def main(events: str, streams: int, rounds: int, name: str) -> None:
    """Measure and write ``bench/results/<name>.{md,json}``."""
    ns = [int(x) for x in events.split(",")]
    rows: list[dict[str, Any]] = []

    async def run() -> None:
        for v in VARIANTS:  # warm up
            for n in ns:
                await _pass(v, n, streams // 4)
        for r in range(rounds):
            order = VARIANTS if r % 2 == 0 else tuple(reversed(VARIANTS))
            row: dict[str, Any] = {}
            for v in order:
                row[v] = {n: min([await _pass(v, n, streams) for _ in range(5)]) for n in ns}
            rows.append(row)
            print(r, {v: {n: round(x, 2) for n, x in per_n.items()} for v, per_n in row.items()})

    asyncio.run(run())
    md = [f"# Ceiling of a direct streamed-answer send (`python -m bench.stream_layers_micro`), {name}", "",
          f"{rounds} rounds, best of 5 passes x {streams} streams per variant and N; thread CPU µs per stream "
          "(median over rounds, min-max); per event: slope over N per round, median.", "",
          "| variant | " + " | ".join(f"µs/stream, {n} ev" for n in ns) + " | per event µs | "
          "- response, per stream at " + str(max(ns)) + " ev (median of rounds) |",
          "|---|" + "---:|" * (len(ns) + 2)]
    summary: dict[str, Any] = {}
    big = max(ns)
    for v in VARIANTS:
        per_n = {n: [row[v][n] for row in rows] for n in ns}
        slopes = [_slope(row[v]) for row in rows] if len(ns) > 1 else [0.0]
        diffs = [row[v][big] - row["response"][big] for row in rows]
        summary[v] = {"per_stream": {n: statistics.median(x) for n, x in per_n.items()},
                      "per_event": statistics.median(slopes), "diff_vs_response": statistics.median(diffs),
                      "rounds": per_n}
        cells = " | ".join(f"{statistics.median(x):.2f} ({min(x):.2f}-{max(x):.2f})" for x in per_n.values())
        md.append(f"| {v} | {cells} | {statistics.median(slopes):.3f} | {statistics.median(diffs):+.2f} |")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps({"rows": rows, "summary": summary}, indent=1, default=str))
    (RESULTS / f"{name}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
