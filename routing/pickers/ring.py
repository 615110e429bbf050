"""Consistent-hash ring: the first eligible owner clockwise from the request.

Each candidate owns ``virtual_nodes`` points on a 64-bit ring. The request's
point hashes the key of block ``skip_blocks`` of its chain (skipping blocks
shared by everyone, such as a common system prompt, so that conversations
rather than the shared head decide the spread). The ring is built over *all*
candidates, so a filtered-out owner hands its requests to the next point
clockwise and nobody else's move. Reasons: ``ring_owner``, ``ring_spill``.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence

from routing.hashing import hash64, request_point
from routing.plugins import Pick
from routing.types import Candidate, RouteRequest

__all__ = ["RingPicker"]

_MAX_RINGS = 64


class RingPicker:
    """See module doc. ``virtual_nodes`` >= 1, ``skip_blocks`` >= 0 (raises
    :class:`ValueError`). Caches up to 64 rings (one per candidate set)."""

    name = "ring"

    def __init__(self, virtual_nodes: int = 64, skip_blocks: int = 1) -> None:
        if virtual_nodes < 1:
            raise ValueError("virtual_nodes must be >= 1")
        if skip_blocks < 0:
            raise ValueError("skip_blocks must be >= 0")
        self.virtual_nodes = virtual_nodes
        self.skip_blocks = skip_blocks
        self._rings: dict[tuple[str, ...], tuple[list[int], list[str]]] = {}

    def _ring(self, ids: tuple[str, ...]) -> tuple[list[int], list[str]]:
        ring = self._rings.get(ids)
        if ring is None:
            pts = sorted(
                (hash64(rid.encode("utf-8"), v.to_bytes(4, "big")), rid) for rid in ids for v in range(self.virtual_nodes)
            )
            ring = ([p for p, _ in pts], [r for _, r in pts])
            if len(self._rings) > _MAX_RINGS:
                self._rings.clear()
            self._rings[ids] = ring
        return ring

    def pick(self, req: RouteRequest, candidates: Sequence[Candidate], eligible: Sequence[Candidate],
             scores: Mapping[str, float]) -> Pick:
        """The first eligible owner clockwise from the request's point."""
        kept = {c.replica_id: c for c in eligible}
        points, owners = self._ring(tuple(sorted({c.replica_id for c in candidates})))
        start = bisect.bisect_left(points, hash64(request_point(req, self.skip_blocks)))
        first = owners[start % len(owners)]
        for i in range(len(owners)):
            rid = owners[(start + i) % len(owners)]
            if rid in kept:
                return Pick(kept[rid], "ring_owner" if rid == first else "ring_spill")
        raise ValueError("no eligible candidate is on the ring")  # eligible ⊆ candidates: unreachable
