"""Decision cache in front of a decision point.

A cached decision is reused only for inputs that agree on every DECLARED key
field (:data:`DEFAULT_KEY_FIELDS`). A policy that reads an input field not in
the key would be served stale answers, so the key list must grow with the
policy (pass ``key_fields``). Fields of the shipped policy (rego/authz.rego):

- ``version``; ``identity.spiffe_id`` (deny-list), ``identity.trust_domain``
- ``tenant.id``, ``tenant.tier`` (cap), ``tenant.models`` (entitlement),
  ``tenant.pools``, ``tenant.regulated``, ``tenant.data_residency``
  (replicas), ``tenant.max_tokens`` (cap): every tenant fact comes from the
  tenant registry through the input, so a changed or revoked entitlement is
  a different key at once, never a stale hit
- ``request.endpoint``, ``request.model`` (entitlement)
- ``candidates[].id|pool|healthy|labels.data_residency`` (pools, residency,
  concentration fallback)
- ``alerts[].id|kind|replica_id|tenant_id`` (concentration rule)

Not in the key (the shipped policy never reads them; a property test,
tests/policy/test_i13_cache_key.py, varies each and shows the decision
does not change): ``request.max_tokens`` (the policy returns a cap, it
does not compare the request against it: the gateway clamps; keying on it
made almost every demo-replay request a miss, since each asks for its own
output length), ``request.prompt_tokens``, ``request.stream``,
``request.sequences``, ``candidates[].load``, other candidate labels,
``time``, ``identity.claims``, ``tenant.labels``.

Entries expire after a hard TTL (seconds) and the whole cache is cleared on
every policy or data change (:meth:`DecisionCache.clear`, wired through the
inner decision point's ``add_change_listener``) and on every tenant
registry reload (the gateway calls :meth:`CachedDecisionPoint.clear`). A cached decision keeps the
decision id of the evaluation that produced it and has ``cached=True``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from cachetools import TTLCache

from policy.decision import Decision, DecisionPoint

DEFAULT_KEY_FIELDS: tuple[str, ...] = (
    "version",
    "identity.spiffe_id",
    "identity.trust_domain",
    "tenant.id",
    "tenant.tier",
    "tenant.models",
    "tenant.pools",
    "tenant.regulated",
    "tenant.data_residency",
    "tenant.max_tokens",
    "request.endpoint",
    "request.model",
    "candidates[].id",
    "candidates[].pool",
    "candidates[].healthy",
    "candidates[].labels.data_residency",
    "alerts[].id",
    "alerts[].kind",
    "alerts[].replica_id",
    "alerts[].tenant_id",
)

_MISSING = object()


def _get(doc: Any, parts: Sequence[str]) -> Any:
    for p in parts:
        if not isinstance(doc, dict):
            return _MISSING
        doc = doc.get(p, _MISSING)
        if doc is _MISSING:
            return _MISSING
    return doc


def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    if value is _MISSING:
        return "\x00missing"
    return value


def _compile_fields(fields: Sequence[str]) -> list[tuple[tuple[str, ...], tuple[str, ...] | None]]:
    compiled = []
    for f in fields:
        if "[]." in f:
            head, tail = f.split("[].", 1)
            compiled.append((tuple(head.split(".")), tuple(tail.split("."))))
        else:
            compiled.append((tuple(f.split(".")), None))
    return compiled


class DecisionCache:
    """TTL cache of decisions keyed on declared input fields.

    Args:
        ttl_s: hard time-to-live of an entry, seconds.
        max_entries: bound on entries (least recently used evicted).
        key_fields: dotted input paths; ``a[].b`` takes ``b`` of every
            element of list ``a`` (in order).
        clock: monotonic clock in seconds (tests inject a fake).
    """

    def __init__(
        self,
        ttl_s: float = 1.0,
        max_entries: int = 10000,
        key_fields: Sequence[str] = DEFAULT_KEY_FIELDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if ttl_s <= 0 or max_entries <= 0:
            raise ValueError("ttl_s and max_entries must be positive")
        self.key_fields = tuple(key_fields)
        self._fields = _compile_fields(self.key_fields)
        self._entries: TTLCache[Any, Decision] = TTLCache(maxsize=max_entries, ttl=ttl_s, timer=clock)
        self.hits = 0
        self.misses = 0
        self.clears = 0

    def key(self, input: dict[str, Any]) -> tuple[Any, ...]:
        """The cache key of an input document (a hashable tuple)."""
        out: list[Any] = []
        for head, tail in self._fields:
            value = _get(input, head)
            if tail is not None and isinstance(value, list):
                value = tuple(_freeze(_get(item, tail)) for item in value)
            else:
                value = _freeze(value)
            out.append(value)
        return tuple(out)

    def get(self, key: tuple[Any, ...]) -> Decision | None:
        """The live decision for ``key`` (counts a hit or a miss)."""
        found = self._entries.get(key)
        if found is None:
            self.misses += 1
            return None
        self.hits += 1
        return found

    def put(self, key: tuple[Any, ...], decision: Decision) -> None:
        """Store a decision (as produced, ``cached=False``)."""
        self._entries[key] = decision

    def clear(self) -> None:
        """Drop every entry (policy or data changed)."""
        self._entries.clear()
        self.clears += 1

    def __len__(self) -> int:
        return len(self._entries)


class CachedDecisionPoint:
    """A DecisionPoint that consults a DecisionCache before ``inner``.

    Registers ``cache.clear`` with ``inner.add_change_listener`` when the
    inner decision point offers it. Errors are never cached.
    """

    def __init__(self, inner: DecisionPoint, cache: DecisionCache) -> None:
        self.inner = inner
        self.cache = cache
        add = getattr(inner, "add_change_listener", None)
        if callable(add):
            add(cache.clear)

    def clear(self) -> None:
        """Drop every cached decision (the facts behind the input changed, e.g. a registry reload)."""
        self.cache.clear()

    async def decide(self, input: dict[str, Any]) -> Decision:
        """Cached decision, else the inner decision (then cached).

        Raises:
            PolicyError: from the inner decision point.
        """
        key = self.cache.key(input)
        hit = self.cache.get(key)
        if hit is not None:
            return hit.as_cached()
        decision = await self.inner.decide(input)
        self.cache.put(key, decision)
        return decision
