"""Whether a test may skip for a missing system binary (``redis-server``, ``rsyslogd``): one rule.

:func:`require_system_binary` skips the test only when the binary is absent *and* the ``CI``
environment variable is unset (a developer machine without ``make system-deps``); under CI a
missing binary is a failure, so a CI job cannot silently skip the shared-state or syslog tests.
``.ci/run`` exports ``CI=true`` itself (session 22, S21-newcomer-9), whatever the runner sets.
"""
from __future__ import annotations

import os

import pytest

__all__ = ["require_system_binary"]


def require_system_binary(binary: str | None, missing: str, tests: str) -> str:
    """Return ``binary`` (its path); when it is None, skip the test with the reason ``missing`` (e.g.
    "rsyslogd is not installed (...)"), or fail it when ``CI`` is set ("...; CI is set, so ``tests``
    may not be skipped"). Raises pytest's skip or fail outcome."""
    if binary is not None:
        return binary
    if os.environ.get("CI"):
        pytest.fail(f"{missing}; CI is set, so {tests} may not be skipped", pytrace=False)
    pytest.skip(missing)
