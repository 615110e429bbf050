"""Session 17, P16-3: with ``state.backend: redis`` a plain answer's first byte is observed late (A15-2)
as with the in-process tracker. Before, the flow-control tracker wrapped the shared calibrating ticket
in a notifying ticket of its own (gateway/flow_load.py), whose type the pipeline does not take a late
observation from, so the first byte was observed and its prefill part released (and published) at the
byte's arrival. Now the shared tracker takes ``notify`` (routing/shared.py) and the calibrating tracker
passes it on (routing/calibration_tracker.py): the pipeline holds the calibrating ticket itself.

The unit tests build the tracker chain as gateway/build.py does for the Redis backend (no Redis needed);
the last test runs a gateway on a real ``redis-server``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gateway.flow_load import NotifyingLoadTracker
from gateway.pipeline_answer import reads_perf_counter
from routing.calibration import Calibration, CalibratingLoadTracker
from routing.calibration_tracker import LATE_FIRST_BYTE
from routing.load import InProcessLoadTracker
from routing.shared import LoadDelta, RemoteLoadView, SharedLoadTracker
from tests.conftest import Stack
from tests.gateway.test_s16_post_first_byte import _Shared
from tests.support.first_byte import one_watched_request


class _Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class _Cal(Calibration):
    """A calibration that keeps the first-byte times it is fed (seconds)."""

    def __init__(self) -> None:
        super().__init__(prior_rate=1000.0)
        self.ttfts: list[float] = []

    def observe_first_byte(self, replica_id: str, uncached_tokens: float, queued_tokens: float, ttft_s: float,
                           *a: Any) -> None:
        self.ttfts.append(ttft_s)
        super().observe_first_byte(replica_id, uncached_tokens, queued_tokens, ttft_s, *a)


def _chain(clock: _Clock) -> tuple[NotifyingLoadTracker, _Cal, list[object], list[str], InProcessLoadTracker]:
    """gateway/build.py's chain for ``state.backend: redis`` with calibration: notifying(calibrating(shared(local)))."""
    local = InProcessLoadTracker()
    emitted: list[object] = []
    cal = _Cal()
    notifying = NotifyingLoadTracker(CalibratingLoadTracker(SharedLoadTracker(local, RemoteLoadView(), emitted.append),
                                                            cal, clock))
    wakes: list[str] = []
    notifying.on_release = lambda: wakes.append("wake")
    return notifying, cal, emitted, wakes, local


def test_the_shared_calibrating_ticket_takes_a_late_first_byte() -> None:
    clock = _Clock(10.0)
    tracker, cal, emitted, wakes, local = _chain(clock)
    ticket = tracker.dispatch("r1", 100, 20, 1, "t")
    assert type(ticket) in LATE_FIRST_BYTE  # what the pipeline asks (gateway/pipeline.py, A15-2)
    clock.now = 12.5
    ticket.observe_first_byte_at(10.75)  # after the last part, with the time the byte arrived
    assert cal.ttfts == [0.75]  # the arrival's figure
    assert local.snapshot("r1").queued_prefill_tokens == 100 and wakes == []  # nothing released yet
    ticket.finish()
    snap = local.snapshot("r1")
    assert (snap.queued_prefill_tokens, snap.decode_tokens, snap.running_requests) == (0, 0, 0)
    # one release: one delta published with the prefill part, one wake of the dispatcher
    assert emitted == [LoadDelta("r1", 100, 20, 1), LoadDelta("r1", -100, -20, -1)] and wakes == ["wake"]
    ticket.finish()
    ticket.observe_first_byte_at(13.0)
    assert cal.ttfts == [0.75] and wakes == ["wake"] and len(emitted) == 2


def test_a_stream_and_an_uncalibrated_request_release_and_wake_as_before() -> None:
    """The wrapper's releases, notifications and deltas (gateway/flow_load.py ``_NotifyingTicket``) are kept:
    a first byte releases the prefill part (one delta, one wake), the end the rest (one delta, one wake);
    a second first byte or end releases, publishes and wakes nothing (the wrapper woke the dispatcher on
    a second first byte too, with nothing released: :class:`routing.load.Ticket`'s rule now)."""
    clock = _Clock(1.0)
    tracker, cal, emitted, wakes, local = _chain(clock)
    ticket = tracker.dispatch("r1", 64, 8, 1, "t")
    clock.now = 1.25
    ticket.first_byte()
    ticket.first_byte()
    assert cal.ttfts == [0.25] and local.snapshot("r1").queued_prefill_tokens == 0
    assert emitted == [LoadDelta("r1", 64, 8, 1), LoadDelta("r1", -64, 0, 0)] and wakes == ["wake"]
    ticket.finish()
    ticket.finish()
    assert emitted[2:] == [LoadDelta("r1", 0, -8, -1)] and wakes == ["wake", "wake"]
    plain = tracker.dispatch("r2", 10, 2, 1, "t", calibrate=False)  # R10-3: no observation, still notified
    assert type(plain) not in LATE_FIRST_BYTE
    plain.finish()
    assert emitted[3:] == [LoadDelta("r2", 10, 2, 1), LoadDelta("r2", -10, -2, -1)]
    assert wakes == ["wake"] * 3 and cal.ttfts == [0.25]


def test_notify_needs_a_tracker_that_takes_it() -> None:
    # a tracker that takes no notify (test_s16_post_first_byte's): the calibrating tracker does not claim to
    tracker = CalibratingLoadTracker(_Shared(), Calibration(prior_rate=1.0), _Clock(0.0))
    assert not tracker.takes_notify
    with pytest.raises(TypeError):
        tracker.dispatch("r1", 1, 1, notify=NotifyingLoadTracker(InProcessLoadTracker()))


@pytest.fixture
def config_overrides(tmp_path: Path, redis_server: Any) -> dict[str, Any]:
    return {"state": {"backend": "redis", "url": redis_server.url, "key_prefix": "pgs17f:", "lease_ttl_s": 2.0,
                      "sync_poll_s": 1.0},
            "policy": {"versions_dir": str(tmp_path / "versions")}}


BODY = json.dumps({"model": "sim-model", "prompt": "one two three", "max_tokens": 2}).encode()


async def test_gateway_on_redis_observes_the_plain_first_byte_late(stack: Stack,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A gateway on Redis: the plain answer's observation is fed after its last part, with the record's
    ``t_first_byte`` minus the dispatch time exactly; its load goes back (and is published) in one step."""
    gw = stack.components
    cal = gw.calibration
    assert gw.shared is not None and cal is not None and reads_perf_counter(cal.clock)
    assert isinstance(gw.router.loads.inner.inner, SharedLoadTracker)  # type: ignore[attr-defined]
    deltas: list[LoadDelta] = []
    real_emit = gw.shared.routing.emit

    def emit(event: Any) -> None:
        if isinstance(event, LoadDelta):
            deltas.append(event)
        real_emit(event)

    monkeypatch.setattr(gw.shared.routing, "emit", emit)
    rec, observed, dispatched = await one_watched_request(stack, monkeypatch, BODY)
    assert rec.status == 200
    assert len(observed) == 1
    ttft, when = observed[0]
    assert when == "last part"  # before: "before any part" (observed at the byte's arrival)
    assert ttft == rec.t_first_byte - dispatched[0]  # type: ignore[operator]  # the byte's arrival, exactly
    # published: the dispatch, then everything back in one delta (before: a first-byte delta, then the rest)
    assert len(deltas) == 2 and deltas[0].running_requests == 1 and deltas[1].running_requests == -1, deltas
    assert deltas[1].prefill_tokens == -deltas[0].prefill_tokens and deltas[1].replica_id == rec.replica
