"""Session 13 (issue 14): the verified-token cache's plain-dict entries (no ``cachetools.TLRUCache``)
against a reference model, on random sequences of puts, gets, key changes and clock moves.

Held: an answer is only ever the identity last stored under that exact name, for the same trust
domain and keys version, before its time (``min(exp + leeway, stored + max_ttl)``), not cleared since;
the cache never holds more than ``maxsize`` entries; with room to spare it answers exactly as the model;
when full it drops expired entries first, then the one closest to its expiry.
"""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.identity import VerifiedTokenCache, WorkloadIdentity
from gateway.identity.spiffe_id import SpiffeId


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _ident(td: str, exp: float | None, n: int) -> WorkloadIdentity:
    return WorkloadIdentity(SpiffeId(td, f"/w{n}"), td, expires_at=exp)


_OPS = st.lists(st.one_of(
    st.tuples(st.just("put"), st.integers(0, 5), st.sampled_from(["a.org", "b.org"]), st.integers(0, 1),
              st.one_of(st.none(), st.floats(0, 200))),
    st.tuples(st.just("get"), st.integers(0, 5), st.sampled_from(["a.org", "b.org"]), st.integers(0, 1)),
    st.tuples(st.just("tick"), st.floats(0, 80)),
    st.tuples(st.just("clear"), st.sampled_from(["a.org", "b.org"])),
), max_size=60)


def _run(ops: list[tuple], maxsize: int) -> None:
    clock = _Clock()
    cache = VerifiedTokenCache(maxsize, 100.0, leeway_s=5.0, clock=clock)
    model: dict[str, tuple[WorkloadIdentity, str, int, float]] = {}
    evicted = False
    for n, op in enumerate(ops):
        if op[0] == "put":
            _, k, td, ver, exp_in = op
            ident = _ident(td, None if exp_in is None else clock.t + exp_in, n)
            until = clock.t + 100.0 if exp_in is None else min(clock.t + 100.0, clock.t + exp_in + 5.0)
            live = {name for name, v in model.items() if clock.t < v[3]}
            if clock.t < until and f"t{k}" not in live and len(live) >= maxsize:
                evicted = True  # from now on the cache may answer less than the model, never more
            cache.put(f"t{k}", ident, ver)
            if clock.t < until:
                model[f"t{k}"] = (ident, td, ver, until)
        elif op[0] == "get":
            _, k, td, ver = op
            got = cache.get(f"t{k}", td, ver)
            m = model.get(f"t{k}")
            valid = m is not None and m[1] == td and m[2] == ver and clock.t < m[3]
            if got is not None:
                assert valid and got is m[0]  # never an answer the model refuses
            elif not evicted:
                assert not valid  # with room to spare: exactly the model
            if m is not None and not valid:
                model.pop(f"t{k}")  # a refused entry is dropped
        elif op[0] == "tick":
            clock.t += op[1]
        else:
            cache.clear_trust_domain(op[1])
            model = {k: v for k, v in model.items() if v[1] != op[1]}
        assert len(cache) <= maxsize


@settings(max_examples=400, deadline=None)
@given(_OPS)
def test_roomy_cache_answers_as_the_model(ops: list[tuple]) -> None:
    _run(ops, maxsize=100)


@settings(max_examples=400, deadline=None)
@given(_OPS)
def test_full_cache_never_answers_what_the_model_refuses(ops: list[tuple]) -> None:
    _run(ops, maxsize=2)


def test_full_cache_drops_expired_then_the_closest_to_expiry() -> None:
    clock = _Clock()
    cache = VerifiedTokenCache(2, 100.0, clock=clock)
    cache.put("late", _ident("a.org", clock.t + 90, 1), 0)
    cache.put("soon", _ident("a.org", clock.t + 30, 2), 0)
    cache.put("new", _ident("a.org", clock.t + 60, 3), 0)  # full: "soon" (closest to expiry) goes
    assert cache.get("soon", "a.org", 0) is None
    assert cache.get("late", "a.org", 0) is not None and cache.get("new", "a.org", 0) is not None
    clock.t += 61  # "new" expired
    cache.put("third", _ident("a.org", clock.t + 80, 4), 0)  # the expired one goes, "late" stays
    assert cache.get("late", "a.org", 0) is not None and cache.get("third", "a.org", 0) is not None
    assert len(cache) == 2
