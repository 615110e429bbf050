"""Session 26 (cut26, issue 14): ``TenantBreaker.succeeded`` reads the pair's entry with one
``TTLCache`` lookup (``table[tenant]``) instead of ``Cache.get`` (``in`` then ``[]``).

Differential: any sequence of successes, failures, clock steps and reads gives the same verdicts,
reads and table state (live entries and their LRU order, read through ``popitem`` on a copy) as the
session 25 method, kept here verbatim as the reference. Small ``max_tenants`` forces evictions, so a
change of the LRU touch on a read would show; short windows make entries expire between calls.
"""

from __future__ import annotations

import copy

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.tenant_breaker import REFRESH_S, TenantBreaker, _Entry


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class _Session25Breaker(TenantBreaker):
    """The breaker with the session 25 ``succeeded`` (46e374b), the reference."""

    def succeeded(self, replica_id: str, tenant_id: str | None, served: bool = True) -> None:
        if not served:
            return
        self._seq += 1
        self._served_seq[replica_id] = self._seq
        if tenant_id is None:
            return
        now = self._clock()
        table = self._table(replica_id)
        entry = table.get(tenant_id)
        if entry is not None and entry.last_ok and now - entry.last_at < REFRESH_S:
            return
        entry = entry or _Entry()
        entry.last_ok, entry.last_at, entry.streak = True, now, 0
        table[tenant_id] = entry


_TENANTS = st.sampled_from(["a", "b", "c", "d", None])
_REPLICAS = st.sampled_from(["r1", "r2"])
_OPS = st.one_of(
    st.tuples(st.just("ok"), _REPLICAS, _TENANTS, st.booleans()),
    st.tuples(st.just("fail"), _REPLICAS, _TENANTS, st.booleans()),
    st.tuples(st.just("tick"), st.sampled_from([0.0, 0.25, 0.5, 0.999, 1.0, 1.5, 2.0, 3.0, 7.0])),
    st.tuples(st.just("forget"), _REPLICAS),
)


def _state(b: TenantBreaker, clock: _Clock) -> dict[str, object]:
    """Every observable of ``b`` now: per replica the live entries in LRU order (popitem on a copy)."""
    out: dict[str, object] = {"seq": b._seq, "served": dict(b._served_seq), "blocked_pairs": b.blocked_pairs,
                              "open_until_max": b.open_until_max, "any_open": b.any_open()}
    for rid, table in sorted(b._replicas.items()):
        dup = copy.copy(table)
        order = []
        while True:
            try:
                key, e = dup.popitem()
            except KeyError:
                break
            order.append((key, e.last_ok, e.last_at, e.streak, e.open_until, e.seq, tuple(e.failures)))
        out[rid] = order
        for t in ("a", "b", "c", "d", None):
            out[f"{rid}/{t}"] = (b.blocked(rid, t), b.streak(rid, t))
    return out


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(_OPS, max_size=60), threshold=st.integers(1, 3), window_s=st.sampled_from([0.5, 2.0, 5.0]),
       cooldown_s=st.sampled_from([0.0, 0.5, 3.0]), max_tenants=st.integers(2, 3))
def test_succeeded_equals_session25(ops: list[tuple], threshold: int, window_s: float, cooldown_s: float,
                                    max_tenants: int) -> None:
    clock = _Clock()
    opened_new: list[tuple[str, str]] = []
    opened_old: list[tuple[str, str]] = []
    new = TenantBreaker(threshold, cooldown_s, window_s=window_s, max_tenants=max_tenants, clock=clock,
                        on_open=lambda r, t: opened_new.append((r, t)))
    old = _Session25Breaker(threshold, cooldown_s, window_s=window_s, max_tenants=max_tenants, clock=clock,
                            on_open=lambda r, t: opened_old.append((r, t)))
    for op in ops:
        if op[0] == "ok":
            assert new.succeeded(op[1], op[2], op[3]) == old.succeeded(op[1], op[2], op[3])
        elif op[0] == "fail":
            assert new.failed(op[1], op[2], vouched=op[3]) == old.failed(op[1], op[2], vouched=op[3])
        elif op[0] == "tick":
            clock.t += op[1]
        else:
            new.forget(op[1])
            old.forget(op[1])
        assert opened_new == opened_old
        assert _state(new, clock) == _state(old, clock)


def test_a_fresh_success_is_not_written_again_and_an_old_one_is() -> None:
    """The REFRESH_S skip still works through the new lookup: within it the entry object is left as
    it was; after it (or after the entry expired) the success is written again."""
    clock = _Clock()
    b = TenantBreaker(2, 1.0, window_s=5.0, clock=clock)
    b.succeeded("r1", "a")
    first = b._replicas["r1"]["a"]
    assert (first.last_ok, first.last_at) == (True, 1000.0)
    clock.t += REFRESH_S / 2
    b.succeeded("r1", "a")
    assert b._replicas["r1"]["a"].last_at == 1000.0  # skipped
    clock.t += REFRESH_S
    b.succeeded("r1", "a")
    assert b._replicas["r1"]["a"].last_at == 1000.0 + 1.5 * REFRESH_S  # written again
    clock.t += 100.0  # past window_s + cooldown_s: the entry expired
    b.succeeded("r1", "a")
    fresh = b._replicas["r1"]["a"]
    assert fresh is not first and fresh.last_at == clock.t and fresh.streak == 0
