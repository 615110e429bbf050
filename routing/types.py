"""Value types shared by the router, the policies and their plugins.

All frozen dataclasses; no behaviour beyond small derived properties. Each writes its fields in an
``__init__`` of its own (issue 14, session 23): the instance dictionary filled directly, where the
generated ``__init__`` of a frozen dataclass calls ``object.__setattr__`` once per field (~0.75 µs less
per object; several are built per routed request). Fields, defaults, equality, hash and repr are the
dataclass's own (tests/routing/test_s23_value_init.py checks each against the generated ``__init__``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from routing.calibration import ReplicaEstimate

__all__ = ["ReplicaLoad", "RouteRequest", "Candidate", "RouteChoice", "NoCandidateError"]


class _NoScores:
    """The type of :data:`_NO_SCORES`."""


#: ``RouteChoice``'s ``scores`` when not given (a new empty dict each, as ``field(default_factory=dict)``)
_NO_SCORES = _NoScores()


class NoCandidateError(LookupError):
    """Raised when a routing decision is asked for with no candidate replica."""


@dataclass(frozen=True)
class ReplicaLoad:
    """Load of one replica: ``queued_prefill_tokens`` and ``decode_tokens``
    in tokens, ``running_requests`` in requests, ``prefilling_requests``:
    requests dispatched whose first byte has not arrived yet (still queued
    or prefilling; their prefill tokens make ``queued_prefill_tokens``)."""

    replica_id: str
    queued_prefill_tokens: int = 0
    decode_tokens: int = 0
    running_requests: int = 0
    prefilling_requests: int = 0

    def __init__(self, replica_id: str, queued_prefill_tokens: int = 0, decode_tokens: int = 0,
                 running_requests: int = 0, prefilling_requests: int = 0) -> None:
        d = self.__dict__  # = the frozen dataclass's __init__ (module doc)
        d["replica_id"] = replica_id
        d["queued_prefill_tokens"] = queued_prefill_tokens
        d["decode_tokens"] = decode_tokens
        d["running_requests"] = running_requests
        d["prefilling_requests"] = prefilling_requests

    def shared_wait_tokens(self, uncached_tokens: int) -> int:
        """Queued prefill tokens that delay a new request of ``uncached_tokens``
        on a replica whose concurrent prefills share its rate (chunked
        prefill, processor sharing): each prefill in progress holds the new
        one back by at most the new one's own size, so
        ``min(queued, prefilling · uncached)`` (an upper bound of
        ``Σ min(q_i, u)``; on a one-prefill-at-a-time replica the whole
        queue waits instead)."""
        return min(self.queued_prefill_tokens, self.prefilling_requests * max(0, uncached_tokens))

    @property
    def tokens(self) -> int:
        """Total token load: queued prefill tokens + decode tokens in flight."""
        return self.queued_prefill_tokens + self.decode_tokens


@dataclass(frozen=True)
class RouteRequest:
    """What a policy knows of one request.

    ``block_keys``: the tenant's HMAC block-hash chain under the current key
    version (``tenancy.prefix.block_hash_chain``), one key per full block;
    ``prompt_tokens``: prompt length in tokens (all sequences); ``max_tokens``:
    expected output tokens (all sequences: a batch of n prompts asks for n x
    the per-sequence ``max_tokens``); ``block_size``: tokens per KV block;
    ``sequences``: sequences the replica runs (elements of a list ``prompt``);
    ``calibrate``: False when the request has prompt parts the router counts but does not hash
    (chat ``tools``, ``response_format``, …): its first byte then does not feed the calibration
    (R10-3, :mod:`routing.calibration`).
    """

    tenant_id: str
    block_keys: Sequence[bytes]
    prompt_tokens: int
    max_tokens: int
    block_size: int
    sequences: int = 1
    calibrate: bool = True

    def __init__(self, tenant_id: str, block_keys: Sequence[bytes], prompt_tokens: int, max_tokens: int,
                 block_size: int, sequences: int = 1, calibrate: bool = True) -> None:
        d = self.__dict__  # = the frozen dataclass's __init__ (module doc)
        d["tenant_id"] = tenant_id
        d["block_keys"] = block_keys
        d["prompt_tokens"] = prompt_tokens
        d["max_tokens"] = max_tokens
        d["block_size"] = block_size
        d["sequences"] = sequences
        d["calibrate"] = calibrate


@dataclass(frozen=True)
class Candidate:
    """One routable replica: its current ``load`` and ``matched_blocks``
    (leading blocks of the request believed cached there, max over the
    current and previous key versions); ``estimate``: its calibrated rate,
    queue weight and engine metrics (:mod:`routing.calibration`), ``None``
    when the router has no calibration or nothing was learnt yet."""

    replica_id: str
    load: ReplicaLoad
    matched_blocks: int = 0
    estimate: ReplicaEstimate | None = None

    def __init__(self, replica_id: str, load: ReplicaLoad, matched_blocks: int = 0,
                 estimate: ReplicaEstimate | None = None) -> None:
        d = self.__dict__  # = the frozen dataclass's __init__ (module doc)
        d["replica_id"] = replica_id
        d["load"] = load
        d["matched_blocks"] = matched_blocks
        d["estimate"] = estimate


@dataclass(frozen=True)
class RouteChoice:
    """A routing decision.

    ``predicted_prefix_tokens``: prefix tokens expected cached on the chosen
    replica; ``available_prefix_tokens``: best over all candidates (the gap is
    what the load guard gave up); ``reason``: short machine-friendly string;
    ``scores``: per-candidate score (policy specific; lower is better) for
    debugging.
    """

    replica_id: str
    policy: str
    predicted_prefix_tokens: int
    available_prefix_tokens: int
    reason: str
    scores: Mapping[str, float] = field(default_factory=dict)

    def __init__(self, replica_id: str, policy: str, predicted_prefix_tokens: int, available_prefix_tokens: int,
                 reason: str, scores: Mapping[str, float] | _NoScores = _NO_SCORES) -> None:
        d = self.__dict__  # = the frozen dataclass's __init__ (module doc); scores: a new dict when not given
        d["replica_id"] = replica_id
        d["policy"] = policy
        d["predicted_prefix_tokens"] = predicted_prefix_tokens
        d["available_prefix_tokens"] = available_prefix_tokens
        d["reason"] = reason
        d["scores"] = {} if scores is _NO_SCORES else scores
