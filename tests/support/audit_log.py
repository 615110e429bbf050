"""Audit hubs for tests: an in-memory stand-in log, or a real hub writing files under a test's folder.

``AuditHub(ListLog())`` lets a test read every audit event the gateway emitted
(request and operator events) without sinks on disk; :func:`file_audit_hub` builds
the real hub (signed JSONL sink, spill file) as the gateway does. Import the
fixtures :func:`audit_log` and :func:`audit_hub` into a test module (or conftest) to run
its ``stack`` on a :class:`ListLog`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from audit.keys import generate_signing_key
from gateway.auditing import AuditHub

__all__ = ["ListLog", "audit_hub", "audit_log", "file_audit_hub"]


def file_audit_hub(tmp: Path, **sections: Any) -> AuditHub:
    """A real :class:`AuditHub` (``AuditHub.from_config``): a fresh signing key at
    ``tmp/keys/audit.key``, signed JSONL events under ``tmp/audit`` (a checkpoint every 1 s),
    spill under ``tmp/spill`` (at most 1 MiB), plus ``sections`` (more ``audit.*`` keys:
    sinks such as ``ocsf``/``syslog``, ``summary``). Raises FileExistsError when ``tmp/keys``
    exists, ValueError on an invalid section."""
    key = tmp / "keys" / "audit.key"
    key.parent.mkdir()
    generate_signing_key(key)
    return AuditHub.from_config({
        "jsonl": {"dir": str(tmp / "audit"), "signing_key_file": str(key), "checkpoint_s": 1},
        **sections,
        "spill": {"dir": str(tmp / "spill"), "max_bytes": 1 << 20},
    })


class ListLog:
    """In-memory audit log: the subset of :class:`audit.log.AuditLog` the hub uses.
    ``events`` holds every emitted event, oldest first; it always accepts and never drops."""

    accepting = True
    dropped = 0

    def __init__(self) -> None:
        self.events: list[Any] = []

    def emit(self, event: Any) -> None:
        """Keep ``event`` (an :class:`audit.event.AuditEvent` or operator event)."""
        self.events.append(event)

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None


@pytest.fixture
def audit_log() -> ListLog:
    """Every audit event the gateway emits (a fresh :class:`ListLog`)."""
    return ListLog()


@pytest.fixture
def audit_hub(audit_log: ListLog) -> AuditHub:
    """The ``stack``'s audit hub over :func:`audit_log`."""
    return AuditHub(audit_log)
