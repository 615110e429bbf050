"""Where the "on" gateway's extra CPU per request goes in ``bench.audit_overhead`` (not a test).

Two readings of that bench's output (session 28, gwaudit28):

``python -m bench.audit_overhead_diff profiles DIR`` — the differential profile of the two gateways'
event-loop threads written by ``PG_BENCH_PROFILE=DIR python -m bench.audit_overhead`` (``off-<pid>.prof``,
``on-<pid>.prof``; cProfile on the thread-CPU clock). Everything is per request (the number of
``parse_inference_request`` calls of each profile): calls and tottime in total, the functions whose
tottime grows most from off to on, the functions of one mode only, and the calls into
``gateway/auditing.py`` (the gateway's audit surface) from outside it. cProfile adds ~1.6 µs of CPU per
call (this machine, thread clock), so absolute µs are inflated; compare calls and shares.

``python -m bench.audit_overhead_diff inflation RESULT.json ...`` — per ``bench.audit_overhead`` result
(its ``cpu_ms_per_request``): the gateway's CPU per request in its own rounds, on (and the baseline
tree's, if any) against off, beside the simulated replicas' (the same work in every mode: what they
gain in the "on" rounds is the machine's, i.e. contention or a slower machine, not audit work). The
gateway's extra over its off figure scaled by the replicas' change is the part the machine-wide
change does not explain; a least-squares line ``gateway change = a + b * replicas change`` over
all the files says how much is constant (``a``, the real extra work, as a fraction of off) and how
much follows the machine (``b``).
"""
from __future__ import annotations

import glob
import json
import pstats
import statistics
from pathlib import Path
from typing import Any

import click

#: (name, off ms, on ms, replicas off ms, replicas on ms): one gateway of one run, CPU per request
Pair = tuple[str, float, float, float, float]


def inflation_pairs(name: str, cpu_ms_per_request: dict[str, dict[str, float]]) -> list[Pair]:
    """The (gateway, replicas) pairs of one ``bench.audit_overhead`` result: ``gateway_on`` in the on
    rounds (and ``gateway_base`` in the baseline rounds) against ``gateway_off`` in the off rounds,
    with the replicas' CPU per request in the same rounds. ``cpu_ms_per_request``: the result's
    ``{process: {"off"|"on"|"base": ms per request}}``. Raises KeyError without a gateway or replicas row."""
    off = cpu_ms_per_request["gateway_off"]["off"]
    rep = cpu_ms_per_request["replicas"]
    out = [(name, off, cpu_ms_per_request["gateway_on"]["on"], rep["off"], rep["on"])]
    if "gateway_base" in cpu_ms_per_request and "base" in rep:
        out.append((f"{name} base", off, cpu_ms_per_request["gateway_base"]["base"], rep["off"], rep["base"]))
    return out


def extra_us(pair: Pair) -> float:
    """µs per request the gateway spends above its off figure scaled by the replicas' change."""
    _, off, on, rep_off, rep_on = pair
    return (on - off * rep_on / rep_off) * 1000.0


def fit(pairs: list[Pair]) -> tuple[float, float, float]:
    """Least squares over ``pairs``: (a, b, correlation) of ``on/off - 1 = a + b * (rep_on/rep_off - 1)``
    (fractions). Raises ``statistics.StatisticsError`` with fewer than two pairs or constant x."""
    xs = [p[4] / p[3] - 1 for p in pairs]
    ys = [p[2] / p[1] - 1 for p in pairs]
    b, a = statistics.linear_regression(xs, ys)
    return a, b, statistics.correlation(xs, ys)


def _short(key: tuple[str, int, str]) -> str:
    path = key[0]
    for cut in ("site-packages/", "python3.11/"):
        path = path.split(cut)[-1]
    for top in ("gateway/", "audit/", "routing/", "tenancy/", "bench/"):
        if f"/{top}" in path:
            path = top + path.split(f"/{top}", 1)[1]
    return f"{path}:{key[1]}:{key[2]}"


def _requests(stats: dict[Any, Any]) -> int:
    return max(v[1] for k, v in stats.items() if k[2] == "parse_inference_request")


@click.group()
def main() -> None:
    """Readings of bench.audit_overhead's output (module doc)."""


@main.command()
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--top", type=int, default=25)
def profiles(directory: Path, top: int) -> None:
    """Differential profile of DIRECTORY's off-*.prof and on-*.prof, per request."""
    st = {m: pstats.Stats(glob.glob(str(directory / f"{m}-*.prof"))[0]).stats for m in ("off", "on")}
    n = {m: _requests(s) for m, s in st.items()}
    for m in ("off", "on"):
        s = st[m]
        click.echo(f"{m}: {n[m]} requests, {sum(v[1] for v in s.values()) / n[m]:.1f} calls and "
                   f"{sum(v[2] for v in s.values()) / n[m] * 1e6:.1f} µs tottime per request")
    rows = []
    for k in set(st["off"]) | set(st["on"]):
        a, b = st["off"].get(k), st["on"].get(k)
        per = [(v[1] / n[m], v[2] / n[m] * 1e6, v[3] / n[m] * 1e6) if v else (0.0, 0.0, 0.0)
               for m, v in (("off", a), ("on", b))]
        rows.append((per[1][1] - per[0][1], _short(k), per[0], per[1]))
    line = "{:>8.2f} {:>7.2f} {:>7.2f} {:>8.2f} {:>8.2f} {:>9.2f} {:>9.2f}  {}"
    head = "{:>8} {:>7} {:>7} {:>8} {:>8} {:>9} {:>9}  {}".format(
        "d tot", "c/r off", "c/r on", "tot off", "tot on", "cum off", "cum on", "function")
    for title, sel in (("tottime per request, largest increase off -> on (µs)", sorted(rows, reverse=True)[:top]),
                       ("only in on, by cumtime", sorted((r for r in rows if r[2][0] == 0), key=lambda r: -r[3][2])[:top]),
                       ("only in off, by cumtime", sorted((r for r in rows if r[3][0] == 0), key=lambda r: -r[2][2])[:top])):
        click.echo(f"\n{title}\n{head}")
        for d, name, o, i in sel:
            click.echo(line.format(d, o[0], i[0], o[1], i[1], o[2], i[2], name))
    click.echo("\ncalls into gateway/auditing.py from outside it (per request: calls, cumtime µs)")
    for m in ("off", "on"):
        total = 0.0
        for k, v in sorted(st[m].items(), key=lambda kv: -kv[1][3]):
            if "gateway/auditing.py" not in k[0]:
                continue
            outside = [c for ck, c in v[4].items() if "gateway/auditing.py" not in ck[0]]
            if outside:
                calls, cum = sum(c[0] for c in outside) / n[m], sum(c[3] for c in outside) / n[m] * 1e6
                total += cum
                click.echo(f"  {m:>3} {k[2]:<24} {calls:5.2f} {cum:8.1f}")
        click.echo(f"  {m:>3} {'total':<24} {'':5} {total:8.1f}")


@main.command()
@click.argument("results", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
def inflation(results: tuple[Path, ...]) -> None:
    """Gateway vs replicas CPU per request, on against off, for each RESULTS json (module doc)."""
    pairs: list[Pair] = []
    for path in results:
        pairs += inflation_pairs(path.stem.removeprefix("audit_overhead-"),
                                 json.loads(path.read_text())["cpu_ms_per_request"])
    click.echo("| run | gateway off ms | on ms | change | replicas off ms | on ms | change | extra over replicas-scaled off, µs |")
    click.echo("|---|---:|---:|---:|---:|---:|---:|---:|")
    for p in pairs:
        name, off, on, rep_off, rep_on = p
        click.echo(f"| {name} | {off:.3f} | {on:.3f} | {(on / off - 1) * 100:+.1f} % | {rep_off:.3f} | {rep_on:.3f} "
                   f"| {(rep_on / rep_off - 1) * 100:+.1f} % | {extra_us(p):+.0f} |")
    extras = [extra_us(p) for p in pairs]
    click.echo(f"\nextra over replicas-scaled off: median {statistics.median(extras):+.1f} µs "
               f"(min {min(extras):+.0f}, max {max(extras):+.0f}; {len(pairs)} gateways)")
    if len(pairs) >= 2:
        a, b, r = fit(pairs)
        click.echo(f"fit: gateway change = {a * 100:+.1f} % + {b:.2f} x replicas change (correlation {r:.2f})")


if __name__ == "__main__":
    main()
