"""Issue 17: a release undone (the tenant had no concurrency slot) puts the request back at the
head of its tenant's queue and takes back the tokens charged for it (routing/fairness.py)."""

from __future__ import annotations

from routing.fairness import FairQueue


def test_put_back_restores_the_head_and_the_counter() -> None:
    q: FairQueue[str] = FairQueue()
    q.push("a", "a1", 2.0)
    q.push("a", "a2", 2.0)
    q.push("b", "b1", 1.0)
    sel = q.select(lambda item: "warm" if item.startswith("a") else None)
    assert sel is not None and sel.item == "a1"  # a's oldest
    q.remove("a", "a1")
    q.charge("a", 100)  # released: 100 uncached tokens / weight 2
    assert q.counter("a") == 50.0
    q.put_back("a", "a1", 100)  # no slot: undone
    assert q.counter("a") == 0.0 and q.queued("a") == 2 and len(q) == 3
    order: list[str] = []
    while len(q):
        s = q.select(lambda item: "warm")
        assert s is not None
        order.append(s.item)
        q.remove(s.tenant_id, s.item)
    assert order.index("a1") < order.index("a2")  # FIFO within the tenant kept
