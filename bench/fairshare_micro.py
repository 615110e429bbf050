"""In-process micro-benchmark of flow control's release path with a prefill-token bound (session 25,
fairshare: the per-tenant share of a replica's prefill room, gateway/flow_share.py). CPU µs per request
(``time.thread_time``, best of 7 loops) for ``FlowControl._release_now`` + the ticket's first byte + its
end, in three cases:

- ``alone_idle``: one tenant, each request ends before the next (it holds nothing at placement: one
  dict lookup on the share path);
- ``alone_busy``: one tenant with 8 requests in flight (it holds prefill on the replicas: the share check
  runs, no other tenant active);
- ``two_busy``: tenants a and b alternating, 8 in flight (the share check with another tenant active).

Each tree runs in its own process (``PYTHONPATH=tree``), trees interleaved round by round; give the same
tree twice for an A/A. Usage::

    python bench/fairshare_micro.py --tree before=/tmp/before --tree after=. --tree after2=. --rounds 6

Prints one line per round and tree, then the median per tree and case (µs/request).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

import click

CHILD = r"""
import json, sys, time
from collections import deque
from gateway.config_flow import FlowConfig
from gateway.flow_waiting import Waiting
from tests.gateway.test_s2_flow_dispatch import make, req
N = int(sys.argv[1])
ids = ["r0", "r1", "r2"]

def run(tenants, depth):
    flow = make(FlowConfig(replica_max_queued_prefill_tokens=10**9, replica_max_running_requests=10**6), n=3)
    ring = deque()
    best = 1e9
    for _ in range(7):
        c0 = time.thread_time()
        for i in range(N):
            w = Waiting(tenants[i % len(tenants)], 1.0, req(prompt=100, keys=(b"k%d" % (i % 64), b"u%d" % i)), ids, ())
            flow._release_now(w)
            t = w.result[1]
            ring.append(t)
            if len(ring) > depth:
                old = ring.popleft()
                old.first_byte()
                old.finish()
        best = min(best, (time.thread_time() - c0) / N * 1e6)
    return best

print(json.dumps({"alone_idle": run(["a"], 0), "alone_busy": run(["a"], 8), "two_busy": run(["a", "b"], 8)}))
"""


@click.command(help="A/B + A/A of flow control's release path (module doc).")
@click.option("--tree", "tree", multiple=True, required=True, help="name=path (repeat; same path twice: A/A)")
@click.option("--rounds", type=int, default=6, show_default=True)
@click.option("--n", type=int, default=20000, show_default=True, help="requests per timing loop")
@click.option("--python", default=sys.executable, show_default=True)
def main(tree: tuple[str, ...], rounds: int, n: int, python: str) -> None:
    trees = [t.split("=", 1) for t in tree]
    res: dict[str, list[dict[str, float]]] = {name: [] for name, _ in trees}
    for r in range(rounds):
        order = trees if r % 2 == 0 else trees[::-1]
        for name, path in order:
            out = subprocess.run([python, "-c", CHILD, str(n)], cwd=path, env={"PYTHONPATH": path},
                                 capture_output=True, text=True, check=True).stdout
            res[name].append(json.loads(out))
            print(f"round {r} {name}: {out.strip()}", flush=True)
    for name, rows in res.items():
        med = {k: round(statistics.median(x[k] for x in rows), 3) for k in rows[0]}
        spread = {k: round(max(x[k] for x in rows) - min(x[k] for x in rows), 3) for k in rows[0]}
        print(f"median {name}: {json.dumps(med)} spread {json.dumps(spread)}")


if __name__ == "__main__":
    main()
