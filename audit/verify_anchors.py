"""Reading the off-host checkpoint copies (anchors) back from the other sinks' files.

Anchors: the JSONL sink hands every checkpoint to the other sinks as a
``kind="checkpoint"`` event, so the OCSF file, the syslog receiver's file (CEF
or OCSF payload) and the OTLP collector hold signed copies keyed by
``head_seq`` and ``head`` (chain hash). :func:`load_anchors` reads those copies
back from such files; given to :func:`audit.verify.verify_files` as ``anchors``, each one
(signature checked) must match the files: a copy sealing a sequence number the
files no longer reach means the files were cut (``truncated``), a copy whose
hash differs means a fork or rewrite (``off_host_mismatch``). Event records
after the last anchored checkpoint are counted as ``unanchored_records`` and
the report's status is ``UNANCHORED``, never plain ``OK``.

The comparison itself is in :func:`audit.verify.verify_files`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from audit.cef import CefParseError, parse_cef
from audit.verify_report import Problem

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
        except (ValueError, RecursionError):  # S25-review-4: a deep line is no checkpoint, not a crash
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


def normalise_checkpoint(body: dict[str, Any]) -> dict[str, Any] | None:
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
                    except (ValueError, RecursionError):  # S25-review-4: RecursionError too
                        found = []
                for body in found:
                    cp = normalise_checkpoint(body)
                    if cp is None:
                        continue
                    key = (cp["head_seq"], cp["head"], cp["sig"])
                    if key not in seen:
                        seen.add(key)
                        anchors.append(dict(cp, source=f"{path.name}:{lineno}"))
    return anchors, problems
