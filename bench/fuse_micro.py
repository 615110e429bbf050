"""In-process A/B of session 14's "fuse" cuts, this tree vs another, interleaved (not a test).

``python -m bench.fuse_micro --baseline DIR [--rounds 5] [--name fuse_micro]``

Issue 14, session 14. Each round runs one fresh ``python`` process per tree (``PYTHONPATH`` = the tree; the
trees alternate, order reversed every other round; pass this tree itself as ``--baseline`` for an A/A
check) that times, warm, with ``time.thread_time`` (best of 7 loops of 20,000), per call:

* ``ticket``: the gateway's load-accounting chain as :mod:`gateway.build` wires it for ``cache_aware``
  (``NotifyingLoadTracker(CalibratingLoadTracker(InProcessLoadTracker()))``, notice = a flow-control-like
  no-op): ``dispatch`` + ``first_byte`` + ``finish`` of one request, the calibration's flush after it;
* ``counters``: a reservation's and a settlement's per-tenant token counters (4 + 5 increments through
  the gateway's counter batch, as ``Admission.check_prompt`` / ``_count_settlement`` make them), with
  the batch flushed every 1000 requests.

Also the Python calls of one iteration (``sys.setprofile``: ``call`` + ``c_call`` events). Results:
``bench/results/<name>.{json,md}``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import click

from sim.click_options import ClickOptions

REPO = Path(__file__).resolve().parents[1]

_CHILD = r'''
import json, sys, time
from routing.load import InProcessLoadTracker
from routing.calibration import CalibratingLoadTracker, Calibration
from gateway.flow_load import NotifyingLoadTracker
from gateway.metrics import GatewayMetrics
cal = Calibration(prior_rate=10000.0)
cal.defer_observations(True)
loads = NotifyingLoadTracker(CalibratingLoadTracker(InProcessLoadTracker(), cal, time.monotonic))
loads.on_release = lambda: None
def ticket():
    t = loads.dispatch("r0", 48, 1, 1, "tenant-a", True)
    t.first_byte()
    t.finish()
    cal.flush()
m = GatewayMetrics()
fam_r, fam_c, fam_f, fam_ch = m.tenant_tokens_reserved, m.tenant_tokens_charged, m.tenant_tokens_refunded, m.tenant_charges
rp, ro = fam_r.labels("tenant-a", "prompt"), fam_r.labels("tenant-a", "output")
cp, co, fp, fo = (fam_c.labels("tenant-a", "prompt"), fam_c.labels("tenant-a", "output"),
                  fam_f.labels("tenant-a", "prompt"), fam_f.labels("tenant-a", "output"))
add = getattr(m.batch, "add", None)
n = [0]
def counters():
    if add is not None:
        add(((rp, 64), (ro, 1)))
        add(((cp, 64), (co, 1), (fp, 0), (fo, 0), (fam_ch.labels("tenant-a", "usage"), 1)))
    else:
        rp.inc(64); ro.inc(1)
        for c, v in ((cp, 64), (co, 1), (fp, 0), (fo, 0)):
            c.inc(v)
        fam_ch.labels("tenant-a", "usage").inc()
    n[0] += 1
    if n[0] % 1000 == 0:
        m.batch.flush()
out = {}
for name, f in (("ticket", ticket), ("counters", counters)):
    for _ in range(2000):
        f()
    best = float("inf")
    for _ in range(7):
        t0 = time.thread_time()
        for _ in range(20000):
            f()
        best = min(best, (time.thread_time() - t0) / 20000 * 1e6)
    calls = [0]
    def prof(frame, event, arg):
        if event in ("call", "c_call"):
            calls[0] += 1
    sys.setprofile(prof); f(); sys.setprofile(None)
    out[name] = {"us": round(best, 3), "calls": calls[0] - 1}
print(json.dumps(out))
'''


def measure(tree: Path) -> dict[str, dict[str, float]]:
    """One child process of ``tree``: its figures per case."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", _CHILD], env=env, check=True, capture_output=True, text=True, cwd=tree)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    ap = ClickOptions(prog="python -m bench.fuse_micro", description=__doc__.splitlines()[0])
    ap.option("--baseline", type=click.Path(path_type=Path), required=True)
    ap.option("--rounds", type=int, default=5)
    ap.option("--name", default="fuse_micro")
    ap.option("--out", type=click.Path(path_type=Path), default=REPO / "bench" / "results")
    args = ap.parse(argv)
    trees = {"this": REPO, "baseline": args.baseline}
    runs: dict[str, list[dict[str, dict[str, float]]]] = {"this": [], "baseline": []}
    for r in range(args.rounds):
        for name in (["this", "baseline"] if r % 2 == 0 else ["baseline", "this"]):
            runs[name].append(measure(trees[name]))
    cases = sorted(runs["this"][0])
    summary = {c: {t: {"us": statistics.median(x[c]["us"] for x in runs[t]), "calls": runs[t][0][c]["calls"]}
                   for t in trees} for c in cases}
    doc = {"baseline": str(args.baseline), "rounds": args.rounds, "runs": runs, "summary": summary}
    lines = [f"# fuse micro A/B (`python -m bench.fuse_micro --baseline {args.baseline} --rounds {args.rounds}`)", "",
             "| case | this µs | baseline µs | this calls | baseline calls |", "|---|---:|---:|---:|---:|"]
    for c in cases:
        s = summary[c]
        lines.append(f"| {c} | {s['this']['us']:.3f} | {s['baseline']['us']:.3f} | {s['this']['calls']} | "
                     f"{s['baseline']['calls']} |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    (args.out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
