"""Routing: prefix index, load tracking, routing policies, router, replica set and health."""

from __future__ import annotations

from gateway.routing.index import PrefixIndex
from gateway.routing.load import LoadTracker, ReplicaLoad, Ticket
from gateway.routing.policies import (
    Candidate,
    NoCandidateError,
    RouteChoice,
    RouteRequest,
    RoutingPolicy,
    build_policy,
)
from gateway.routing.replicas import Replica, ReplicaSet
from gateway.routing.router import Router, RouterCounters

__all__ = [
    "PrefixIndex",
    "LoadTracker",
    "ReplicaLoad",
    "Ticket",
    "Candidate",
    "NoCandidateError",
    "RouteChoice",
    "RouteRequest",
    "RoutingPolicy",
    "build_policy",
    "Replica",
    "ReplicaSet",
    "Router",
    "RouterCounters",
]
