"""Gateway configuration: one YAML file plus environment overrides.

The file is validated with pydantic; every section and field is documented in
``docs/configuration.md``. Environment variables override file values:
``PREFIXGATE__<SECTION>__<FIELD>=value`` (double underscore between levels,
case-insensitive; complex values as JSON), e.g.
``PREFIXGATE__LISTEN__PORT=9000`` or ``PREFIXGATE__ROUTING__POLICY=round_robin``.

Secrets never live in this file: the master secret is read from
``tenancy.master_secret_file`` or the environment variable named by
``tenancy.master_secret_env``; the audit signing key from its own file.

This module assembles the sections (:class:`GatewayConfig`) and loads the
file; each section is defined in a ``gateway/config_*.py`` module by topic
and re-exported here, so ``from gateway.config import <Section>`` keeps working.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from audit.config_errors import pydantic_problem
from audit.config_schema import AuditSection
from gateway.config_base import ConfigError, ConfigSection
from gateway.config_http import LimitsConfig, ListenConfig, ServerConfig, UpstreamConfig
from gateway.config_identity import IdentityConfig, TrustDomainConfig  # noqa: F401 (re-exported)
from gateway.config_metrics import MetricsConfig  # noqa: F401 (re-exported)
from gateway.config_policy import PolicyConfig
from gateway.config_routing import HealthConfig, ReplicaConfig, RoutingConfig
from gateway.config_flow import FlowConfig
from gateway.config_state import StateConfig
from gateway.config_tenancy import TenancyConfig, check_tenancy
from gateway.config_tracing import TracingConfig

__all__ = ["ENV_PREFIX", "GatewayConfig", "ConfigError", "StateConfig", "load_config", "check_tenancy",
           "unknown_env_sections"]

#: Environment overrides: ``PREFIXGATE__<SECTION>__<FIELD>`` (case-insensitive).
ENV_PREFIX = "PREFIXGATE__"


#: base of the sections (a section added here subclasses it, as before the split)
_Section = ConfigSection


class GatewayConfig(BaseSettings):
    """The whole gateway configuration (see docs/configuration.md)."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="forbid", case_sensitive=False
    )

    listen: ListenConfig = Field(default_factory=ListenConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    admin: ListenConfig | None = Field(default_factory=lambda: ListenConfig(port=8081))
    models: list[str] = Field(default_factory=lambda: ["sim-model"])
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    upstream: UpstreamConfig = Field(default_factory=UpstreamConfig)
    routing: RoutingConfig = Field(default_factory=RoutingConfig)
    replicas: list[ReplicaConfig] = Field(default_factory=list)
    health: HealthConfig = Field(default_factory=HealthConfig)
    tenancy: TenancyConfig = Field(default_factory=TenancyConfig)
    identity: IdentityConfig = Field(default_factory=IdentityConfig)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    audit: AuditSection = Field(default_factory=AuditSection)
    tracing: TracingConfig = Field(default_factory=TracingConfig)
    state: StateConfig = Field(default_factory=StateConfig)
    flow: FlowConfig = Field(default_factory=FlowConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Environment overrides the file (passed as init kwargs).
        return (env_settings, init_settings)

    @model_validator(mode="after")
    def _check(self) -> "GatewayConfig":
        ids = [r.id for r in self.replicas]
        if len(ids) != len(set(ids)):
            raise ValueError("replicas: replica ids must be unique")
        return self


def load_config(path: str | Path | None, overrides: dict[str, Any] | None = None) -> GatewayConfig:
    """Load and validate the YAML file at ``path`` (``None``: defaults only).

    ``overrides`` (a nested dict) is merged over the file before the
    environment is applied. Raises :class:`ConfigError` with every validation
    problem listed by its dotted location, and for an environment override whose
    section is not a top-level key (:func:`unknown_env_sections`).
    """
    data: dict[str, Any] = {}
    if path is not None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} must hold a mapping at the top level")
        data = loaded
    if overrides:
        data = _merge(data, overrides)
    if unknown := unknown_env_sections(os.environ):
        raise ConfigError("invalid configuration: " + "; ".join(unknown))
    try:
        cfg = GatewayConfig(**data)
    except ValidationError as exc:
        problems = "; ".join(pydantic_problem(err, data) for err in exc.errors())
        raise ConfigError(f"invalid configuration: {problems}") from None
    check_tenancy(cfg.tenancy)
    return cfg


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def unknown_env_sections(environ: Mapping[str, str]) -> list[str]:
    """One operator-facing line per variable of ``environ`` that starts with :data:`ENV_PREFIX`
    (case-insensitive) but whose first segment is not a top-level key of :class:`GatewayConfig`
    (``PREFIXGATE__LIMTS__MAX_BODY_BYTES``): pydantic-settings reads only known top-level keys, so such
    a variable was ignored silently, ``config check`` included, while a misspelt field inside a known
    section is an error (session 21, S21-newcomer-4). Empty when there is none; never raises."""
    known = sorted(GatewayConfig.model_fields)
    out = []
    for name in sorted(environ):
        if name.upper().startswith(ENV_PREFIX):
            section = name[len(ENV_PREFIX):].split("__", 1)[0].lower()
            if section not in GatewayConfig.model_fields:
                out.append(f"environment variable {name}: unknown section {section!r} "
                           f"(known: {', '.join(known)})")
    return out
