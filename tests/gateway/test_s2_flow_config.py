"""flow: one tenant's queue bound must stay below the gateway-wide shedding bound (issue 17).

Since a queued request holds no concurrency slot, a tenant at its concurrency can keep
``tenant_max_queued_requests`` requests waiting; if that alone reached
``shed_max_in_flight_requests``, one tenant could make the gateway shed every tenant's
requests. The configuration refuses such bounds.
"""
from __future__ import annotations

import pytest

from gateway.config_flow import FlowConfig


def test_default_tenant_queue_is_below_the_shedding_bound() -> None:
    cfg = FlowConfig()
    assert cfg.tenant_max_queued_requests < cfg.shed_max_in_flight_requests


@pytest.mark.parametrize("queued,shed", [(1024, 1024), (2000, 1024), (2, 2)])
def test_a_tenant_queue_reaching_the_shedding_bound_is_refused(queued: int, shed: int) -> None:
    with pytest.raises(ValueError, match="tenant_max_queued_requests must be below shed_max_in_flight_requests"):
        FlowConfig(tenant_max_queued_requests=queued, shed_max_in_flight_requests=shed)


def test_a_tenant_queue_below_the_shedding_bound_is_accepted() -> None:
    assert FlowConfig(tenant_max_queued_requests=1, shed_max_in_flight_requests=2).tenant_max_queued_requests == 1
