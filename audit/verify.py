"""Offline verification of hash-chained audit files (``prefixgate audit verify``).

Detects, and reports the first of: a modified record (hash mismatch), a
missing record (sequence gap), reordered records, a broken link between
records or files, a missing file in the middle of the chain (a header names
a predecessor that is absent), a checkpoint whose Ed25519 signature does not
verify or whose head does not match the chain, and (when given) an off-host
checkpoint copy that the files no longer contain.

Cannot detect (documented in docs/audit.md): records appended after the last
checkpoint and then removed (truncation of the unsealed tail) unless an
off-host checkpoint copy newer than the remaining tail is supplied; removal
of whole trailing files without an off-host copy; a complete rewrite by
someone who also holds the signing key.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from audit.chain import GENESIS, checkpoint_signature_ok, key_id, record_hash
from audit.jsonl import FILE_SUFFIX, list_log_files


@dataclass(frozen=True, slots=True)
class Problem:
    """One verification failure. ``line`` is 1-based within ``file``."""

    kind: str  # modified|missing_record|reordered|broken_link|missing_file|bad_signature|checkpoint_mismatch|malformed|off_host_mismatch
    file: str
    line: int | None
    seq: int | None
    detail: str


@dataclass
class VerifyReport:
    """Result of :func:`verify_files`. ``ok`` is False if any problem."""

    files: int = 0
    records: int = 0
    checkpoints: int = 0
    unsealed_records: int = 0
    last_checkpoint: dict[str, Any] | None = None
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no problem was found."""
        return not self.problems

    @property
    def first_problem(self) -> Problem | None:
        """The first problem in chain order, or None."""
        return self.problems[0] if self.problems else None


def _expand(paths: Iterable[str | Path]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        out.extend(list_log_files(p) if p.is_dir() else [p])
    return out


def _load(path: Path, report: VerifyReport) -> list[tuple[int, dict[str, Any]]]:
    records = []
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            try:
                rec = json.loads(raw)
                if not isinstance(rec, dict) or not {"seq", "type", "prev", "body", "hash"} <= rec.keys():
                    raise ValueError("missing fields")
            except ValueError as exc:
                report.problems.append(Problem("malformed", path.name, lineno, None, str(exc)))
                continue
            records.append((lineno, rec))
    return records


def verify_files(
    paths: Sequence[str | Path],
    public_key: Ed25519PublicKey,
    off_host_checkpoints: Iterable[dict[str, Any]] = (),
    require_genesis: bool = True,
) -> VerifyReport:
    """Verify chained audit files (files or directories) against ``public_key``.

    Args:
        paths: log files and/or directories (all ``audit-*.jsonl`` inside).
        public_key: the Ed25519 checkpoint verification key.
        off_host_checkpoints: checkpoint bodies received by other sinks; each
            must be present (same head_seq and head) in the files.
        require_genesis: the first file must start the chain (no predecessor).

    Returns:
        A :class:`VerifyReport`; problems are in chain order. Content errors
        and absent paths are reported, not raised; unreadable files raise
        ``OSError``.
    """
    report = VerifyReport()
    kid = key_id(public_key)
    loaded: list[tuple[Path, list[tuple[int, dict[str, Any]]]]] = []
    for path in _expand(paths):
        if not path.exists():
            report.problems.append(Problem("missing_file", path.name, None, None, "file given but not found"))
            continue
        loaded.append((path, _load(path, report)))
    loaded.sort(key=lambda item: item[1][0][1]["seq"] if item[1] else float("inf"))
    names = {p.name for p, _ in loaded}
    report.files = len(loaded)
    head, expect_seq = GENESIS, 0
    prev_file: str | None = None
    seen_checkpoints: dict[int, str] = {}
    since_checkpoint = 0
    for index, (path, records) in enumerate(loaded):
        fname = path.name
        seqs = {r["seq"] for _, r in records}
        if records and records[0][1]["type"] != "header":
            report.problems.append(Problem("malformed", fname, records[0][0], None, "file does not start with a header"))
        elif records:
            first_line, first = records[0]
            pred = first["body"].get("predecessor")
            if index == 0 and pred is not None:
                if require_genesis:
                    report.problems.append(
                        Problem("missing_file", fname, first_line, first["seq"], f"predecessor {pred} not given")
                    )
                head, expect_seq = first["prev"], first["seq"]
            elif index > 0 and pred != prev_file:
                kind = "missing_file" if pred not in names else "broken_link"
                report.problems.append(
                    Problem(kind, fname, first_line, first["seq"], f"predecessor {pred} expected, chain has {prev_file}")
                )
        for lineno, rec in records:
            seq, rtype, prev, body = rec["seq"], rec["type"], rec["prev"], rec["body"]
            report.records += 1
            if record_hash(seq, rtype, prev, body) != rec["hash"] and \
                    record_hash(seq, rtype, prev, body, legacy=True) != rec["hash"]:
                report.problems.append(Problem("modified", fname, lineno, seq, "record hash does not match its content"))
            elif seq != expect_seq:
                if seq > expect_seq and any(s in seqs for s in range(expect_seq, seq)):
                    kind, detail = "reordered", f"seq {seq} where {expect_seq} expected (it appears later)"
                elif seq > expect_seq:
                    kind, detail = "missing_record", f"records {expect_seq}..{seq - 1} missing"
                else:
                    kind, detail = "reordered", f"seq {seq} after {expect_seq - 1}"
                report.problems.append(Problem(kind, fname, lineno, seq, detail))
            elif prev != head:
                report.problems.append(Problem("broken_link", fname, lineno, seq, "prev does not match previous record hash"))
            if rtype == "checkpoint":
                report.checkpoints += 1
                if body.get("key_id") != kid or not checkpoint_signature_ok(public_key, body):
                    report.problems.append(Problem("bad_signature", fname, lineno, seq, "checkpoint signature invalid"))
                elif body.get("head") != prev or body.get("head_seq") != seq - 1:
                    report.problems.append(
                        Problem("checkpoint_mismatch", fname, lineno, seq, "checkpoint head is not the preceding record")
                    )
                else:
                    seen_checkpoints[int(body["head_seq"])] = str(body["head"])
                    report.last_checkpoint = body
                since_checkpoint = 0
            else:
                since_checkpoint += 1
            head, expect_seq = rec["hash"], max(seq, expect_seq - 1) + 1
        prev_file = fname
    report.unsealed_records = since_checkpoint
    for cp in off_host_checkpoints:
        hs = cp.get("head_seq")
        if seen_checkpoints.get(hs) != cp.get("head"):  # type: ignore[arg-type]
            report.problems.append(
                Problem("off_host_mismatch", str(cp.get("file", "?")), None, hs, "off-host checkpoint not found in files (truncated or forked)")
            )
    return report


def format_report(report: VerifyReport) -> str:
    """Human-readable multi-line summary for the CLI."""
    lines = [
        f"files={report.files} records={report.records} checkpoints={report.checkpoints} "
        f"unsealed_records={report.unsealed_records} -> {'OK' if report.ok else 'FAILED'}"
    ]
    for p in report.problems:
        where = f"{p.file}:{p.line}" if p.line is not None else p.file
        lines.append(f"  {p.kind} at {where} seq={p.seq}: {p.detail}")
    if report.unsealed_records:
        lines.append(f"  note: {report.unsealed_records} record(s) after the last checkpoint are not sealed")
    return "\n".join(lines)


__all__ = ["Problem", "VerifyReport", "verify_files", "format_report", "FILE_SUFFIX"]
