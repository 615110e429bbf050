"""In-process CPU of session 26's two per-answer cuts (issue 14, helper cut26), per source tree (not a test).

``python -m bench.cut26_micro --tree NAME=DIR [--tree ...] [--calls 20000] [--rounds 8] [--name NAME]``

Cases (each tree's own code, one request's share):

* ``breaker_ok``: :meth:`gateway.tenant_breaker.TenantBreaker.succeeded` of a 2xx answer, one replica and one
  tenant, the breaker's clock moving 1.7 ms per answer (the sequential benchmark's pace: the pair's entry is
  read every time and written again once per ``REFRESH_S``);
* ``queue_wait``: flow control's queue-wait observation (``FlowControl.observe_wait``'s metric call: the
  tree's ``GatewayMetrics.flow_queue_wait`` child where it has one, else ``flow_queue_wait_seconds``).

Every tree runs in a child process of its own (``PYTHONPATH=DIR``), rounds interleaved (the order rotates each
round); per round and case the best of 5 passes of ``--calls`` calls, thread CPU µs per call
(``time.thread_time``). Name one tree twice for the A/A. Results: ``bench/results/<name>.md`` and ``.json``.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import click

RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results"
CASES = ("breaker_ok", "queue_wait")


def _best(step: Callable[[int], None], calls: int) -> float:
    for i in range(500):
        step(i)
    best = float("inf")
    for _ in range(5):
        t0 = time.thread_time()
        for i in range(calls):
            step(i)
        best = min(best, (time.thread_time() - t0) * 1e6 / calls)
    return best


def _child(calls: int) -> dict[str, float]:
    """In the child: best-of-5 thread CPU µs per call of each case (this process's ``gateway``)."""
    from gateway.metrics import GatewayMetrics
    from gateway.tenant_breaker import TenantBreaker

    now = [1000.0]

    def clock() -> float:
        return now[0]

    breaker = TenantBreaker(3, 30.0, clock=clock)
    succeeded = breaker.succeeded

    def breaker_ok(_i: int) -> None:
        now[0] += 0.0017
        succeeded("replica-0", "tenant-a")

    metrics = GatewayMetrics()
    observe = (getattr(metrics, "flow_queue_wait", None) or metrics.flow_queue_wait_seconds).observe

    def queue_wait(i: int) -> None:
        observe(2e-6 * (i % 7))

    return {"breaker_ok": _best(breaker_ok, calls), "queue_wait": _best(queue_wait, calls)}


@click.command()
@click.option("--tree", "trees", multiple=True, required=True, help="NAME=DIR: a source tree (repeatable)")
@click.option("--calls", default=20000, show_default=True)
@click.option("--rounds", default=8, show_default=True)
@click.option("--name", default="cut26-micro", show_default=True)
@click.option("--child", is_flag=True, hidden=True)
def main(trees: tuple[str, ...], calls: int, rounds: int, name: str, child: bool) -> None:
    """CPU per call of each case, per source tree (module doc)."""
    if child:
        print(json.dumps(_child(calls)))
        return
    # here, not at the top: the child runs this file with another tree's ``bench`` first on its path
    from bench._tree_rounds import child_json, interleaved, median_range, median_range_rows

    named = [t.partition("=")[::2] for t in trees]
    rows, load = interleaved(named, rounds, lambda tree: child_json(
        [sys.executable, __file__, "--child", "--calls", str(calls), "--tree", "x=x"], tree),
        describe=lambda got: "/".join(f"{v:.3f}" for v in got.values()), load=True)
    summary, spread = median_range(rows, CASES, 3)
    doc = {"benchmark": "cut26_micro", "args": {"trees": list(trees), "calls": calls, "rounds": rounds},
           "python": sys.version.split()[0], "loadavg_per_round": load, "median_us": summary,
           "min_max_us": spread, "rows": rows}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(doc, indent=1))
    lines = [f"# Session 26 cut26's cuts in process: thread CPU µs per call (`python -m bench.cut26_micro`), {name}",
             "", f"{rounds} interleaved rounds; per round and case the best of 5 passes of {calls} calls (child process "
             f"per tree); median of the rounds [min-max]; Python {doc['python']}; 1-minute load average per round "
             f"{min(load):.1f}-{max(load):.1f} on 2 cores (machine shared with other helpers).", "",
             *median_range_rows(summary, spread, CASES)]
    lines += ["", "Trees: " + ", ".join(f"{n} = {t}" for n, t in named) + "."]
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
