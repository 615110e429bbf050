"""Issue 14, session 14: the calibrating tracker over the in-process one hands out one fused ticket
(no wrapping tickets). It must charge, observe and notify exactly as the wrapped chain did: the
same counters after each step, one observation per first byte (none after ``finish``), one notice
per release that gave load back, read from the notifying tracker at each release."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.flow_load import NotifyingLoadTracker
from routing.calibration import CalibratingLoadTracker, Calibration
from routing.load import InProcessLoadTracker


class _Plain:
    """An inner tracker that is not the in-process one: the calibrating tracker must wrap (old path)."""

    def __init__(self) -> None:
        self.inner = InProcessLoadTracker()

    def dispatch(self, *a: Any, **kw: Any) -> Any:
        return self.inner.dispatch(*a[:4])

    def snapshot(self, rid: str) -> Any:
        return self.inner.snapshot(rid)


def _stack(fused: bool) -> tuple[NotifyingLoadTracker, Calibration, list[float], list[str]]:
    now = [0.0]
    cal = Calibration(prior_rate=1000.0)
    inner: Any = InProcessLoadTracker() if fused else _Plain()
    loads = NotifyingLoadTracker(CalibratingLoadTracker(inner, cal, lambda: now[0]))
    notes: list[str] = []
    loads.on_release = lambda: notes.append("x")
    return loads, cal, now, notes


steps = st.lists(st.tuples(st.integers(0, 2), st.sampled_from(["first_byte", "finish"])), max_size=12)


@settings(max_examples=150, deadline=None)
@given(sizes=st.lists(st.tuples(st.integers(0, 500), st.integers(0, 50), st.booleans()), min_size=1, max_size=3),
       script=steps)
def test_fused_ticket_matches_the_wrapped_chain(sizes: list[tuple[int, int, bool]],
                                                script: list[tuple[int, str]]) -> None:
    runs, notices = [], []
    for fused in (True, False):
        loads, cal, now, notes = _stack(fused)
        assert (type(loads.dispatch("z", 0, 0)).__name__ == "_FusedCalibratingTicket") is fused
        tickets = [loads.dispatch("r0", p, d, 1, "t", calibrate=c) for p, d, c in sizes]
        trace, gave_back = [], 0
        state = [[True, True] for _ in tickets]  # per ticket: prefill held, held
        for i, (k, what) in enumerate(script):
            now[0] = 0.5 * (i + 1)
            j = k % len(tickets)
            before = len(notes)
            getattr(tickets[j], what)()
            held = state[j]
            released = held[1] and (what == "finish" or held[0])
            gave_back += released
            held[0] = False
            held[1] = held[1] and what != "finish"
            trace.append((loads.snapshot("r0"), cal.observations("r0"), tickets[j].active))
            if fused:  # a notice exactly when the step gave load back (the wrapper also noticed no-ops)
                assert len(notes) - before == released
        runs.append(trace)
        notices.append(len(notes))
    assert runs[0] == runs[1]
    assert notices[0] <= notices[1]


def test_notice_is_read_at_each_release_and_an_ended_ticket_observes_nothing() -> None:
    loads, cal, now, notes = _stack(True)
    t = loads.dispatch("r0", 100, 5, 1, "t")
    t.finish()
    t.first_byte()  # after finish: no observation, no notice
    assert cal.observations("r0") == 0 and notes == ["x"]
    t2 = loads.dispatch("r0", 100, 5, 1, "t")
    loads.on_release = lambda: notes.append("y")
    now[0] = 1.0
    t2.first_byte()
    t2.first_byte()
    t2.finish()
    t2.finish()
    assert notes == ["x", "y", "y"] and cal.observations("r0") == 1
    assert loads.snapshot("r0").tokens == 0 and loads.snapshot("r0").running_requests == 0
