"""Verify several gateway instances' audit chains at once (``prefixgate audit verify DIR1 DIR2 ...``, issue 16).

With ``state.backend: redis`` every gateway process keeps its own chain
(``serve --workers N`` writes worker ``i``'s files under ``<jsonl.dir>/worker-<i>``,
and ``audit.instance`` is stamped on every event). This module groups the
paths given into chains, verifies each chain on its own with
:func:`audit.verify.verify_files`, and checks the instance id:

* within a chain, every event naming an instance names the same one
  (``instance_mismatch`` otherwise: events of two instances spliced into
  one chain); events without an instance beside ones with it are counted
  (``events_without_instance``, a note: a chain started before
  ``audit.instance`` was set);
* across chains, no two chains name the same instance
  (``duplicate_instance``: a copied chain, or two instances configured with
  one id, so events could not be attributed).

Grouping (:func:`chain_groups`): every directory given is one chain if it holds
log files itself, and each of its subdirectories holding log files (the
``worker-*/`` of ``serve --workers N``) is one more chain; a directory holding
none itself but such subdirectories (the parent of ``worker-*/``) gives one
chain per subdirectory; all plain files given form one chain together, as
``audit verify FILE...`` always did. A directory reached twice (given, and
found under a parent given too) is one chain. Before session 24
(S24-newcomer-3) a directory with log files of its own was that one chain
only: the ``worker-*/`` chains beside its files (one ``jsonl.dir`` used first
by one ``serve``, then by ``serve --workers N``) were neither verified nor
named, and an edited worker record read ``OK``, exit 0.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from audit.jsonl import list_log_files
from audit.verify import verify_files
from audit.verify_keys import TrustedKeys, key_ring
from audit.verify_report import Problem, VerifyReport, format_report


@dataclass
class ChainReport:
    """One chain's result: its label (directory or ``files``), the instance it names, its report."""

    label: str
    paths: list[Path]
    report: VerifyReport
    instance: str | None = None
    events_without_instance: int = 0


@dataclass
class InstancesReport:
    """Result of :func:`verify_instances`: one :class:`ChainReport` per chain plus cross-chain problems."""

    chains: list[ChainReport] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    @property
    def status(self) -> str:
        """``FAILED`` if any chain failed or a cross-chain problem was found, else ``OK``."""
        if self.problems or any(c.report.status == "FAILED" for c in self.chains):
            return "FAILED"
        if any(c.report.status == "UNANCHORED" for c in self.chains):
            return "UNANCHORED"
        return "OK"


def chain_groups(paths: Sequence[str | Path]) -> list[tuple[str, list[Path]]]:
    """Split ``paths`` into chains: ``[(label, [path, ...]), ...]`` in the order given.

    A directory with log files is one chain, followed by one chain per
    subdirectory holding log files (sorted by name; one level down, as
    ``serve --workers N`` writes ``worker-<i>/``); a directory without log
    files but with such subdirectories is one chain per subdirectory; a
    directory with neither is one (empty) chain, reported by the verifier as
    missing; all plain files (and absent paths) together are one chain. A
    directory met twice (same resolved path) is one chain, where first met.
    Fails closed (S24-newcomer-3): every chain found under a directory given
    is verified, none is skipped silently.
    """
    groups: list[tuple[str, list[Path]]] = []
    loose: list[Path] = []
    seen: set[Path] = set()

    def add(d: Path) -> None:
        if d.resolve() not in seen:
            seen.add(d.resolve())
            groups.append((str(d), [d]))

    for p in map(Path, paths):
        if not p.is_dir():
            loose.append(p)
            continue
        subs = sorted(d for d in p.iterdir() if d.is_dir() and list_log_files(d))
        if list_log_files(p) or not subs:
            add(p)
        for d in subs:
            add(d)
    if loose:
        groups.insert(0, ("files", loose))
    return groups


def _instances(paths: list[Path]) -> tuple[dict[str, int], int]:
    """Counts of the instance ids named by the chain's event records, and events naming none."""
    named: dict[str, int] = {}
    without = 0
    files = [f for p in paths for f in (list_log_files(p) if p.is_dir() else [p]) if f.exists()]
    for f in files:
        with open(f, "rb") as fh:
            for raw in fh:
                try:
                    rec = json.loads(raw)
                    body = rec.get("body") if isinstance(rec, dict) else None
                except (ValueError, RecursionError):  # S25-review-4: RecursionError (a deep line) too
                    continue  # malformed lines are the chain verifier's to report
                if not isinstance(body, dict) or rec.get("type") != "event":
                    continue
                inst = body.get("instance")
                if isinstance(inst, str):
                    named[inst] = named.get(inst, 0) + 1
                else:
                    without += 1
    return named, without


def verify_instances(paths: Sequence[str | Path], public_key: TrustedKeys,
                     require_genesis: bool = True) -> InstancesReport:
    """Verify each chain found in ``paths`` (see :func:`chain_groups`) on its own, and the instance ids.

    Args:
        paths: directories (one per instance, or parents of ``worker-*/``) and/or files.
        public_key: the Ed25519 checkpoint key (the instances of one deployment share it), or
            several (across a rotation; :func:`audit.verify.verify_files`).
        require_genesis: each chain's first file must start the chain.

    Returns:
        An :class:`InstancesReport`; chain problems are in each chain's report,
        ``instance_mismatch`` too, ``duplicate_instance`` in the report's own list.
        Unreadable files raise ``OSError``.
    """
    out = InstancesReport()
    public_key = key_ring(public_key)  # a key id given twice raises once, before any chain
    owners: dict[str, str] = {}
    for label, group in chain_groups(paths):
        report = verify_files(group, public_key, require_genesis=require_genesis)
        named, without = _instances(group)
        chain = ChainReport(label, group, report, events_without_instance=without if named else 0)
        if len(named) > 1:
            report.problems.append(Problem(
                "instance_mismatch", label, None, None,
                "events of several instances in one chain: " + ", ".join(f"{k} ({v})" for k, v in sorted(named.items()))))
        elif named:
            chain.instance = next(iter(named))
            if chain.instance in owners:
                out.problems.append(Problem(
                    "duplicate_instance", label, None, None,
                    f"instance {chain.instance} also names the chain {owners[chain.instance]}"))
            owners.setdefault(chain.instance, label)
        out.chains.append(chain)
    return out


def format_instances_report(result: InstancesReport) -> str:
    """Multi-line text: each chain's report (indented) under its label and instance, then the combined line."""
    lines: list[str] = []
    for c in result.chains:
        lines.append(f"chain {c.label} instance={c.instance or '-'}:")
        lines.extend("  " + ln for ln in format_report(c.report).splitlines())
        if c.events_without_instance:
            lines.append(f"  note: {c.events_without_instance} event(s) name no instance")
    for p in result.problems:
        lines.append(f"{p.kind} at {p.file}: {p.detail}")
    failed = sum(c.report.status == "FAILED" for c in result.chains)
    lines.append(f"combined: chains={len(result.chains)} ok={len(result.chains) - failed} failed={failed} "
                 f"records={sum(c.report.records for c in result.chains)} -> {result.status}")
    return "\n".join(lines)


__all__ = ["ChainReport", "InstancesReport", "chain_groups", "format_instances_report", "verify_instances"]
