"""Issue 14 (session 7): flow control's fast path routes among the candidates its placement check
built (``flow.replica_max_queued_prefill_tokens`` set, or a replica without room) instead of
building them again in ``Router.route``; the choices and the router's state are those of routing
the released request among its room afresh."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.config_flow import FlowConfig
from gateway.flow import FlowControl
from gateway.flow_waiting import Waiting as _Waiting
from routing.router import Router
from tenancy.registry import Tenant
from tests.gateway.test_s2_flow_dispatch import make, req


def _count_candidates(router: Router) -> list[int]:
    calls: list[int] = []
    real = router.candidates

    def counted(*a, **kw):  # type: ignore[no-untyped-def]
        calls.append(1)
        return real(*a, **kw)

    router.candidates = counted  # type: ignore[method-assign]
    return calls


def _fresh_route(flow: FlowControl) -> None:
    """The reference: the released request routed among its room by ``Router.route`` (candidates rebuilt)."""
    def _route(w, *args):  # type: ignore[no-untyped-def]
        choice, ticket = flow.router.route(w.req, w.room, w.alt_chains)
        w.result = (choice, ticket)
        w.charged = max(0, w.req.prompt_tokens - choice.predicted_prefix_tokens)
        flow.queue.charge(w.tenant_id, w.charged)

    flow._route = _route  # type: ignore[method-assign]


async def test_the_fast_path_builds_the_candidates_once() -> None:
    flow = make(FlowConfig(replica_max_queued_prefill_tokens=10_000), n=3)
    calls = _count_candidates(flow.router)
    rel = await flow.release(Tenant("a"), req(prompt=100, keys=(b"k1", b"k2")), ["r0", "r1", "r2"], (),
                             deadline=10**9)
    assert rel.choice.replica_id in {"r0", "r1", "r2"}
    assert len(calls) == 1


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.tuples(st.integers(16, 400), st.integers(0, 3), st.booleans()), min_size=1, max_size=25),
       bound=st.sampled_from([None, 300, 100_000]))
async def test_choices_and_state_equal_a_fresh_route(steps: list[tuple[int, int, bool]], bound: int | None) -> None:
    cfg = FlowConfig(replica_max_queued_prefill_tokens=bound, replica_max_running_requests=64)
    fast, ref = make(cfg, n=3), make(cfg, n=3)
    _fresh_route(ref)
    held = []
    for n, (prompt, prefix, finish) in enumerate(steps):
        keys = tuple(b"p%d" % i for i in range(prefix)) + (b"u%d" % n,)
        ws = [_Waiting("a", 1.0, req(prompt=prompt, keys=keys), ["r0", "r1", "r2"], ()) for _ in range(2)]
        released = [flow._release_now(w) for flow, w in zip((fast, ref), ws)]  # the fast path itself
        assert released[0] == released[1]
        if released[0]:
            assert ws[0].result[0] == ws[1].result[0]  # the RouteChoice: replica, prefix tokens, scores
            held.append((ws[0].result[1], ws[1].result[1]))
        if finish and held:
            for t in held.pop(0):
                t.finish()
        for rid in ("r0", "r1", "r2"):
            assert fast.router.loads.snapshot(rid) == ref.router.loads.snapshot(rid)
        assert fast.router.index.stats() == ref.router.index.stats()
        assert fast.queue.counter("a") == ref.queue.counter("a")
