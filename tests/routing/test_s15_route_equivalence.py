"""Issue 14, session 15 (helper "route"): the routing stage's cuts change no decision.

* :meth:`InProcessPrefixIndex.record_later` (the router's record, applied at the index's next read or
  by :meth:`Router.settle` in the replica wait) against :meth:`record` at once: every read in between
  and the final state are the same.
* A whole router (``cache_aware`` with calibration, deferred observations, the notifying and
  calibrating trackers, 1-3 replicas) against the old behaviour (an index that records at once, a
  tracker without the ``tokens`` shortcut, no estimate built at the flush): the same choices (replica,
  reason, scores, prefix figures), loads, load figures and index state over random request streams
  with first bytes, ends, flushes, settles and restarts in between.
* The inline single-candidate load guard (:meth:`LoadGuardFilter._one`) and ``cache_aware``'s summed
  costs against the session-14 code, copied here as the reference.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from routing.calibration import CalibratingLoadTracker, Calibration, ReplicaEstimate
from routing.config import policy_from_config
from routing.filters.load_guard import LoadGuardFilter
from routing.hashing import prefix_tokens
from routing.index import InProcessPrefixIndex
from routing.load import InProcessLoadTracker
from routing.policies.cache_aware import CacheAwareConfig, CacheAwarePolicy
from routing.router import Router
from routing.scorers._rates import rates_and_queue_weights
from routing.types import Candidate, ReplicaLoad, RouteRequest
from gateway.flow_load import NotifyingLoadTracker

KEYS = [bytes([i]) for i in range(12)]


class EagerIndex:
    """The old behaviour: only the :class:`routing.index.PrefixIndex` protocol (no ``record_later``),
    so the router records at once."""

    def __init__(self, capacity: int) -> None:
        self._i = InProcessPrefixIndex(capacity)

    @property
    def capacity_blocks(self) -> int:
        return self._i.capacity_blocks

    def match(self, replica_id: str, keys: Sequence[bytes]) -> int:
        return self._i.match(replica_id, keys)

    def match_many(self, keys: Sequence[bytes], replica_ids: Any) -> dict[str, int]:
        return self._i.match_many(keys, replica_ids)

    def record(self, replica_id: str, keys: Sequence[bytes]) -> None:
        self._i.record(replica_id, keys)

    def forget_replica(self, replica_id: str) -> None:
        self._i.forget_replica(replica_id)

    def replica_blocks(self, replica_id: str) -> int:
        return self._i.replica_blocks(replica_id)

    def stats(self) -> Any:
        return self._i.stats()


class SnapshotOnly:
    """The old behaviour of the load figure: a tracker with ``snapshot`` and ``dispatch`` only."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def dispatch(self, *a: Any, **k: Any) -> Any:
        return self.inner.dispatch(*a, **k)

    def snapshot(self, replica_id: str) -> ReplicaLoad:
        return self.inner.snapshot(replica_id)


chains = st.lists(st.integers(0, len(KEYS) - 1), min_size=0, max_size=6).map(lambda xs: tuple(KEYS[i] for i in xs))
replica_ids = st.sampled_from(["a", "b", "c"])

index_ops = st.lists(st.one_of(
    st.tuples(st.just("record"), replica_ids, chains),
    st.tuples(st.just("match"), replica_ids, chains),
    st.tuples(st.just("match_many"), st.lists(replica_ids, max_size=3), chains),
    st.tuples(st.just("blocks"), replica_ids, st.just(())),
    st.tuples(st.just("stats"), replica_ids, st.just(())),
    st.tuples(st.just("forget"), replica_ids, st.just(())),
    st.tuples(st.just("flush"), replica_ids, st.just(())),
), max_size=60)


def _apply(index: Any, op: tuple[str, Any, tuple[bytes, ...]], later: bool) -> Any:
    name, rid, keys = op
    if name == "record":
        return (index.record_later if later else index.record)(rid, keys)
    if name == "match":
        return index.match(rid, keys)
    if name == "match_many":
        return index.match_many(keys, rid)
    if name == "blocks":
        return index.replica_blocks(rid)
    if name == "stats":
        return index.stats()
    if name == "forget":
        return index.forget_replica(rid)
    return index.flush() if later else None


def _state(index: InProcessPrefixIndex) -> tuple[Any, ...]:
    return (index.stats(), tuple(index.match(r, KEYS[:k]) for r in "abc" for k in range(len(KEYS) + 1)),
            tuple(index.replica_blocks(r) for r in "abc"))


@settings(max_examples=300, deadline=None)
@given(ops=index_ops, capacity=st.integers(1, 8))
def test_record_later_reads_as_record_at_once(ops: list[Any], capacity: int) -> None:
    eager, lazy = InProcessPrefixIndex(capacity), InProcessPrefixIndex(capacity)
    for op in ops:
        assert _apply(lazy, op, True) == _apply(eager, op, False), op
    assert _state(lazy) == _state(eager)


def _stack(new: bool) -> tuple[Router, Calibration]:
    cal = Calibration(prior_rate=10000.0, min_samples=2) if new else _OldCalibration(prior_rate=10000.0, min_samples=2)
    cal.defer_observations(True)
    clock = iter(range(10**9)).__next__  # the same deterministic "time" in both stacks
    inner = InProcessLoadTracker() if new else SnapshotOnly(InProcessLoadTracker())
    loads = NotifyingLoadTracker(CalibratingLoadTracker(inner, cal, lambda: float(clock()) / 1000.0))
    index = InProcessPrefixIndex(6) if new else EagerIndex(6)
    policy = policy_from_config(CacheAwareConfig(dispatch_window_requests_per_replica=3))
    return Router(policy, index, loads, 16, cal), cal


class _OldCalibration(Calibration):
    """The old flush: the observations only (the estimates built at the next read)."""

    def flush(self) -> None:
        pending = self._pending  # test-only look at the queue it overrides
        if pending:
            self._pending = []
            for rid, tenant, u, q, y, s in pending:
                self._replica(rid).observe(tenant, u, q, y, s)


route_ops = st.lists(st.one_of(
    st.tuples(st.just("route"), st.tuples(st.sampled_from(["t1", "t2"]), chains, st.integers(0, 120),
                                          st.integers(0, 40), st.lists(replica_ids, min_size=1, max_size=3),
                                          st.booleans())),
    st.tuples(st.just("first_byte"), st.integers(0, 50)),
    st.tuples(st.just("finish"), st.integers(0, 50)),
    st.tuples(st.just("flush"), st.just(0)),
    st.tuples(st.just("settle"), st.just(0)),
    st.tuples(st.just("forget"), replica_ids),
), max_size=50)


@settings(max_examples=200, deadline=None)
@given(ops=route_ops)
def test_router_decides_as_before(ops: list[Any]) -> None:
    stacks = [_stack(True), _stack(False)]
    tickets: list[list[Any]] = [[], []]
    for op in ops:
        got: list[list[Any]] = [[], []]
        for s, (router, cal) in enumerate(stacks):
            name, arg = op
            if name == "route":
                tenant, keys, prompt, out, ids, calibrate = arg
                req = RouteRequest(tenant, keys, max(prompt, len(keys) * 16), out, 16, calibrate=calibrate)
                choice, ticket = router.route(req, ids)
                tickets[s].append(ticket)
                got[s].append((choice, router.load_tokens(choice.replica_id)
                            if s == 0 else router.loads.snapshot(choice.replica_id).tokens))
            elif name in ("first_byte", "finish"):
                if tickets[s]:
                    getattr(tickets[s][arg % len(tickets[s])], name)()
            elif name == "flush":
                cal.flush()
            elif name == "settle":
                router.settle()
            else:
                router.forget_replica(arg)
            got[s].append(tuple(router.loads.snapshot(r) for r in "abc"))
        assert got[0] == got[1], op
    new, old = stacks[0][0], stacks[1][0]
    assert new.counters() == old.counters()
    assert new.index.stats() == old.index.stats()
    assert all(new.index.match(r, KEYS[:k]) == old.index.match(r, KEYS[:k]) for r in "abc" for k in range(13))
    assert all(stacks[0][1].estimate(r) == stacks[1][1].estimate(r) for r in "abc")


def _old_one(g: LoadGuardFilter, req: RouteRequest, c: Candidate) -> list[Candidate]:
    """LoadGuardFilter._one as of session 14 (74d94e6)."""
    uncached = req.prompt_tokens - prefix_tokens(req, c.matched_blocks)
    unit = max(1, req.prompt_tokens + req.max_tokens)
    running = c.load.running_requests + (0.0 if not g.calibrated or c.estimate is None
                                         else c.estimate.external_requests)
    if not running + 1 <= g._request_cap(0 / unit, (0 + running + 1) / 1):
        return []
    if g.token_factor is None:
        return [c]
    est = c.estimate
    w = est.queue_weight if g.calibrated and est is not None and est.calibrated else 1.0
    if w >= 1.0:
        load = c.load.tokens
    else:
        s = c.load.shared_wait_tokens(uncached)
        load = s + w * (c.load.queued_prefill_tokens - s) + c.load.decode_tokens
    mean = (0 + load + (uncached + req.max_tokens)) / 1
    tok_cap = math.ceil(g.token_factor * mean / unit) * unit
    tok_cap += g.slack_requests * unit + g.token_slack
    return [c] if load + uncached + req.max_tokens - 0 <= tok_cap else []


def _old_costs(p: CacheAwarePolicy, req: RouteRequest, candidates: Sequence[Candidate]) -> dict[str, float]:
    """CacheAwarePolicy._costs as of session 14 (74d94e6), without the queue-externality scorer."""
    ttft, decode, affinity = p._own_scorers[:3]
    rw = rates_and_queue_weights(candidates, ttft.prefill_tokens_per_s, ttft.calibrated)
    out = {}
    for c in candidates:
        load = c.load
        rate, w = rw[c.replica_id]
        matched = max(0, min(c.matched_blocks * req.block_size, req.prompt_tokens))
        u = req.prompt_tokens - matched
        if ttft.calibrated:
            s = load.shared_wait_tokens(u)
            cost = (s + w * (load.queued_prefill_tokens - s) + u) / rate
        else:
            cost = (load.queued_prefill_tokens + u) / rate
        cost += decode.weight * load.decode_tokens / rate
        cost += -(affinity.weight * matched / rate)
        out[c.replica_id] = cost
    return out


estimates = st.one_of(st.none(), st.builds(
    ReplicaEstimate, st.floats(100.0, 1e5), st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.integers(0, 9),
    st.none(), st.booleans(), st.floats(0.0, 8.0)))
candidates = st.builds(
    Candidate, replica_ids,
    st.builds(ReplicaLoad, st.just("x"), st.integers(0, 5000), st.integers(0, 5000), st.integers(0, 12),
              st.integers(0, 12)),
    st.integers(0, 10), estimates)
requests = st.builds(RouteRequest, st.just("t"), st.just(()), st.integers(0, 400), st.integers(0, 300),
                     st.sampled_from([1, 16]))


@settings(max_examples=500, deadline=None)
@given(req=requests, c=candidates, calibrated=st.booleans(), token=st.sampled_from([None, 1.0, 1.25, 3.0]),
       factor=st.sampled_from([1.0, 2.0]), slack=st.sampled_from([0.0, 4.0]))
def test_single_candidate_guard_as_before(req: RouteRequest, c: Candidate, calibrated: bool, token: float | None,
                                          factor: float, slack: float) -> None:
    g = LoadGuardFilter(factor, token, slack, 0.0, calibrated)
    assert g.filter(req, [c]) == _old_one(g, req, c)


@settings(max_examples=500, deadline=None)
@given(req=requests, cands=st.lists(candidates, min_size=1, max_size=3, unique_by=lambda c: c.replica_id),
       calibrate=st.booleans(), decode=st.sampled_from([0.0, 0.5]))
def test_costs_as_before(req: RouteRequest, cands: list[Candidate], calibrate: bool, decode: float) -> None:
    p = CacheAwarePolicy(CacheAwareConfig(calibrate=calibrate, decode_weight=decode))
    assert p._costs(req, cands) == _old_costs(p, req, cands)


def test_routing_needs_no_settle_for_the_next_request() -> None:
    """A sequential next request sees the previous one's record whether or not the replica wait ran."""
    router, _ = _stack(True)
    req = RouteRequest("t1", KEYS[:3], 48, 1, 16)
    first, t = router.route(req, ["a"])
    t.finish()
    second, _ = router.route(req, ["a"])
    assert (first.predicted_prefix_tokens, second.predicted_prefix_tokens) == (0, 48)
