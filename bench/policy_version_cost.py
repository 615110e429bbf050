"""A/B of the per-event cost of ``policy.version`` (session 25 fixops, S24-newcomer-4).

``python -m bench.policy_version_cost --base DIR [--rounds R] [--events N] [--out FILE]``

Per request event, the audit worker's format path: :func:`audit.request_event.request_event` of a request
row, the canonical JSON (:func:`audit.encoded.shared_json`, the JSONL record body and the OTLP log body),
:func:`audit.ocsf.ocsf_line` and :func:`audit.cef.cef_line`; process CPU (``time.process_time_ns``),
microseconds per event, best of 5 passes over ``N`` rows. Each round runs, in fresh child processes and in
this order, tree A (``--base``, e.g. ``git archive c7e7fbd``), tree B (this tree, rows with a policy
version), then A again: A/B and the A/A noise floor side by side. Gateway side (not measured here): one
method call (``RequestRecord.decided``) instead of a three-name assignment and one more row value.

Results: ``bench/results/policy_version_cost.json`` (or ``--out``). A benchmark, not a test.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import click

_CHILD = r"""
import time, uuid, json, sys
from audit.request_event import REQUEST_ROW_FIELDS, request_event
from audit.encoded import shared_json
from audit.ocsf import ocsf_line
from audit.cef import cef_line
n = int(sys.argv[1])
rows = []
for i in range(n):
    t = 1000.0 + i
    row = [str(uuid.UUID(int=i)), 1764000000000 + i, "allowed", f"{i:032x}",
           "spiffe://demo.prefixgate.test/tenant-a/app", "demo.prefixgate.test", "tenant-a",
           str(uuid.UUID(int=i + 1)), "allowed", "entitled", "/v1/completions", "sim-model", 100, 4, 1,
           104, 104, 100, 4, 4, "usage", None, "r0", "default", "cache_aware", 64, 64, 64, 1200.0,
           t, t + 1e-4, t + 2e-4, t + 3e-4, t + 4e-4, t + 5e-4, t + 2e-3, t + 3e-3,
           200, "127.0.0.1", f"{i:032x}", f"{i * 7:016x}" * 2, None, 0.0, None]
    if len(REQUEST_ROW_FIELDS) == len(row) + 1:
        row.append(7)  # policy_version
    rows.append(row)
best = None
for _ in range(5):
    t0 = time.process_time_ns()
    for row in rows:
        ev = request_event(row)
        shared_json(ev, keep=False)
        ocsf_line(ev)
        cef_line(ev)
    us = (time.process_time_ns() - t0) / 1000 / n
    best = us if best is None else min(best, us)
print(json.dumps({"us_per_event": best, "row_values": len(REQUEST_ROW_FIELDS)}))
"""


def _run(tree: Path, events: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", _CHILD, str(events)], cwd=tree, env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


@click.command()
@click.option("--base", "base", type=click.Path(exists=True, file_okay=False, path_type=Path), required=True)
@click.option("--rounds", default=6, show_default=True)
@click.option("--events", default=5000, show_default=True)
@click.option("--out", type=click.Path(path_type=Path), default=Path("bench/results/policy_version_cost.json"))
def main(base: Path, rounds: int, events: int, out: Path) -> None:
    """Interleaved rounds A, B, A (see the module doc)."""
    here = Path(__file__).resolve().parents[1]
    res: dict[str, list[float]] = {"A": [], "B": [], "A2": []}
    for _ in range(rounds):
        for name, tree in (("A", base), ("B", here), ("A2", base)):
            res[name].append(_run(tree, events)["us_per_event"])
    summary = {k: {"median_us": statistics.median(v), "min_us": min(v), "max_us": max(v), "rounds": v}
               for k, v in res.items()}
    summary["B_minus_A_median_us"] = summary["B"]["median_us"] - summary["A"]["median_us"]
    summary["A2_minus_A_median_us"] = summary["A2"]["median_us"] - summary["A"]["median_us"]
    summary["note"] = "shared 2-core machine (5 helpers working); process CPU, best of 5 passes per child"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2) + "\n")
    click.echo(json.dumps({k: v for k, v in summary.items() if k != "note"}, indent=None)[:2000])


if __name__ == "__main__":
    main()
