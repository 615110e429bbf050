"""Session 13 (issue 14): the flow tracker's ticket calls the tracker's ``on_release`` as set at the time
of each release (no closure per ticket), and the load release still floors every counter at zero."""

from __future__ import annotations

from gateway.flow_load import NotifyingLoadTracker
from routing.load import InProcessLoadTracker
from routing.types import ReplicaLoad


def test_ticket_calls_the_callback_set_after_dispatch_once_per_release() -> None:
    loads = NotifyingLoadTracker(InProcessLoadTracker())
    calls: list[str] = []
    t = loads.dispatch("r0", 70, 8, 1)
    loads.on_release = lambda: calls.append("first")  # set after the ticket exists (gateway/build.py order)
    t.first_byte()
    loads.on_release = lambda: calls.append("second")
    t.finish()
    t.finish()  # idempotent: no second notice
    assert calls == ["first", "second"]
    assert loads.snapshot("r0") == ReplicaLoad("r0")
    assert t.replica_id == "r0" and not t.active


def test_release_floors_at_zero_with_the_same_types() -> None:
    tracker = InProcessLoadTracker()
    tracker.dispatch("r0", 10, 5, 2)
    tracker.release("r0", 100, 100, 100, 100)  # more than held: every counter floors at 0
    snap = tracker.snapshot("r0")
    assert snap == ReplicaLoad("r0", 0, 0, 0, 0)
    assert all(type(v) is int for v in (snap.queued_prefill_tokens, snap.decode_tokens, snap.running_requests,
                                        snap.prefilling_requests))
    tracker.dispatch("r0", 10, 5, 2)
    tracker.release("r0", 4, 1, 1, 1)
    assert tracker.snapshot("r0") == ReplicaLoad("r0", 6, 4, 1, 1)
