"""Build an :class:`audit.log.AuditLog` from the ``audit`` config section.

Shape (all sections optional except ``spill``; sizes bytes, times seconds)::

    jsonl:  {dir, signing_key_file, rotate_bytes, rotate_s, checkpoint_s}
    ocsf:   {file}                       # OCSF JSON lines to a local file
    syslog: {host, port, protocol: tcp|tls|udp, format: cef|ocsf, ca_file, max_message_bytes}
    otlp:   {endpoint, headers, timeout_s, compression: gzip, ca_file}
                                        # OTLP/HTTP logs, e.g. http://collector:4318/v1/logs;
                                        # headers: extra request headers (collector auth; never
                                        # logged); timeout_s per request (default 5); compression
                                        # off unless "gzip"; ca_file: trust bundle for an https
                                        # endpoint (refused with http://)
    spill:  {dir, max_bytes}
    summary: {window_s, first_n, max_sources}   # flood aggregation, on by default
                                        # (window 10 s, first 5); ``summary: false`` turns it off
    instance: "host/w1"                 # stamped on every event (serve --workers N sets it per worker)
    slow_send_s: 1.0                    # a sink send of in-memory events running longer moves
                                        # them to the sink's spill (AuditLog slow_send_s)

The signing key file must not be inside ``jsonl.dir`` (refused).
"""
from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from audit.keys import load_signing_key
from audit.log import AuditLog
from audit.sink import AuditSink
from audit.summary import SummaryAggregator


class AuditConfigError(ValueError):
    """The audit config section is invalid."""


def build_audit(config: dict[str, Any], registry: CollectorRegistry | None = None,
                validate_only: bool = False) -> AuditLog | None:
    """Create the AuditLog and its sinks (not started; call ``await log.start()``).

    ``validate_only``: check the section and build the sinks (no side
    effects: nothing is opened, locked or created) and return None — what
    the gateway does before it hands the section to the audit worker process.

    Raises:
        AuditConfigError: missing ``spill.dir``, no sink, signing key inside
            the log directory, unknown protocol/format.
        audit.keys.KeyFileError: unreadable signing key.
    """
    sinks: list[AuditSink] = []
    if (j := config.get("jsonl")) is not None:
        from audit.jsonl import JsonlChainSink

        log_dir = Path(j["dir"]).resolve()
        key_file = Path(j["signing_key_file"]).resolve()
        if log_dir == key_file.parent or log_dir in key_file.parents:
            raise AuditConfigError("jsonl.signing_key_file must not live inside jsonl.dir")
        sinks.append(JsonlChainSink(log_dir, load_signing_key(key_file), rotate_bytes=int(j.get("rotate_bytes", 64 << 20)),
                                    rotate_s=float(j.get("rotate_s", 3600)), checkpoint_s=float(j.get("checkpoint_s", 60))))
    if (o := config.get("ocsf")) is not None and o.get("file"):
        from audit.ocsf import OcsfFileSink

        sinks.append(OcsfFileSink(str(o["file"])))
    if (s := config.get("syslog")) is not None:
        from audit.syslog import SyslogSink, ocsf_payload
        from audit.cef import format_cef

        protocol = s.get("protocol", "tcp")
        fmt = s.get("format", "cef")
        if fmt not in ("cef", "ocsf"):
            raise AuditConfigError(f"syslog.format must be cef or ocsf, not {fmt!r}")
        ctx = ssl.create_default_context(cafile=s.get("ca_file")) if protocol == "tls" else None
        try:
            cap = s.get("max_message_bytes")
            sinks.append(SyslogSink(s["host"], int(s["port"]), protocol, ssl_context=ctx,
                                    formatter=format_cef if fmt == "cef" else ocsf_payload,
                                    max_message_bytes=int(cap) if cap is not None else None))
        except ValueError as exc:
            raise AuditConfigError(str(exc)) from exc
    if (t := config.get("otlp")) is not None and t.get("endpoint"):
        from audit.otlp import OtlpLogSink

        endpoint = str(t["endpoint"])
        headers = t.get("headers") or {}
        if not isinstance(headers, dict):
            raise AuditConfigError("otlp.headers must be a mapping of header name to value")
        ca_file = t.get("ca_file")
        if ca_file and not endpoint.startswith("https://"):
            raise AuditConfigError("otlp.ca_file needs an https:// endpoint")
        try:
            otlp_ctx = ssl.create_default_context(cafile=ca_file) if ca_file else None
            sinks.append(OtlpLogSink(endpoint=endpoint, headers={str(k): str(v) for k, v in headers.items()},
                                     timeout_s=float(t.get("timeout_s", 5.0)), compression=t.get("compression"),
                                     ssl_context=otlp_ctx))
        except (ValueError, OSError) as exc:  # bad option, unreadable or invalid ca_file
            raise AuditConfigError(f"otlp: {exc}") from exc
    if not sinks:
        raise AuditConfigError("audit needs at least one sink")
    spill = config.get("spill") or {}
    if "dir" not in spill:
        raise AuditConfigError("audit.spill.dir is required")
    summary = config.get("summary", {})
    if summary is None:
        summary = {}
    if summary is False:
        aggregator = None
    elif isinstance(summary, dict):
        aggregator = SummaryAggregator(float(summary.get("window_s", 10)), int(summary.get("first_n", 5)),
                                       int(summary.get("max_sources", 10_000)))
    else:
        raise AuditConfigError("audit.summary must be a mapping or false")
    try:
        slow_send_s = float(config.get("slow_send_s", 1.0))
    except (TypeError, ValueError):
        raise AuditConfigError("audit.slow_send_s must be a number of seconds") from None
    if not slow_send_s > 0:
        raise AuditConfigError("audit.slow_send_s must be > 0")
    if validate_only:
        return None
    instance = config.get("instance")
    if instance is not None and (not isinstance(instance, str) or not 0 < len(instance) <= 128):
        raise AuditConfigError("audit.instance must be a string of 1 to 128 characters")
    return AuditLog(sinks, spill["dir"], spill_max_bytes=int(spill.get("max_bytes", 256 << 20)),
                    aggregator=aggregator, registry=registry, slow_send_s=slow_send_s, instance=instance)
