"""In-process CPU of one plain request's load ticket with ``state.backend: redis``, trees interleaved (not a test).

``python -m bench.shared_ticket_micro --baseline DIR [--aa DIR] [--rounds 6] [--requests 20000] [--name NAME]``

Session 17 (P16-3). The tracker chain gateway/build.py makes for the Redis backend with calibration:
``NotifyingLoadTracker(CalibratingLoadTracker(SharedLoadTracker(InProcessLoadTracker(), RemoteLoadView(),
emit), Calibration, time.monotonic))`` (``emit`` appends to a list, as the routing stream's queue takes
an event; the dispatcher's wake-up is a no-op). Per request, what the pipeline does with a plain answer's
ticket: ``dispatch``, then the first byte (at the byte's arrival, ``first_byte()``, unless the ticket's type
is in ``routing.calibration_tracker.LATE_FIRST_BYTE``: then ``observe_first_byte_at`` after the answer,
A15-2), ``finish``; the calibration's queued observations are applied every 64 requests. Per tree:
thread CPU µs per request (best of 5 passes of ``--requests``) and the Python calls of one request
(``sys.setprofile`` call + c_call events, noise-free); each tree in a fresh process (``PYTHONPATH`` =
the tree), alternating; an A/A copy (``--aa``) gives the noise. Results: ``bench/results/<name>.{json,md}``.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from bench.harness import run_child_json, write_json_and_markdown
from sim.click_options import ClickOptions

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"

_CHILD = r'''
import json, sys, time
N = int(sys.argv[1])
from gateway.flow_load import NotifyingLoadTracker
from routing.calibration import Calibration, CalibratingLoadTracker
from routing.calibration_tracker import LATE_FIRST_BYTE
from routing.load import InProcessLoadTracker
from routing.shared import RemoteLoadView, SharedLoadTracker
import routing
assert routing.__file__.startswith(sys.argv[2]), routing.__file__
events = []
cal = Calibration(prior_rate=10000.0)
cal.defer_observations(True)
tracker = NotifyingLoadTracker(CalibratingLoadTracker(SharedLoadTracker(InProcessLoadTracker(), RemoteLoadView(),
                                                                        events.append), cal, time.monotonic))
tracker.on_release = lambda: None
clock = time.monotonic

def one(i):
    t = tracker.dispatch("r%d" % (i % 4), 300, 16, 1, "tenant-a")
    if type(t) in LATE_FIRST_BYTE:
        t.observe_first_byte_at(clock())  # A15-2: after the answer's last part
    else:
        t.first_byte()  # at the byte's arrival
    t.finish()
    if i % 64 == 63:
        cal.flush()
        events.clear()

for i in range(2000):
    one(i)
calls = [0]
def count(frame, event, arg):
    if event in ("call", "c_call"):
        calls[0] += 1
sys.setprofile(count)
one(5)
sys.setprofile(None)
best = None
for _ in range(5):
    t0 = time.thread_time_ns()
    for i in range(N):
        one(i)
    dt = (time.thread_time_ns() - t0) / N / 1e3
    best = dt if best is None or dt < best else best
print(json.dumps({"us": round(best, 3), "calls": calls[0] - 1}))
'''


def measure(tree: Path, n: int) -> dict[str, Any]:
    """One child process on ``tree``: ``{"us", "calls"}``. Raises ``RuntimeError`` when it fails."""
    return run_child_json(tree, _CHILD, str(n), str(tree))  # type: ignore[no-any-return]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: the table to stdout and ``bench/results/<name>.{json,md}``."""
    ap = ClickOptions("bench.shared_ticket_micro", __doc__ or "")
    ap.option("--baseline", type=click.Path(path_type=Path, exists=True), required=True)
    ap.option("--aa", type=click.Path(path_type=Path, exists=True), default=None, help="a copy of this tree")
    ap.option("--rounds", type=int, default=6)
    ap.option("--requests", type=int, default=20000)
    ap.option("--out", type=click.Path(path_type=Path), default=RESULTS)
    ap.option("--name", default="shared_ticket_micro")
    args = ap.parse(argv)
    trees = {"this": REPO, "baseline": args.baseline.resolve(), **({"aa": args.aa.resolve()} if args.aa else {})}
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in trees}
    for r in range(args.rounds):
        for label in (list(trees) if r % 2 == 0 else list(trees)[::-1]):
            runs[label].append(measure(trees[label], args.requests))
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{k} {v[-1]['us']:.3f} µs" for k, v in runs.items()),
              flush=True)
    med = {k: {m: statistics.median(x[m] for x in v) for m in ("us", "calls")} for k, v in runs.items()}
    diff = {k: statistics.median(a["us"] - b["us"] for a, b in zip(runs["this"], v, strict=True))
            for k, v in runs.items() if k != "this"}
    doc = {"benchmark": "shared_ticket_micro", "trees": {k: str(v) for k, v in trees.items()}, "rounds": args.rounds,
           "requests": args.requests, "runs": runs, "median": med, "this_minus_us": diff}
    lines = [f"# A plain request's load ticket on the Redis backend's tracker chain "
             f"(`python -m bench.shared_ticket_micro`), {args.name}", "",
             f"{args.rounds} interleaved rounds, best of 5 passes of {args.requests} requests; thread CPU µs per "
             "request; Python calls of one request (dispatch, first byte or late observation, finish).", "",
             "| tree | path | µs | calls |", "|---|---|---:|---:|"]
    for k, m in med.items():
        lines.append(f"| {k} | `{trees[k]}` | {m['us']:.3f} | {m['calls']:.0f} |")
    lines += ["", "Median per-round difference, this minus: " + "; ".join(f"{k} {d:+.3f} µs" for k, d in diff.items())
              + "."]
    args.out.mkdir(parents=True, exist_ok=True)
    write_json_and_markdown(args.out / args.name, doc, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
