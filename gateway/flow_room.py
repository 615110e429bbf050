"""Flow control's placement rules (gateway/flow.py; docs/fairness.md): whether one replica has
room for one more request (:class:`ReplicaRoom`) and whether a request should wait for a warm
replica or go cold now (:func:`warmth`). Pure: no I/O, no queue state."""

from __future__ import annotations

from gateway.config_flow import FlowConfig
from routing.calibration import Calibration
from routing.fairness import Placement
from routing.types import Candidate, ReplicaLoad

__all__ = ["ReplicaRoom", "warmth"]


class ReplicaRoom:
    """The per-replica bounds of the ``flow`` section, each divided by ``flow.instances``:
    ``max_running`` requests, ``max_prefill`` queued prefill tokens (None: no bound) and the engine's
    waiting requests (``replica_max_engine_waiting_requests``, read from ``calibration``'s engine samples)."""

    __slots__ = ("max_running", "max_prefill", "engine_waiting", "calibration")

    def __init__(self, cfg: FlowConfig, calibration: Calibration | None) -> None:
        self.max_running = cfg.per_instance(cfg.replica_max_running_requests)
        p = cfg.replica_max_queued_prefill_tokens
        self.max_prefill = cfg.per_instance(p) if p is not None else None
        self.engine_waiting = cfg.replica_max_engine_waiting_requests
        self.calibration = calibration

    def has_room(self, load: ReplicaLoad, uncached: int, sequences: int) -> bool:
        """Room on one replica for one more request of ``uncached`` prefill tokens and ``sequences``
        sequences (an empty replica always has room)."""
        if load.running_requests and load.running_requests + sequences > self.max_running:
            return False
        mp = self.max_prefill
        if mp is not None and load.queued_prefill_tokens and load.queued_prefill_tokens + uncached > mp:
            return False
        bound = self.engine_waiting
        if bound is not None and self.calibration is not None:
            est = self.calibration.estimate(load.replica_id)
            eng = est.engine if est is not None else None
            if eng is not None and eng.waiting is not None and eng.waiting >= bound and load.running_requests:
                return False
        return True


def warmth(cands: list[Candidate], room: set[str], block_size: int, prompt_tokens: int,
           max_prefill: int | None, wait_ratio: float = 4.0) -> Placement:
    """``warm`` when a replica holding the request's longest cached prefix has room (or there
    is no cached prefix to lose). Otherwise compare, in prefill tokens, recomputing the prefix
    elsewhere (``cold``) with waiting for the least-loaded warm replica to regain room: the
    prefill it must drain first (its queued prefill tokens beyond what leaves room for this
    request under ``max_prefill``, or all of them without a token bound). Waiting is cheaper:
    ``None`` (the request is not placed now; others are released meanwhile; its tenant's wait
    bound still applies) while that drain is at most ``wait_ratio`` times the prefix."""
    best = max((c.matched_blocks for c in cands), default=0)
    if best == 0 or any(c.matched_blocks == best and c.replica_id in room for c in cands):
        return "warm"
    prefix = best * block_size
    uncached = max(0, prompt_tokens - prefix)
    drain = min(c.load.queued_prefill_tokens + (uncached - max_prefill if max_prefill is not None else 0)
                for c in cands if c.matched_blocks == best)
    return None if prefix * wait_ratio >= drain else "cold"
