"""In-process CPU of the session-16 ``post`` cuts, this tree vs others (not a test).

``python -m bench.post_micro --baseline DIR [--aa DIR] [--rounds 6] [--n 20000] [--name post_micro]``

Issue 14, session 16 (helper ``post``). Four figures per tree, each the best of 9 passes of ``--n``
calls in thread CPU µs per call, each tree in its own process, the trees interleaved (this, baseline,
A/A copy of this) for ``--rounds`` rounds:

* ``cut_spaced``: a ``drop`` tenant's plain answer written as aiohttp's ``json_response`` writes it (the
  simulator: ``": "`` and ``", "``), what the answer path runs on it (``may_name_cached`` or the details
  check, then ``plain_without_cached``) on the 250-byte answer of bench.answer_micro (A15-1);
* ``cut_compact``: the same answer compact (vLLM's shape; must not get slower);
* ``fb_path`` / ``fb_tail``: a plain answer's load ticket (the gateway's trackers: in-process, calibrating
  with deferred observations, notifying) at its first byte's arrival (``post``: ``first_byte()`` where the
  tree calls it there) and after the last part (the tree's late observation if any, ``finish()``, the
  calibration's flush, as ``_after_answer`` runs them), timed per request with the cost of the clock
  reads (an empty pair) subtracted (A15-2);
* ``sse4``: a ``drop`` tenant's stream read of four delta events (``SseScanner.feed``) (S15-3);
* ``sse1``: one read of one 16-token delta event, the stream past its second event; ``sse_stream``: a whole
  32-event stream as the simulated replicas send it (one read per event, fresh scanner), per event (session 21).
Medians and per-round differences: ``bench/results/<name>.{json,md}``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from bench._tree_rounds import code_child, interleaved, this_minus, this_minus_rows
from sim.click_options import ClickOptions

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"

_CHILD = r'''
import json, sys, time
sys.path.insert(0, TREE)
import orjson
from gateway import usage_privacy as up
from gateway.sse import SseScanner
from gateway.flow_load import NotifyingLoadTracker
from routing.calibration import Calibration, CalibratingLoadTracker
from routing.load import InProcessLoadTracker
assert up.__file__.startswith(TREE), up.__file__
OBJ = {"id": "cmpl-5f1e2d3c4b5a69788796a5b4", "object": "text_completion", "created": 1764670000,
       "model": "sim-model", "choices": [{"index": 0, "text": "lorem", "logprobs": None, "finish_reason": "length"}],
       "usage": {"prompt_tokens": 64, "completion_tokens": 1, "total_tokens": 65,
                 "prompt_tokens_details": {"cached_tokens": 48}}}
SPACED = json.dumps(OBJ).encode()
COMPACT = orjson.dumps(OBJ)

def cut(data):
    obj = orjson.loads(data)
    usage = obj.get("usage")
    def one():
        if ("prompt_tokens_details" in usage) or up.may_name_cached(data):
            return up.plain_without_cached(data, obj, usage)
        return data
    out = one()
    assert b"cached_tokens" not in out and orjson.loads(out) == up.without_counter(obj), out
    return one

def best(fn, n):
    b = 1e9
    for _ in range(9):
        t0 = time.thread_time_ns()
        for _ in range(n):
            fn()
        b = min(b, (time.thread_time_ns() - t0) / n / 1000)
    return b

res = {"cut_spaced": best(cut(SPACED), N), "cut_compact": best(cut(COMPACT), N)}

cal = Calibration(prior_rate=10000.0)
cal.defer_observations(True)
notifying = NotifyingLoadTracker(CalibratingLoadTracker(InProcessLoadTracker(), cal, time.monotonic))
notifying.on_release = lambda: None
try:
    from routing.calibration_tracker import LATE_FIRST_BYTE
except ImportError:
    LATE_FIRST_BYTE = frozenset()
def request(clock=time.thread_time_ns):
    """One plain answer's ticket: dispatch (untimed), the first byte's arrival (path), the end (tail)."""
    t = notifying.dispatch("r1", 64, 1, 1, "t", True)
    t0 = clock()
    if type(t) not in LATE_FIRST_BYTE:
        t.first_byte()
    t1 = clock()
    if type(t) in LATE_FIRST_BYTE:
        t.observe_first_byte_at(time.perf_counter())
    t.finish()
    cal.flush()  # as the gateway's _after_answer, once per request
    return t1 - t0, clock() - t1
def empty(clock=time.thread_time_ns):
    t0 = clock(); t1 = clock(); return t1 - t0, clock() - t1
path = tail = 1e9
for _ in range(9):
    p = q = e1 = e2 = 0
    for _ in range(N):
        a, b = request(); c, d = empty(); p += a; q += b; e1 += c; e2 += d
    path = min(path, (p - e1) / N / 1000); tail = min(tail, (q - e2) / N / 1000)
res["fb_path"], res["fb_tail"] = path, tail

DELTA = b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"sim-model","choices":[{"index":0,"text":" w","logprobs":null,"finish_reason":null}]}\n\n'
READ = DELTA * 4
sc = SseScanner(keep_usage_chunk=False, drop_cached=True)
sc.feed(DELTA)
assert sc.feed(READ) == READ
res["sse4"] = best(lambda: sc.feed(READ), N)

# session 21: a whole 32-event stream as the simulated replicas send it (16-token deltas, one read each, the
# gateway's usage event dropped), on a fresh scanner per stream: µs per event
HEAD = '{"id":"cmpl-0123456789abcdef01234567","object":"text_completion","created":1764763200,"model":"sim-model","choices":[{"index":0,"text":"'
def ev(text, finish="null"):
    return ('data: ' + HEAD + text + '","logprobs":null,"finish_reason":' + finish + '}],"usage":null}\n\n').encode()
STREAM = [ev(" w0")] + [ev("".join(f" w{i}x{j}" for j in range(16))) for i in range(30)] + [ev(" end" * 16, '"length"'),
          b'data: {"id":"cmpl-0123456789abcdef01234567","object":"text_completion","created":1764763200,"model":"sim-model","choices":[],"usage":{"prompt_tokens":64,"completion_tokens":497,"total_tokens":561}}\n\ndata: [DONE]\n\n']
def stream():
    s = SseScanner(keep_usage_chunk=False, drop_cached=True)
    for c in STREAM:
        s.feed(c)
    s.finish()
    assert s.output_tokens == 32 and s.events == 33, (s.output_tokens, s.events)
res["sse_stream"] = best(stream, max(1, N // 32)) / 32
sc1 = SseScanner(keep_usage_chunk=False, drop_cached=True)
for c in STREAM[:3]:
    sc1.feed(c)
res["sse1"] = best(lambda: sc1.feed(STREAM[5]), N)
print(json.dumps(res))
'''

FIGURES = ("cut_spaced", "cut_compact", "fb_path", "fb_tail", "sse4", "sse1", "sse_stream")


def one(tree: Path, n: int) -> dict[str, float]:
    """The figures (µs per call) on the code of ``tree``."""
    return code_child(_CHILD, tree, {"TREE": str(tree), "N": n})  # type: ignore[no-any-return]


def run(trees: dict[str, Path], rounds: int, n: int) -> dict[str, Any]:
    """Interleaved rounds over ``trees`` (label -> source tree); returns the result document."""
    rows, _ = interleaved(trees, rounds, lambda tree: one(Path(tree), n), order="alternate",
                          describe=lambda got: " ".join(f"{f} {got[f]:.2f}" for f in FIGURES))
    runs = {k: {f: [r[f] for r in got] for f in FIGURES} for k, got in rows.items()}
    med, diffs = this_minus(runs, FIGURES)
    return {"trees": {k: str(v) for k, v in trees.items()}, "rounds": rounds, "n": n, "runs": runs,
            "median_us": med, "this_minus_median_us": diffs}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    ap = ClickOptions(prog="python -m bench.post_micro", description=__doc__.splitlines()[0])
    ap.option("--baseline", type=click.Path(path_type=Path), required=True)
    ap.option("--aa", type=click.Path(path_type=Path), default=None, help="a copy of this tree (A/A noise)")
    ap.option("--rounds", type=int, default=6)
    ap.option("--n", type=int, default=20000)
    ap.option("--out", type=click.Path(path_type=Path), default=RESULTS)
    ap.option("--name", default="post_micro")
    args = ap.parse(argv)
    trees = {"this": REPO, "baseline": args.baseline.resolve(), **({"aa": args.aa.resolve()} if args.aa else {})}
    doc = run(trees, args.rounds, args.n)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = [f"# Session-16 post cuts, CPU per call in process (`python -m bench.post_micro`), {args.name}", "",
             f"{doc['rounds']} interleaved rounds, best of 9 x {doc['n']} calls each; thread CPU µs/call.", "",
             *this_minus_rows(doc["median_us"], doc["this_minus_median_us"], FIGURES)]
    (args.out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
