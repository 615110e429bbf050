"""The pydantic schema of the ``audit`` configuration section (:class:`AuditSection`).

Every key of the section, its type, default and bounds live here (sizes
bytes, times seconds; documented key by key in docs/configuration.md, and a
test keeps the two equal). Unknown keys are refused at every level
(``extra="forbid"``), so a typo such as ``audit.sylog`` or
``audit.syslog.prot`` fails at config load instead of silently dropping a
sink. ``gateway.config.GatewayConfig.audit`` is typed with it (errors read
``invalid configuration: audit.syslog.prot: Extra inputs are not
permitted``); :func:`parse_audit` validates a plain mapping the same way for
callers of :func:`audit.config.build_audit` (the audit worker child, tests,
benches) and raises :class:`AuditConfigError` reading ``audit.<dotted.key>:
<message>``.

Rules that need more than one key's value or the filesystem (at least one
sink, ``spill.dir`` required, the signing key outside ``jsonl.dir``,
``otlp.ca_file`` only with https) are :func:`audit.config.build_audit`'s, as
before. An ``ocsf`` block without ``file`` and an ``otlp`` block without
``endpoint`` (or with an empty one) configure no sink, as before.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, Union, get_args

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, field_validator

from audit.config_errors import pydantic_problem

__all__ = ["AuditConfigError", "AuditSection", "parse_audit", "section_keys"]

#: shortest syslog message cap accepted (``audit.syslog.MIN_MESSAGE_BYTES``, checked again by the sink)
MIN_SYSLOG_MESSAGE_BYTES = 480

_Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]
_Bytes = Annotated[int, Field(gt=0)]
_Ratio = Annotated[float, Field(ge=0, le=1)]


class AuditConfigError(ValueError):
    """The audit config section is invalid (message: ``audit.<dotted.key>: <meaning>`` or a rule's own)."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class JsonlSection(_Section):
    """``audit.jsonl``: the hash-chained JSONL log with signed checkpoints (audit/jsonl.py)."""

    dir: str
    signing_key_file: str
    rotate_bytes: _Bytes = 64 << 20
    rotate_s: _Seconds = 3600.0
    checkpoint_s: _Seconds = 60.0


class OcsfSection(_Section):
    """``audit.ocsf``: OCSF JSON lines to a local file (no ``file``: no sink)."""

    file: str | None = None


class SyslogSection(_Section):
    """``audit.syslog``: RFC 5424 messages (CEF or OCSF payload) over tcp, tls or udp."""

    host: str
    port: Annotated[int, Field(ge=1, le=65535)]
    protocol: Literal["tcp", "tls", "udp"] = "tcp"
    format: Literal["cef", "ocsf"] = "cef"
    #: trust bundle for ``protocol: tls`` (the system store when unset)
    ca_file: str | None = None
    max_message_bytes: Annotated[int, Field(ge=MIN_SYSLOG_MESSAGE_BYTES)] | None = None


class OtlpSection(_Section):
    """``audit.otlp``: OTLP/HTTP logs to a collector (no or empty ``endpoint``: no sink).

    ``headers`` are extra request headers (collector auth; never logged); numbers are sent as text.
    """

    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True)

    endpoint: str | None = None
    headers: dict[str, str] | None = None
    timeout_s: _Seconds = 5.0
    compression: Literal["gzip"] | None = None
    ca_file: str | None = None


class SpillSection(_Section):
    """``audit.spill``: the per-sink spill files for events a sink has not taken yet."""

    dir: str
    max_bytes: _Bytes = 256 << 20


class SummarySection(_Section):
    """``audit.summary``: flood aggregation of unauthenticated / rejected / denied / rate-limited events."""

    window_s: _Seconds = 10.0
    first_n: Annotated[int, Field(ge=0)] = 5
    max_sources: Annotated[int, Field(ge=1)] = 10_000


class ConcentrationSection(_Section):
    """``audit.concentration``: :class:`audit.concentration.ConcentrationMonitor` arguments
    (the gateway adds the router's load-guard factor); unset keys take the monitor's defaults."""

    window_s: _Seconds = 60.0
    share_threshold: Annotated[float, Field(gt=0, le=1)] | None = None
    index_threshold: _Ratio = 0.5
    hold_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 30.0
    clear_ratio: Annotated[float, Field(gt=0, lt=1)] = 0.8
    hit_drop_ratio: _Ratio = 0.5
    min_requests: Annotated[int, Field(ge=0)] = 20
    baseline_windows: Annotated[int, Field(ge=1)] = 10
    pools: dict[str, list[str]] | None = None
    significance_z: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 3.0
    attribution_cover_ratio: Annotated[float, Field(gt=0, le=1)] = 0.8
    attribution_max_tenants: Annotated[int, Field(ge=0)] = 3
    eval_interval_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.05


def _summary_tag(value: Any) -> str | None:
    if value is False:
        return "off"
    return "on" if isinstance(value, (Mapping, SummarySection)) else None


_Summary = Annotated[
    Union[Annotated[SummarySection, Tag("on")], Annotated[Literal[False], Tag("off")]],
    Discriminator(_summary_tag, custom_error_type="audit_summary", custom_error_message="must be a mapping or false"),
]


class AuditSection(_Section):
    """The whole ``audit`` section (docs/configuration.md, docs/audit.md).

    A sink is configured by its block (``jsonl``, ``ocsf``, ``syslog``, ``otlp``; None: off);
    ``summary: false`` turns flood aggregation off (null or unset: on with the defaults);
    ``worker``: ``process`` (sinks in the ``python -m audit.worker`` child) or ``inline``;
    ``instance``: 1-128 characters stamped on every event; ``slow_send_s``: seconds after which
    a sink send of in-memory events moves them to the sink's spill.
    """

    worker: Literal["process", "inline"] = "process"
    jsonl: JsonlSection | None = None
    ocsf: OcsfSection | None = None
    syslog: SyslogSection | None = None
    otlp: OtlpSection | None = None
    spill: SpillSection | None = None
    summary: _Summary = Field(default_factory=SummarySection)
    instance: Annotated[str, Field(min_length=1, max_length=128)] | None = None
    slow_send_s: _Seconds = 1.0
    concentration: ConcentrationSection | None = None

    @field_validator("summary", mode="before")
    @classmethod
    def _null_summary_is_on(cls, value: Any) -> Any:
        return {} if value is None else value

    def worker_section(self) -> dict[str, Any]:
        """The keys the sinks need (all but ``worker`` and ``concentration``), as set in the
        file or the environment (unset keys left out, so defaults stay the code's): the plain,
        JSON-ready mapping :class:`audit.remote.RemoteAuditLog` sends to the worker child."""
        return self.model_dump(exclude_unset=True, exclude={"worker", "concentration"})

    def concentration_kwargs(self) -> dict[str, Any]:
        """The ``concentration`` keys that were set, as monitor keyword arguments (``{}``: none)."""
        return {} if self.concentration is None else self.concentration.model_dump(exclude_unset=True)


def parse_audit(config: Mapping[str, Any] | AuditSection) -> AuditSection:
    """``config`` validated as an :class:`AuditSection` (a model is returned as it is).

    Raises:
        AuditConfigError: every problem as ``audit.<dotted.key>: <message>``, ``; ``-joined.
    """
    if isinstance(config, AuditSection):
        return config
    try:
        return AuditSection.model_validate(config)
    except ValidationError as exc:
        problems = (pydantic_problem(err, config, prefix="audit") for err in exc.errors())
        raise AuditConfigError("; ".join(problems)) from None


def section_keys(model: type[BaseModel], prefix: str = "") -> set[str]:
    """Every dotted key of ``model``: each field, and each field of a nested section model
    (``{"jsonl", "jsonl.dir", ..., "summary", "summary.window_s", ...}``)."""
    keys: set[str] = set()
    for name, field in model.model_fields.items():
        dotted = f"{prefix}{name}"
        keys.add(dotted)
        for sub in _models_in(field.annotation):
            keys |= section_keys(sub, f"{dotted}.")
    return keys


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]
