"""R4-11: ``prefixgate_flow_queued_requests`` moves with other tenants' prompt lengths once the
per-replica prefill-token bound is set (a threshold oracle), so the unauthenticated public
``/metrics`` must not carry it; operators read it on ``/admin/metrics``."""

from __future__ import annotations

from typing import Any

GAUGE = "prefixgate_flow_queued_requests"


def families(text: str) -> set[str]:
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


async def test_queue_gauge_is_on_admin_metrics_only(stack: Any) -> None:
    public = await stack.client.get("/metrics")
    assert public.status_code == 200
    assert GAUGE not in public.text
    assert GAUGE in families(await stack.admin_metrics())
