"""The tracing section of the configuration: the OpenTelemetry exporter, offload and sampling."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gateway.config_base import ConfigSection


class TracingConfig(ConfigSection):
    """OpenTelemetry tracing exporter."""

    exporter: Literal["none", "console", "otlp", "memory"] = "none"
    otlp_endpoint: str | None = None
    #: Encode and export spans off the gateway process instead of in a thread of it (otlp and console
    #: only): with the audit worker process, the worker builds them from the request rows and, for otlp,
    #: POSTs them itself (``audit.span_post``, session 10); otherwise in a child process
    #: (``audit.span_exporter_proc``).
    offload: bool = True
    #: Fraction of requests traced (0..1; audit events are never sampled).
    sample_ratio: float = Field(1.0, ge=0.0, le=1.0)
