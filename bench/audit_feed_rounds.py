"""What the two audit-worker feed benches share (not a test): ``bench.audit_worker_feed`` and
``bench.audit_overhead_worker`` (session 12: one copy instead of two).

Parent side only: their child processes run with another tree's ``PYTHONPATH`` (a ``--baseline``
tree may not have this module), so the child gets :func:`worker_config`'s result in its argument
instead of importing it.

* :func:`worker_config`: the worker's audit section, as ``bench.audit_overhead``'s "on" gateway
  configures it (JSONL hash chain, OCSF file, CEF over TCP syslog, OTLP logs, spill; ``spans``: the
  OTLP tracing section);
* :func:`feed_trees`: this tree, plus ``--baseline`` or (``--same``, an A/A) this tree again;
* :func:`alternate_rounds`: the receivers' process (syslog, OTLP; ``bench.audit_worker_cpu``) and
  the rounds, each tree once per round, the order alternating;
* :func:`paired_medians`: per tree the median of each figure, and the median per-round difference
  of each tree against the first.
"""
from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

__all__ = ["worker_config", "feed_trees", "alternate_rounds", "paired_medians"]


def worker_config(work: Path, key_file: Path, ports: tuple[int, int], *, spans: bool,
                  checkpoint_s: float = 1.0) -> dict[str, Any]:
    """The audit worker's config (``audit.worker``'s first line) writing under ``work``, signing with
    ``key_file``, sending CEF to ``127.0.0.1:ports[0]`` (TCP) and OTLP to ``127.0.0.1:ports[1]``;
    ``spans``: with the ``spans`` section (OTLP/HTTP ``/v1/traces``, as ``AuditHub.from_config`` adds it)."""
    doc: dict[str, Any] = {
        "jsonl": {"dir": str(work / "audit"), "signing_key_file": str(key_file), "checkpoint_s": checkpoint_s},
        "ocsf": {"file": str(work / "ocsf.jsonl")},
        "syslog": {"host": "127.0.0.1", "port": ports[0], "protocol": "tcp", "format": "cef"},
        "otlp": {"endpoint": f"http://127.0.0.1:{ports[1]}/v1/logs"},
        "spill": {"dir": str(work / "spill")}}
    if spans:
        doc["spans"] = {"exporter": "otlp", "endpoint": f"http://127.0.0.1:{ports[1]}/v1/traces",
                        "resource": {"service.name": "prefixgate", "telemetry.sdk.language": "python"},
                        "resource_schema_url": None}
    return doc


def feed_trees(this: Path, baseline: Path | None, same: bool) -> dict[str, Path]:
    """The trees of a comparison, by name: ``this``, then ``baseline`` (resolved) or, when ``same``,
    ``this`` again as ``this_again`` (an A/A)."""
    if same:
        return {"this": this, "this_again": this}
    return {"this": this} | ({"baseline": baseline.resolve()} if baseline else {})


def alternate_rounds(trees: dict[str, Path], rounds: int,
                     run: Callable[[str, Path, tuple[int, int], int], dict[str, Any]]) -> list[dict[str, Any]]:
    """Start the receivers' process, then ``rounds`` rounds of ``run(name, tree, ports, round)`` for each
    tree (even rounds in ``trees``' order, odd ones reversed); each result gets its ``tree`` and
    ``round`` and is printed. Returns the results in run order; the receivers are stopped at the end."""
    import multiprocessing as mp

    from bench.audit_worker_cpu import _receivers

    parent, child = mp.Pipe()
    recv = mp.get_context("spawn").Process(target=_receivers, args=(child,), daemon=True)
    recv.start()
    rows: list[dict[str, Any]] = []
    try:
        ports = parent.recv()
        for i in range(rounds):
            for name in (list(trees) if i % 2 == 0 else list(trees)[::-1]):
                r = run(name, trees[name], ports, i) | {"tree": name, "round": i}
                rows.append(r)
                print(r, flush=True)
    finally:
        recv.kill()
        recv.join(5)
    return rows


def paired_medians(rows: list[dict[str, Any]], names: list[str], keys: Iterable[str], rounds: int,
                   digits: int | None = None) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """``(median, difference)``: per tree in ``names`` the median of each of ``keys`` over its rows, and
    per tree after the first the median over rounds of (its figure - the first tree's, same round);
    rounded to ``digits`` when given."""
    keys = tuple(keys)

    def fig(x: float) -> float:
        return round(x, digits) if digits is not None else x

    def one(tree: str, key: str, i: int) -> float:
        return next(r[key] for r in rows if r["tree"] == tree and r["round"] == i)

    med = {t: {k: fig(statistics.median(r[k] for r in rows if r["tree"] == t)) for k in keys} for t in names}
    diff = {t: {k: fig(statistics.median(one(t, k, i) - one(names[0], k, i) for i in range(rounds))) for k in keys}
            for t in names[1:]}
    return med, diff
