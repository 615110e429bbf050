"""The checks ``prefixgate config check`` runs besides :func:`gateway.config.load_config` (session 14,
review RV2-7): the build-time refusals of ``serve`` (:func:`gateway.build.build`) that need no secret and
no network, so that a file the command calls valid does not make ``serve`` exit 1 for them.

* the salt-pool rule (:func:`gateway.salt_pools.salt_pool_error`, R10-1): a replica with
  ``cache_salt: false`` may serve only one tenant's pool;
* the policy: in ``embedded`` mode the directory ``policy.dir`` (or the shipped policy) must exist, load
  and compile with the configured built-in allow-list (``policy.allowed_builtins``), as
  :func:`gateway.pep.build_decision_point` compiles it; in ``remote`` mode ``policy.url`` must be set
  (the server is not asked).

* ``tenancy.state_file``: its directory must exist (:func:`tenancy.state_lock.missing_directory`; session 21,
  S21-newcomer-2: ``serve`` refuses to start without it, and before it started and answered every key or
  salt rotation 500).

Not checked (they need a secret, a network or a running process): the master secret and key state's contents,
Redis (``state``), trust bundles fetched over HTTPS, a remote policy server, the tokenizer files,
and the stored versions of ``policy.versions_dir``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.salt_pools import salt_pool_error
from tenancy.state_lock import missing_directory

if TYPE_CHECKING:
    from gateway.config import GatewayConfig
    from tenancy.registry import TenantRegistry

__all__ = ["build_time_errors"]


def build_time_errors(cfg: GatewayConfig, registry: TenantRegistry) -> list[str]:
    """The errors ``serve`` would refuse ``cfg`` for at build time, of those needing no secret or network
    (module doc), as operator-facing lines (``configuration: ...`` / ``policy: ...``); empty when none.
    ``registry``: the tenant registry built from ``cfg.tenancy``. Reads the policy directory's files;
    never raises for a bad policy (its error is a line)."""
    out: list[str] = []
    error = salt_pool_error(cfg.replicas, registry.tenants())
    if error is not None:
        out.append(f"configuration: {error}")
    error = policy_error(cfg)
    if error is not None:
        out.append(f"policy: {error}")
    if cfg.tenancy.state_file and (error := missing_directory(cfg.tenancy.state_file)) is not None:
        out.append(f"tenancy.state_file: {error}")
    return out


def policy_error(cfg: GatewayConfig) -> str | None:
    """Why ``cfg.policy`` would not load at start (module doc), or None. The embedded engine is built
    without worker threads and closed at once."""
    pc = cfg.policy
    if pc.mode != "embedded":
        return None if pc.url else "policy.url is required in remote mode"
    from policy.builtin_allowlist import allowed_builtins
    from policy.embedded import EmbeddedOpa

    try:
        engine = EmbeddedOpa(pc.resolved_dir(), offload=False, timeout_s=pc.timeout_s,
                             allowed_builtins=allowed_builtins(pc.allowed_builtins))
    except Exception as exc:  # PolicyCompileError, OSError (a missing directory), ValueError
        return f"{pc.resolved_dir()}: {exc}"
    engine.close()
    return None
