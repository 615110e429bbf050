"""Small persistent state of the key ring: key versions, salt epochs, the master generation.

Only *numbers* are stored, never a key or a secret. The file survives
restarts so that a rotated tenant key (or salt) is not silently rolled back.
Layout (JSON)::

    {"format": 1, "master_generation": 2,
     "tenants": {"<tenant id>": {"key_version": 2, "salt_epoch": 0}}}

``master_generation`` (>= 1; absent in older files: 1) is the highest master
generation this instance has used or adopted (issue 16: it never goes back).

Writes are atomic: a temporary file in the same directory, ``fsync``, then
``os.replace`` (POSIX rename is atomic), created with mode 0600.

Every number only moves forward (:func:`forward`, :func:`merge_forward`): the one
rule of the key ring (:meth:`tenancy.keys.KeyRing.adopt`, its writes of this file,
which merge with what they find there, R11-1) and of the shared state
(tenancy/shared_keys.py adopts through ``KeyRing.adopt``; its Lua script applies
the same rule inside Redis).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field

__all__ = ["StateError", "TenantState", "KeyState", "forward", "load_state", "merge_forward", "save_state"]

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
    """All persisted key-ring counters: by tenant id, and the master generation (>= 1)."""

    tenants: dict[str, TenantState] = field(default_factory=dict)
    master_generation: int = 1

    def to_json(self) -> dict:
        """Return the JSON-able document of this state."""
        return {
            "format": _FORMAT,
            "master_generation": self.master_generation,
            "tenants": {
                tid: {"key_version": ts.key_version, "salt_epoch": ts.salt_epoch}
                for tid, ts in sorted(self.tenants.items())
            },
        }


def forward(a: TenantState, b: TenantState) -> TenantState:
    """Field-by-field maximum of two tenant states: a key version or salt epoch never goes back."""
    return TenantState(max(a.key_version, b.key_version), max(a.salt_epoch, b.salt_epoch))


def merge_forward(a: KeyState, b: KeyState) -> KeyState:
    """Union of the tenants of ``a`` and ``b``, each :func:`forward` of both; the higher master generation."""
    tenants = dict(a.tenants)
    for tid, ts in b.tenants.items():
        tenants[tid] = forward(tenants[tid], ts) if tid in tenants else ts
    return KeyState(tenants=tenants, master_generation=max(a.master_generation, b.master_generation))


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
    return KeyState(tenants=tenants, master_generation=generation)


def save_state(path: str, state: KeyState) -> None:
    """Atomically replace the state file at ``path`` with ``state``.

    Raises :class:`StateError` when the directory is not writable.
    """
    directory = os.path.dirname(os.path.abspath(path))
    data = json.dumps(state.to_json(), indent=2, sort_keys=True).encode("utf-8")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".pg-keystate-", dir=directory)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
    except OSError as exc:
        raise StateError(f"cannot write state file {path!r}: {exc.strerror}") from exc
