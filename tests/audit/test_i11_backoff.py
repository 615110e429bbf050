"""Issue 11 item 4: the one backoff schedule of the audit pipeline."""

from __future__ import annotations

import pytest

from audit.backoff import Backoff


def test_doubles_up_to_the_cap_and_resets() -> None:
    b = Backoff(0.1, 0.5)
    assert [b.next() for _ in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    b.reset()
    assert b.next() == 0.1


def test_first_delay_may_exceed_the_cap() -> None:
    b = Backoff(30, 5)  # RemoteAuditLog(restart_initial_s=30) keeps its first 30 s wait
    assert [b.next(), b.next()] == [30, 5]


def test_negative_delays_are_refused() -> None:
    with pytest.raises(ValueError):
        Backoff(-1, 5)
    with pytest.raises(ValueError):
        Backoff(0.1, -1)
