"""Session 16 (diff leftover of session 15; reverted in 16 over a load-flaky concentration test, whose cause
session 17 found in the test, tests/audit_e2e/test_e2e_concentration.py: folded again in 17): the queued
records of ``InProcessPrefixIndex.record_later`` are applied before every other method of the index reads or
changes it, by one rule (``_queued_first``; inline in ``match_many``, the method on the request's path)
instead of the same two lines at the top of each method.

Every public method is checked: after ``record_later`` it answers, and leaves the index, exactly as after an
immediate ``record``. A public method added without the rule, or missing from :data:`CALLS`, fails here.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest

from routing.index import InProcessPrefixIndex

KEYS = (b"k1", b"k2", b"k3")
#: each public method of the index (but the queue's own two) with the arguments it is called with here
CALLS: dict[str, Callable[[InProcessPrefixIndex], Any]] = {
    "match": lambda ix: ix.match("r0", KEYS),
    "match_many": lambda ix: ix.match_many(KEYS, ["r0", "r1"]),
    "record": lambda ix: ix.record("r1", KEYS[:2]),
    "forget_replica": lambda ix: ix.forget_replica("r0"),
    "replica_blocks": lambda ix: ix.replica_blocks("r0"),
    "stats": lambda ix: ix.stats(),
}
QUEUE = {"record_later", "flush", "capacity_blocks"}


def _state(ix: InProcessPrefixIndex) -> tuple[Any, ...]:
    """What the index holds, read through its public methods only."""
    return (ix.stats(), ix.match_many(KEYS, ["r0", "r1"]), ix.replica_blocks("r0"), ix.replica_blocks("r1"))


def test_every_public_method_is_listed() -> None:
    public = {n for n, _ in inspect.getmembers(InProcessPrefixIndex) if not n.startswith("_")}
    assert public == set(CALLS) | QUEUE, "a new public method: add it to CALLS (and apply the queue first)"


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_queued_record_reads_as_one_made_at_once(name: str) -> None:
    now, later = InProcessPrefixIndex(2), InProcessPrefixIndex(2)  # capacity 2: the chain is cut
    now.record("r0", KEYS)
    later.record_later("r0", KEYS)
    assert CALLS[name](later) == CALLS[name](now)  # the queued record applied before the call
    assert _state(later) == _state(now)


def test_queued_records_apply_in_call_order_before_a_read() -> None:
    now, later = InProcessPrefixIndex(3), InProcessPrefixIndex(3)
    for rid, keys in (("r0", KEYS), ("r1", KEYS[:1]), ("r0", (b"x", b"y"))):
        now.record(rid, keys)
        later.record_later(rid, keys)
    assert later.match("r0", KEYS) == now.match("r0", KEYS) == 1  # k1 kept (touched last), k2/k3 evicted
    assert _state(later) == _state(now)


def test_record_keeps_its_name_and_documentation() -> None:
    assert InProcessPrefixIndex.record.__name__ == "record"
    assert InProcessPrefixIndex.record.__qualname__ == "InProcessPrefixIndex.record"
    assert "deepest-first" in (InProcessPrefixIndex.record.__doc__ or "")
