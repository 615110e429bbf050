from __future__ import annotations

import pytest

from routing.load import InProcessLoadTracker, ReplicaLoad


def test_dispatch_first_byte_finish() -> None:
    lt = InProcessLoadTracker()
    t1 = lt.dispatch("r", 100, 20)
    t2 = lt.dispatch("r", 50, 10)
    assert lt.snapshot("r") == ReplicaLoad("r", 150, 30, 2, 2)
    assert lt.snapshot("r").tokens == 180
    t1.first_byte()
    t1.first_byte()  # idempotent
    assert lt.snapshot("r") == ReplicaLoad("r", 50, 30, 2, 1)
    t1.finish()
    t1.finish()  # idempotent
    assert lt.snapshot("r") == ReplicaLoad("r", 50, 10, 1, 1)
    t2.finish()  # error before first byte releases the prefill part too
    assert lt.snapshot("r") == ReplicaLoad("r", 0, 0, 0)
    t2.first_byte()  # after finish: no effect
    assert lt.snapshot("r") == ReplicaLoad("r", 0, 0, 0)
    assert not t2.active


def test_unknown_replica_and_bad_values() -> None:
    lt = InProcessLoadTracker()
    assert lt.snapshot("x") == ReplicaLoad("x")
    with pytest.raises(ValueError):
        lt.dispatch("x", -1, 0)
