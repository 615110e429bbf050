"""Issue 14, session 14 (fewer stages): the batched counters' one-call ``add`` and the fair queue's
``size`` attribute keep what they replace."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter

from gateway.metrics import BoundChildren, CounterBatch
from routing.fairness import FairQueue


def test_counter_batch_add_equals_inc_per_child() -> None:
    reg = CollectorRegistry()
    batch = CounterBatch()
    reg.register(batch)
    fam = BoundChildren(Counter("c_total", "c", ["t", "k"], registry=reg), batch)
    plain = Counter("p_total", "p", registry=reg)  # not of the batch: inc()'d directly
    a, b = fam.labels("t1", "prompt"), fam.labels("t1", "output")
    batch.add(((a, 3), (b, 0), (a, 2), (plain, 5)))
    assert reg.get_sample_value("p_total") == 5  # at once
    assert reg.get_sample_value("c_total", {"t": "t1", "k": "prompt"}) == 5  # the read flushed the batch
    assert reg.get_sample_value("c_total", {"t": "t1", "k": "output"}) == 0
    with pytest.raises(ValueError):
        batch.add(((a, 1), (b, -1)))
    assert reg.get_sample_value("c_total", {"t": "t1", "k": "prompt"}) == 6  # the pair before it was added


def test_fair_queue_size_follows_len() -> None:
    q: FairQueue[str] = FairQueue()
    q.push("a", "x1")
    q.push("b", "y1")
    assert q.size == len(q) == 2
    q.remove("a", "x1")
    assert q.size == len(q) == 1
    sel = q.select(lambda item: "warm")
    assert sel is not None and sel.item == "y1" and q.size == len(q) == 1  # selecting does not take it out
    assert q.remove("b", "y1") and q.size == len(q) == 0
    q.put_back("b", "y1")
    assert q.size == len(q) == 1
