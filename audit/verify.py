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

Key rotation (session 24, S23-fixverify-1): a file whose header names a retired key
(``retires``, written by :class:`audit.jsonl.JsonlChainSink` when the chain's last
checkpoint was another key's) retires it for the rest of the chain: a later checkpoint
signed by that key is ``retired_key`` even with a valid signature (a leaked old private
key signing a forged tail behind the new key's checkpoints). The header is sealed by the
new key's checkpoints like any record; removing it means rewriting the chain from before
the rotation, which the new key's anchored copies reveal.

Cannot detect (documented in docs/audit.md): records appended after the last
externally anchored checkpoint and then removed (reported as unanchored, not
as missing); without anchors, truncation after the last in-file checkpoint
and removal of whole trailing files; a complete rewrite by someone who also
holds the signing key and every anchor copy.

This module's one job is checking the chain (and the anchors given) over the
files; reading anchors is :mod:`audit.verify_anchors`, the report and its text
form are :mod:`audit.verify_report`.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from audit.chain import GENESIS, checkpoint_signature_ok, record_hash
from audit.jsonl import FILE_SUFFIX, list_log_files
from audit.verify_anchors import normalise_checkpoint
from audit.verify_keys import TrustedKeys, key_ring
from audit.verify_report import Problem, VerifyReport


def _expand(paths: Iterable[str | Path]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        out.extend(list_log_files(p) if p.is_dir() else [p])
    return out


def _typed(rec: dict[str, Any]) -> bool:
    """Whether a record's fields have the types the chain writes (``seq`` an int, not a bool; ``type``,
    ``prev``, ``hash`` strings; ``body`` an object): the checks below compare and index them."""
    seq = rec["seq"]
    return (isinstance(seq, int) and not isinstance(seq, bool) and isinstance(rec["body"], dict)
            and all(isinstance(rec[k], str) for k in ("type", "prev", "hash")))


def _holds_seq_in(seqs: Sequence[int], low: int, high: int) -> bool:
    """Whether sorted ``seqs`` holds a seq in ``[low, high)``: O(log n) (bisect). Before session 24 the range
    was walked (``any(s in seqs for s in range(low, high))``), so a tampered record whose seq is far ahead
    (10**8: 10 s; 10**15: days) kept ``audit verify`` from reporting (S24-review-3)."""
    i = bisect.bisect_left(seqs, low)
    return i < len(seqs) and seqs[i] < high


def _hash_matches(rec: dict[str, Any]) -> bool:
    """Whether a typed record's ``hash`` is its content's, in the current or the legacy encoding. A value one
    encoding cannot hold (orjson: an integer beyond 64 bits; a writer never wrote one) is a mismatch in it, never
    an exception: before session 25 (S25-review-4) such a tampered record crashed ``audit verify`` with a
    TypeError traceback and no report."""
    seq, rtype, prev, body = rec["seq"], rec["type"], rec["prev"], rec["body"]
    for legacy in (False, True):
        try:
            if record_hash(seq, rtype, prev, body, legacy=legacy) == rec["hash"]:
                return True
        except (TypeError, ValueError, RecursionError):
            continue
    return False


def _load(path: Path, report: VerifyReport) -> list[tuple[int, dict[str, Any]]]:
    records = []
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            try:
                rec = json.loads(raw)
                if not isinstance(rec, dict) or not {"seq", "type", "prev", "body", "hash"} <= rec.keys():
                    raise ValueError("missing fields")
                if not _typed(rec):  # S24-review-3: a tampered record's odd types are reported, never a crash
                    raise ValueError("fields of the wrong type (seq an integer, type/prev/hash strings, body an object)")
            except ValueError as exc:
                report.problems.append(Problem("malformed", path.name, lineno, None, str(exc)))
                continue
            except RecursionError:  # S25-review-4: a line nested too deeply for json.loads (was a traceback)
                report.problems.append(Problem("malformed", path.name, lineno, None, "nested too deeply"))
                continue
            records.append((lineno, rec))
    return records


def verify_files(
    paths: Sequence[str | Path],
    public_key: TrustedKeys,
    off_host_checkpoints: Iterable[dict[str, Any]] = (),
    require_genesis: bool = True,
    anchors: Iterable[dict[str, Any]] | None = None,
) -> VerifyReport:
    """Verify chained audit files (files or directories) against ``public_key`` (one key or several).

    Args:
        paths: log files and/or directories (all ``audit-*.jsonl`` inside).
        public_key: the Ed25519 checkpoint verification key, or several (an iterable, or a ring
            from :func:`audit.verify_keys.key_ring`): across a signing-key rotation each
            checkpoint is checked with the key of the ``key_id`` it names; one whose ``key_id``
            no given key has is ``unknown_key`` (S23-newcomer-4), one whose signature does not
            verify with its key is ``bad_signature``. The hash links are checked across the
            switch like any others.
        off_host_checkpoints: checkpoint bodies received by other sinks; each
            must match the files (same ``head`` at ``head_seq``): a copy past
            the end of the files is ``truncated``, one whose hash differs is
            ``off_host_mismatch``. Signatures are not checked (trusted input).
        require_genesis: the first file must start the chain (no predecessor).
        anchors: checkpoint copies read back from other sinks' output
            (:func:`load_anchors`); None = not checked. Like
            ``off_host_checkpoints``, but each signature is checked (a copy
            with a given key's id and a bad signature is ``bad_anchor``, one of
            another key is ignored and counted in ``anchors_foreign``), and
            the report counts the event records after the last anchored
            checkpoint (``unanchored_records``; status ``UNANCHORED``).

    Returns:
        A :class:`VerifyReport`; problems are in chain order, anchor problems
        last. Content errors and absent paths are reported, not raised;
        no log file at all is a ``missing_file`` problem (an empty or wrong
        directory never reads as verified); unreadable files raise ``OSError``;
        a key id given twice raises :class:`audit.verify_keys.DuplicateKeyError`.
    """
    report = VerifyReport()
    ring = key_ring(public_key)
    checks: list[tuple[dict[str, Any], bool]] = [(dict(cp), False) for cp in off_host_checkpoints]
    if anchors is not None:
        report.anchored = True
        for cp in anchors:
            norm = normalise_checkpoint(cp)
            where = str(cp.get("source", "?"))
            if norm is None:
                report.problems.append(Problem("bad_anchor", where, None, None, "checkpoint copy lacks fields"))
            elif norm["key_id"] not in ring:
                report.anchors_foreign += 1
            elif not checkpoint_signature_ok(ring[norm["key_id"]], norm):
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
    if not loaded and not report.problems:  # nothing to verify is not a verified trail (fail closed)
        report.problems.append(Problem("missing_file", ", ".join(map(str, paths)) or "-", None, None,
                                       "no audit log files found"))
    loaded.sort(key=lambda item: item[1][0][1]["seq"] if item[1] else float("inf"))
    names = {p.name for p, _ in loaded}
    report.files = len(loaded)
    head, expect_seq = GENESIS, 0
    prev_file: str | None = None
    seen_checkpoints: dict[int, str] = {}
    last_kid: str | None = None  # key id of the last verified checkpoint
    retired: dict[str, tuple[str, int]] = {}  # key id -> (file, seq) of the header that retired it
    since_checkpoint = 0
    first_seq: int | None = None
    last_seq: int | None = None
    for index, (path, records) in enumerate(loaded):
        fname = path.name
        seqs = sorted({r["seq"] for _, r in records})  # sorted: _holds_seq_in
        if records and records[0][1]["type"] != "header":
            report.problems.append(Problem("malformed", fname, records[0][0], None, "file does not start with a header"))
        elif records:
            first_line, first = records[0]
            if isinstance(first["body"].get("retires"), str):  # a key rotation (session 24)
                retired.setdefault(first["body"]["retires"], (fname, first["seq"]))
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
            if not _hash_matches(rec):
                report.problems.append(Problem("modified", fname, lineno, seq, "record hash does not match its content"))
            elif seq != expect_seq:
                if seq > expect_seq and _holds_seq_in(seqs, expect_seq, seq):
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
                named_kid = body.get("key_id")  # a tampered file may hold any JSON value here (S24-review-1)
                signer = ring.get(named_kid) if isinstance(named_kid, str) else None
                if signer is None:
                    report.problems.append(Problem(
                        "unknown_key", fname, lineno, seq,
                        f"checkpoint signed by key id {body.get('key_id')!s:.40}, which no given public key has "
                        f"(given: {', '.join(sorted(ring))}); give its public key (--public-key, repeatable)"))
                elif not checkpoint_signature_ok(signer, body):
                    report.problems.append(Problem("bad_signature", fname, lineno, seq,
                                                   f"checkpoint signature invalid (key id {body.get('key_id')})"))
                elif body.get("head") != prev or body.get("head_seq") != seq - 1:
                    report.problems.append(
                        Problem("checkpoint_mismatch", fname, lineno, seq, "checkpoint head is not the preceding record")
                    )
                elif body.get("key_id") in retired:
                    where, at = retired[str(body["key_id"])]
                    report.problems.append(Problem(
                        "retired_key", fname, lineno, seq,
                        f"checkpoint signed by key id {body['key_id']}, which the header of {where} (seq {at}) "
                        "retired: a retired key signs nothing after its rotation (a leaked old key forging a tail, "
                        "or the old key put back in use: rotate to a new key)"))
                else:
                    seen_checkpoints[int(body["head_seq"])] = str(body["head"])
                    report.last_checkpoint = body
                    by_key, kid = report.checkpoints_by_key, str(body["key_id"])
                    if by_key and kid != last_kid:
                        report.key_switches += 1
                    by_key[kid], last_kid = by_key.get(kid, 0) + 1, kid
                since_checkpoint = 0
            else:
                since_checkpoint += 1
            head, expect_seq = rec["hash"], max(seq, expect_seq - 1) + 1
        prev_file = fname
    report.unsealed_records = since_checkpoint
    report.keys_retired = len(retired)
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


__all__ = ["Problem", "VerifyReport", "verify_files", "FILE_SUFFIX"]
