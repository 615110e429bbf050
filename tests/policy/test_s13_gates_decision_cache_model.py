"""Session 13 (issue 14): the decision cache's plain-dict entries (no ``cachetools.TTLCache``) against a
reference model, on random sequences of puts, gets, clears and clock moves.

Held: an answer is only ever the decision last stored under that exact key, marked cached, with its
decision id, less than ``ttl_s`` after it was stored and not cleared since; never more than
``max_entries`` entries; with room to spare exactly the model; when full the oldest entry goes.
"""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from policy.cache import DecisionCache
from policy.decision import Decision


class _Clock:
    def __init__(self) -> None:
        self.t = 50.0

    def __call__(self) -> float:
        return self.t


def _decision(n: int) -> Decision:
    return Decision(True, "ok", "", None, None, None, f"id-{n}")


_OPS = st.lists(st.one_of(
    st.tuples(st.just("put"), st.integers(0, 5)),
    st.tuples(st.just("get"), st.integers(0, 5)),
    st.tuples(st.just("tick"), st.floats(0, 0.7)),
    st.tuples(st.just("clear"),),
), max_size=80)


def _run(ops: list[tuple], max_entries: int) -> None:
    clock = _Clock()
    cache = DecisionCache(ttl_s=1.0, max_entries=max_entries, clock=clock)
    model: dict[tuple, tuple[Decision, float]] = {}
    evicted = False
    for n, op in enumerate(ops):
        if op[0] == "put":
            key = ("k", op[1])
            live = [k for k, (_, t) in model.items() if clock.t < t]
            if key not in live and len(live) >= max_entries:
                evicted = True
            d = _decision(n)
            cache.put(key, d)
            model[key] = (d, clock.t + 1.0)
        elif op[0] == "get":
            key = ("k", op[1])
            got = cache.get(key)
            m = model.get(key)
            valid = m is not None and clock.t < m[1]
            if got is not None:
                assert valid and got.cached and got.decision_id == m[0].decision_id and got.allow == m[0].allow
            elif not evicted:
                assert not valid
        elif op[0] == "tick":
            clock.t += op[1]
        else:
            cache.clear()
            model.clear()
        assert len(cache) <= max_entries


@settings(max_examples=400, deadline=None)
@given(_OPS)
def test_roomy_cache_answers_as_the_model(ops: list[tuple]) -> None:
    _run(ops, max_entries=100)


@settings(max_examples=400, deadline=None)
@given(_OPS)
def test_full_cache_never_answers_what_the_model_refuses(ops: list[tuple]) -> None:
    _run(ops, max_entries=2)


def test_expiry_is_exact_and_full_drops_the_oldest() -> None:
    clock = _Clock()
    cache = DecisionCache(ttl_s=1.0, max_entries=2, clock=clock)
    cache.put(("a",), _decision(1))
    clock.t += 0.5
    cache.put(("b",), _decision(2))
    cache.put(("a",), _decision(3))  # a re-put: "a" is now the newest
    cache.put(("c",), _decision(4))  # full: "b" (the oldest) goes
    assert cache.get(("b",)) is None and cache.get(("a",)).decision_id == "id-3"
    clock.t += 0.999
    assert cache.get(("c",)) is not None
    clock.t += 0.001  # exactly ttl_s after "a" and "c" were stored: expired
    assert cache.get(("a",)) is None and cache.get(("c",)) is None and len(cache) == 0
