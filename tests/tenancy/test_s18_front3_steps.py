"""Session 18 (issue 14, helper front3): the front's steps cut without changing an answer.

``KeyRing.prefix_chain`` reads the current key from the derived-key memo outside a grace period
(no ``lookup_keys`` call): its chains equal those of every key :meth:`KeyRing.lookup_keys` names,
hashed by :func:`tenancy.prefix.block_hash_chain` with a fresh HMAC per block, before, during and
after a tenant or master rotation, and stay per tenant. ``TokenBucket.refill`` / ``try_take`` refill
inline: the same levels and waits as the session-17 arithmetic on any sequence of calls.
"""

from __future__ import annotations

import hashlib
import hmac

from hypothesis import given, settings
from hypothesis import strategies as st

from tenancy.keys import KeyRing
from tenancy.limits import TokenBucket

MASTER = b"m" * 32
OTHER_MASTER = b"n" * 32


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _reference(ring: KeyRing, tenant: str, tokens: list[int], block: int) -> tuple[str, tuple, tuple]:
    """``(kid, current, previous)`` from lookup_keys and a plain ``hmac.new`` per block (RFC 2104)."""
    chains = []
    for k in ring.lookup_keys(tenant):
        prev, out = b"pg-prefix-v1" + k.kid.encode(), []
        for i in range(len(tokens) // block):
            msg = b"".join(t.to_bytes(4, "big") for t in tokens[i * block:(i + 1) * block])
            prev = hmac.new(k.key, prev + msg, hashlib.sha256).digest()[:16]
            out.append(prev)
        chains.append((k.kid, tuple(out)))
    return chains[0][0], chains[0][1], tuple(chains[1:])


def _same(ring: KeyRing, tenant: str, tokens: list[int]) -> None:
    got = ring.prefix_chain(tenant, tokens, 4)
    assert (got.kid, got.current, got.previous) == _reference(ring, tenant, tokens, 4)


def test_prefix_chain_equals_every_lookup_key_chain_across_rotations() -> None:
    clock = _Clock()
    ring = KeyRing(MASTER, grace_s=60, clock=clock)
    tokens = list(range(40))
    for _ in range(2):  # the second time: the memo's hit
        _same(ring, "acme", tokens)
    a, b = ring.prefix_chain("acme", tokens, 4), ring.prefix_chain("beta", tokens, 4)
    assert a.kid != b.kid and not set(a.current) & set(b.current)  # never shared across tenants
    ring.rotate_tenant("acme")  # in grace: two chains, the old one still recognised
    _same(ring, "acme", tokens)
    assert len(ring.prefix_chain("acme", tokens, 4).previous) == 1
    _same(ring, "beta", tokens)  # a grace period of another tenant: beta's one chain
    clock.t += 61  # the grace ended: one chain under version 2
    _same(ring, "acme", tokens)
    assert ring.prefix_chain("acme", tokens, 4).previous == ()
    ring.rotate_master(OTHER_MASTER)  # a retired master in grace: its chain recognised too
    _same(ring, "acme", tokens)
    assert len(ring.prefix_chain("acme", tokens, 4).previous) == 1
    clock.t += 61
    _same(ring, "acme", tokens)
    _same(ring, "beta", tokens)
    assert ring.prefix_chain("acme", tokens, 4).current != a.current  # new master, new key


class _Session17Bucket:
    """The session-17 ``TokenBucket`` arithmetic (refill through ``_refill``), the reference."""

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate, self.burst, self.level, self.updated = float(rate), float(burst), float(burst), now

    def _refill(self, now: float) -> None:
        if now > self.updated:
            self.level = min(self.burst, self.level + (now - self.updated) * self.rate)
            self.updated = now

    def refill(self, now: float) -> float:
        self._refill(now)
        return self.level

    def try_take(self, n: float, now: float, *, allow_debt: bool = False, need: float | None = None) -> float:
        self._refill(now)
        if allow_debt:
            need = min(n, self.burst) if need is None else min(need, self.burst)
        else:
            need = n
        if need > self.burst:
            return float("inf")
        if self.level >= need:
            self.level -= n
            return 0.0
        return (need - self.level) / self.rate


_OPS = st.lists(st.tuples(st.sampled_from(["take", "debt", "need", "refill"]),
                          st.floats(0, 30, allow_nan=False), st.floats(-5, 5, allow_nan=False)), max_size=30)


@settings(max_examples=300, deadline=None)
@given(st.floats(0.01, 50), st.floats(0.5, 40), _OPS)
def test_token_bucket_inline_refill_equals_session_17(rate: float, burst: float, ops: list) -> None:
    now = 0.0
    new, old = TokenBucket(rate, burst, now), _Session17Bucket(rate, burst, now)
    for op, n, dt in ops:
        now += dt  # a clock may read earlier than the last update (no refill then)
        if op == "refill":
            assert new.refill(now) == old.refill(now)
        elif op == "take":
            assert new.try_take(n, now) == old.try_take(n, now)
        elif op == "debt":
            assert new.try_take(n, now, allow_debt=True) == old.try_take(n, now, allow_debt=True)
        else:
            assert new.try_take(n, now, allow_debt=True, need=0.0) == old.try_take(n, now, allow_debt=True, need=0.0)
        assert (new.level, new.updated) == (old.level, old.updated)


def _old_reserve(levels: dict, tenant, prompt: int, output: int, now: float) -> tuple[float, str] | None:  # type: ignore[no-untyped-def]
    """The session-17 ``InProcessLedger.reserve`` decision on reference buckets: None (taken) or (wait, reason)."""
    buckets = []
    for kind, rate, burst, n in (("prompt", tenant.prompt_tokens_per_s, tenant.prompt_tokens_burst, prompt),
                                 ("output", tenant.output_tokens_per_s, tenant.output_tokens_burst, output)):
        if rate is None:
            continue
        b = levels.setdefault(kind, _Session17Bucket(rate, burst if burst is not None else max(1.0, rate), now))
        b.refill(now)
        need = min(float(n), b.burst)
        buckets.append((b, n, 0.0 if b.level >= need else (need - b.level) / b.rate, f"tenant_{kind}_tokens"))
    waits = [(w, r) for _, _, w, r in buckets if w > 0]
    if waits:
        return max(w for w, _ in waits), waits[0][1]
    for b, n, _, _ in buckets:
        b.level -= n
    return None


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.none(), st.floats(0.5, 50)), st.one_of(st.none(), st.integers(1, 60)),
       st.one_of(st.none(), st.floats(0.5, 50)), st.one_of(st.none(), st.integers(1, 60)),
       st.lists(st.tuples(st.integers(0, 80), st.integers(0, 80), st.floats(0, 3, allow_nan=False)), max_size=20))
def test_ledger_reserve_refuses_and_takes_as_session_17(prate, pburst, orate, oburst, calls) -> None:  # type: ignore[no-untyped-def]
    from tenancy.ledger import InProcessLedger
    from tenancy.limits import RateLimited
    from tenancy.registry import Tenant
    tenant = Tenant(id="acme", models=frozenset({"m"}), prompt_tokens_per_s=prate, prompt_tokens_burst=pburst,
                    output_tokens_per_s=orate, output_tokens_burst=oburst)
    led, ref, now = InProcessLedger(), {}, 0.0
    for prompt, output, dt in calls:
        now += dt
        want = _old_reserve(ref, tenant, prompt, output, now)
        try:
            led.reserve(tenant, prompt, output, now)
            got = None
        except RateLimited as exc:
            got = (exc.retry_after_s, exc.reason)
        assert got == want
        for kind in ("prompt", "output"):
            assert led.level("acme", kind, now) == (ref[kind].level if kind in ref else None)
