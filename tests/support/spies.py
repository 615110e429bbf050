"""Call-order spies for tests: which of several steps ran, in which order.

``log_calls(gw.audit, "emit_request", log, "recorded", monkeypatch)`` replaces the attribute with
a wrapper that appends ``"recorded"`` to ``log`` and then calls the original (same arguments,
same result); ``monkeypatch`` restores it after the test. ``log_answer_bytes(log, monkeypatch)`` logs
``"answer bytes"`` when upstream answer bytes arrive after another step.
"""
from __future__ import annotations

from typing import Any

import pytest

__all__ = ["log_answer_bytes", "log_calls"]


def log_calls(obj: Any, name: str, log: list[str], label: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every call of ``obj.<name>`` append ``label`` to ``log`` first (a plain function or a
    method; an ``async`` one is logged when called, not when awaited)."""
    real = getattr(obj, name)

    def spy(*a: Any, **kw: Any) -> Any:
        log.append(label)
        return real(*a, **kw)

    monkeypatch.setattr(obj, name, spy)


def log_answer_bytes(log: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Append ``"answer bytes"`` to ``log`` when a replica's answer bytes reach the gateway
    (``UpstreamConnection.data_received``), once per run of such reads (not again while it is last)."""
    from gateway.upstream_conn import UpstreamConnection

    real_received = UpstreamConnection.data_received

    def received(self: UpstreamConnection, data: bytes) -> None:
        if not log or log[-1] != "answer bytes":
            log.append("answer bytes")
        real_received(self, data)

    monkeypatch.setattr(UpstreamConnection, "data_received", received)
