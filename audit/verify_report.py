"""The result of verifying an audit trail: :class:`Problem`, :class:`VerifyReport`, and its text form for the CLI.

Filled by :func:`audit.verify.verify_files` (and :func:`audit.verify_anchors.load_anchors`
for problems with the anchor files).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Problem:
    """One verification failure. ``line`` is 1-based within ``file``."""

    kind: str  # modified|missing_record|reordered|broken_link|missing_file|bad_signature|checkpoint_mismatch|malformed|off_host_mismatch|truncated|bad_anchor|unknown_key|retired_key
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
    #: True when anchors (off-host checkpoint copies) were checked at all
    anchored: bool = False
    #: anchors that matched the files
    anchors_matched: int = 0
    #: anchors signed by another key (another gateway's trail): ignored
    anchors_foreign: int = 0
    #: anchors older than the first record given (``require_genesis=False``): not checkable
    anchors_before_range: int = 0
    #: head_seq of the last checkpoint an anchor confirms, or None
    last_anchored_seq: int | None = None
    #: event records after ``last_anchored_seq`` (all of them when none matched)
    unanchored_records: int = 0
    #: verified checkpoints per signing key id, in chain order of first use (S23-newcomer-4)
    checkpoints_by_key: dict[str, int] = field(default_factory=dict)
    #: times the signing key id changed between consecutive verified checkpoints (one per rotation)
    key_switches: int = 0
    #: key ids a file header in the range retires (session 24: their later checkpoints are ``retired_key``)
    keys_retired: int = 0

    @property
    def ok(self) -> bool:
        """True when no problem was found (see :attr:`status` for the anchored tail)."""
        return not self.problems

    @property
    def status(self) -> str:
        """``FAILED`` (a problem), ``UNANCHORED`` (anchors were checked and event
        records follow the last anchored checkpoint) or ``OK``."""
        if self.problems:
            return "FAILED"
        if self.anchored and self.unanchored_records:
            return "UNANCHORED"
        return "OK"

    @property
    def first_problem(self) -> Problem | None:
        """The first problem in chain order, or None."""
        return self.problems[0] if self.problems else None


def format_report(report: VerifyReport) -> str:
    """Human-readable multi-line summary for the CLI."""
    head = (f"files={report.files} records={report.records} checkpoints={report.checkpoints} "
            f"unsealed_records={report.unsealed_records}")
    if report.anchored:
        head += (f" anchors={report.anchors_matched} last_anchored_seq={report.last_anchored_seq} "
                 f"unanchored_records={report.unanchored_records}")
    lines = [f"{head} -> {report.status}"]
    for p in report.problems:
        where = f"{p.file}:{p.line}" if p.line is not None else p.file
        lines.append(f"  {p.kind} at {where} seq={p.seq}: {p.detail}")
    if len(report.checkpoints_by_key) > 1:
        lines.append("  note: checkpoints signed by several keys (a key rotation): " +
                     ", ".join(f"key id {k} ({n})" for k, n in report.checkpoints_by_key.items()) +
                     f"; the key changed {report.key_switches} time(s) in chain order, "
                     f"{report.keys_retired} rotation(s) recorded (a retired key may not sign again)")
    if report.unsealed_records:
        lines.append(f"  note: {report.unsealed_records} record(s) after the last checkpoint are not sealed")
    if report.anchored:
        if report.unanchored_records:
            lines.append(f"  unanchored: {report.unanchored_records} event record(s) after the last externally "
                         "anchored checkpoint; their removal could not be detected")
        if report.anchors_foreign:
            lines.append(f"  note: {report.anchors_foreign} checkpoint copies signed by another key ignored")
        if report.anchors_before_range:
            lines.append(f"  note: {report.anchors_before_range} checkpoint copies before the first file given")
    else:
        lines.append("  note: not checked against off-host checkpoint copies (--anchors): "
                     "a file cut after its last checkpoint would still read as complete")
    return "\n".join(lines)
