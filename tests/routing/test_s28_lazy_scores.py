"""Session 28 (cut28, issue 14): ``cache_aware``'s one-candidate choice carries its scores as
:class:`routing.policies.cache_aware.LazyCosts`, computed at the first read. Read after the router has
dispatched the request (its replica's load changed), they are still the costs of the load the choice saw,
equal to the eager ``_costs`` dict of the choice's moment both ways, unhashable like it, with its ``repr``;
the choice itself is unchanged (routing rules: tests/routing/test_s8_choose_one.py)."""

from __future__ import annotations

import time

import pytest

from routing.calibration import CalibratingLoadTracker, Calibration
from routing.config import policy_from_config
from routing.index import InProcessPrefixIndex
from routing.load import InProcessLoadTracker
from routing.policies.cache_aware import CacheAwareConfig, LazyCosts
from routing.router import Router
from routing.types import RouteRequest


def _router() -> Router:
    cal = Calibration(prior_rate=10000.0)
    loads = CalibratingLoadTracker(InProcessLoadTracker(), cal, time.monotonic)
    return Router(policy_from_config(CacheAwareConfig()), InProcessPrefixIndex(4000), loads, 16, cal)


def _req(i: int) -> RouteRequest:
    return RouteRequest(tenant_id="acme", block_keys=[b"k", b"u%d" % i], prompt_tokens=85, max_tokens=4, block_size=16)


def test_scores_read_late_are_the_costs_the_choice_saw() -> None:
    router = _router()
    router.route(_req(0), ["r0"])  # some load on r0 first
    req = _req(1)
    cands = router.candidates(req, ["r0"])
    eager = router.policy._costs(req, cands)  # type: ignore[attr-defined]
    choice, ticket = router.route_among(req, cands)  # dispatched: r0's load changes before the read
    assert type(choice.scores) is LazyCosts
    assert router.loads.snapshot("r0") != cands[0].load
    assert router.policy._costs(req, router.candidates(req, ["r0"])) != eager  # type: ignore[attr-defined]
    assert choice.scores == eager and eager == choice.scores
    assert dict(choice.scores) == eager and list(choice.scores) == ["r0"] and len(choice.scores) == 1
    assert choice.scores["r0"] == eager["r0"] and repr(choice.scores) == repr(eager)
    with pytest.raises(TypeError):
        hash(choice.scores)
    ticket.finish()

