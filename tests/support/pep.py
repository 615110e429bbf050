"""A policy enforcement point over a counting decision point, for the decision-cache tests
(tests/policy/test_s6_pep_key.py, tests/policy/test_i14_fast_key.py, tests/gateway/test_s16_front_fast_paths.py;
one copy since session 17, duplicates D3/D11 of session 16).

:class:`CountingDecisionPoint` allows every request and keeps each input document it is asked about;
:func:`cached_pep` builds ``PolicyEnforcementPoint`` over it behind a ``CachedDecisionPoint`` whose
cache lookups are recorded, with an audit hub that reports fixed alerts and metrics that count nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from gateway.pep import DecisionPoint, PolicyEnforcementPoint
from policy.cache import CachedDecisionPoint, DecisionCache
from policy.decision import Decision
from routing.load import InProcessLoadTracker

__all__ = ["CountingDecisionPoint", "cached_pep"]


class CountingDecisionPoint:
    """A decision point that allows every request; ``docs``: the input documents asked about, in
    order; the n-th decision's id is ``d<n>``."""

    def __init__(self) -> None:
        self.docs: list[dict[str, Any]] = []

    async def decide(self, input: dict[str, Any]) -> Decision:
        self.docs.append(input)
        return Decision(True, "allowed", "", None, None, None, f"d{len(self.docs)}")


class _Audit:
    """The audit hub's one method the PEP reads: the active alerts (a copy of ``alerts`` at each call)."""

    def __init__(self, alerts: Sequence[dict[str, Any]]) -> None:
        self.alerts = alerts

    def active_alerts(self) -> list[dict[str, Any]]:
        return list(self.alerts)


class _Child:
    def inc(self) -> None:
        pass


class _Metrics:
    """The PEP's one metric (``policy_cache``), counting nothing."""

    class policy_cache:  # noqa: N801
        @staticmethod
        def labels(_: str) -> _Child:
            return _Child()


async def _none() -> None:
    return None


def cached_pep(ttl_s: float, alerts: Sequence[dict[str, Any]] = (), clock: Callable[[], float] = time.monotonic,
               ) -> tuple[PolicyEnforcementPoint, CachedDecisionPoint, CountingDecisionPoint, list[Any]]:
    """``(pep, cached, inner, keys)``: a PEP over ``cached`` (a decision cache of ``ttl_s`` seconds on
    ``clock``) over ``inner`` (:class:`CountingDecisionPoint`); ``keys`` receives every key the cache is
    asked for; the audit hub reports ``alerts``."""
    inner = CountingDecisionPoint()
    cached = CachedDecisionPoint(inner, DecisionCache(ttl_s=ttl_s, clock=clock))
    keys: list[Any] = []
    real_get = cached.cache.get
    cached.cache.get = lambda key: keys.append(key) or real_get(key)  # type: ignore[method-assign]
    pdp = DecisionPoint(cached, inner, start=_none, stop=_none)  # type: ignore[arg-type]
    pep = PolicyEnforcementPoint(pdp, InProcessLoadTracker(), _Audit(alerts), _Metrics())  # type: ignore[arg-type]
    return pep, cached, inner, keys
