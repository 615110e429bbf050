"""ReplicaSet keeps its routable ids and candidates until its version moves (issue 14, session 6).

Every path that changes routability must invalidate them: a long random walk over every public
way to change a set (membership, health verdicts, breaker verdicts and attempts, half-open
probes, restarts, the cool-down passing) compares the cached answers, after each step, with
the answers recomputed from ``is_routable`` (which is never cached). Leaving out the version
bump of any one path makes it fail (checked, one at a time), except the cool-down's: nothing is
kept while a circuit is open, so that one is covered twice.
"""
from __future__ import annotations

import random

import pytest

from gateway.replicas import CircuitState, Replica, ReplicaSet

POOLS = ("a", "b", "c")


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _expected(rs: ReplicaSet, pools: frozenset[str] | None) -> list[str]:
    return [r.id for r in rs.all()
            if (not pools or r.pool in pools) and rs.is_routable(r.id)]


def _step(rs: ReplicaSet, clock: Clock, rng: random.Random, serial: list[int]) -> None:
    ids = [r.id for r in rs.all()]
    op = rng.randrange(13)
    if op == 0 or not ids:
        serial[0] += 1
        rs.add(Replica(f"r{serial[0]}", f"http://h{serial[0]}", pool=rng.choice(POOLS)))
        return
    rid = rng.choice(ids)
    if op == 1:
        rs.remove(rid)
    elif op == 2:
        rs.mark_health(rid, rng.random() < 0.6)
    elif op == 3:
        rs.record_success(rid)
    elif op == 4:
        for _ in range(rng.choice((1, rs.failure_threshold))):
            rs.record_failure(rid)
    elif op == 5:
        rs.record_status(rid, rng.choice((200, 404, 500, 503)))
    elif op == 6:
        rs.on_dispatch(rid)
    elif op == 7:
        rs.release_probe(rid)
    elif op == 8:
        att = rs.attempt(rid)
        rng.choice((att.succeeded, att.failed, att.release))()
    elif op == 9:
        rs.observe_instance(rid, rng.choice(("i1", "i2")))
    elif op == 10:
        clock.t += rng.choice((0.5, rs.cooldown_s, rs.cooldown_s + 1))  # cool-downs pass
    elif op == 11:
        att = rs.attempt(rid)  # a probe left in flight
        if rng.random() < 0.5:
            att.release()
    else:
        rs.state(rid)  # reading a state may advance its circuit


@pytest.mark.parametrize("seed", range(8))
def test_cached_routable_ids_and_candidates_follow_every_change(seed: int) -> None:
    rng = random.Random(seed)
    clock = Clock()
    rs = ReplicaSet([Replica(f"s{i}", f"http://s{i}", pool=POOLS[i % 3]) for i in range(4)],
                    failure_threshold=2, cooldown_s=5.0, clock=clock)
    serial = [0]
    pool_sets = [None, frozenset(), frozenset({"a"}), frozenset({"b", "c"})]
    seen_open = seen_half_open = 0
    for _ in range(3000):
        _step(rs, clock, rng, serial)
        if len(rs.all()) > 8:
            rs.remove(rs.all()[0].id)
        for _ in range(2):  # twice: the second answer comes from the cache
            got_all = rs.routable_ids()
            got_a = rs.routable_ids(["a"])
            cands = {p: [r.id for r in rs.candidates(p if p is not None else frozenset())] for p in pool_sets}
        assert got_all == _expected(rs, None)
        assert got_a == _expected(rs, frozenset({"a"}))
        for p, got in cands.items():
            assert got == _expected(rs, p), (p, got)
        states = [rs.state(r.id).circuit for r in rs.all()]
        seen_open += CircuitState.OPEN in states
        seen_half_open += CircuitState.HALF_OPEN in states
    assert seen_open and seen_half_open  # the walk went through every circuit state


def test_answers_are_reused_until_the_version_moves_and_are_fresh_lists() -> None:
    rs = ReplicaSet([Replica("a", "http://a"), Replica("b", "http://b", pool="p")])
    v = rs.version
    first = rs.routable_ids()
    first.append("junk")  # callers may change their list
    assert rs.routable_ids() == ["a", "b"] and rs.version == v
    c = rs.candidates(frozenset())
    c.clear()
    assert [r.id for r in rs.candidates(frozenset())] == ["a", "b"]
    for _ in range(3):
        rs.record_success("a")  # a routine success changes nothing routable: version kept
        rs.on_dispatch("a")
        rs.mark_health("a", True)
    assert rs.version == v
    rs.mark_health("b", False)
    assert rs.version > v and rs.routable_ids() == ["a"]
    assert [r.id for r in rs.candidates(frozenset({"p"}))] == []


def test_an_open_circuit_turns_half_open_with_time_without_any_call_in_between() -> None:
    clock = Clock()
    rs = ReplicaSet([Replica("a", "http://a")], failure_threshold=1, cooldown_s=5.0, clock=clock)
    rs.record_failure("a")
    assert rs.routable_ids() == []
    clock.t += 5.0
    assert rs.routable_ids() == ["a"]  # the cool-down passed: one half-open probe allowed
    rs.on_dispatch("a")
    assert rs.routable_ids() == []
