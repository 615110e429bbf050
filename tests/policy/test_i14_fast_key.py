"""Issue 14: decision-cache hits without building the policy input document.

:func:`policy.cache.fast_key` computes the decision-cache key from the facts
``build_policy_input`` takes. Property: for random facts it equals
``DecisionCache().key(build_policy_input(...))`` (so fast_key(a) == fast_key(b)
iff built_key(a) == built_key(b)), and it declines (``None``) exactly when
building would raise. :func:`policy.cache.decide_from_facts` builds the
document only on a miss.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from policy.cache import CachedDecisionPoint, DecisionCache, decide_from_facts, fast_key
from policy.input import PolicyInputError, build_policy_input
from tests.support.pep import CountingDecisionPoint

NAMES = st.sampled_from(["a", "b", "eu", "us", "sim-model", "\x00missing", ""])
ANY_SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-2, 3), NAMES, st.floats(allow_nan=True))
MAYBE_BAD = lambda good: st.integers(0, 59).flatmap(lambda i: good if i else ANY_SCALAR)  # noqa: E731  (mostly valid)

labels = st.dictionaries(NAMES, NAMES, max_size=3)
identity = st.fixed_dictionaries({
    "spiffe_id": MAYBE_BAD(st.sampled_from(["spiffe://t/ns/a", "spiffe://t/ns/b"])),
    "trust_domain": MAYBE_BAD(st.sampled_from(["t", "u"])),
    "claims": MAYBE_BAD(st.fixed_dictionaries({"aud": st.lists(NAMES, max_size=2), "exp": st.integers(0, 9)})),
})
tenant = st.fixed_dictionaries({
    "id": MAYBE_BAD(st.sampled_from(["acme", "globex"])),
    "tier": st.one_of(st.none(), NAMES, st.integers(0, 2)),
    "models": MAYBE_BAD(st.lists(NAMES, max_size=3)),
    "pools": MAYBE_BAD(st.one_of(st.lists(NAMES, max_size=3), st.frozensets(NAMES, max_size=3))),
    "labels": MAYBE_BAD(labels),
    "max_tokens": MAYBE_BAD(st.one_of(st.none(), st.integers(0, 5))),
    "regulated": MAYBE_BAD(st.booleans()),
    "data_residency": MAYBE_BAD(st.sampled_from([None, "eu", "us"])),
}, optional={"max_prompt_tokens": st.integers(0, 5), "max_output_tokens": st.integers(0, 5)})
request = st.fixed_dictionaries({
    "endpoint": MAYBE_BAD(st.sampled_from(["/v1/completions", "/v1/chat/completions"])),
    "model": MAYBE_BAD(st.sampled_from(["sim-model", "m2"])),
}, optional={
    "prompt_tokens": MAYBE_BAD(st.integers(0, 100)),
    "max_tokens": MAYBE_BAD(st.one_of(st.none(), st.integers(0, 100))),
    "stream": MAYBE_BAD(st.booleans()),
    "sequences": MAYBE_BAD(st.integers(1, 4)),
})
candidate = st.fixed_dictionaries({
    "id": MAYBE_BAD(st.sampled_from(["r0", "r1", "r2"])),
    "pool": MAYBE_BAD(st.sampled_from(["default", "eu"])),
    "labels": MAYBE_BAD(st.sampled_from([{}, {"data_residency": "eu"}, {"data_residency": "us", "x": "y"}])),
    "healthy": MAYBE_BAD(st.booleans()),
    "load": MAYBE_BAD(st.one_of(st.integers(0, 9), st.floats(0, 9))),
})
alert = st.fixed_dictionaries({
    "id": MAYBE_BAD(st.sampled_from(["a1", "a2"])),
    "kind": MAYBE_BAD(st.sampled_from(["replica_concentration", "cache_miss"])),
}, optional={"replica_id": st.sampled_from([None, "r0", 3]), "replica": st.sampled_from(["r1", None]),
             "tenant_id": st.sampled_from([None, "acme", 7]), "since": st.floats(0, 9)})
facts = st.tuples(identity, tenant, request, st.lists(candidate, max_size=3, unique_by=lambda c: str(c["id"])),
                  st.lists(alert, max_size=2, unique_by=lambda a: str(a["id"])))


def _built_key(f: tuple[Any, ...]) -> tuple[Any, ...] | None:
    try:
        return DecisionCache().key(build_policy_input(*f, now=1.0))
    except PolicyInputError:
        return None


@settings(max_examples=600, deadline=None)
@given(f=facts)
def test_fast_key_is_the_built_documents_key(f: tuple[Any, ...]) -> None:
    """Equal to the built document's key; None exactly when building raises."""
    built = _built_key(f)
    event("valid" if built is not None else "invalid")
    assert fast_key(*f) == built


@settings(max_examples=400, deadline=None)
@given(a=facts, b=facts)
def test_fast_keys_agree_iff_built_keys_agree(a: tuple[Any, ...], b: tuple[Any, ...]) -> None:
    ka, kb = _built_key(a), _built_key(b)
    if ka is None or kb is None:
        return
    assert (fast_key(*a) == fast_key(*b)) == (ka == kb)


_FACTS = ({"spiffe_id": "spiffe://t/ns/a", "trust_domain": "t", "claims": {}},
          {"id": "acme", "tier": "standard", "models": ["m"], "pools": ["default"]},
          {"endpoint": "/v1/completions", "model": "m", "prompt_tokens": 3, "max_tokens": 5},
          [{"id": "r0", "pool": "default", "labels": {}, "healthy": True, "load": 0}], [])


async def test_a_hit_builds_no_document(monkeypatch: pytest.MonkeyPatch) -> None:
    inner = CountingDecisionPoint()
    dp = CachedDecisionPoint(inner, DecisionCache(ttl_s=60))
    first = await decide_from_facts(dp, *_FACTS, now=1.0)
    built: list[int] = []
    import policy.input

    real = policy.input.build_policy_input
    monkeypatch.setattr(policy.input, "build_policy_input", lambda *a, **k: built.append(1) or real(*a, **k))
    again = await decide_from_facts(dp, *_FACTS[:2], {**_FACTS[2], "max_tokens": 9}, *_FACTS[3:], now=2.0)
    assert (first.cached, again.cached, again.decision_id, len(inner.docs), built) == (False, True, "d1", 1, [])
    other = await decide_from_facts(dp, _FACTS[0], {**_FACTS[1], "models": []}, *_FACTS[2:], now=3.0)
    assert (other.cached, len(inner.docs), built) == (False, 2, [1])


async def test_a_hit_never_skips_input_validation() -> None:
    dp = CachedDecisionPoint(CountingDecisionPoint(), DecisionCache(ttl_s=60))
    await decide_from_facts(dp, *_FACTS, now=1.0)
    with pytest.raises(PolicyInputError):  # same key, but a field outside it is mistyped
        await decide_from_facts(dp, *_FACTS[:2], {**_FACTS[2], "stream": "yes"}, *_FACTS[3:], now=2.0)
