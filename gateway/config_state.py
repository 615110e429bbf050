"""The state section of the configuration: where state shared between gateway processes and instances lives."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from gateway.config_base import ConfigSection


class StateConfig(ConfigSection):
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
    phantom slots beyond it (and a crashed instance's published routing
    load leaves every view within it). ``sync_poll_s``: how often key,
    policy and registry records are re-read besides the Pub/Sub message
    (0 < s <= 1). ``stream_max_entries``: length the routing event stream
    is trimmed to (approximately; one entry is a batch of events), at most
    ``stream_max_bytes // stream_entry_max_bytes`` (R13-1: the stream is
    bounded by what it costs, in bytes). ``stream_entry_max_bytes``: the
    largest body of one stream entry (a bigger batch or chain is split;
    one ``XREAD`` takes 1 MiB / this many entries). ``stream_max_bytes``:
    the routing stream's byte budget (bodies; gateway/shared_bounds.py).
    ``on_unavailable``: what admission does while
    Redis does not answer: ``fail_closed`` (503 ``state_unavailable`` with
    ``Retry-After``) or ``local`` (each process enforces every tenant's
    limits divided by ``instances_expected``, the number of gateway
    processes sharing the state, all hosts counted), with an error log line
    and the ``prefixgate_state_available`` gauge at 0; admission uses Redis
    again as soon as a probe (every ``probe_interval_s``) answers.
    ``command_timeout_s``: connect and reply timeout of one Redis command.
    """

    backend: Literal["memory", "redis"] = "memory"
    url: str | None = None
    username: str | None = Field(None, min_length=1, max_length=128)
    password_file: str | None = None
    password_env: str | None = Field(None, min_length=1)
    tls_ca_file: str | None = None
    key_prefix: str = Field("prefixgate:", pattern=r"^[A-Za-z0-9_.:{}-]{1,64}$")
    lease_ttl_s: float = Field(10.0, gt=0, le=10)
    on_unavailable: Literal["fail_closed", "local"] = "fail_closed"
    instances_expected: int = Field(1, ge=1, le=1024)
    command_timeout_s: float = Field(0.5, gt=0, le=10)
    probe_interval_s: float = Field(1.0, gt=0, le=60)
    sync_poll_s: float = Field(1.0, gt=0, le=1)
    stream_max_entries: int = Field(10_000, ge=100, le=10_000_000)
    stream_entry_max_bytes: int = Field(65_536, ge=4096, le=1 << 20)
    stream_max_bytes: int = Field(64 << 20, ge=1 << 20, le=1 << 36)

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
