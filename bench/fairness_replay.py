"""Benchmark: the Mooncake replay with and without flow control (issue 17), median of N runs.

``python -m bench.fairness_replay [--runs 3] [--rows 1000] [--settings off,on,engaged,engaged_wait4] [--out FILE]``

Each run is ``prefixgate-sim demo --rows R --policies cache_aware --skew-rows 0`` (6 simulated
replicas, 3 tenants, time scale 10, no flood) in a child process, flow control chosen by
environment overrides of the gateway configuration:

* ``off``: ``PREFIXGATE__FLOW__ENABLED=false`` (the router alone, as before issue 17);
* ``on``: the defaults (generous bounds: nothing waits);
* ``engaged``: ``PREFIXGATE__FLOW__REPLICA_MAX_QUEUED_PREFILL_TOKENS=1500`` (about three average
  prompts per replica: a fifth of the requests wait) and ``flow.locality_wait_ratio`` 1 (the first
  session's locality rule, the default when these results were taken);
* ``engaged_wait4``: as ``engaged`` with ``flow.locality_wait_ratio`` 4, the default now (wait for
  the prefix replica while its drain is up to 4x the prefix, instead of 1x); ``engaged_wait16``: 16x.

Runs are interleaved (off, on, engaged, off, ...) so that a change in the machine's load touches
every setting alike. Reported per setting: the field-wise median of TTFT p50/p90/p99, e2e p50/p99
(trace seconds) and the prefix-cache hit rate, and each against ``off``. Loopback only; bounded
(about one to two minutes per run). The machine may be shared: read the ratios.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sim.click_options import ClickOptions

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "bench" / "results" / "fairness_replay.json"
FIELDS = ("ttft_p50", "ttft_p90", "ttft_p99", "e2e_p50", "e2e_p99", "hit_rate")
SETTINGS: dict[str, dict[str, str]] = {
    "off": {"PREFIXGATE__FLOW__ENABLED": "false"},
    "on": {},
    "engaged": {"PREFIXGATE__FLOW__REPLICA_MAX_QUEUED_PREFILL_TOKENS": "1500",
                "PREFIXGATE__FLOW__LOCALITY_WAIT_RATIO": "1"},
    "engaged_wait4": {"PREFIXGATE__FLOW__REPLICA_MAX_QUEUED_PREFILL_TOKENS": "1500",
                      "PREFIXGATE__FLOW__LOCALITY_WAIT_RATIO": "4"},
    "engaged_wait16": {"PREFIXGATE__FLOW__REPLICA_MAX_QUEUED_PREFILL_TOKENS": "1500",
                       "PREFIXGATE__FLOW__LOCALITY_WAIT_RATIO": "16"},
}


def _run(setting: str, rows: int, out: Path, timeout_s: float) -> dict[str, Any]:
    """One demo run of ``setting``; its cache_aware summary (raises on failure)."""
    env = {**os.environ, **SETTINGS[setting], "PYTHONPATH": str(ROOT)}
    name = f"replay-{setting}-{time.monotonic_ns()}"
    cmd = [sys.executable, "-m", "sim.cli", "demo", "--rows", str(rows), "--policies", "cache_aware",
           "--skew-rows", "0", "--out", str(out), "--name", name]
    subprocess.run(cmd, env=env, cwd=ROOT, check=True, timeout=timeout_s, stdout=subprocess.DEVNULL)
    doc = json.loads((out / f"{name}.json").read_text())
    return doc["routers"][0]


def main() -> None:
    """Run the settings ``--runs`` times each, interleaved; write ``--out`` (.json)."""
    ap = ClickOptions(description=__doc__.splitlines()[0])
    ap.option("--runs", type=int, default=3)
    ap.option("--rows", type=int, default=1000)
    ap.option("--settings", default="off,on,engaged")
    ap.option("--timeout-s", type=float, default=600.0, help="bound on one run")
    ap.option("--out", default=str(DEFAULT_OUT))
    args = ap.parse()
    settings = [s for s in args.settings.split(",") if s]
    each: dict[str, list[dict[str, Any]]] = {s: [] for s in settings}
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="pg-replay-") as d:
        for i in range(args.runs):
            for s in settings:
                t = time.monotonic()
                r = _run(s, args.rows, Path(d), args.timeout_s)
                each[s].append({f: r.get(f) for f in FIELDS} | {"errors": r.get("errors"), "ok": r.get("ok")})
                print(f"run {i + 1} {s:8s} hit {r['hit_rate']:.3f} TTFT p50 {r['ttft_p50']:.3f} "
                      f"p99 {r['ttft_p99']:.3f} ({time.monotonic() - t:.0f} s)", flush=True)
    medians = {s: {f: statistics.median(x[f] for x in runs) for f in FIELDS} for s, runs in each.items()}
    ratios = {s: {f: round(m[f] / medians["off"][f], 3) for f in FIELDS}
              for s, m in medians.items() if "off" in medians and s != "off"}
    doc = {"command": f"python -m bench.fairness_replay --runs {args.runs} --rows {args.rows} "
                      f"--settings {args.settings}",
           "settings": {s: SETTINGS[s] for s in settings},
           "machine": f"{os.cpu_count()} CPUs, shared with other jobs; load average {load_start} -> "
                      f"{os.getloadavg()}",
           "medians": medians, "vs_off": ratios, "each_run": each}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({"medians": medians, "vs_off": ratios}, indent=1))


if __name__ == "__main__":
    main()
