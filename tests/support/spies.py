"""Call-order spies for tests: which of several steps ran, in which order.

``log_calls(gw.audit, "emit_request", log, "recorded", monkeypatch)`` replaces the attribute with
a wrapper that appends ``"recorded"`` to ``log`` and then calls the original (same arguments,
same result); ``monkeypatch`` restores it after the test.
"""
from __future__ import annotations

from typing import Any

import pytest

__all__ = ["log_calls"]


def log_calls(obj: Any, name: str, log: list[str], label: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every call of ``obj.<name>`` append ``label`` to ``log`` first (a plain function or a
    method; an ``async`` one is logged when called, not when awaited)."""
    real = getattr(obj, name)

    def spy(*a: Any, **kw: Any) -> Any:
        log.append(label)
        return real(*a, **kw)

    monkeypatch.setattr(obj, name, spy)
