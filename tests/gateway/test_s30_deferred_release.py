"""Issue 14, session 30 (helper cut30): flow control's fast path with ``defer=True`` returns the router's choice
(:class:`gateway.flow_waiting.PendingRelease`) and charges it at ``commit()`` (the pipeline: right after its upstream
write, no await in between). Committed at once, it leaves exactly what ``release_now(defer=False)`` leaves: the same
choice, loads, index entries, router counters, tenant counters and ``Release`` figures, for requests of several
tenants, prefixes and sizes on one or three replicas (with and without the prefill-token bound, whose placement
builds the candidates the route then uses), tickets finished on the way; a refusal (no room) changes nothing either
way. Before its commit the request holds nothing: no load, no index entry, no virtual tokens."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.config_flow import FlowConfig
from gateway.flow import FlowControl
from gateway.flow_waiting import PendingRelease, Release
from tenancy.registry import Tenant
from tests.gateway.test_s2_flow_dispatch import make, req

_STEP = st.tuples(st.sampled_from("ab"), st.integers(1, 200), st.integers(0, 4), st.booleans())


def _state(flow: FlowControl, n: int) -> tuple[object, ...]:
    r = flow.router
    return ([r.loads.snapshot(f"r{k}") for k in range(n)], r.index.stats(), r.counters(),
            flow.queue.counters(), len(flow.queue))


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(_STEP, min_size=1, max_size=14), n=st.sampled_from([1, 3]), bound=st.booleans())
def test_a_deferred_release_committed_at_once_equals_an_immediate_one(steps: list[tuple[str, int, int, bool]],
                                                                        n: int, bound: bool) -> None:
    cfg = FlowConfig(replica_max_queued_prefill_tokens=400) if bound else FlowConfig()
    now, later = make(cfg, n=n), make(cfg, n=n)
    ids = [f"r{k}" for k in range(n)]
    held: list[tuple[Release, Release]] = []
    for tenant, prompt, shared, finish in steps:
        r = req(tenant, prompt, tuple(b"k%d" % j for j in range(shared)))
        want = now.release_now(Tenant(tenant), r, ids, ())
        pending = later.release_now(Tenant(tenant), r, ids, (), None, True)
        if want is None:  # no room: declined both ways, nothing changed
            assert pending is None
        else:
            assert type(pending) is PendingRelease and pending.choice == want.choice
            got = pending.commit()
            assert (got.choice, got.virtual_tokens) == (want.choice, want.virtual_tokens)
            assert type(got.ticket) is type(want.ticket) and got.ticket is not want.ticket
            held.append((want, got))
        assert _state(later, n) == _state(now, n)
        if finish and held:
            want, got = held.pop(0)
            want.ticket.finish()
            got.ticket.finish()
            assert _state(later, n) == _state(now, n)


def test_before_its_commit_a_deferred_release_holds_nothing() -> None:
    flow = make(FlowConfig(), n=1)
    before = _state(flow, 1)
    pending = flow.release_now(Tenant("a"), req("a", 120, (b"k0", b"k1")), ["r0"], (), None, True)
    assert type(pending) is PendingRelease and pending.choice.replica_id == "r0"
    loads, index, counters, tenants, queued = _state(flow, 1)
    assert (loads, index, counters.requests, queued) == (before[0], before[1], before[2].requests, before[4])
    assert tenants.get("a", 0.0) <= 0.0 + (before[3].get("a", 0.0))  # only the pass-through, no charge
    release = pending.commit()
    assert release.ticket is not None and flow.router.loads.snapshot("r0").running_requests == 1
    assert flow.router.counters().requests == counters.requests + 1
    assert release.commit() is release  # a Release is already charged
