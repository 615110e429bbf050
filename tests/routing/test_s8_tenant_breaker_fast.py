"""gateway/tenant_breaker.py (session 8, issue 14): the success fast path reads the pair from a plain
dict kept beside the TTLCache (``_Pairs.held``) instead of the cache's timed ``get``. Without eviction
pressure every verdict, streak and open pair equals that of the same breaker without the fast path;
with it, ``held`` holds exactly the entries still in the cache, so memory stays bounded."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.tenant_breaker import REFRESH_S, TenantBreaker
from tests.routing.test_s7_tenant_breaker_unit import Clock

_ops = st.lists(st.tuples(st.sampled_from(["ok", "fail", "tick"]), st.sampled_from(["r0", "r1"]),
                          st.sampled_from(["a", "b", "c", "d"]), st.floats(0.0, 3.0 * REFRESH_S)),
                max_size=60)


def _run(ops: list[tuple[str, str, str, float]], fast: bool, max_tenants: int) -> tuple[list[object], TenantBreaker]:
    clock = Clock()
    tb = TenantBreaker(2, 1.5, window_s=2.0, max_tenants=max_tenants, clock=clock)
    tb._fast = fast and tb._fast
    out: list[object] = []
    for op, rid, tid, dt in ops:
        if op == "tick":
            clock.t += dt
        elif op == "ok":
            tb.succeeded(rid, tid)
        else:
            out.append(tb.failed(rid, tid))
        out.append(tuple((r, t, tb.blocked(r, t), tb.streak(r, t)) for r in ("r0", "r1") for t in "abcd"))
    return out, tb


@settings(max_examples=300, deadline=None)
@given(_ops)
def test_fast_path_decides_as_the_cache_read(ops: list[tuple[str, str, str, float]]) -> None:
    assert _run(ops, True, 8)[0] == _run(ops, False, 8)[0]


@settings(max_examples=300, deadline=None)
@given(_ops)
def test_held_entries_are_exactly_those_in_the_cache(ops: list[tuple[str, str, str, float]]) -> None:
    _, tb = _run(ops, True, 2)  # four tenants, two places: evictions
    for rid in ("r0", "r1"):
        table = tb._table(rid)
        present = len(table)  # the cache's own count (it drops expired entries first)
        assert len(table.held) == present <= 2
        for tid, entry in table.held.items():
            assert table.get(tid) in (entry, None)  # the cached object itself (None: past its TTL)
