"""Pure routing logic: prefix index, load tracker, router and policies.

No I/O and no import of ``gateway``: the gateway and the offline simulator
(``sim/des.py``) both drive it. A policy is a chain of plugins, filter →
scorer → picker (:mod:`routing.plugins`, :mod:`routing.scheduler`); state
that several gateway instances will share sits behind the
:class:`PrefixIndex` and :class:`LoadTracker` protocols, in-process by
default. See docs/routing.md.
"""

from __future__ import annotations

from routing.config import PolicyConfig, policy_from_config
from routing.index import InProcessPrefixIndex, IndexStats, PrefixIndex
from routing.load import InProcessLoadTracker, LoadTicket, LoadTracker, Ticket
from routing.plugins import Filter, Pick, Picker, RoutingPolicy, Scorer
from routing.policies import POLICY_NAMES, build_policy
from routing.router import Router, RouterCounters
from routing.scheduler import Scheduler
from routing.types import Candidate, NoCandidateError, ReplicaLoad, RouteChoice, RouteRequest

__all__ = [
    "Candidate",
    "Filter",
    "InProcessLoadTracker",
    "InProcessPrefixIndex",
    "IndexStats",
    "LoadTicket",
    "LoadTracker",
    "NoCandidateError",
    "POLICY_NAMES",
    "Pick",
    "Picker",
    "PolicyConfig",
    "PrefixIndex",
    "ReplicaLoad",
    "RouteChoice",
    "RouteRequest",
    "Router",
    "RouterCounters",
    "RoutingPolicy",
    "Scheduler",
    "Scorer",
    "Ticket",
    "build_policy",
    "policy_from_config",
]
