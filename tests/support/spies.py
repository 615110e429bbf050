"""A call spy for tests that check the order of a request's steps (shared by
tests/gateway/test_s3_end_after_send.py, test_s10_critical_path.py and test_s11_hotpath.py)."""

from __future__ import annotations

from typing import Any

import pytest

__all__ = ["spy"]


def spy(obj: Any, name: str, log: list[str], label: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Replace ``obj.name`` (through ``monkeypatch``, undone after the test) by a wrapper that appends
    ``label`` to ``log`` and then calls the original with the same arguments, returning its result."""
    real = getattr(obj, name)

    def spied(*a: Any, **kw: Any) -> Any:
        log.append(label)
        return real(*a, **kw)

    monkeypatch.setattr(obj, name, spied)
