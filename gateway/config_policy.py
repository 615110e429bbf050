"""The policy section of the configuration: the policy decision point (embedded or remote OPA) and its limits."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from gateway.config_base import ConfigSection

#: the policy input's top-level fields (policy.input.build_policy_input) and one dotted path under them
_INPUT_ROOTS = frozenset({"version", "identity", "tenant", "request", "candidates", "alerts", "time"})
_KEY_PATH = re.compile(r"(?:(?:candidates|alerts)\[\]\.)?[A-Za-z_][A-Za-z0-9_-]*(?:\.[A-Za-z_][A-Za-z0-9_-]*)*")


class PolicyConfig(ConfigSection):
    """Policy decision point: embedded OPA (default) or a remote OPA.

    ``timeout_s`` is one overall deadline per decision (seconds); past it the
    request fails closed with 503. The default (0.2 s) leaves room for CPU
    contention on small machines; a dedicated deployment can use ~0.05 s.
    ``push_timeout_s``: remote mode with ``versions_dir``, the total deadline
    of one policy or data push to OPA (seconds, > 0; default 30): OPA
    compiles every module on a policy PUT, often longer than a decision's
    deadline; past it the push is a lost reply (502 ``target_refused``, the
    change given back; S19-R9). Decisions keep ``timeout_s``.
    ``offload``: evaluate embedded decisions in a worker thread, so a
    runaway evaluation is abandoned at the deadline instead of holding the
    event loop; off by default because the thread hop costs more than a
    typical decision (docs/policy.md, "Latency"); a late inline result is
    still discarded and answered 503.
    ``allowed_builtins``: built-ins (dotted names, e.g. ``time.now_ns``)
    that policy modules may call in addition to the default pure list
    (``policy.builtin_allowlist.DEFAULT_ALLOWED_BUILTINS``; docs/policy.md).
    ``health_interval_s``: remote mode, how long a PDP health result is
    reused by ``/readyz`` (seconds).
    ``versions_keep``: with ``versions_dir``, how many committed versions are kept (>= 1, default 100):
    after each change (and at start) the oldest beyond it are pruned, never the version in force; a
    roll-back to a pruned one answers 404 ``version_pruned`` (session 25, S24-fixreg-3).
    ``dir``: the embedded engine's policy directory; unset (the default) is
    the policy installed with the package (:func:`rego.policy_dir`), never a
    path relative to the working directory. ``versions_dir`` (operator
    policy management writes the active set into ``dir``) needs an explicit
    ``dir``: the installed copy is never written to.
    ``cache_key_fields``: extra dotted input paths the decision cache keys on
    (``request.prompt_tokens``, ``tenant.labels.team``, ``candidates[].load``).
    Embedded mode: added to the paths read from the policy's own modules
    (R10-2, :mod:`policy.input_refs`). Remote mode, where the gateway cannot see
    the policy: the decision cache is used only when this is set (``[]``: the
    remote policy reads the shipped policy's fields only); unset, remote
    decisions are not cached (start-up WARNING).
    """

    mode: Literal["embedded", "remote"] = "embedded"
    dir: str | None = None
    versions_dir: str | None = None
    versions_keep: int = Field(100, ge=1)
    url: str | None = None
    token_env: str | None = None
    ca_file: str | None = None
    timeout_s: float = Field(0.2, gt=0)
    push_timeout_s: float = Field(30.0, gt=0)
    offload: bool = False
    cache_ttl_s: float = Field(1.0, ge=0)
    cache_max_entries: int = Field(10000, ge=0)
    cache_key_fields: list[str] | None = None
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

    @field_validator("cache_key_fields")
    @classmethod
    def _check_key_fields(cls, value: list[str] | None) -> list[str] | None:
        if value is not None:
            for path in value:
                if not _KEY_PATH.fullmatch(path) or path.split(".", 1)[0].split("[", 1)[0] not in _INPUT_ROOTS:
                    raise ValueError(f"cache_key_fields: {path!r} is not a dotted input path under one of "
                                     f"{', '.join(sorted(_INPUT_ROOTS))} (list elements: candidates[].x)")
        return value

    @field_validator("allowed_builtins")
    @classmethod
    def _check_builtins(cls, value: list[str]) -> list[str]:
        from policy.builtin_allowlist import check_builtin_name

        return [check_builtin_name(n) for n in value]
