"""Pooled reading of :mod:`bench.critical_path` runs with the trees' roles swapped (issue 14, session 25, helper
cut; not a test).

``python -m bench.critical_path_pairs --dir DIR --out FILE.md "LABEL:AB,BA[,AB2,BA2...]" [...]``

One ``bench.critical_path`` run compares two ``prefixgate serve`` processes; session 25 found a per-process offset
(an A/A of one tree against its own export differed by up to ~40 µs total thread CPU per request, stable over the
run's 16 rounds), so more rounds of one run do not shrink it. This reading pairs a run where tree X is ``this``
(the first process started, its bench file) with one where X is ``baseline``: per run the median over rounds of the
per-round difference (this - baseline, µs), then X - Y = (d(X as this) - d(Y as this)) / 2 per pair of runs,
which cancels an offset of the slot; the median and the range over the pairs. Each argument names (after its
LABEL, which holds no colon) the JSON results (``DIR/<name>.json``) of runs with X as ``this`` and with Y as
``this``, alternating. Figures: thread CPU µs per request of the windows ``pre`` (arrival to upstream send),
``post`` (answer to last part sent), their total, and the work after the last part (``tail``).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import click

KEYS = ("total_cpu", "pre_cpu", "post_cpu", "tail_cpu")


def paired(doc: dict) -> dict[str, float]:
    """Median over the rounds of (this - baseline) for each of :data:`KEYS` (µs)."""
    rows = zip(doc["per_round"]["this"], doc["per_round"]["baseline"])
    diffs: dict[str, list[float]] = {k: [] for k in KEYS}
    for a, b in rows:
        for k in KEYS:
            diffs[k].append(a[k] - b[k])
    return {k: statistics.median(v) for k, v in diffs.items()}


@click.command()
@click.option("--dir", "directory", type=click.Path(path_type=Path), required=True)
@click.option("--out", type=click.Path(path_type=Path), required=True)
@click.argument("pairs", nargs=-1, required=True)
def main(directory: Path, out: Path, pairs: tuple[str, ...]) -> None:
    """Write the pooled table (module doc) to ``--out`` and print it."""
    lines = ["| comparison | runs (X as this / Y as this) | total CPU X - Y, median [range] | pre | post | tail |",
             "|---|---|---:|---:|---:|---:|"]
    for spec in pairs:
        label, _, names = spec.partition(":")
        runs = [paired(json.loads((directory / f"{n}.json").read_text())) for n in names.split(",")]
        halves = [{k: (x[k] - y[k]) / 2 for k in KEYS} for x, y in zip(runs[::2], runs[1::2])]
        cells = []
        for k in KEYS:
            vals = [h[k] for h in halves]
            cells.append(f"{statistics.median(vals):+.1f} [{min(vals):+.1f}, {max(vals):+.1f}]")
        lines.append(f"| {label} | {names.replace(',', ', ')} | " + " | ".join(cells) + " |")
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
