"""Issue 14, session 17 (front2): whole steps cut from a request's front, each rule kept.

- The send order (gateway/send_order.py): the pipeline awaits ``SEND_ORDER.wait_turn`` only when sends were
  started since its head was stamped; a request whose turn it is already runs on without a coroutine or a
  yield, and one stamped before a send still lets that send's work run first.
- The decision cache (policy/cache.py) and the verified-token cache (gateway/identity/token_cache.py) on a
  ``cachetools.FIFOCache``: an entry is never served at or past its expiry (a hit never extends it), the
  bound holds and the oldest entry goes first, ``len`` counts live entries.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from gateway.app import build_public_app
from gateway.identity import VerifiedTokenCache, WorkloadIdentity, parse_spiffe_id
from gateway.send_order import SCOPE_KEY, SEND_ORDER, SendOrder
from policy.cache import DecisionCache
from policy.decision import Decision
from tests.conftest import Stack
from tests.gateway.test_s2_record_after_send import _scope
from tests.support.spies import log_calls

BODY = json.dumps({"model": "sim-model", "prompt": "one two three four five", "max_tokens": 2}).encode()


async def _serve_stamped(stack: Stack, log: list[str], behind: int) -> None:
    """One request whose head was stamped ``behind`` sends ago; a loop callback is queued right before it
    (the work of an earlier request's send: an upstream body writer)."""
    app = build_public_app(stack.components, manage_lifecycle=False)
    messages = [{"type": "http.request", "body": BODY, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    async def send(message: dict[str, Any]) -> None:
        pass

    scope = _scope("/v1/completions", stack.auth())
    scope[SCOPE_KEY] = SEND_ORDER.sends - behind
    asyncio.get_running_loop().call_soon(log.append, "earlier send's work")
    await app(scope, receive, send)


@pytest.mark.parametrize("behind", [1, 0])
async def test_a_request_behind_a_send_yields_to_it_and_one_whose_turn_it_is_does_not(
        stack: Stack, monkeypatch: pytest.MonkeyPatch, behind: int) -> None:
    log: list[str] = []
    await _serve_stamped(stack, log, 0)  # warm: connections, caches
    log.clear()
    log_calls(stack.components.authn, "authenticate_now", log, "authenticated", monkeypatch)
    waits: list[int] = []
    real_wait = SendOrder.wait_turn

    def spy_wait(self: SendOrder, scope: Any) -> Any:
        waits.append(1)
        return real_wait(self, scope)

    monkeypatch.setattr(SendOrder, "wait_turn", spy_wait)
    await _serve_stamped(stack, log, behind)
    if behind:  # a send started since its head: that send's work runs before this request's first step
        assert log.index("earlier send's work") < log.index("authenticated") and waits == [1]
    else:  # its turn: authenticated in the same step, no wait_turn coroutine made
        assert log.index("authenticated") < log.index("earlier send's work") and waits == []


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _decision(i: int) -> Decision:
    return Decision(True, "allowed", "", None, None, None, f"d{i}")


def test_decision_cache_entry_ends_at_its_ttl_and_a_hit_never_extends_it() -> None:
    clock = _Clock()
    cache = DecisionCache(ttl_s=1.0, clock=clock)
    cache.put(("k",), _decision(1))
    clock.t = 100.9
    hit = cache.get(("k",))
    assert hit is not None and hit.cached and hit.decision_id == "d1"
    clock.t = 101.0  # the hard TTL from the store, not from the hit at 100.9
    assert cache.get(("k",)) is None and len(cache) == 0
    assert (cache.hits, cache.misses) == (1, 1)
    cache.put(("k",), _decision(2))  # stored again: a new TTL
    assert cache.get(("k",)).decision_id == "d2" and len(cache) == 1  # type: ignore[union-attr]


def test_decision_cache_is_bounded_and_evicts_the_oldest_first() -> None:
    clock = _Clock()
    cache = DecisionCache(ttl_s=10.0, max_entries=3, clock=clock)
    for i in range(3):
        cache.put((i,), _decision(i))
        clock.t += 1
    assert cache.get((0,)) is not None  # a hit does not make it the newest: the oldest stored still goes first
    cache.put((3,), _decision(3))
    assert cache.get((0,)) is None and [cache.get((i,)) is not None for i in (1, 2, 3)] == [True] * 3
    assert len(cache) == 3
    cache.clear()
    assert len(cache) == 0 and cache.get((3,)) is None


def _identity(expires_at: float | None) -> WorkloadIdentity:
    return WorkloadIdentity(spiffe_id=parse_spiffe_id("spiffe://t/ns/a"), trust_domain="t", expires_at=expires_at)


def test_token_cache_entry_ends_at_its_expiry_and_the_bound_holds() -> None:
    clock = _Clock()
    cache = VerifiedTokenCache(2, 60, clock=clock)
    ident = _identity(130.0)
    cache.put("a", ident, 1)
    assert cache.get("a", "t", 1) is ident
    clock.t = 129.9
    assert cache.get("a", "t", 1) is ident
    clock.t = 130.0  # exp (leeway 0)
    assert cache.get("a", "t", 1) is None and len(cache) == 0
    clock.t = 100.0
    for name in ("a", "b", "c"):  # the oldest stored goes first when full
        cache.put(name, _identity(None), 1)
    assert cache.get("a", "t", 1) is None and cache.get("b", "t", 1) is not None and len(cache) == 2
    clock.t = 160.0  # the max_ttl_s cap (60 s after each store)
    assert cache.get("c", "t", 1) is None and len(cache) == 0
