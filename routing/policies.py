"""Routing policies: pick one replica among authorized, healthy candidates.

All policies implement :class:`RoutingPolicy` and are pure: they read the
request summary and per-candidate state (load, matched prefix blocks) and
return a :class:`RouteChoice`; they never touch the index or the load tracker
(the :class:`~routing.router.Router` does). Ties are broken
deterministically (rendezvous hash of the request's prefix, then replica id),
so equal inputs give equal choices in every process.

Policies (``build_policy`` names):

* ``round_robin``: cycle over the candidates sorted by id.
* ``least_load``: fewest token load (queued prefill + decode tokens), then
  fewest running requests.
* ``consistent_hash``: consistent hashing with bounded loads (Mirrokni,
  Thorup, Zadimoghaddam, "Consistent Hashing with Bounded Loads", SODA 2018 /
  arXiv 1608.01350, 2017): walk the ring clockwise from the request's point to
  the first replica whose running requests stay within
  ``ceil((1 + epsilon) · mean)``, the mean counting this request.
* ``cache_aware``: estimated time to first token with a bounded-load guard
  (see :class:`CacheAwarePolicy`).
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from routing.load import ReplicaLoad

__all__ = [
    "RouteRequest",
    "Candidate",
    "RouteChoice",
    "RoutingPolicy",
    "NoCandidateError",
    "RoundRobinPolicy",
    "LeastLoadPolicy",
    "ConsistentHashPolicy",
    "CacheAwarePolicy",
    "build_policy",
    "POLICY_NAMES",
]


class NoCandidateError(LookupError):
    """Raised when a routing decision is asked for with no candidate replica."""


@dataclass(frozen=True)
class RouteRequest:
    """What a policy knows of one request.

    ``block_keys``: the tenant's HMAC block-hash chain under the current key
    version (``tenancy.prefix.block_hash_chain``), one key per full block;
    ``prompt_tokens``: prompt length in tokens (all sequences); ``max_tokens``:
    expected output tokens (all sequences: a batch of n prompts asks for n x
    the per-sequence ``max_tokens``); ``block_size``: tokens per KV block;
    ``sequences``: sequences the replica runs (elements of a list ``prompt``).
    """

    tenant_id: str
    block_keys: Sequence[bytes]
    prompt_tokens: int
    max_tokens: int
    block_size: int
    sequences: int = 1


@dataclass(frozen=True)
class Candidate:
    """One routable replica: its current ``load`` and ``matched_blocks``
    (leading blocks of the request believed cached there, max over the
    current and previous key versions)."""

    replica_id: str
    load: ReplicaLoad
    matched_blocks: int = 0


@dataclass(frozen=True)
class RouteChoice:
    """A routing decision.

    ``predicted_prefix_tokens``: prefix tokens expected cached on the chosen
    replica; ``available_prefix_tokens``: best over all candidates (the gap is
    what the load guard gave up); ``reason``: short machine-friendly string;
    ``scores``: per-candidate score (policy specific; lower is better except
    where the reason says otherwise) for debugging and audit.
    """

    replica_id: str
    policy: str
    predicted_prefix_tokens: int
    available_prefix_tokens: int
    reason: str
    scores: Mapping[str, float] = field(default_factory=dict)


@runtime_checkable
class RoutingPolicy(Protocol):
    """Interface of every routing policy."""

    name: str

    def choose(self, req: RouteRequest, candidates: Sequence[Candidate]) -> RouteChoice:
        """Pick one of ``candidates`` for ``req``; raises
        :class:`NoCandidateError` when ``candidates`` is empty."""
        ...


def _hash64(*parts: bytes) -> int:
    h = hashlib.blake2b(digest_size=8)
    for p in parts:
        h.update(len(p).to_bytes(4, "big"))
        h.update(p)
    return int.from_bytes(h.digest(), "big")


def _prefix_tokens(req: RouteRequest, blocks: int) -> int:
    return max(0, min(blocks * req.block_size, req.prompt_tokens))


def _request_point(req: RouteRequest, skip_blocks: int) -> bytes:
    """Bytes that identify the request's "own" prefix: the key of block
    ``skip_blocks`` (a chain key, so it covers blocks 0..skip_blocks), or the
    last key of shorter prompts, or the tenant id for prompts without a full block."""
    if req.block_keys:
        return req.block_keys[min(skip_blocks, len(req.block_keys) - 1)]
    return b"tenant:" + req.tenant_id.encode("utf-8")


def _tiebreak(point: bytes, replica_id: str) -> int:
    """Rendezvous-hash tie-breaker: spreads ties over replicas per request,
    deterministically."""
    return _hash64(point, replica_id.encode("utf-8"))


def _choice(
    policy: str,
    req: RouteRequest,
    cands: Sequence[Candidate],
    chosen: Candidate,
    reason: str,
    scores: Mapping[str, float],
) -> RouteChoice:
    best = max(c.matched_blocks for c in cands)
    return RouteChoice(
        replica_id=chosen.replica_id,
        policy=policy,
        predicted_prefix_tokens=_prefix_tokens(req, chosen.matched_blocks),
        available_prefix_tokens=_prefix_tokens(req, best),
        reason=reason,
        scores=dict(scores),
    )


def _require(cands: Sequence[Candidate]) -> None:
    if not cands:
        raise NoCandidateError("no candidate replica")


class RoundRobinPolicy:
    """Cycle through the candidates sorted by replica id (one shared counter)."""

    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def choose(self, req: RouteRequest, candidates: Sequence[Candidate]) -> RouteChoice:
        """See :class:`RoutingPolicy`."""
        _require(candidates)
        ordered = sorted(candidates, key=lambda c: c.replica_id)
        chosen = ordered[self._next % len(ordered)]
        self._next += 1
        return _choice(self.name, req, candidates, chosen, "rotation", {c.replica_id: 0.0 for c in candidates})


class LeastLoadPolicy:
    """Fewest token load (queued prefill + decode tokens), then fewest running
    requests, then rendezvous hash, then id."""

    name = "least_load"

    def choose(self, req: RouteRequest, candidates: Sequence[Candidate]) -> RouteChoice:
        """See :class:`RoutingPolicy`."""
        _require(candidates)
        point = _request_point(req, 0)
        chosen = min(
            candidates,
            key=lambda c: (c.load.tokens, c.load.running_requests, _tiebreak(point, c.replica_id), c.replica_id),
        )
        return _choice(
            self.name, req, candidates, chosen, "min_token_load", {c.replica_id: float(c.load.tokens) for c in candidates}
        )


class ConsistentHashPolicy:
    """Consistent hashing with bounded loads (Mirrokni et al. 2017).

    Each replica owns ``virtual_nodes`` points on a 64-bit ring. The request's
    point hashes the key of block ``skip_blocks`` of its chain (skipping
    blocks shared by everyone, such as a common system prompt, so that
    conversations rather than the shared head decide the spread). Walking
    clockwise, the first replica with ``running_requests + 1 <=
    ceil((1 + epsilon) · (total_running + 1) / n)`` is chosen.
    """

    name = "consistent_hash"

    def __init__(self, *, epsilon: float = 0.25, virtual_nodes: int = 64, skip_blocks: int = 1) -> None:
        if epsilon <= 0:
            raise ValueError("epsilon must be positive")
        if virtual_nodes < 1:
            raise ValueError("virtual_nodes must be >= 1")
        if skip_blocks < 0:
            raise ValueError("skip_blocks must be >= 0")
        self.epsilon = float(epsilon)
        self.virtual_nodes = int(virtual_nodes)
        self.skip_blocks = int(skip_blocks)
        self._rings: dict[tuple[str, ...], tuple[list[int], list[str]]] = {}

    @property
    def load_factor(self) -> float:
        """Bound on a replica's load relative to the mean: ``1 + epsilon``."""
        return 1.0 + self.epsilon

    def _ring(self, ids: tuple[str, ...]) -> tuple[list[int], list[str]]:
        ring = self._rings.get(ids)
        if ring is None:
            pts = sorted(
                (_hash64(rid.encode("utf-8"), v.to_bytes(4, "big")), rid) for rid in ids for v in range(self.virtual_nodes)
            )
            ring = ([p for p, _ in pts], [r for _, r in pts])
            if len(self._rings) > 64:
                self._rings.clear()
            self._rings[ids] = ring
        return ring

    def choose(self, req: RouteRequest, candidates: Sequence[Candidate]) -> RouteChoice:
        """See :class:`RoutingPolicy`; ``scores`` hold each candidate's running requests."""
        _require(candidates)
        by_id = {c.replica_id: c for c in candidates}
        points, owners = self._ring(tuple(sorted(by_id)))
        total = sum(c.load.running_requests for c in candidates) + 1
        cap = math.ceil((1.0 + self.epsilon) * total / len(candidates))
        start = bisect.bisect_left(points, _hash64(_request_point(req, self.skip_blocks)))
        first = owners[start % len(owners)]
        scores = {c.replica_id: float(c.load.running_requests) for c in candidates}
        for i in range(len(owners)):
            rid = owners[(start + i) % len(owners)]
            if by_id[rid].load.running_requests + 1 <= cap:
                reason = "ring_owner" if rid == first else "ring_spill"
                return _choice(self.name, req, candidates, by_id[rid], reason, scores)
        # Unreachable: the least loaded replica always fits under the cap.
        chosen = min(candidates, key=lambda c: (c.load.running_requests, c.replica_id))
        return _choice(self.name, req, candidates, chosen, "ring_fallback", scores)


class CacheAwarePolicy:
    """Estimated time to first token with a prefix-affinity weight, under a
    bounded-load guard.

    For candidate ``c`` with ``m_c`` matched prefix tokens (from the index),
    the request would prefill ``u_c = prompt_tokens - m_c`` tokens behind the
    replica's queued prefill tokens ``q_c``; its estimated TTFT (seconds) is
    ``(q_c + u_c) / prefill_tokens_per_s`` plus a decode-load term
    ``decode_weight · decode_tokens_c / prefill_tokens_per_s``. The ranking
    cost subtracts ``prefix_weight · m_c / prefill_tokens_per_s``: a cached
    prefix also pays off for the conversation's *next* turns (moving a
    conversation duplicates its history and evicts others), which the
    one-request TTFT estimate ignores. Lowest cost wins.

    Lineage: Dynamo's KV router costs new prefill blocks after overlap plus
    active decode blocks; LMetric multiplies new prefill tokens by batch size;
    llm-d sums weighted prefix/queue/kv-usage scorers; SGLang's cache-aware
    router balances only past a fixed imbalance gate and otherwise follows a
    match-ratio threshold. Here the trade is made on every request, and the
    balance is enforced by a guard instead of a gate.

    Guard (bounded loads, Mirrokni et al. 2017), means over the candidates
    *including* this request so an idle cluster still routes: a candidate is
    eligible only if afterwards

    * its running requests ``<= ceil(max_request_factor · mean)``, and
    * (``guard_tokens``) its token load (queued prefill + decode tokens)
      ``<= ceil(max_load_factor · mean / unit) · unit + slack_requests · unit
      + token_slack`` with ``unit = prompt_tokens + max_tokens`` (the token
      analogue of Mirrokni's ceil: a replica holding only this request is
      always eligible); the slack, in units of this request's size, keeps a lightly loaded cluster sticky where a few requests
      in flight make the relative bound meaningless. ``slack_requests=0`` and
      ``token_slack=0`` give the strict (rounded-up) ``max_load_factor`` bound.

    If no candidate is eligible the least token-loaded one is taken. Ties:
    more matched blocks, then rendezvous hash of the request's own prefix
    (block ``skip_blocks``), then id.

    Defaults were tuned with ``sim/des.py`` on the Mooncake conversation trace
    (2000 rows, 6 replicas; see ``bench/results/des_tuning.md``). Raises
    :class:`ValueError` on out-of-range parameters.
    """

    name = "cache_aware"

    def __init__(
        self,
        *,
        max_load_factor: float = 1.25,
        max_request_factor: float | None = 2.0,
        slack_requests: float = 4.0,
        token_slack: float = 0.0,
        prefix_weight: float = 16.0,
        decode_weight: float = 0.0,
        prefill_tokens_per_s: float = 10000.0,
        guard_tokens: bool = True,
        skip_blocks: int = 1,
    ) -> None:
        if max_load_factor < 1.0:
            raise ValueError("max_load_factor must be >= 1")
        if max_request_factor is not None and max_request_factor < 1.0:
            raise ValueError("max_request_factor must be >= 1")
        if prefill_tokens_per_s <= 0:
            raise ValueError("prefill_tokens_per_s must be positive")
        for label, v in (
            ("slack_requests", slack_requests),
            ("token_slack", token_slack),
            ("prefix_weight", prefix_weight),
            ("decode_weight", decode_weight),
            ("skip_blocks", skip_blocks),
        ):
            if v < 0:
                raise ValueError(f"{label} must be >= 0")
        self.max_load_factor = float(max_load_factor)
        self.max_request_factor = float(max_load_factor if max_request_factor is None else max_request_factor)
        self.slack_requests = float(slack_requests)
        self.token_slack = float(token_slack)
        self.prefix_weight = float(prefix_weight)
        self.decode_weight = float(decode_weight)
        self.prefill_tokens_per_s = float(prefill_tokens_per_s)
        self.guard_tokens = bool(guard_tokens)
        self.skip_blocks = int(skip_blocks)

    @property
    def load_factor(self) -> float:
        """Token-load bound relative to the mean (``max_load_factor``)."""
        return self.max_load_factor

    def choose(self, req: RouteRequest, candidates: Sequence[Candidate]) -> RouteChoice:
        """See :class:`RoutingPolicy`; ``scores`` are ranking costs in seconds
        (estimated TTFT minus the prefix-affinity credit; ``inf`` for
        candidates excluded by the load guard)."""
        _require(candidates)
        n = len(candidates)
        uncached = {c.replica_id: req.prompt_tokens - _prefix_tokens(req, c.matched_blocks) for c in candidates}
        total_req = sum(c.load.running_requests for c in candidates) + 1
        req_cap = math.ceil(self.max_request_factor * total_req / n)
        # Token mean counts this request at its cheapest placement.
        cost = min(uncached.values()) + req.max_tokens
        # Token analogue of Mirrokni's ceil: the bound is rounded up to whole
        # units of this request's size, so a replica holding nothing but this
        # request is always eligible (an idle cluster routes).
        unit = max(1, req.prompt_tokens + req.max_tokens)
        mean = (sum(c.load.tokens for c in candidates) + cost) / n
        tok_cap = math.ceil(self.max_load_factor * mean / unit) * unit
        tok_cap += self.slack_requests * unit + self.token_slack
        point = _request_point(req, self.skip_blocks)
        rate = self.prefill_tokens_per_s
        scores: dict[str, float] = {}
        eligible: list[Candidate] = []
        for c in candidates:
            est = (c.load.queued_prefill_tokens + uncached[c.replica_id]) / rate
            est += self.decode_weight * c.load.decode_tokens / rate
            est -= self.prefix_weight * (req.prompt_tokens - uncached[c.replica_id]) / rate
            ok = c.load.running_requests + 1 <= req_cap
            if ok and self.guard_tokens:
                ok = c.load.tokens + uncached[c.replica_id] + req.max_tokens <= tok_cap
            scores[c.replica_id] = est if ok else math.inf
            if ok:
                eligible.append(c)
        if not eligible:
            chosen = min(
                candidates,
                key=lambda c: (c.load.tokens, c.load.running_requests, _tiebreak(point, c.replica_id), c.replica_id),
            )
            return _choice(self.name, req, candidates, chosen, "guard_fallback_least_load", scores)
        chosen = min(
            eligible,
            key=lambda c: (scores[c.replica_id], -c.matched_blocks, _tiebreak(point, c.replica_id), c.replica_id),
        )
        best = max(c.matched_blocks for c in candidates)
        if chosen.matched_blocks == best and best > 0:
            reason = "best_prefix"
        elif best > 0 and any(c.matched_blocks == best for c in candidates if c not in eligible):
            reason = "load_guard"
        elif chosen.matched_blocks < best:
            reason = "queue_tradeoff"
        else:
            reason = "no_prefix"
        return _choice(self.name, req, candidates, chosen, reason, scores)


POLICY_NAMES = ("round_robin", "least_load", "consistent_hash", "cache_aware")

_FACTORIES: dict[str, type] = {
    "round_robin": RoundRobinPolicy,
    "least_load": LeastLoadPolicy,
    "consistent_hash": ConsistentHashPolicy,
    "cache_aware": CacheAwarePolicy,
}


def build_policy(name: str, params: Mapping[str, Any] | None = None) -> RoutingPolicy:
    """Build the policy called ``name`` (one of :data:`POLICY_NAMES`) with
    keyword ``params``. Raises :class:`ValueError` for an unknown name, an
    unknown parameter or an out-of-range value."""
    cls = _FACTORIES.get(name)
    if cls is None:
        raise ValueError(f"unknown routing policy {name!r}; known: {', '.join(POLICY_NAMES)}")
    try:
        return cls(**dict(params or {}))
    except TypeError as exc:
        raise ValueError(f"bad parameters for routing policy {name!r}: {exc}") from exc
