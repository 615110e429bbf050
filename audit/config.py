"""Build an :class:`audit.log.AuditLog` from the ``audit`` config section.

The section's keys, types, defaults and bounds are :class:`audit.config_schema.AuditSection`'s
(documented key by key in docs/configuration.md; sizes bytes, times seconds)::

    jsonl:  {dir, signing_key_file, rotate_bytes, rotate_s, checkpoint_s}
    ocsf:   {file}                       # OCSF JSON lines to a local file
    syslog: {host, port, protocol: tcp|tls|udp, format: cef|ocsf, ca_file, max_message_bytes}
    otlp:   {endpoint, headers, timeout_s, compression: gzip, ca_file}
    spill:  {dir, max_bytes}             # required
    summary: {window_s, first_n, max_sources} | false
    instance: "host/w1"
    slow_send_s: 1.0
    worker, concentration                # read by gateway.auditing.AuditHub, not here

Here: the rules over more than one key or the filesystem. The signing key file must not be
inside ``jsonl.dir``; ``otlp.ca_file`` needs an https endpoint; at least one sink; ``spill.dir``.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from audit.config_schema import AuditConfigError, AuditSection, parse_audit
from audit.keys import load_signing_key
from audit.log import AuditLog
from audit.sink import AuditSink
from audit.summary import SummaryAggregator
from audit.tls import client_context

__all__ = ["AuditConfigError", "AuditSection", "build_audit"]


def build_audit(config: Mapping[str, Any] | AuditSection, registry: CollectorRegistry | None = None,
                validate_only: bool = False, input_batched: bool = False) -> AuditLog | None:
    """Create the AuditLog and its sinks (not started; call ``await log.start()``).

    ``config``: the section as a mapping (validated by :func:`audit.config_schema.parse_audit`)
    or an already validated :class:`AuditSection`. ``validate_only``: check the section and
    build the sinks (no side effects: nothing is opened, locked or created) and return None —
    what the gateway does before it hands the section to the audit worker process.
    ``input_batched``: events come in bursts, all of a burst emitted before the sinks run (the audit
    worker: one burst per read of its pipe, ``audit.worker_stdin.READ_INTERVAL_S``), so the file and
    syslog sinks send each burst at once (``linger_s`` 0): the same one write per burst, without a
    timer wake of their own per burst (session 14). The OTLP log sink keeps its ``linger_s``.

    Raises:
        AuditConfigError: a key the schema refuses (``audit.<dotted.key>: <message>``),
            missing ``spill.dir``, no sink, signing key inside the log directory,
            ``otlp.ca_file`` with an http:// endpoint, an unreadable CA file.
        audit.keys.KeyFileError: unreadable signing key.
    """
    section = parse_audit(config)
    sinks: list[AuditSink] = []
    linger = {"linger_s": 0.0} if input_batched else {}
    if (j := section.jsonl) is not None:
        from audit.jsonl import JsonlChainSink

        log_dir = Path(j.dir).resolve()
        key_file = Path(j.signing_key_file).resolve()
        if log_dir == key_file.parent or log_dir in key_file.parents:
            raise AuditConfigError("jsonl.signing_key_file must not live inside jsonl.dir")
        # its encodings kept for the OTLP log sink only when there is one (audit.encoded.shared_json)
        share = section.otlp is not None and bool(section.otlp.endpoint)
        sinks.append(JsonlChainSink(log_dir, load_signing_key(key_file), rotate_bytes=j.rotate_bytes,
                                    rotate_s=j.rotate_s, checkpoint_s=j.checkpoint_s, share_json=share, **linger))
    if (o := section.ocsf) is not None and o.file:
        from audit.ocsf import OcsfFileSink

        sinks.append(OcsfFileSink(o.file, **linger))
    if (s := section.syslog) is not None:
        from audit.syslog import SyslogSink, ocsf_payload
        from audit.cef import format_cef

        try:
            ctx = client_context(s.ca_file) if s.protocol == "tls" else None
            sinks.append(SyslogSink(s.host, s.port, s.protocol, ssl_context=ctx,
                                    formatter=format_cef if s.format == "cef" else ocsf_payload,
                                    max_message_bytes=s.max_message_bytes, **linger))
        except (ValueError, OSError) as exc:  # unreadable or invalid ca_file
            raise AuditConfigError(f"syslog: {exc}") from exc
    if (t := section.otlp) is not None and t.endpoint:
        from audit.otlp import OtlpLogSink

        if t.ca_file and not t.endpoint.startswith("https://"):
            raise AuditConfigError("otlp.ca_file needs an https:// endpoint")
        try:
            otlp_ctx = client_context(t.ca_file) if t.endpoint.startswith("https://") else None
            sinks.append(OtlpLogSink(endpoint=t.endpoint, headers=dict(t.headers or {}), timeout_s=t.timeout_s,
                                     compression=t.compression, ssl_context=otlp_ctx))
        except (ValueError, OSError) as exc:  # bad endpoint URL, unreadable or invalid ca_file
            raise AuditConfigError(f"otlp: {exc}") from exc
    if not sinks:
        raise AuditConfigError("audit needs at least one sink")
    if section.spill is None:
        raise AuditConfigError("audit.spill.dir is required")
    summary = section.summary
    aggregator = None if summary is False else SummaryAggregator(summary.window_s, summary.first_n,
                                                                 summary.max_sources)
    if validate_only:
        return None
    return AuditLog(sinks, section.spill.dir, spill_max_bytes=section.spill.max_bytes, aggregator=aggregator,
                    registry=registry, slow_send_s=section.slow_send_s, instance=section.instance)
