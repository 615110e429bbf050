"""Small persistent state of the key ring: key versions, salt epochs, the master generation, and the
highest shared tenant-registry version seen (issue 16).

Only *numbers* are stored, never a key or a secret. The file survives
restarts so that a rotated tenant key (or salt) is not silently rolled back.
Layout (JSON)::

    {"format": 1, "master_generation": 2, "registry_version": 3,
     "tenants": {"<tenant id>": {"key_version": 2, "salt_epoch": 0}}}

``master_generation`` (>= 1; absent in older files: 1) is the highest master
generation this instance has used or adopted (issue 16: it never goes back).
``registry_version`` (>= 0; absent in older files: 0) is the highest version of the
shared tenants document (``docs:tenants``, gateway/shared_docs.py) this instance
has adopted, published or refused as invalid: a (re)started instance refuses an
authentic but lower record replayed into Redis (S20-R1; an older build reading
the file ignores the field, and its next write drops it).

Writes are atomic and durable (:func:`audit.atomic_file.write_atomic`: a temporary file in the same
directory, ``fsync``, ``os.replace``, ``fsync`` of the directory), mode 0600.

Every number only moves forward (:func:`forward`, :func:`merge_forward`): the one
rule of the key ring (:meth:`tenancy.keys.KeyRing.adopt`, its writes of this file,
which merge with what they find there, R11-1) and of the shared state
(tenancy/shared_keys.py adopts through ``KeyRing.adopt``; its Lua script applies
the same rule inside Redis).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from audit.atomic_file import write_atomic

__all__ = ["StateError", "TenantState", "KeyState", "bumped", "forward", "load_state", "merge_forward",
           "registry_seen", "save_state", "UNROTATED"]

_FORMAT = 1


class StateError(Exception):
    """The state file cannot be read, parsed or written."""


@dataclass
class TenantState:
    """Per-tenant counters: prefix-key version (>= 1) and salt epoch (>= 0)."""

    key_version: int = 1
    salt_epoch: int = 0


@dataclass
class KeyState:
    """All persisted key-ring counters: by tenant id, the master generation (>= 1) and the highest
    shared tenant-registry version seen (>= 0)."""

    tenants: dict[str, TenantState] = field(default_factory=dict)
    master_generation: int = 1
    registry_version: int = 0

    def to_json(self) -> dict:
        """Return the JSON-able document of this state."""
        return {
            "format": _FORMAT,
            "master_generation": self.master_generation,
            "registry_version": self.registry_version,
            "tenants": {
                tid: {"key_version": ts.key_version, "salt_epoch": ts.salt_epoch}
                for tid, ts in sorted(self.tenants.items())
            },
        }


def forward(a: TenantState, b: TenantState) -> TenantState:
    """Field-by-field maximum of two tenant states: a key version or salt epoch never goes back."""
    return TenantState(max(a.key_version, b.key_version), max(a.salt_epoch, b.salt_epoch))


def merge_forward(a: KeyState, b: KeyState) -> KeyState:
    """Union of the tenants of ``a`` and ``b``, each :func:`forward` of both; the higher master generation
    and the higher registry version."""
    tenants = dict(a.tenants)
    for tid, ts in b.tenants.items():
        tenants[tid] = forward(tenants[tid], ts) if tid in tenants else ts
    return KeyState(tenants=tenants, master_generation=max(a.master_generation, b.master_generation),
                    registry_version=max(a.registry_version, b.registry_version))


#: the state of a tenant never rotated; shared, never changed (every change commits a new TenantState)
UNROTATED = TenantState()


def bumped(tenant_id: str, *, key: int = 0, salt: int = 0,
           seen: TenantState = UNROTATED) -> Callable[[KeyState], KeyState]:
    """The change (for :meth:`tenancy.state_lock.StateFile.write`): the tenant's merged numbers moved
    :func:`forward` to ``seen``, then ``key`` / ``salt`` added (a rotation)."""
    def change(base: KeyState) -> KeyState:
        ts = forward(base.tenants.get(tenant_id, UNROTATED), seen)
        return replace(base, tenants={**base.tenants, tenant_id: TenantState(ts.key_version + key, ts.salt_epoch + salt)})
    return change


def registry_seen(version: int) -> Callable[[KeyState], KeyState]:
    """The change: the registry version raised to ``version`` (never lowered: the maximum of both)."""
    return lambda base: replace(base, registry_version=max(base.registry_version, version))


def _int_field(doc: dict, name: str, minimum: int, where: str) -> int:
    value = doc.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise StateError(f"state file: {where}.{name} must be an integer >= {minimum}")
    return value


def load_state(path: str) -> KeyState:
    """Read the state file at ``path``; a missing file gives an empty state.

    Raises :class:`StateError` if the file is unreadable, not JSON, or has an
    unexpected shape (the key ring fails closed rather than guessing).
    """
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except FileNotFoundError:
        return KeyState()
    except (OSError, ValueError) as exc:
        raise StateError(f"state file {path!r} unreadable: {exc.__class__.__name__}") from exc
    if not isinstance(doc, dict) or doc.get("format") != _FORMAT:
        raise StateError(f"state file {path!r}: unsupported format")
    raw = doc.get("tenants", {})
    if not isinstance(raw, dict):
        raise StateError(f"state file {path!r}: 'tenants' must be an object")
    tenants: dict[str, TenantState] = {}
    for tid, entry in raw.items():
        if not isinstance(entry, dict):
            raise StateError(f"state file: tenants.{tid} must be an object")
        tenants[tid] = TenantState(
            key_version=_int_field(entry, "key_version", 1, f"tenants.{tid}"),
            salt_epoch=_int_field(entry, "salt_epoch", 0, f"tenants.{tid}"),
        )
    generation = _int_field(doc, "master_generation", 1, "state") if "master_generation" in doc else 1
    registry = _int_field(doc, "registry_version", 0, "state") if "registry_version" in doc else 0
    return KeyState(tenants=tenants, master_generation=generation, registry_version=registry)


def save_state(path: str, state: KeyState) -> None:
    """Atomically replace the state file at ``path`` with ``state``.

    Raises :class:`StateError` when the directory is not writable.
    """
    data = json.dumps(state.to_json(), indent=2, sort_keys=True).encode("utf-8")
    try:
        write_atomic(path, data, mode=0o600)
    except OSError as exc:
        raise StateError(f"cannot write state file {path!r}: {exc.strerror}") from exc
