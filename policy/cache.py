"""Decision cache in front of a decision point.

A cached decision is reused only for inputs that agree on every key field. The key
follows the policy (R10-2): :func:`policy.input_refs.policy_key_fields` reads the
policy's modules and gives :data:`DEFAULT_KEY_FIELDS` (the shipped policy's fields;
:func:`fast_key` then computes the key without building the input), those fields plus
every other input path the policy reads, or ``None`` (the policy's use of the input
cannot be bounded: nothing is cached, :meth:`DecisionCache.rekey`). Fields of the
shipped policy (rego/authz.rego):

- ``version``; ``identity.spiffe_id`` (deny-list), ``identity.trust_domain``
- ``tenant.id``, ``tenant.tier`` (cap), ``tenant.models`` (entitlement),
  ``tenant.pools``, ``tenant.regulated``, ``tenant.data_residency``
  (replicas), ``tenant.max_tokens`` (cap): every tenant fact comes from the
  tenant registry through the input, so a changed or revoked entitlement is
  a different key at once, never a stale hit
- ``request.endpoint``, ``request.model`` (entitlement)
- ``candidates[].id|pool|healthy|labels.data_residency`` (pools, residency, concentration)
- ``alerts[].id|kind|replica_id|tenant_id`` (concentration rule)

Not in the default key (the shipped policy never reads them; tests/policy/test_i13_cache_key.py):
``request.max_tokens|prompt_tokens|stream|sequences``, ``candidates[].load``, other candidate
labels, ``time``, ``identity.claims``, ``tenant.labels``.

Entries expire after a hard TTL (seconds) and the whole cache is cleared on every policy or data
change (:meth:`DecisionCache.clear`, wired through the inner decision point's ``add_change_listener``)
and on every tenant registry reload (the gateway calls :meth:`CachedDecisionPoint.clear`). A cached
decision keeps the decision id of the evaluation that produced it and has ``cached=True``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from operator import itemgetter
from types import MappingProxyType
from typing import Any

from cachetools import FIFOCache

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
#: what :func:`_freeze` makes of a missing field (fast keys use it directly)
_MISSING_KEY = "\x00missing"


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
        return _MISSING_KEY
    return value


def _compile_fields(fields: Sequence[str]) -> list[tuple[tuple[str, ...], tuple[str, ...] | None]]:
    compiled: list[tuple[tuple[str, ...], tuple[str, ...] | None]] = []
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
        ttl_s: hard time-to-live of an entry from its store, seconds (a hit never extends it).
        max_entries: bound on entries; the oldest stored is evicted first (one TTL: the first to expire).
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
        self.key_fields: tuple[str, ...] | None = tuple(key_fields)
        self._fields = _compile_fields(self.key_fields)
        self.ttl_s, self._clock = ttl_s, clock
        self._entries: FIFOCache[Any, tuple[Decision, float]] = FIFOCache(maxsize=max_entries)  # (it, expiry)
        self.hits = self.misses = 0
        self.clears = 0

    def rekey(self, key_fields: Sequence[str] | None) -> None:
        """Key on ``key_fields`` from now on (``None``: cache nothing) and drop every entry (R10-2).
        :data:`DEFAULT_KEY_FIELDS` itself keeps the fast key."""
        self.key_fields = key_fields if key_fields is None or key_fields is DEFAULT_KEY_FIELDS else tuple(key_fields)
        self._fields = _compile_fields(self.key_fields or ())
        self.clear()

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
        try:  # one FIFOCache lookup (issue 14, session 17: a TTLCache hit was three Python calls)
            found, expires = self._entries[key]
        except KeyError:
            found = expires = None
        if expires is None or not self._clock() < expires:  # absent or expired (the miss's put replaces it)
            self.misses += 1
            return None
        self.hits += 1
        return found

    def put(self, key: tuple[Any, ...], decision: Decision) -> None:
        """Store a decision, marked as served from cache (``cached=True``, same decision id): every
        hit returns that one frozen object (its ``as_cached()`` is itself), none is built per hit."""
        self._entries[key] = (decision.as_cached(), self._clock() + self.ttl_s)

    def clear(self) -> None:
        """Drop every entry (policy or data changed)."""
        self._entries.clear()
        self.clears += 1

    def __len__(self) -> int:  # live entries (an expired one stays until stored again or evicted)
        return sum(self._clock() < expires for _, expires in self._entries.values())


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
        if self.cache.key_fields is None:  # a policy whose input use is unbounded: never cached (R10-2)
            return await self.inner.decide(input)
        return await self.decide_keyed(self.cache.key(input), lambda: input)

    @property
    def default_keys(self) -> bool:
        """Whether the cache keys on :data:`DEFAULT_KEY_FIELDS` (then :func:`fast_key` is its key)."""
        return self.cache.key_fields == DEFAULT_KEY_FIELDS

    async def decide_keyed(self, key: tuple[Any, ...], build: Callable[[], dict[str, Any]]) -> Decision:
        """The cached decision under ``key``, else the inner decision on ``build()`` (the input
        document, built only on a miss; ``key`` must be its cache key), then cached.

        Raises:
            PolicyError: from the inner decision point.
            policy.input.PolicyInputError: from ``build``.
        """
        hit = self.cache.get(key)
        return hit.as_cached() if hit is not None else await self.decide_missed(key, build)

    async def decide_missed(self, key: tuple[Any, ...], build: Callable[[], dict[str, Any]]) -> Decision:
        """:meth:`decide_keyed` after ``self.cache.get(key)`` missed (and counted it): the inner decision on
        ``build()``, then cached. For a caller that looks the hit up itself (gateway/pep.py: on a hit no
        closure, no coroutine; session 9). Not stored when the cache was cleared or rekeyed meanwhile
        (a decision of the replaced policy). Raises as :meth:`decide_keyed`."""
        clears = self.cache.clears
        decision = await self.inner.decide(build())
        if clears == self.cache.clears:
            self.cache.put(key, decision)
        return decision


def _tenant_list(tenant: Mapping[str, Any], key: str) -> tuple[str, ...] | None:
    value = tenant.get(key) or ()
    if type(value) is not list and (isinstance(value, str) or not isinstance(value, (Sequence, set, frozenset))):
        return None
    for v in value:
        if type(v) is not str and not isinstance(v, str):
            return None
    return tuple(sorted(set(value)))


def _count(value: Any, low: int) -> bool:
    if type(value) is int:  # the common case, without the isinstance calls
        return value >= low
    return not isinstance(value, bool) and isinstance(value, int) and value >= low


def _is_mapping(value: Any) -> bool:
    return type(value) is dict or type(value) is MappingProxyType or isinstance(value, Mapping)


def _str_labels(labels: Mapping[Any, Any]) -> bool:
    """True when every key and value of ``labels`` is a string (an empty mapping: True)."""
    for k, v in labels.items():
        if not (isinstance(k, str) and isinstance(v, str)):
            return False
    return True


_INPUT_VERSION: list[Any] = []  # policy.input.INPUT_VERSION, imported on first use
_FIRST = itemgetter(0)


def tenant_key_part(tenant: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """The tenant fields of the :func:`fast_key` (``id, tier, models, pools, regulated, data_residency,
    max_tokens``), or ``None`` when a tenant fact is missing or mistyped (labels included: outside the
    key, validated as ``build_policy_input`` would). A pure function of ``tenant``: callers may keep it
    per (immutable) tenant object."""
    tget = tenant.get
    tid = tget("id")
    if not (isinstance(tid, str) and tid):
        return None
    models, pools = _tenant_list(tenant, "models"), _tenant_list(tenant, "pools")
    t_max, regulated, residency = tget("max_tokens"), tget("regulated", False), tget("data_residency")
    labels = tget("labels") or {}
    if (models is None or pools is None or not (t_max is None or _count(t_max, 0))
            or not isinstance(regulated, bool) or not (residency is None or isinstance(residency, str))
            or not _is_mapping(labels) or (labels and not _str_labels(labels))):
        return None
    return (tid, str(tget("tier") or ""), models, pools, regulated, residency, t_max)


def candidates_key_part(candidates: Sequence[Mapping[str, Any]]) -> tuple[Any, ...] | None:
    """The candidate fields of the :func:`fast_key` (``ids, pools, healthy, data_residency labels``, sorted
    by id), or ``None`` when a candidate fact is missing or mistyped (load and labels included)."""
    cands = []
    for c in candidates:
        cget = c.get
        cid, pool, healthy, load, clabels = (cget("id"), cget("pool"), cget("healthy", False),
                                             cget("load", 0), cget("labels") or {})
        if not (isinstance(cid, str) and cid and isinstance(pool, str) and pool and isinstance(healthy, bool)
                and not isinstance(load, bool) and isinstance(load, (int, float)) and math.isfinite(load)
                and _is_mapping(clabels) and (not clabels or _str_labels(clabels))):
            return None
        cands.append((cid, pool, healthy, clabels.get("data_residency", _MISSING_KEY)))
    if len(cands) > 1:
        cands.sort(key=_FIRST)
    return tuple(zip(*cands)) if cands else _NO_CANDIDATES


_NO_CANDIDATES: tuple[Any, ...] = ((), (), (), ())
#: :func:`alerts_key_part` of no alerts (a caller may use it without the call)
NO_ALERTS: tuple[Any, ...] = _NO_CANDIDATES


def alerts_key_part(alerts: Sequence[Mapping[str, Any]]) -> tuple[Any, ...] | None:
    """The alert fields of the :func:`fast_key` (``ids, kinds, replica ids, tenant ids``, sorted by id),
    or ``None`` when an alert lacks its id or kind."""
    if not alerts:
        return NO_ALERTS
    alts = []
    for a in alerts:
        aid, kind = a.get("id"), a.get("kind")
        if not (isinstance(aid, str) and aid and isinstance(kind, str) and kind):
            return None
        replica, atid = a.get("replica_id", a.get("replica")), a.get("tenant_id")
        alts.append((aid, kind, replica if isinstance(replica, str) else None, atid if isinstance(atid, str) else None))
    if len(alts) > 1:
        alts.sort(key=_FIRST)
    return tuple(zip(*alts))


def head_key_part(identity: Mapping[str, Any], request: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """``(spiffe_id, trust_domain, endpoint, model)`` of the :func:`fast_key`, or ``None`` when an
    identity or request fact is missing or mistyped (claims, token counts, ``stream`` and
    ``queued_requests`` included: outside the key, validated as ``build_policy_input`` would)."""
    g, r = identity.get, request.get
    return head_key_fields(g("spiffe_id"), g("trust_domain"), g("claims") or {}, r("endpoint"), r("model"),
                           r("prompt_tokens"), r("max_tokens"), r("stream", False), r("sequences", 1),
                           r("queued_requests", 0))


def head_key_fields(sid: Any, td: Any, claims: Any, endpoint: Any, model: Any, pt: Any, mt: Any, stream: Any,
                    seq: Any, q: Any) -> tuple[Any, ...] | None:
    """:func:`head_key_part` of the facts themselves (no identity or request dict built: issue 14)."""
    if not (isinstance(sid, str) and sid and isinstance(td, str) and td
            and (type(claims) is dict or type(claims) is MappingProxyType or _is_mapping(claims))
            and isinstance(endpoint, str) and endpoint and isinstance(model, str) and model
            and isinstance(stream, bool)
            # session 15: a plain int in range is answered inline (no _count call); anything else asks _count
            and (pt is None or (type(pt) is int and pt >= 0) or _count(pt, 0))
            and (mt is None or (type(mt) is int and mt >= 0) or _count(mt, 0))
            and ((type(seq) is int and seq >= 1) or _count(seq, 1)) and ((type(q) is int and q >= 0) or _count(q, 0))):
        return None
    return (sid, td, endpoint, model)


def compose_key(head: tuple[Any, ...], tenant_part: tuple[Any, ...], candidates_part: tuple[Any, ...],
                alerts_part: tuple[Any, ...]) -> tuple[Any, ...]:
    """The :func:`fast_key` from its four parts (none of them ``None``)."""
    if not _INPUT_VERSION:
        from policy.input import INPUT_VERSION  # noqa: PLC0415 (policy.input imports policy.decision only)

        _INPUT_VERSION.append(INPUT_VERSION)
    return (_INPUT_VERSION[0], head[0], head[1], *tenant_part, head[2], head[3], *candidates_part, *alerts_part)


def fast_key(identity: Mapping[str, Any], tenant: Mapping[str, Any], request: Mapping[str, Any],
             candidates: Sequence[Mapping[str, Any]], alerts: Sequence[Mapping[str, Any]]) -> tuple[Any, ...] | None:
    """The :data:`DEFAULT_KEY_FIELDS` key of the document :func:`policy.input.build_policy_input`
    would build from these facts, computed without building it (issue 14).

    Takes the same arguments as ``build_policy_input`` (without ``now``: time is not in the
    key) and returns exactly ``DecisionCache().key(build_policy_input(...))`` (property test:
    tests/policy/test_i14_fast_key.py; equal to the session-3 version: tests/policy/test_s4_fast_key.py).
    Returns ``None`` when any fact is missing or mistyped,
    including fields outside the key (request counts, ``stream``, claims, candidate loads and
    labels): the caller then builds the document, whose validation raises
    :class:`policy.input.PolicyInputError` — a cache hit never skips input validation.
    Composed of :func:`head_key_part`, :func:`tenant_key_part`, :func:`candidates_key_part` and
    :func:`alerts_key_part` (a caller may keep the tenant and candidate parts per immutable object).
    """
    head, tpart = head_key_part(identity, request), tenant_key_part(tenant)  # pure: no short cut needed
    cpart = candidates_key_part(candidates) if head is not None and tpart is not None else None
    apart = alerts_key_part(alerts) if cpart is not None else None
    return None if apart is None else compose_key(head, tpart, cpart, apart)  # type: ignore[arg-type]


async def decide_from_facts(dp: Any, identity: Mapping[str, Any], tenant: Mapping[str, Any],
                            request: Mapping[str, Any], candidates: Sequence[Mapping[str, Any]],
                            alerts: Sequence[Mapping[str, Any]], now: float) -> Decision:
    """Decide from the facts of ``build_policy_input``; on a decision-cache hit, without building
    the input document (issue 14).

    When ``dp`` is a :class:`CachedDecisionPoint` whose cache uses :data:`DEFAULT_KEY_FIELDS`,
    the key comes from :func:`fast_key` (equal to the built document's key); the document is built
    only on a miss (or when :func:`fast_key` declines). Any other decision point gets the built
    document.

    Raises:
        policy.input.PolicyInputError: a fact is missing or mistyped (never hidden by a hit).
        PolicyError: from the decision point.
    """
    from policy.input import build_policy_input  # noqa: PLC0415

    if isinstance(dp, CachedDecisionPoint) and dp.default_keys:
        key = fast_key(identity, tenant, request, candidates, alerts)
        if key is not None:
            return await dp.decide_keyed(
                key, lambda: build_policy_input(identity, tenant, request, candidates, alerts, now))
    return await dp.decide(build_policy_input(identity, tenant, request, candidates, alerts, now))
