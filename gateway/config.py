"""Gateway configuration: one YAML file plus environment overrides.

The file is validated with pydantic; every section and field is documented in
``docs/configuration.md``. Environment variables override file values:
``PREFIXGATE__<SECTION>__<FIELD>=value`` (double underscore between levels,
case-insensitive; complex values as JSON), e.g.
``PREFIXGATE__LISTEN__PORT=9000`` or ``PREFIXGATE__ROUTING__POLICY=round_robin``.

Secrets never live in this file: the master secret is read from
``tenancy.master_secret_file`` or the environment variable named by
``tenancy.master_secret_env``; the audit signing key from its own file.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from gateway.flow_config import FlowConfig
from routing.config import PolicyConfig as RoutingPolicyConfig
from routing.policies import CacheAwareConfig

__all__ = ["GatewayConfig", "ConfigError", "StateConfig", "load_config", "check_tenancy"]


class ConfigError(ValueError):
    """Raised when the configuration file is missing, unparsable or invalid."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ListenConfig(_Section):
    """Address of a listener (``port`` 0 picks a free port)."""

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)


class ServerConfig(_Section):
    """The HTTP server of both listeners (uvicorn).

    ``http_parser``: ``httptools`` (default; C, llhttp) or ``h11`` (pure
    Python, slower). Both enforce the same framing rules (gateway/framing.py,
    tests/hostile/test_i10_http_framing.py); they differ only in how some
    malformed requests are refused (httptools answers its own 400 and closes).
    """

    http_parser: Literal["httptools", "h11"] = "httptools"


class LimitsConfig(_Section):
    """Request-size and timing limits of the public listener.

    ``max_body_bytes``: request bodies larger than this answer 413 before they
    are read in full (the rest is then drained, up to max(4 x this, 8 MiB),
    so the client can read the 413: gateway/framing.py). ``body_read_timeout_s``:
    a client that trickles its body longer than this answers 408; it also
    bounds that drain. ``max_json_depth``: deeper JSON answers 400.
    ``max_messages``: gateway-wide ceiling of chat messages per request (a
    tenant's own bound, derived or set, is never above it); counted on the
    parsed JSON before schema validation (400 ``too_many_messages``).
    ``max_json_items``: ceiling of JSON values per body (bounded from above
    by counting ``{``, ``[`` and ``,`` bytes before decoding; 400
    ``too_many_json_items``): decoding, validating and rendering cost grows
    with the number of values, not the bytes.

    Connection-level bounds, enforced on BOTH listeners under both HTTP
    parsers before any route or authentication (gateway/http_guard.py):
    ``max_header_bytes``: the most bytes of one request head (request line,
    header fields, blank line); larger answers 431 and closes.
    ``header_read_timeout_s``: a request head must be complete this long
    after the connection opened (or after the first byte of a later request
    on a keep-alive connection); otherwise 408 and close.
    ``max_connections``: per listener, open connections plus running
    requests beyond which a new request answers 503 (uvicorn's
    ``limit_concurrency``).
    """

    max_body_bytes: int = Field(1 << 20, ge=1024)
    body_read_timeout_s: float = Field(10.0, gt=0)
    max_json_depth: int = Field(32, ge=4, le=256)
    max_output_tokens: int = Field(32768, ge=1)
    max_messages: int = Field(2048, ge=1)
    max_json_items: int = Field(65536, ge=64)
    max_header_bytes: int = Field(16 * 1024, ge=1024, le=1 << 20)
    header_read_timeout_s: float = Field(10.0, gt=0)
    max_connections: int = Field(2048, ge=1)


class UpstreamConfig(_Section):
    """Timeouts and retries of calls to replicas (seconds).

    A request is retried on another allowed replica only before the first
    byte reached the client, at most ``max_attempts`` replicas that received
    it (a refused connection never reached a replica and does not count;
    each replica is tried at most once) and within ``total_timeout_s`` overall.
    """

    connect_timeout_s: float = Field(2.0, gt=0)
    first_byte_timeout_s: float = Field(60.0, gt=0)
    read_timeout_s: float = Field(60.0, gt=0)
    total_timeout_s: float = Field(600.0, gt=0)
    max_attempts: int = Field(2, ge=1, le=5)
    pool_size: int = Field(512, ge=1)


class RoutingConfig(_Section):
    """Routing policy and the prefix index.

    ``policy``: the policy and its parameters, a discriminated union on
    ``name`` (``round_robin``, ``least_load``, ``consistent_hash``,
    ``cache_aware``; a bare name is short for ``{name: ...}``; see
    ``routing.config`` and docs/routing.md); ``block_size`` in tokens (must
    match the replicas' KV block size); ``index_capacity_blocks``: blocks
    remembered per replica (mirror the replica's KV capacity);
    ``max_prefix_blocks``: hashing bound per request. ``params`` (the old
    place of the policy parameters) is rejected with a pointer to
    ``policy``.
    """

    policy: RoutingPolicyConfig = Field(default_factory=CacheAwareConfig)
    block_size: int = Field(16, ge=1, le=1024)
    index_capacity_blocks: int = Field(4000, ge=1)
    max_prefix_blocks: int = Field(8192, ge=1)
    tokenizer: str = "word"
    params: Any = Field(None, exclude=True)

    @field_validator("params")
    @classmethod
    def _params_moved(cls, v: Any) -> None:
        if v is not None:
            raise ValueError("moved: give the policy parameters under routing.policy "
                             "(routing.policy.name: <policy>, then its parameters)")
        return None


class ReplicaConfig(_Section):
    """One upstream replica. ``cache_salt: false`` for engines that reject the
    field (e.g. TensorRT-LLM); such replicas may serve one tenant's pools only."""

    id: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")
    url: str
    pool: str = "default"
    labels: dict[str, str] = Field(default_factory=dict)
    cache_salt: bool = True

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not (v.startswith("http://") or v.startswith("https://")):
            raise ValueError("replica url must start with http:// or https://")
        return v.rstrip("/")


class HealthConfig(_Section):
    """Active health checks of replicas (GET /health)."""

    interval_s: float = Field(2.0, gt=0)
    timeout_s: float = Field(1.0, gt=0)
    unhealthy_after: int = Field(2, ge=1)
    healthy_after: int = Field(1, ge=1)
    breaker_failures: int = Field(3, ge=1)
    breaker_cooldown_s: float = Field(5.0, gt=0)


class TenancyConfig(_Section):
    """Tenants and their key material source (never the secret itself).

    ``forward_user``: what replicas get as the OpenAI ``user`` field:
    ``drop`` (default: nothing; the client's value never reaches a replica)
    or ``pseudonym`` (a stable HMAC pseudonym of the authenticated workload,
    see :func:`tenancy.keys.user_pseudonym`); a tenant's own
    ``forward_user`` overrides it.
    """

    forward_user: Literal["drop", "pseudonym"] = "drop"
    master_secret_file: str | None = None
    master_secret_env: str | None = "PREFIXGATE_MASTER_SECRET"
    state_file: str | None = None
    key_grace_s: float = Field(3600.0, ge=0)
    tenants: list[dict[str, Any]] = Field(default_factory=list)
    operators: list[str] = Field(default_factory=list)
    #: weight of each tier in the gateway's fair release (tenancy/tiers.py; unlisted: 1)
    tier_weights: dict[str, float] = Field(default_factory=dict)

    @field_validator("tier_weights")
    @classmethod
    def _weights(cls, v: dict[str, float]) -> dict[str, float]:
        from tenancy.tiers import TierWeights

        TierWeights(v)
        return v


class TrustDomainConfig(_Section):
    """Where a trust domain's bundle (JWKS) comes from: a file or an HTTPS URL."""

    bundle_file: str | None = None
    bundle_url: str | None = None
    refresh_s: float = Field(300.0, gt=0)
    max_stale_s: float = Field(3600.0, gt=0)

    @model_validator(mode="after")
    def _one_source(self) -> "TrustDomainConfig":
        if bool(self.bundle_file) == bool(self.bundle_url):
            raise ValueError("give exactly one of bundle_file or bundle_url")
        return self


class IdentityConfig(_Section):
    """JWT-SVID authentication (SPIFFE JWT-SVID spec).

    Every request on both listeners needs a JWT-SVID whose ``aud`` holds the
    listener's audience. ``audience`` and ``admin_audience`` must be
    non-empty, without surrounding whitespace, and different from each other
    (else a public token would open the admin listener). ``trusted_proxies``
    (CIDRs) enables two things only: the binding check of a forwarded client
    certificate against the JWT-SVID, and reading the client address the
    proxy attests in ``X-Forwarded-For`` as the request's source; there is
    deliberately no setting under which a forwarded certificate alone
    authenticates, and any unknown key (e.g. an "xfcc only" mode) is refused
    (``extra="forbid"``). ``unauthenticated_rps``/``unauthenticated_burst``:
    per-source bucket of failed signature checks (a source that spent it gets
    429 instead of a signature check; cheap refusals and cached tokens never
    touch it). ``verified_token_cache_size``/``verified_token_cache_max_ttl_s``:
    bounds of each listener's verified-token cache (docs/identity.md).
    """

    audience: str = "prefixgate"
    admin_audience: str = "prefixgate-admin"
    trust_domains: dict[str, TrustDomainConfig] = Field(default_factory=dict)
    leeway_s: float = Field(30.0, ge=0, le=300)
    max_lifetime_s: float = Field(3600.0, gt=0)
    trusted_proxies: list[str] = Field(default_factory=list)
    #: per-source budget of FAILED SIGNATURE CHECKS (per listener): rate /s, burst
    unauthenticated_rps: float = Field(1000.0, gt=0)
    unauthenticated_burst: int = Field(2000, ge=1)
    #: verified-token cache per listener and audience: entries (0: off), lifetime cap (s)
    verified_token_cache_size: int = Field(10_000, ge=0)
    verified_token_cache_max_ttl_s: float = Field(300.0, gt=0)

    @field_validator("audience", "admin_audience")
    @classmethod
    def _audience(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must be a non-empty audience (an empty or blank one would match no token)")
        if v != v.strip() or any(ord(c) < 0x20 or ord(c) == 0x7F for c in v):
            raise ValueError("must not start or end with whitespace nor hold control characters")
        return v

    @field_validator("trusted_proxies")
    @classmethod
    def _proxies(cls, v: list[str]) -> list[str]:
        for p in v:
            try:
                ipaddress.ip_network(p, strict=False)
            except ValueError:
                raise ValueError(f"{p!r} is not an IP network (CIDR)") from None
        return v

    @model_validator(mode="after")
    def _distinct_audiences(self) -> "IdentityConfig":
        if self.audience == self.admin_audience:
            raise ValueError("audience and admin_audience must differ "
                             "(a public token must not open the admin listener)")
        return self


class PolicyConfig(_Section):
    """Policy decision point: embedded OPA (default) or a remote OPA.

    ``timeout_s`` is one overall deadline per decision (seconds); past it the
    request fails closed with 503. The default (0.2 s) leaves room for CPU
    contention on small machines; a dedicated deployment can use ~0.05 s.
    ``offload``: evaluate embedded decisions in a worker thread, so a
    runaway evaluation is abandoned at the deadline instead of holding the
    event loop; off by default because the thread hop costs more than a
    typical decision (docs/policy.md, "Latency"); a late inline result is
    still discarded and answered 503.
    ``allowed_builtins``: built-ins (dotted names, e.g. ``time.now_ns``)
    that policy modules may call in addition to the default pure list
    (``policy.builtins.DEFAULT_ALLOWED_BUILTINS``; docs/policy.md).
    ``health_interval_s``: remote mode, how long a PDP health result is
    reused by ``/readyz`` (seconds).
    ``dir``: the embedded engine's policy directory; unset (the default) is
    the policy installed with the package (:func:`rego.policy_dir`), never a
    path relative to the working directory. ``versions_dir`` (operator
    policy management writes the active set into ``dir``) needs an explicit
    ``dir``: the installed copy is never written to.
    """

    mode: Literal["embedded", "remote"] = "embedded"
    dir: str | None = None
    versions_dir: str | None = None
    url: str | None = None
    token_env: str | None = None
    ca_file: str | None = None
    timeout_s: float = Field(0.2, gt=0)
    offload: bool = False
    cache_ttl_s: float = Field(1.0, ge=0)
    cache_max_entries: int = Field(10000, ge=0)
    allowed_builtins: list[str] = Field(default_factory=list)
    health_interval_s: float = Field(1.0, gt=0, le=60)

    @model_validator(mode="after")
    def _store_needs_dir(self) -> "PolicyConfig":
        if self.versions_dir and not self.dir:
            raise ValueError("versions_dir needs an explicit dir (policy management writes the active "
                             "set there; the installed policy is never modified): copy the shipped "
                             "policy, e.g. `prefixgate policy export DIR`, and set dir")
        return self

    def resolved_dir(self) -> str:
        """``dir``, or the installed shipped policy's directory when unset."""
        if self.dir:
            return self.dir
        from rego import policy_dir

        return str(policy_dir())

    @field_validator("allowed_builtins")
    @classmethod
    def _check_builtins(cls, value: list[str]) -> list[str]:
        from policy.builtins import check_builtin_name

        return [check_builtin_name(n) for n in value]


class TracingConfig(_Section):
    """OpenTelemetry tracing exporter."""

    exporter: Literal["none", "console", "otlp", "memory"] = "none"
    otlp_endpoint: str | None = None
    #: Encode and export spans in a child process (``audit.span_exporter_proc``)
    #: instead of a thread of the gateway process (otlp and console only).
    offload: bool = True
    #: Fraction of requests traced (0..1; audit events are never sampled).
    sample_ratio: float = Field(1.0, ge=0.0, le=1.0)


class StateConfig(_Section):
    """Where state shared between gateway processes and instances lives (issue 16).

    ``backend``: ``memory`` (default: one process, no Redis) or ``redis``
    (``url`` required: ``redis://`` or ``rediss://`` (TLS) or
    ``unix://``; a password in the URL is refused, it comes from
    ``password_file`` (mode 0600) or the variable named by ``password_env``,
    at most one of them; ``username``: the Redis ACL user; ``tls_ca_file``:
    CA bundle that verifies the server, needs ``rediss://``).
    ``key_prefix``: prefix of every Redis key (the ACL user is restricted to
    it). ``lease_ttl_s``: lifetime of a concurrency slot or published load
    that is not renewed (0 < ttl <= 10 s), so a crashed instance leaves no
    phantom slots beyond it.
    """

    backend: Literal["memory", "redis"] = "memory"
    url: str | None = None
    username: str | None = Field(None, min_length=1, max_length=128)
    password_file: str | None = None
    password_env: str | None = Field(None, min_length=1)
    tls_ca_file: str | None = None
    key_prefix: str = Field("prefixgate:", pattern=r"^[A-Za-z0-9_.:{}-]{1,64}$")
    lease_ttl_s: float = Field(10.0, gt=0, le=10)

    @field_validator("url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is None:
            return v
        from urllib.parse import urlsplit

        parts = urlsplit(v)
        if parts.scheme not in ("redis", "rediss", "unix"):
            raise ValueError("state url must start with redis://, rediss:// or unix://")
        if parts.password is not None:
            raise ValueError("state url must not contain a password (use state.password_file or state.password_env)")
        if parts.scheme != "unix" and not parts.hostname:
            raise ValueError("state url needs a host")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "StateConfig":
        if self.backend == "redis" and not self.url:
            raise ValueError("state.url is required when state.backend is redis")
        if self.password_file and self.password_env:
            raise ValueError("set at most one of state.password_file and state.password_env")
        if self.tls_ca_file and not (self.url or "").startswith("rediss://"):
            raise ValueError("state.tls_ca_file needs a rediss:// url")
        return self


class GatewayConfig(BaseSettings):
    """The whole gateway configuration (see docs/configuration.md)."""

    model_config = SettingsConfigDict(
        env_prefix="PREFIXGATE__", env_nested_delimiter="__", extra="forbid", case_sensitive=False
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
    audit: dict[str, Any] = Field(default_factory=dict)
    tracing: TracingConfig = Field(default_factory=TracingConfig)
    state: StateConfig = Field(default_factory=StateConfig)
    flow: FlowConfig = Field(default_factory=FlowConfig)

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
    problem listed by its dotted location.
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
    try:
        cfg = GatewayConfig(**data)
    except ValidationError as exc:
        problems = "; ".join(_problem(err, data) for err in exc.errors())
        raise ConfigError(f"invalid configuration: {problems}") from None
    check_tenancy(cfg.tenancy)
    return cfg


def check_tenancy(tenancy: TenancyConfig) -> None:
    """Validate ``tenancy.tenants`` and ``tenancy.operators`` with the registry's own rules.

    Raises :class:`ConfigError` in the form of every configuration error,
    ``invalid configuration: tenancy.tenants.0.max_output_token: unknown field``.
    """
    from tenancy.registry import TenantConfigError, TenantRegistry

    try:
        TenantRegistry.from_config(tenancy.tenants, operators=tenancy.operators)
    except TenantConfigError as exc:
        raise ConfigError(f"invalid configuration: tenancy.{exc}") from None


def _problem(err: Any, data: Any) -> str:
    """One pydantic error as ``dotted.key: message`` (no ``Value error,`` prefix; a rule over
    the whole file, with no key of its own, is just its message)."""
    msg = str(err["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
    path = ".".join(str(p) for p in _key_path(err["loc"], data))
    return f"{path}: {msg}" if path else msg


def _key_path(loc: tuple[Any, ...], data: Any) -> list[Any]:
    """The error location as the user's keys: a part pydantic adds that is no
    key of the input (the tag of a discriminated union, e.g. ``cache_aware``
    in ``routing.policy.cache_aware.prefix_weight``) is left out when the
    next part is a key there. Parts of values set from the environment (not
    in ``data``) are kept as they are."""
    out: list[Any] = []
    node = data
    i = 0
    while i < len(loc):
        part = loc[i]
        if isinstance(node, dict):
            if part not in node and i + 1 < len(loc) and loc[i + 1] in node:
                i += 1  # a tag: skip it
                continue
            node = node.get(part)
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        else:
            node = None
        out.append(part)
        i += 1
    return out


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out
