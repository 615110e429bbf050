"""The metrics section of the configuration: what the public listener's ``/metrics`` serves (R3-5)."""

from __future__ import annotations

from typing import Literal

from gateway.config_base import ConfigSection


class MetricsConfig(ConfigSection):
    """Prometheus exposition.

    ``public_endpoint``: ``minimal`` (default) serves ``GET /metrics`` on the public listener,
    unauthenticated, with the liveness and overload figures only (the ``public`` registry of
    :class:`gateway.metrics.GatewayMetrics`); ``off`` answers 404 there. Every other metric
    (request counts, prompt and prefix tokens, latencies, concentration, audit, shared state,
    per tenant and per replica) is served only by the admin listener's ``GET /admin/metrics``
    to operators, whatever this setting.
    """

    public_endpoint: Literal["minimal", "off"] = "minimal"
