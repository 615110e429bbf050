"""The shared load view keeps the prefilling-request count the TTFT scorer's shared-wait term needs
(routing/shared.py ``SharedLoadTracker.snapshot``; routing/types.py ``ReplicaLoad.shared_wait_tokens``).

With sharing on, a replica that another instance also loads used to be reported with
``prefilling_requests`` 0, so ``shared_wait_tokens`` read 0 whatever the queue: the
estimated-TTFT scorer saw no queue on exactly the replicas every instance used.
"""
from __future__ import annotations

from routing.load import InProcessLoadTracker
from routing.shared import LoadDelta, RemoteLoadView, SharedLoadTracker


def _tracker() -> tuple[SharedLoadTracker, RemoteLoadView]:
    remote = RemoteLoadView()
    return SharedLoadTracker(InProcessLoadTracker(), remote, lambda _e: None), remote


def test_local_prefilling_requests_survive_remote_load() -> None:
    tracker, remote = _tracker()
    tracker.dispatch("r0", 100, 10)
    remote.apply_delta("other", LoadDelta("r0", 0, 20, 1))  # another instance decoding there
    snap = tracker.snapshot("r0")
    assert (snap.queued_prefill_tokens, snap.decode_tokens, snap.running_requests) == (100, 30, 2)
    assert snap.prefilling_requests == 1
    assert snap.shared_wait_tokens(40) == 40


def test_remote_prefill_counts_its_running_requests_as_an_upper_bound() -> None:
    tracker, remote = _tracker()
    tracker.dispatch("r0", 100, 10)
    remote.apply_delta("other", LoadDelta("r0", 300, 20, 2))  # prefill outstanding on the other one
    snap = tracker.snapshot("r0")
    assert snap.queued_prefill_tokens == 400
    assert snap.prefilling_requests == 3  # at most its 2 running requests still prefill
    assert snap.shared_wait_tokens(50) == 150


def test_without_remote_load_the_local_snapshot_is_returned() -> None:
    tracker, _ = _tracker()
    tracker.dispatch("r0", 100, 10)
    assert tracker.snapshot("r0") == tracker.local.snapshot("r0")
