"""Bytes one tenant's queued requests hold while they wait in flow control's queue (session 12, review R12-2).

A request waiting in its tenant's flow queue keeps only its upstream body, serialized, and its prefix
chains (:func:`queued_form`, session 13, R12b-3: the parsed form of a value-dense body is 5-25x its
bytes, so the count would understate it; the bytes are exactly what is held and what
:func:`gateway.proxy.open_upstream` sends); the per-tenant body budget
(``limits.max_buffered_body_bytes_per_tenant``) counts a body only while it is being read, and
``flow.tenant_max_queued_requests`` bounds the count, not the bytes. :class:`QueuedBytes` sums, per
tenant, the serialized upstream body's length and its chains' bytes (:func:`chain_bytes`, session 14,
review RV2-6) of each request while it waits (taken when it is queued, given back when it
leaves the queue however it leaves: released to a replica, refused, timed out, cancelled) against
``flow.tenant_max_queued_bytes``: a request that would pass it is refused with the 429 ``queue_full``
of a full queue (:meth:`gateway.flow.FlowControl.release`). A tenant with nothing queued may always
queue one request, whatever its size (it is bounded by ``limits.max_body_bytes``).

Event-loop thread only (no locks).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import orjson

from gateway.json_fast import dumps

if TYPE_CHECKING:
    from gateway.request import InferenceRequest

__all__ = ["QueuedBytes", "chain_bytes", "queued_form", "with_salt"]


def queued_form(req: InferenceRequest, body: dict[str, Any]) -> bytes:
    """The upstream ``body`` (a dict built from ``req.body``) as the JSON bytes the request keeps while
    it waits in the flow queue (session 13, R12b-3), exactly what :func:`gateway.proxy.open_upstream`
    would have serialized; its length is what :class:`QueuedBytes` counts.

    The parsed form is dropped: ``body`` and ``req.body`` are emptied in place (the caller's frames
    still name them), ``req.extra_text`` and the prompt texts are dropped
    (:meth:`InferenceRequest.forget_prompt_text`). Nothing after the queue reads them: the route
    request, counts and chains were made before. Measured (/work/notes/s12-review2-parsedmem.py
    shapes): the parsed form held 2.4 MB for a 96 KB body of 32,000 ``{}``; the bytes hold 96 KB.
    The bytes are copied once to their exact size: ``orjson.dumps`` returns a buffer with its spare
    capacity still allocated (tracemalloc: 2 MB behind 36 kB of ``[{},...]``, 1.1 MB behind a 100 kB
    string). Runs only for a request that really waits (the path without a wait serializes as before)."""
    data = memoryview(dumps(body)).tobytes()  # orjson's bytes keep their spare capacity (36 kB: 2 MB)
    body.clear()
    req.body.clear()
    req.extra_text = ""
    req.forget_prompt_text()
    return data


#: bytes one prefix-chain block holds besides its key's own bytes: a bytes object's header (33 B) and
#: its slot in the chain's list (8 B), rounded up (review RV2-6; tracemalloc: 58 B per 16-byte key)
_BLOCK_OVERHEAD = 48
_CHAIN_OVERHEAD = 64  # a list's header


def chain_bytes(current: Sequence[bytes], previous: Sequence[Sequence[bytes]] = ()) -> int:
    """About the bytes a waiting request's prefix chains hold beside its body (session 14, review RV2-6):
    ``current`` (the chain under the tenant's current key) and ``previous`` (chains under older keys in
    their grace period), each ``len(key) + 48`` bytes per block plus 64 per chain; counted with the body
    against ``flow.tenant_max_queued_bytes``. An upper bound of what tracemalloc measures (58 B a block
    for the default 16-byte keys: 8,190 one-letter tokens hold ~30 kB of chain beside a 16 kB body)."""
    n = 0
    for chain in (current, *previous):
        if chain:
            n += len(chain) * (len(chain[0]) + _BLOCK_OVERHEAD) + _CHAIN_OVERHEAD
    return n


def with_salt(body: dict[str, Any] | bytes, salt: str) -> dict[str, Any] | bytes:
    """``body`` with ``cache_salt`` added last: a new dict, or for :func:`queued_form`'s bytes the same
    bytes ``orjson.dumps({**body, "cache_salt": salt})`` gives (the body is a non-empty JSON object
    without ``cache_salt``: the parse drops a client's)."""
    if body.__class__ is bytes:
        return body[:-1] + b',"cache_salt":' + orjson.dumps(salt) + b"}"  # type: ignore[index]
    return {**body, "cache_salt": salt}  # type: ignore[dict-item]


class QueuedBytes:
    """Per tenant, the body bytes of its requests waiting in the flow queue, bounded by ``limit`` (bytes)."""

    __slots__ = ("limit", "_held")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held: dict[str, int] = {}

    def take(self, tenant_id: str, n: int) -> bool:
        """Count ``n`` more bytes for ``tenant_id``; False (nothing counted) when its queued requests
        already hold some and ``n`` more would pass :attr:`limit`."""
        held = self._held.get(tenant_id, 0)
        if held and held + n > self.limit:
            return False
        self._held[tenant_id] = held + n
        return True

    def give_back(self, tenant_id: str, n: int) -> None:
        """``n`` bytes taken for ``tenant_id`` leave the queue (exactly once per successful :meth:`take`)."""
        left = self._held.get(tenant_id, 0) - n
        if left > 0:
            self._held[tenant_id] = left
        else:
            self._held.pop(tenant_id, None)

    def held(self, tenant_id: str) -> int:
        """Bytes ``tenant_id``'s queued requests hold now."""
        return self._held.get(tenant_id, 0)

    def total(self) -> int:
        """Bytes all tenants' queued requests hold now."""
        return sum(self._held.values())
