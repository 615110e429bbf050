"""The router: prefix index + load tracker + one routing policy.

``Router.route`` is the gateway's single call for step 6 of the request flow:
it looks up the matched prefix of every candidate replica (over the current
key version's chain and any previous versions' chains, so a key rotation does
not throw away warm caches), lets the policy choose, charges the load, and
records the chosen replica's current-version keys in the index.

Counters separate three reasons for a low prefix hit rate:

* ``available / prompt`` low: the workload has little reuse (or the index
  has forgotten it);
* ``predicted / available`` low: the router traded cache for balance;
* ``delivered / predicted`` low: the index is stale (replicas evicted or
  restarted), measured from the ``cached_tokens`` replicas report.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from routing.calibration import Calibration
from routing.index import PrefixIndex
from routing.load import LoadTicket, LoadTracker
from routing.plugins import RoutingPolicy
from routing.types import Candidate, NoCandidateError, RouteChoice, RouteRequest

__all__ = ["Router", "RouterCounters", "NoCandidateError"]


@dataclass(frozen=True)
class RouterCounters:
    """Cumulative router counters, in requests and prompt tokens.

    ``observed_*`` count only requests for which :meth:`Router.observe_delivered`
    was called, so ``observed_delivered / observed_predicted`` compares like
    with like.
    """

    requests: int
    prompt_tokens: int
    available_prefix_tokens: int
    predicted_prefix_tokens: int
    observed_requests: int
    observed_predicted_prefix_tokens: int
    delivered_prefix_tokens: int
    overdelivered_tokens: int
    underdelivered_tokens: int


class Router:
    """Route requests among candidate replicas with one policy.

    ``index`` and ``loads`` are the local views (:class:`PrefixIndex`,
    :class:`LoadTracker` protocols; in-process by default) the router reads
    and updates synchronously; it performs no I/O.

    ``block_size`` is in tokens and must match the chains' block size (raises
    :class:`ValueError` if not positive). ``calibration`` (optional): its
    per-replica estimates are attached to the candidates (``Candidate.estimate``);
    feed it with a :class:`routing.calibration.CalibratingLoadTracker` as ``loads``.
    """

    def __init__(self, policy: RoutingPolicy, index: PrefixIndex, loads: LoadTracker, block_size: int,
                 calibration: Calibration | None = None) -> None:
        if block_size <= 0:
            raise ValueError("block_size must be positive")
        self.calibration = calibration
        self.policy = policy
        self.index = index
        self.loads = loads
        self.block_size = block_size
        # an index that defers its records to its next read (or :meth:`settle`): the decision does not
        # need its own record (issue 14, session 15; :meth:`routing.index.InProcessPrefixIndex.record_later`)
        self._record = getattr(index, "record_later", None) or index.record
        self._settle = getattr(index, "flush", None)
        tokens = getattr(loads, "tokens", None)
        #: ``replica_id`` → its token load now (``loads.snapshot(replica_id).tokens``: queued prefill +
        #: decode tokens); without a snapshot when the tracker reads it directly (routing.load)
        self.load_tokens: Callable[[str], int] = tokens if tokens is not None else (
            lambda replica_id: loads.snapshot(replica_id).tokens)
        self._requests = 0
        self._prompt = 0
        self._available = 0
        self._predicted = 0
        self._obs_requests = 0
        self._obs_predicted = 0
        self._delivered = 0
        self._over = 0
        self._under = 0

    def candidates(
        self, req: RouteRequest, candidate_ids: Iterable[str], alt_key_chains: Sequence[Sequence[bytes]] = ()
    ) -> list[Candidate]:
        """Build the policy's candidates: load snapshot and matched blocks,
        the max over ``req.block_keys`` and each chain in ``alt_key_chains``."""
        ids = list(dict.fromkeys(candidate_ids))
        matched = self.index.match_many(req.block_keys, ids)
        for chain in alt_key_chains:
            for rid, m in self.index.match_many(chain, ids).items():
                if m > matched[rid]:
                    matched[rid] = m
        cal, snapshot = self.calibration, self.loads.snapshot
        out = []  # a loop, not a comprehension: no frame of its own (issue 14, session 15)
        if cal is None:
            for rid in ids:
                out.append(Candidate(rid, snapshot(rid), matched[rid]))
        else:
            for rid in ids:
                out.append(Candidate(rid, snapshot(rid), matched[rid], cal.estimate(rid)))
        return out

    def route(
        self, req: RouteRequest, candidate_ids: Iterable[str], alt_key_chains: Sequence[Sequence[bytes]] = ()
    ) -> tuple[RouteChoice, LoadTicket]:
        """Choose a replica for ``req`` among ``candidate_ids`` (authorized and
        healthy), charge its load (prefill tokens = prompt tokens − predicted
        prefix tokens; decode tokens = ``req.max_tokens``; running requests =
        ``req.sequences``) and record its
        current-version keys in the index. Call ``LoadTicket.first_byte()`` at
        the first streamed token and ``LoadTicket.finish()`` when done (always).
        Raises :class:`NoCandidateError` when ``candidate_ids`` is empty.
        """
        return self.route_among(req, self.candidates(req, candidate_ids, alt_key_chains))

    def route_among(self, req: RouteRequest, cands: Sequence[Candidate]) -> tuple[RouteChoice, LoadTicket]:
        """:meth:`route` among candidates already built by :meth:`candidates` with no change to
        the index, the loads or the calibration since (flow control's fast path builds them for its
        placement check: issue 14). Raises :class:`NoCandidateError` when ``cands`` is empty."""
        choice = self.choose_among(req, cands)
        return choice, self.commit(req, choice)

    def choose(self, req: RouteRequest, candidate_ids: Iterable[str],
               alt_key_chains: Sequence[Sequence[bytes]] = ()) -> RouteChoice:
        """:meth:`route`'s choice without its charge: :meth:`commit` it (see :meth:`choose_among`)."""
        return self.choose_among(req, self.candidates(req, candidate_ids, alt_key_chains))

    def choose_among(self, req: RouteRequest, cands: Sequence[Candidate]) -> RouteChoice:
        """The first half of :meth:`route_among`: the policy's choice (its own bookkeeping included, e.g. the
        dispatch-share window), no load charged and no key recorded. Call :meth:`commit` with it before
        anything reads or changes the loads, the index or the calibration, and before any await: then every
        other request sees what :meth:`route_among` leaves (issue 14, session 30: the gateway charges after
        its upstream write). Raises :class:`NoCandidateError` when ``cands`` is empty."""
        if not cands:
            raise NoCandidateError("no candidate replica")
        return self.policy.choose(req, cands)

    def commit(self, req: RouteRequest, choice: RouteChoice) -> LoadTicket:
        """The second half of :meth:`route_among` for ``choice`` (of :meth:`choose_among`, once): the
        replica's load charged (its :class:`LoadTicket`), the request's keys recorded, the counters."""
        prefill = max(0, req.prompt_tokens - choice.predicted_prefix_tokens)
        ticket = self.loads.dispatch(choice.replica_id, prefill, max(0, req.max_tokens),
                                     max(1, req.sequences), req.tenant_id, req.calibrate)
        self._record(choice.replica_id, req.block_keys)  # applied before the index's next read
        self._requests += 1
        self._prompt += max(0, req.prompt_tokens)
        self._available += choice.available_prefix_tokens
        self._predicted += choice.predicted_prefix_tokens
        return ticket

    def settle(self) -> None:
        """Apply the index records :meth:`route_among` left for later (an index with ``record_later``,
        :class:`routing.index.InProcessPrefixIndex`); any read of the index applies them too, so this
        only chooses when their CPU is spent (the gateway: while the replica works, ``Held.run_prep``).
        No-op for an index that records at once."""
        if self._settle is not None:
            self._settle()

    def observe_delivered(self, choice: RouteChoice, cached_tokens: int) -> None:
        """Record the prefix tokens the replica actually reused for ``choice``
        (``usage.prompt_tokens_details.cached_tokens``)."""
        cached = max(0, int(cached_tokens))
        self._obs_requests += 1
        self._obs_predicted += choice.predicted_prefix_tokens
        self._delivered += cached
        diff = cached - choice.predicted_prefix_tokens
        if diff > 0:
            self._over += diff
        else:
            self._under -= diff

    def forget_replica(self, replica_id: str) -> None:
        """The replica lost its cache (restart): drop its index entries (and
        what the calibration learnt of it)."""
        self.index.forget_replica(replica_id)
        if self.calibration is not None:
            self.calibration.forget_replica(replica_id)

    def counters(self) -> RouterCounters:
        """Snapshot of the cumulative counters (see :class:`RouterCounters`)."""
        return RouterCounters(
            requests=self._requests,
            prompt_tokens=self._prompt,
            available_prefix_tokens=self._available,
            predicted_prefix_tokens=self._predicted,
            observed_requests=self._obs_requests,
            observed_predicted_prefix_tokens=self._obs_predicted,
            delivered_prefix_tokens=self._delivered,
            overdelivered_tokens=self._over,
            underdelivered_tokens=self._under,
        )
