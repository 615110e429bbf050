"""Helpers for the app-level audit tests (tests/audit_e2e): audit config, file readers, polling.

The audit hub is built exactly as the gateway builds it
(:meth:`gateway.auditing.AuditHub.from_config`) from an ``audit`` config
section; the stack fixture of ``tests/conftest.py`` takes it through its
``audit_hub`` fixture.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "audit"))
from rsyslog_helper import RSYSLOGD, Rsyslog  # noqa: E402,F401

from audit.keys import generate_signing_key  # noqa: E402
from tests.support.waiting import wait_for  # noqa: F401,E402 - re-exported to the e2e tests

TD = "demo.prefixgate.test"
CANARY = "canaryzebra"
PROMPT = " ".join([CANARY] + [f"w{i}" for i in range(100)])


def audit_section(tmp: Path, *, syslog_port: int | None = None, **extra: Any) -> dict[str, Any]:
    """An ``audit`` config section with the JSONL chain (key outside the log dir), the OCSF
    file and the spill dir under ``tmp``; a CEF/TCP syslog sink when ``syslog_port`` is given.
    ``extra`` sections (``summary``, ``concentration``, ``spill`` …) are merged over it."""
    key = tmp / "keys" / "audit-signing.key"
    if not key.exists():
        key.parent.mkdir(parents=True, exist_ok=True)
        generate_signing_key(key)
    doc: dict[str, Any] = {
        "jsonl": {"dir": str(tmp / "audit"), "signing_key_file": str(key), "checkpoint_s": 1},
        "ocsf": {"file": str(tmp / "ocsf.jsonl")},
        "spill": {"dir": str(tmp / "spill"), "max_bytes": 1 << 20},
    }
    if syslog_port is not None:
        doc["syslog"] = {"host": "127.0.0.1", "port": syslog_port, "protocol": "tcp", "format": "cef"}
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(doc.get(k), dict):
            doc[k] = {**doc[k], **v}
        else:
            doc[k] = v
    return doc


def complete_lines(f: Path) -> list[str]:
    """The newline-terminated lines of ``f`` (without their newlines). A last line the writer has
    not finished yet (no newline) is left out: a polling reader sees it on its next read. A
    complete line that is not valid JSON is still the caller's error."""
    text = f.read_text()
    return text[: text.rfind("\n") + 1].splitlines()


def jsonl_events(tmp: Path) -> list[dict[str, Any]]:
    """Bodies of the ``event`` records of the JSONL chain files under ``tmp/audit`` (file order;
    complete lines only, see :func:`complete_lines`)."""
    out = []
    for f in sorted((tmp / "audit").glob("*.jsonl")):
        for line in complete_lines(f):
            rec = json.loads(line)
            if rec.get("type") == "event":
                out.append(rec["body"])
    return out


def ocsf_events(tmp: Path) -> list[dict[str, Any]]:
    """The OCSF file sink's events (complete lines only, see :func:`complete_lines`)."""
    f = tmp / "ocsf.jsonl"
    return [json.loads(line) for line in complete_lines(f)] if f.exists() else []


async def set_faults(url: str, **faults: Any) -> None:
    """``POST /sim/faults`` on one simulated replica (``{}`` clears)."""
    import httpx

    async with httpx.AsyncClient(timeout=5) as c:
        r = await c.post(url + "/sim/faults", json=faults)
        r.raise_for_status()
