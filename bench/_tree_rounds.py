"""The per-tree benches' shared parts (S27-tidy27-5, session 29): one child process per source tree and
measurement, trees interleaved over rounds, and the report rows (bench/parse_micro.py, cut26_micro.py,
relay_micro.py, post_micro.py, cut28_micro.py, answer_micro.py, upstream_conn_micro.py).

A tree is a directory holding the project's packages (this checkout, or an export of another commit:
``git archive C | tar -x -C DIR``); a child runs with ``PYTHONPATH`` = the tree and its working directory the
tree, and prints its result as JSON on its last line of standard output. Figures are whatever the child
measures (thread CPU µs per call in every bench here)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

__all__ = ["child_json", "code_child", "interleaved", "median_range", "median_range_rows", "one_figure",
           "one_figure_rows", "this_minus", "this_minus_rows"]

R = TypeVar("R")
Order = Literal["rotate", "alternate", "fixed"]


def child_json(argv: Sequence[str], tree: str | Path, env: Mapping[str, str] | None = None) -> Any:
    """Run ``argv`` (a child process) with working directory ``tree`` and environment ``env`` (default: this
    process's with ``PYTHONPATH`` = ``tree``) and return the JSON value of its last line of standard output.

    Raises:
        subprocess.CalledProcessError: the child exited non-zero (its output on the exception).
        json.JSONDecodeError, IndexError: the last line is not JSON, or the child printed nothing.
    """
    env = {**os.environ, "PYTHONPATH": str(tree)} if env is None else dict(env)
    done = subprocess.run(list(argv), env=env, capture_output=True, text=True, check=True, cwd=str(tree))
    return json.loads(done.stdout.strip().splitlines()[-1])


def code_child(code: str, tree: str | Path, values: Mapping[str, object],
               env: Mapping[str, str] | None = None) -> Any:
    """:func:`child_json` of ``python -c`` on ``code`` after one ``NAME = repr(value)`` line per item of
    ``values`` (e.g. ``{"TREE": str(tree), "N": 20000}``), with this interpreter."""
    head = "".join(f"{name} = {value!r}\n" for name, value in values.items())
    return child_json([sys.executable, "-c", head + code], tree, env)


def _order(trees: list[tuple[str, R]], rnd: int, order: Order) -> list[tuple[str, R]]:
    if order == "rotate":  # round r starts at tree r mod the count
        k = rnd % len(trees)
        return trees[k:] + trees[:k]
    if order == "alternate":  # forward on even rounds, backward on odd ones
        return trees if rnd % 2 == 0 else trees[::-1]
    return trees


def interleaved(trees: Mapping[str, str | Path] | Sequence[tuple[str, str | Path]], rounds: int,
                measure: Callable[[str | Path], R], *, order: Order = "rotate",
                describe: Callable[[R], str] | None = None, load: bool = False,
                sep: str = "; ") -> tuple[dict[str, list[R]], list[float]]:
    """``measure(tree)`` (one child process, e.g. through :func:`child_json`) once per tree per round, the trees
    in ``order`` each round (``rotate``: round r starts at the r-th tree; ``alternate``: forward, then backward;
    ``fixed``: as given).

    After each round, when ``describe`` is given, prints ``round i/N[ (load L)]: NAME describe(result)`` for
    every tree, joined by ``sep`` (``load``: with the 1-minute load average).

    Returns:
        (results per tree name in round order, the 1-minute load average after each round).
    """
    named = list(trees.items()) if isinstance(trees, Mapping) else list(trees)
    rows: dict[str, list[R]] = {name: [] for name, _ in named}
    loads: list[float] = []
    for rnd in range(rounds):
        for name, tree in _order(named, rnd, order):
            rows[name].append(measure(tree))
        loads.append(os.getloadavg()[0])
        if describe is not None:
            head = f"round {rnd + 1}/{rounds}" + (f" (load {loads[-1]:.1f})" if load else "")
            print(f"{head}: " + sep.join(f"{name} {describe(got[-1])}" for name, got in rows.items()), flush=True)
    return rows, loads


def median_range(rows: Mapping[str, Sequence[Mapping[str, float]]], keys: Sequence[str],
                 digits: int) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, list[float]]]]:
    """Per tree and key: the median over the rounds, and ``[min, max]``, each rounded to ``digits``.

    Raises:
        KeyError: a round's result lacks a key. statistics.StatisticsError: a tree has no round."""
    summary = {n: {k: round(statistics.median(r[k] for r in got), digits) for k in keys} for n, got in rows.items()}
    spread = {n: {k: [round(min(r[k] for r in got), digits), round(max(r[k] for r in got), digits)] for k in keys}
              for n, got in rows.items()}
    return summary, spread


def median_range_rows(summary: Mapping[str, Mapping[str, float]], spread: Mapping[str, Mapping[str, Sequence[float]]],
                      keys: Sequence[str]) -> list[str]:
    """A Markdown table of :func:`median_range`: header ``| tree | key ... |``, then ``median [min-max]`` per
    tree and key."""
    lines = ["| tree | " + " | ".join(keys) + " |", "|---|" + "---:|" * len(keys)]
    for n in summary:
        lines.append(f"| {n} | " + " | ".join(f"{summary[n][k]} [{spread[n][k][0]}-{spread[n][k][1]}]" for k in keys)
                     + " |")
    return lines


def this_minus(runs: Mapping[str, Mapping[str, Sequence[float]]],
               keys: Sequence[str]) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """``runs`` (tree -> key -> one value per round; one tree named ``this``): the median per tree and key, and
    per other tree the median of the per-round differences ``this`` minus that tree.

    Raises:
        KeyError: no tree ``this``. ValueError: trees with different round counts."""
    med = {n: {k: statistics.median(v[k]) for k in keys} for n, v in runs.items()}
    diffs = {n: {k: statistics.median([a - b for a, b in zip(runs["this"][k], v[k], strict=True)]) for k in keys}
             for n, v in runs.items() if n != "this"}
    return med, diffs


def this_minus_rows(med: Mapping[str, Mapping[str, float]], diffs: Mapping[str, Mapping[str, float]],
                    keys: Sequence[str]) -> list[str]:
    """Two Markdown tables of :func:`this_minus` (3 decimals): the medians per tree, then (after a blank line,
    a caption and a blank line) the signed differences per other tree."""
    lines = ["| tree | " + " | ".join(keys) + " |", "|---|" + "---:|" * len(keys)]
    for n, v in med.items():
        lines.append(f"| {n} | " + " | ".join(f"{v[k]:.3f}" for k in keys) + " |")
    lines += ["", "Median per-round difference, this minus the other tree (µs/call):", "",
              "| vs | " + " | ".join(keys) + " |", "|---|" + "---:|" * len(keys)]
    for n, v in diffs.items():
        lines.append(f"| {n} | " + " | ".join(f"{v[k]:+.3f}" for k in keys) + " |")
    return lines


def one_figure(runs: Mapping[str, Sequence[float]]) -> tuple[dict[str, float], dict[str, float]]:
    """``runs`` (tree -> one figure per round; one tree named ``this``): the median per tree, and per other
    tree the median of the per-round differences ``this`` minus that tree.

    Raises:
        KeyError: no tree ``this``. ValueError: trees with different round counts."""
    diffs = {n: [a - b for a, b in zip(runs["this"], v, strict=True)] for n, v in runs.items() if n != "this"}
    return ({n: statistics.median(v) for n, v in runs.items()}, {n: statistics.median(v) for n, v in diffs.items()})


def one_figure_rows(trees: Mapping[str, str], runs: Mapping[str, Sequence[float]], med: Mapping[str, float],
                    diffs: Mapping[str, float]) -> list[str]:
    """A Markdown table of :func:`one_figure` (tree, its path, median, every round's figure; 2 decimals), a
    blank line and ``Median per-round difference, this minus: NAME ±d µs, ....``"""
    lines = ["| tree | path | median µs | runs |", "|---|---|---:|---|"]
    for n, v in runs.items():
        lines.append(f"| {n} | `{trees[n]}` | {med[n]:.2f} | {', '.join(f'{x:.2f}' for x in v)} |")
    return lines + ["", "Median per-round difference, this minus: " + ", ".join(
        f"{n} {v:+.2f} µs" for n, v in diffs.items()) + "."]
