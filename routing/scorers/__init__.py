"""Scorers: a cost per candidate, lower is better, weight applied.

* :mod:`routing.scorers.estimated_ttft`: queued + uncached prefill time (s);
* :mod:`routing.scorers.decode_load`: weighted decode tokens in flight (s);
* :mod:`routing.scorers.prefix_affinity`: weighted credit for a cached prefix (s, negative);
* :mod:`routing.scorers.queue_externality`: delay added to the requests queued behind (s, opt-in);
* :mod:`routing.scorers.token_load`: queued prefill + decode tokens;
* :mod:`routing.scorers.running_requests`: requests in flight.
"""

from __future__ import annotations

from routing.scorers.decode_load import DecodeLoadScorer
from routing.scorers.estimated_ttft import EstimatedTTFTScorer
from routing.scorers.prefix_affinity import PrefixAffinityScorer
from routing.scorers.queue_externality import QueueExternalityScorer
from routing.scorers.running_requests import RunningRequestsScorer
from routing.scorers.token_load import TokenLoadScorer

__all__ = ["DecodeLoadScorer", "EstimatedTTFTScorer", "PrefixAffinityScorer", "QueueExternalityScorer",
           "RunningRequestsScorer", "TokenLoadScorer"]
