"""Gateways of the same code started from differently made trees, side by side (not a test).

``python -m bench.tree_start_aa --tree repo=/work/main --tree export=DIR --tree aa=DIR2 [--rounds 10]
[--requests 300] [--name NAME]``

Session 28 (S28-lead-1): is a gateway started from the repository (``/work/main``: the editable install's
tree, its ``__pycache__``, ``.git``, ``prefixgate.egg-info``) dearer per request than one started from an
export of the same commit (``git archive | tar -x``)? Every tree's gateway is started by
``bench.overhead``'s one start path (:func:`bench.overhead._start_slot`: ``python -P -m gateway.cli serve``,
working directory and ``PYTHONPATH`` = the tree) on the ``bench.overhead`` configuration (policy from the
tree's own ``rego/``), all of them live at once in front of one simulated replica. After 200 warm-up
requests each, ``--rounds`` rounds of ``--requests`` sequential requests go to each gateway in turn (order
reversed every other round). Per round and gateway, from ``/proc``: the event loop thread's CPU (the
scheduler's ns count), all threads' CPU, minor page faults, voluntary and involuntary context switches (per
request) and the client's p50. Reported: medians over the rounds, and per tree the median of its per-round
difference to the first ``--tree`` (paired; with an A/A copy in the set, the noise beside it).
Results: ``bench/results/<name>.{json,md}``; the work directory (configs, logs, audit files) is removed.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import click

from bench.overhead import RESULTS, WARMUP, _Body, _second_config, _start_slot, sequential
from sim.click_options import ClickOptions

#: per-request figures of a round (``counters`` deltas over the round's requests), then the client's p50
FIELDS = ("main_us", "all_us", "minflt", "vcsw", "ivcsw", "p50_us")


def counters(pid: int) -> dict[str, int]:
    """``/proc`` counters of process ``pid`` (Linux): ``main_ns`` (its main thread's time on a CPU, ns),
    ``all_ns`` (every live thread's), ``minflt`` (minor page faults), ``vcsw`` / ``ivcsw`` (voluntary and
    involuntary context switches of the main thread). Raises OSError when the process is gone."""
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    main_ns = int(Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[0])
    all_ns = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            all_ns += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass  # a thread that ended meanwhile
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {"main_ns": main_ns, "all_ns": all_ns, "minflt": int(stat[7]),
            "vcsw": int(status["voluntary_ctxt_switches"]), "ivcsw": int(status["nonvoluntary_ctxt_switches"])}


def started_from(pid: int) -> dict[str, str]:
    """How process ``pid`` runs (Linux ``/proc``): its working directory, ``PYTHONPATH`` and ``GOGC`` (after
    ``prefixgate serve``'s re-exec) and command line. Raises OSError when the process is gone."""
    env = dict(item.split("=", 1) for item in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in item)
    return {"cwd": os.readlink(f"/proc/{pid}/cwd"), "PYTHONPATH": env.get("PYTHONPATH", ""),
            "GOGC": env.get("GOGC", ""), "cmdline": Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ").strip()}


def per_request(before: Mapping[str, int], after: Mapping[str, int], n: int) -> dict[str, float]:
    """The :func:`counters` deltas per request over ``n`` requests: CPU in µs (``main_us``, ``all_us``),
    the counts as they are."""
    out = {k: (after[k] - before[k]) / n for k in ("minflt", "vcsw", "ivcsw")}
    out["main_us"] = (after["main_ns"] - before["main_ns"]) / n / 1e3
    out["all_us"] = (after["all_ns"] - before["all_ns"]) / n / 1e3
    return out


def paired_to_first(per: Mapping[str, Sequence[Mapping[str, float]]], keys: Sequence[str]) -> dict[str, dict[str, Any]]:
    """For every tree but the first of ``per`` (tree -> its rounds' rows, round ``i`` at index ``i``): per key the
    median over rounds of (tree's row minus the first tree's row of the same round), rounded to 0.01, and
    ``higher``: in how many rounds the tree's ``main_us`` was above the first's."""
    names = list(per)
    first = per[names[0]]
    out: dict[str, dict[str, Any]] = {}
    for name in names[1:]:
        pairs = list(zip(per[name], first, strict=False))
        out[name] = {k: round(statistics.median(a[k] - b[k] for a, b in pairs), 2) if pairs else None for k in keys}
        out[name]["higher"] = sum(1 for a, b in pairs if a["main_us"] > b["main_us"])
    return out


async def run(trees: Mapping[str, Path], rounds: int, requests: int) -> dict[str, Any]:
    """The measurement (module doc); returns the result document."""
    from bench.harness import start_demo_stack
    from sim.demo import ClusterSpec
    from sim.procs import stop_process

    load_start = os.getloadavg()
    stack = await start_demo_stack(Path(tempfile.mkdtemp(prefix="pg-tree-start-aa-")),
                                   ClusterSpec(replicas=1, time_scale=1e6, decode_s_per_token=0.0))
    cfg = stack.gateway_config(["tenant-a"])
    headers = {"Content-Type": "application/json", **dict(stack.headers_for(["tenant-a"])("tenant-a"))}
    bodies = _Body(False)
    live: dict[str, tuple[Any, str]] = {}
    per: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    started: dict[str, dict[str, str]] = {}
    try:
        for name, tree in trees.items():
            doc = _second_config(cfg, stack.paths, name)
            doc["policy"]["dir"] = str(tree / "rego")
            live[name] = await _start_slot(name, tree, doc, stack.paths)
        for name, (proc, base) in live.items():
            started[name] = started_from(proc.pid)
            await sequential(base + "/v1/completions", headers, WARMUP * 4, bodies)
        names = list(trees)
        for r in range(rounds):
            for name in (names if r % 2 == 0 else names[::-1]):
                proc, base = live[name]
                before = counters(proc.pid)
                seq = await sequential(base + "/v1/completions", headers, requests, bodies)
                row = per_request(before, counters(proc.pid), requests)
                row["p50_us"] = seq["p50_ms"] * 1e3
                per[name].append(row)
            print(f"round {r + 1}/{rounds}: " + "; ".join(f"{n} {per[n][-1]['main_us']:.1f}" for n in names), flush=True)
    finally:
        for proc, _ in live.values():
            stop_process(proc)
        stack.stop()
        shutil.rmtree(stack.paths.work, ignore_errors=True)
    med = {n: {k: round(statistics.median(x[k] for x in rows), 2) for k in FIELDS} for n, rows in per.items()}
    return {"benchmark": "tree_start_aa", "trees": {k: str(v) for k, v in trees.items()}, "rounds": rounds,
            "requests": requests, "started": started, "loadavg": {"start": load_start, "end": os.getloadavg()}, "median": med,
            "paired_to_first": paired_to_first(per, FIELDS), "per_round": per}


def to_markdown(doc: Mapping[str, Any], name: str) -> str:
    """The result document as a markdown table."""
    first = next(iter(doc["trees"]))
    lines = [f"# Gateways started from differently made trees (`python -m bench.tree_start_aa`), {name}", "",
             f"{doc['rounds']} rounds of {doc['requests']} sequential requests per gateway, alternating; per request; "
             f"load average (1 min) {doc['loadavg']['start'][0]:.2f} -> {doc['loadavg']['end'][0]:.2f}.", "",
             f"| tree | path | loop thread CPU µs | all threads CPU µs | minor faults | vol. switches | invol. switches "
             f"| client p50 µs | loop CPU minus {first}'s, paired (rounds higher) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for n, m in doc["median"].items():
        p = doc["paired_to_first"].get(n)
        paired = "-" if p is None else f"{p['main_us']:+.1f} ({p['higher']}/{doc['rounds']})"
        lines.append(f"| {n} | `{doc['trees'][n]}` | {m['main_us']:.1f} | {m['all_us']:.1f} | {m['minflt']:.2f} | "
                     f"{m['vcsw']:.2f} | {m['ivcsw']:.2f} | {m['p50_us']:.0f} | {paired} |")
    lines += ["", "Started (after the re-exec): " + "; ".join(
        f"{n}: cwd `{v['cwd']}`, PYTHONPATH `{v['PYTHONPATH']}`, GOGC {v['GOGC'] or '-'}"
        for n, v in doc.get("started", {}).items()) + "."]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: the table to stdout and ``bench/results/<name>.{json,md}``."""
    ap = ClickOptions("bench.tree_start_aa", (__doc__ or "").splitlines()[0])
    ap.option("--tree", "trees", multiple=True, required=True, metavar="NAME=DIR",
              help="a source tree to start a gateway from (repeatable; the first is the reference)")
    ap.option("--rounds", type=int, default=10)
    ap.option("--requests", type=int, default=300)
    ap.option("--out", type=click.Path(path_type=Path), default=RESULTS)
    ap.option("--name", default="tree_start_aa")
    args = ap.parse(argv)
    trees: dict[str, Path] = {}
    for item in args.trees:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise SystemExit(f"--tree {item!r}: expected NAME=DIR")
        trees[name] = Path(path).resolve()
    import uvloop

    doc = uvloop.run(run(trees, args.rounds, args.requests))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    md = to_markdown(doc, args.name)
    (args.out / f"{args.name}.md").write_text(md)
    print(md, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
