"""Issue 17: which tenants the dispatcher skips for want of a concurrency slot
(gateway/flow_slots.py), and a release undone returning to its place in arrival order."""

from __future__ import annotations

from gateway.flow_slots import SlotGate
from routing.fairness import FairQueue


def test_in_process_refusal_lasts_one_round() -> None:
    g = SlotGate()
    g.refused_now("a")
    assert g.skipped("a") and g.at_concurrency("a") and not g.skipped("b")
    g.new_round()
    assert not g.skipped("a")


def test_after_a_redis_refusal_one_ask_at_a_time_until_granted() -> None:
    g = SlotGate()
    g.asking("a")
    g.asking("a")  # never refused: asks in parallel
    assert not g.skipped("a")
    g.asked("a", False)  # refused: skipped until the recheck
    assert g.skipped("a") and g.at_concurrency("a")
    g.recheck()
    assert g.skipped("a")  # still one ask of a pending and a was refused: wait for it
    g.asked("a", None)
    assert not g.skipped("a")
    g.asking("a")
    assert g.skipped("a")  # probing: the next waits for this one
    g.asked("a", True)
    g.asking("a")
    assert not g.skipped("a")  # granted: parallel again


def test_put_back_keeps_arrival_order() -> None:
    q: FairQueue[str] = FairQueue()
    for x in ("a1", "a2", "a3"):
        q.push("a", x)
    pos = {x: q.position("a", x) for x in ("a1", "a2")}
    q.remove("a", "a1")
    q.remove("a", "a2")
    q.put_back("a", "a2", 0, pos["a2"])  # refusals may come back in any order
    q.put_back("a", "a1", 0, pos["a1"])
    order = []
    while len(q):
        s = q.select(lambda item: "warm")
        assert s is not None
        order.append(s.item)
        q.remove("a", s.item)
    assert order == ["a1", "a2", "a3"]
