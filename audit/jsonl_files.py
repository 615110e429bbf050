"""The files of a hash-chained audit log: names, listing, and what :class:`audit.jsonl.JsonlChainSink` reads
back at open (the chain's last record, the key of its last checkpoint, the keys its headers retire)."""
from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

__all__ = ["FILE_PREFIX", "FILE_SUFFIX", "MAX_SEQ", "file_name_for", "list_log_files", "retired_keys", "tail"]

FILE_PREFIX = "audit-"
FILE_SUFFIX = ".jsonl"
#: A record's ``seq`` is below this (a signed 64-bit integer, what SIEMs and OCSF's ``long`` hold); a writer
#: starts at 0 and counts up by one, so a larger one is crafted.
MAX_SEQ = 1 << 63


def file_name_for(seq: int) -> str:
    """Log file name whose first record has sequence number ``seq``."""
    return f"{FILE_PREFIX}{seq:012d}{FILE_SUFFIX}"


def list_log_files(directory: Path) -> list[Path]:
    """Chained log files in ``directory`` in chain order."""
    return sorted(p for p in Path(directory).glob(f"{FILE_PREFIX}*{FILE_SUFFIX}") if p.is_file())


def tail(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """``(last whole record, key_id of the last checkpoint)`` of a log file (None where there is none).

    A whole record is a line that decodes to an object with an integer ``seq`` and a string ``hash``; any
    other line (a crafted ``[1]``, a ``seq`` that is a string, negative or not below :data:`MAX_SEQ`) is
    skipped here, so the sink continues the chain from the record before it and ``audit verify`` reports the
    line (session 25, S25-review-10: before, ``int(last["seq"])`` stopped the sink's open with a TypeError;
    session 27, S26-review26-10: a crafted ``seq`` beyond 64 bits was taken as the chain's end)."""
    last, signer = None, None
    with open(path, "rb") as fh:
        for line in fh:
            if line.endswith(b"\n"):
                with contextlib.suppress(ValueError, RecursionError):  # S25-review-4: RecursionError too
                    rec = json.loads(line)
                    if (type(rec) is not dict or type(seq := rec.get("seq")) is not int or not 0 <= seq < MAX_SEQ
                            or type(rec.get("hash")) is not str):
                        continue
                    last = rec
                    body = rec.get("body")
                    if isinstance(body, dict) and rec.get("type") == "checkpoint":
                        signer = body.get("key_id")
    return last, signer if isinstance(signer, str) else None


def retired_keys(files: list[Path]) -> set[str]:
    """The key ids the headers of ``files`` retire (their first lines only)."""
    out: set[str] = set()
    for path in files:
        with contextlib.suppress(OSError, ValueError, AttributeError, KeyError, TypeError, RecursionError), \
                open(path, "rb") as fh:
            retired = json.loads(fh.readline())["body"].get("retires")
            if isinstance(retired, str):
                out.add(retired)
    return out
