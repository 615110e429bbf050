"""Offline verification of hash-chained audit files (``prefixgate audit verify``).

Detects, and reports the first of: a modified record (hash mismatch), a
missing record (sequence gap), reordered records, a broken link between
records or files, a missing file in the middle of the chain (a header names
a predecessor that is absent), a checkpoint whose Ed25519 signature does not
verify or whose head does not match the chain, and (when given) an off-host
checkpoint copy that the files no longer contain.

Anchors: the JSONL sink hands every checkpoint to the other sinks as a
``kind="checkpoint"`` event, so the OCSF file, the syslog receiver's file (CEF
or OCSF payload) and the OTLP collector hold signed copies keyed by
``head_seq`` and ``head`` (chain hash). :func:`load_anchors` reads those copies
back from such files; given to :func:`verify_files` as ``anchors``, each one
(signature checked) must match the files: a copy sealing a sequence number the
files no longer reach means the files were cut (``truncated``), a copy whose
hash differs means a fork or rewrite (``off_host_mismatch``). Event records
after the last anchored checkpoint are counted as ``unanchored_records`` and
the report's status is ``UNANCHORED``, never plain ``OK``.

Cannot detect (documented in docs/audit.md): records appended after the last
externally anchored checkpoint and then removed (reported as unanchored, not
as missing); without anchors, truncation after the last in-file checkpoint
and removal of whole trailing files; a complete rewrite by someone who also
holds the signing key and every anchor copy.
"""
from __future__ import annotations

import bisect
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from audit.cef import CefParseError, parse_cef
from audit.chain import GENESIS, checkpoint_signature_ok, key_id, record_hash
from audit.jsonl import FILE_SUFFIX, list_log_files


@dataclass(frozen=True, slots=True)
class Problem:
    """One verification failure. ``line`` is 1-based within ``file``."""

    kind: str  # modified|missing_record|reordered|broken_link|missing_file|bad_signature|checkpoint_mismatch|malformed|off_host_mismatch|truncated|bad_anchor
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


_CHECKPOINT_FIELDS = frozenset({"file", "head_seq", "head", "time", "key_id", "sig"})
_CEF_MSG_PAIR = re.compile(r"(?:^|; )([a-z_]+)=")


def _checkpoint_bodies(value: Any, depth: int = 0) -> Iterator[dict[str, Any]]:
    """Checkpoint bodies anywhere inside a decoded JSON value: a chain record
    (``type`` checkpoint), an audit event (``checkpoint``), an OCSF event
    (``unmapped.prefixgate.checkpoint``), an OTLP JSON export (event JSON in a
    string body), or a bare body."""
    if depth > 12:
        return
    if isinstance(value, dict):
        if _CHECKPOINT_FIELDS <= value.keys():
            yield value
            return
        for v in value.values():
            yield from _checkpoint_bodies(v, depth + 1)
    elif isinstance(value, list):
        for v in value:
            yield from _checkpoint_bodies(v, depth + 1)
    elif isinstance(value, str) and value.startswith("{") and '"head_seq"' in value:
        try:
            yield from _checkpoint_bodies(json.loads(value), depth + 1)
        except ValueError:
            return


def _cef_checkpoint(line: str) -> dict[str, Any] | None:
    """The checkpoint body of a CEF ``checkpoint:sealed`` line (``msg`` holds
    ``k=v; k=v`` sorted by key, see :func:`audit.cef.format_cef`), else None."""
    try:
        header, ext = parse_cef(line)
    except CefParseError:
        return None
    if header[4] != "checkpoint:sealed" or "msg" not in ext:
        return None
    msg = ext["msg"]
    keys = list(_CEF_MSG_PAIR.finditer(msg))
    body = {m.group(1): msg[m.end():(keys[i + 1].start() if i + 1 < len(keys) else len(msg))]
            for i, m in enumerate(keys)}
    return body if _CHECKPOINT_FIELDS <= body.keys() else None


def _normalise(body: dict[str, Any]) -> dict[str, Any] | None:
    """The signed fields of a checkpoint copy with their JSONL types
    (``head_seq`` int, the rest strings), or None if they cannot be."""
    try:
        out = {k: str(body[k]) for k in _CHECKPOINT_FIELDS if k != "head_seq"}
        out["head_seq"] = int(body["head_seq"])
    except (KeyError, TypeError, ValueError):
        return None
    return out


def load_anchors(paths: Iterable[str | Path]) -> tuple[list[dict[str, Any]], list[Problem]]:
    """Read checkpoint copies ("anchors") from files other sinks wrote
(``paths``: files, or directories whose files are all read).

    Accepted, line by line: JSON lines (the OCSF file, JSON event or chain
    record copies, OTLP JSON exports), and text lines such as a syslog
    receiver's file with a CEF payload (``CEF:0|...|checkpoint:sealed|...``)
    or an OCSF JSON payload after the syslog header. Lines without a
    checkpoint are skipped.

    Returns:
        ``(anchors, problems)``: each anchor is a checkpoint body
        (``file, head_seq, head, time, key_id, sig``) plus ``source``
        (``path:line``), de-duplicated by ``(head_seq, head, sig)``; problems
        name anchor files that do not exist. Signatures are checked by
        :func:`verify_files`.
    """
    anchors: list[dict[str, Any]] = []
    problems: list[Problem] = []
    seen: set[tuple[int, str, str]] = set()
    files: list[Path] = []
    for path in map(Path, paths):
        files.extend(sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path])
    for path in files:
        if not path.is_file():
            problems.append(Problem("missing_file", str(path), None, None, "anchor file given but not found"))
            continue
        with open(path, "rb") as fh:
            for lineno, raw in enumerate(fh, start=1):
                if b"head_seq" not in raw:
                    continue
                line = raw.decode("utf-8", errors="replace")
                found: list[dict[str, Any]] = []
                if "CEF:" in line:
                    cp = _cef_checkpoint(line)
                    found = [cp] if cp is not None else []
                elif "{" in line:
                    try:
                        found = list(_checkpoint_bodies(json.loads(line[line.index("{"):])))
                    except ValueError:
                        found = []
                for body in found:
                    cp = _normalise(body)
                    if cp is None:
                        continue
                    key = (cp["head_seq"], cp["head"], cp["sig"])
                    if key not in seen:
                        seen.add(key)
                        anchors.append(dict(cp, source=f"{path.name}:{lineno}"))
    return anchors, problems


def verify_files(
    paths: Sequence[str | Path],
    public_key: Ed25519PublicKey,
    off_host_checkpoints: Iterable[dict[str, Any]] = (),
    require_genesis: bool = True,
    anchors: Iterable[dict[str, Any]] | None = None,
) -> VerifyReport:
    """Verify chained audit files (files or directories) against ``public_key``.

    Args:
        paths: log files and/or directories (all ``audit-*.jsonl`` inside).
        public_key: the Ed25519 checkpoint verification key.
        off_host_checkpoints: checkpoint bodies received by other sinks; each
            must match the files (same ``head`` at ``head_seq``): a copy past
            the end of the files is ``truncated``, one whose hash differs is
            ``off_host_mismatch``. Signatures are not checked (trusted input).
        require_genesis: the first file must start the chain (no predecessor).
        anchors: checkpoint copies read back from other sinks' output
            (:func:`load_anchors`); None = not checked. Like
            ``off_host_checkpoints``, but each signature is checked (a copy
            with this key's id and a bad signature is ``bad_anchor``, one of
            another key is ignored and counted in ``anchors_foreign``), and
            the report counts the event records after the last anchored
            checkpoint (``unanchored_records``; status ``UNANCHORED``).

    Returns:
        A :class:`VerifyReport`; problems are in chain order, anchor problems
        last. Content errors and absent paths are reported, not raised;
        unreadable files raise ``OSError``.
    """
    report = VerifyReport()
    kid = key_id(public_key)
    checks: list[tuple[dict[str, Any], bool]] = [(dict(cp), False) for cp in off_host_checkpoints]
    if anchors is not None:
        report.anchored = True
        for cp in anchors:
            norm = _normalise(cp)
            where = str(cp.get("source", "?"))
            if norm is None:
                report.problems.append(Problem("bad_anchor", where, None, None, "checkpoint copy lacks fields"))
            elif norm["key_id"] != kid:
                report.anchors_foreign += 1
            elif not checkpoint_signature_ok(public_key, norm):
                report.problems.append(Problem("bad_anchor", where, None, norm["head_seq"],
                                               "checkpoint copy signature invalid"))
            else:
                checks.append((dict(norm, source=where), True))
    wanted: set[int] = set()
    for cp, _ in checks:
        try:
            wanted.add(int(cp.get("head_seq")))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            pass
    hashes: dict[int, str] = {}  # seq -> record hash, only at anchored head_seqs
    wanted_sorted = sorted(wanted)
    # events per gap between anchored seqs: buckets[i] = events with i anchors below their seq
    buckets = [0] * (len(wanted_sorted) + 1)
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
    first_seq: int | None = None
    last_seq: int | None = None
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
            if first_seq is None:
                first_seq = seq
            last_seq = seq if last_seq is None else max(last_seq, seq)
            if seq in wanted:
                hashes[seq] = rec["hash"]
            if rtype == "event":
                buckets[bisect.bisect_left(wanted_sorted, seq)] += 1
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
    for cp, is_anchor in checks:
        hs = cp.get("head_seq")
        where = str(cp.get("source", cp.get("file", "?")))
        if not isinstance(hs, int) or isinstance(hs, bool):
            report.problems.append(Problem("bad_anchor", where, None, None, "head_seq is not an integer"))
            continue
        if first_seq is not None and hs < first_seq and not require_genesis:
            report.anchors_before_range += 1
            continue
        if last_seq is None or hs > last_seq:
            report.problems.append(Problem(
                "truncated", where, None, hs,
                f"an off-host checkpoint copy seals the chain up to seq {hs} ({cp.get('file', '?')}); "
                f"the files end at seq {last_seq}: records or files were removed"))
        elif seen_checkpoints.get(hs) != cp.get("head") and hashes.get(hs) != cp.get("head"):
            report.problems.append(Problem(
                "off_host_mismatch", where, None, hs,
                "off-host checkpoint copy does not match the files (forked or rewritten)"))
        elif is_anchor:
            report.anchors_matched += 1
            if report.last_anchored_seq is None or hs > report.last_anchored_seq:
                report.last_anchored_seq = hs
    if report.anchored:
        below = 0 if report.last_anchored_seq is None else wanted_sorted.index(report.last_anchored_seq) + 1
        report.unanchored_records = sum(buckets[below:])
    return report


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


__all__ = ["Problem", "VerifyReport", "load_anchors", "verify_files", "format_report", "FILE_SUFFIX"]
