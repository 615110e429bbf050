"""Per-tenant key ring: HKDF-derived prefix keys, key ids, rotation, cache salts.

Derivation of prefix keys, key ids (kids) and user pseudonyms from the
master secret (RFC 5869 HKDF-SHA256, the labels and formats): see
:mod:`tenancy.key_derivation`. The kid is public and seeds
:func:`tenancy.prefix.block_hash_chain`, so chains of two key versions never
collide.

Rotation: :meth:`KeyRing.rotate_tenant` bumps a tenant's version; new prefix
keys use it at once, while :meth:`KeyRing.lookup_keys` and
:meth:`KeyRing.prefix_chain` still return the previous version for
``grace_s`` seconds so the router keeps finding prefixes indexed under it
(cache locality survives the rotation). :meth:`KeyRing.rotate_master`
re-derives every tenant from a new master secret, keeping the old master's
keys for the same grace period. Grace is in-process only (the prefix index
is in memory too). Key versions, salt epochs and the master generation persist in a JSON state file
(:mod:`tenancy.state`), locked and merged forward at every write (R11-1: :mod:`tenancy.state_lock`,
:meth:`KeyRing._persist`); derived keys and secrets are never written.

The master secret comes from a file (refused if group/world accessible) or an
environment variable, never from the configuration file
(:mod:`tenancy.master_secret`); the derivation functions are in
:mod:`tenancy.key_derivation`. This module's one job is the ring: versions,
rotation with grace, salts, state. It re-exports the names in ``__all__`` so
that ``tenancy.keys`` stays the key ring's public import path.
"""

from __future__ import annotations

import hmac
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from tenancy.key_derivation import (PREFIX_KEY_INFO, USER_KEY_INFO, PrefixChains, TenantKey, derive_prefix_key,
                                    key_id, user_pseudonym)
from tenancy.master_secret import (MIN_MASTER_SECRET_BYTES, KeyRingError, MasterUnchanged, check_master_secret,
                                   load_master_secret)
from tenancy.prefix import DEFAULT_DIGEST_SIZE, block_hash_chain
from tenancy.salt import cache_salt as _cache_salt
from tenancy.salt import derive_salt_key
from tenancy.state import UNROTATED as _UNROTATED
from tenancy.state import KeyState, TenantState, bumped, forward, registry_seen
from tenancy.state_lock import KeyStateDirectoryMissing, KeyStateInUse, StateFile

__all__ = [
    "KeyRingError", "KeyStateDirectoryMissing", "KeyStateInUse", "MasterUnchanged", "MIN_MASTER_SECRET_BYTES",
    "PREFIX_KEY_INFO", "TenantKey", "PrefixChains", "KeyRing", "load_master_secret", "derive_prefix_key", "key_id",
    "USER_KEY_INFO", "user_pseudonym",
]


@dataclass
class _Retired:
    generation: int
    master: bytes = field(repr=False)
    versions: dict[str, int]
    expires_at: float


@dataclass
class _GraceKey:
    key: TenantKey
    expires_at: float


class KeyRing:
    """Per-tenant prefix keys and cache salts derived from one master secret.

    ``master_secret``: at least 32 bytes (see :func:`load_master_secret`).
    ``grace_s``: seconds a previous key version stays recognised after a
    rotation. ``clock``: monotonic seconds (injectable for tests).
    ``state_path``: JSON file keeping key versions and salt epochs across
    restarts (``None`` keeps them in memory only). ``state_lock``: the state
    file's lock (:class:`tenancy.state_lock.StateFile`): ``"shared"`` (default,
    a ring serving traffic, held until :meth:`close`), ``"exclusive"`` (offline
    command) or ``None`` (read only). Thread-safe. Raises :class:`KeyRingError`
    for a short secret or an unusable state file (:class:`KeyStateDirectoryMissing`, a
    subclass, when its directory does not exist), :class:`KeyStateInUse` for a
    conflicting lock holder, ``ValueError`` for another ``state_lock``.
    """

    def __init__(
        self,
        master_secret: bytes,
        *,
        grace_s: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
        state_path: str | None = None,
        state_lock: str | None = "shared",
    ) -> None:
        check_master_secret(master_secret)
        if grace_s < 0:
            raise KeyRingError("grace_s must be >= 0")
        self._master = bytes(master_secret)
        self._generation = 1
        self._grace_s = float(grace_s)
        self._clock = clock
        self._lock = threading.RLock()
        self._retired_masters: list[_Retired] = []
        self._grace: dict[str, list[_GraceKey]] = {}
        self._cache: dict[tuple[int, str, int], TenantKey] = {}
        self._salt_cache: dict[tuple[int, str, int], str] = {}
        self._user_cache: dict[tuple[int, str, str], str] = {}
        self._file = None if state_path is None else StateFile(state_path, state_lock)
        try:
            self._state = KeyState() if self._file is None else self._file.load()
        except KeyRingError:
            self.close()
            raise
        self._generation = self._state.master_generation
        self._subkeys: dict[tuple[int, bytes], bytes] = {}

    def close(self) -> None:
        """Release the state file's lock (idempotent; else at garbage collection or exit; retaken to write)."""
        if self._file is not None:
            self._file.close()

    # -- introspection ---------------------------------------------------
    @property
    def grace_s(self) -> float:
        """Grace period of previous key versions, in seconds."""
        return self._grace_s

    @property
    def master_generation(self) -> int:
        """The master generation in use (>= 1; persisted in the state file, never lowered)."""
        return self._generation

    def key_version(self, tenant_id: str) -> int:
        """Return the current prefix-key version of ``tenant_id`` (1 if never rotated)."""
        with self._lock:
            return self._tenant_state(tenant_id).key_version

    def salt_epoch(self, tenant_id: str) -> int:
        """Return the current cache-salt epoch of ``tenant_id`` (0 if never rotated)."""
        with self._lock:
            return self._tenant_state(tenant_id).salt_epoch

    # -- keys --------------------------------------------------------------
    def current(self, tenant_id: str) -> TenantKey:
        """Return the tenant's current prefix key (used for new prefix chains)."""
        with self._lock:
            version = self._tenant_state(tenant_id).key_version
            return self._derive(self._master, self._generation, tenant_id, version)

    def lookup_keys(self, tenant_id: str) -> list[TenantKey]:
        """Return the keys whose chains are recognised now: current first, then
        previous versions still in grace (newest first), without duplicates."""
        with self._lock:
            if not self._grace and not self._retired_masters:  # no rotation in grace: nothing to expire
                ts = self._state.tenants.get(tenant_id) or _UNROTATED  # = _tenant_state, without its call (s16)
                return [self._derive(self._master, self._generation, tenant_id, ts.key_version)]
            now = self._clock()
            self._expire(now)
            keys = [self.current(tenant_id)]
            keys.extend(g.key for g in reversed(self._grace.get(tenant_id, [])))
            for retired in reversed(self._retired_masters):
                version = retired.versions.get(tenant_id, 1)
                keys.append(self._derive(retired.master, retired.generation, tenant_id, version))
            return list({k.kid: k for k in keys}.values())  # one per kid, first-seen order (a kid names one key)

    def prefix_chain(
        self,
        tenant_id: str,
        tokens: Sequence[int],
        block_size: int,
        *,
        digest_size: int = DEFAULT_DIGEST_SIZE,
        max_blocks: int | None = None,
    ) -> PrefixChains:
        """Hash ``tokens`` into block chains under every key of :meth:`lookup_keys`.

        ``block_size`` in tokens; see :func:`tenancy.prefix.block_hash_chain`
        (whose ``ValueError`` it propagates). Outside a grace period this is
        one chain; during one, one extra chain per recognised old version.
        """
        with self._lock:  # s18: outside a grace period, = lookup_keys()[0] without its call, list and _derive's call
            if not self._grace and not self._retired_masters:
                ck = (self._generation, tenant_id, (self._state.tenants.get(tenant_id) or _UNROTATED).key_version)
                keys, first = None, self._cache.get(ck) or self._derive(self._master, *ck)
            else:
                keys = self.lookup_keys(tenant_id)
                first = keys[0]
        current = tuple(block_hash_chain(first.key, tokens, block_size, key_id=first.kid, digest_size=digest_size,
                                         max_blocks=max_blocks))
        if keys is None or len(keys) == 1:  # outside a grace period (issue 14: no list of pairs per request)
            return PrefixChains(first.kid, current)
        previous = tuple(
            (k.kid, tuple(block_hash_chain(k.key, tokens, block_size, key_id=k.kid, digest_size=digest_size,
                                           max_blocks=max_blocks)))
            for k in keys[1:]
        )
        return PrefixChains(first.kid, current, previous)

    def rotate_tenant(self, tenant_id: str) -> TenantKey:
        """Start a new prefix-key version for ``tenant_id`` and persist it.

        The previous version stays in :meth:`lookup_keys` for ``grace_s``
        seconds. The cache salt is unchanged. Returns the new current key.
        Raises :class:`KeyRingError` if the state file cannot be written
        (the rotation is then not applied).
        """
        with self._lock:
            self._persist(bumped(tenant_id, key=1))  # puts the key in use in grace
            return self.current(tenant_id)

    def rotate_master(self, new_secret: bytes) -> int:
        """Switch to ``new_secret``; every tenant re-derives its keys and salt.

        The old master's keys stay recognised by :meth:`lookup_keys` for
        ``grace_s`` seconds; cache salts change at once (a master rotation
        deliberately turns replica caches cold). Refuses a short secret (``KeyRingError``)
        or the secret already in use (:class:`MasterUnchanged`, compared in
        constant time). The new generation is persisted before it is used
        (``KeyRingError`` if the state file cannot be written: nothing applied).
        Returns the new master generation number.
        """
        check_master_secret(new_secret)
        with self._lock:
            if hmac.compare_digest(new_secret, self._master):
                raise MasterUnchanged("new master secret equals the current one")
            versions = {tid: ts.key_version for tid, ts in self._state.tenants.items()}
            written = self._persist(lambda base: replace(base, master_generation=base.master_generation + 1))
            self._switch_master(new_secret, written.master_generation, versions)
            return self._generation

    def adopt_master(self, generation: int, secret: bytes | None = None) -> bool:
        """Move to master ``generation`` announced by another instance (issue 16), with ``secret``.

        Forward only: a ``generation`` not above the current one changes nothing
        (returns False). ``secret`` None or equal to the one in use (an
        instance started with the new secret) only raises the generation
        number; otherwise this is :meth:`rotate_master` to that generation
        (grace as there). Persisted first; raises :class:`KeyRingError` as
        :meth:`rotate_master` does. The caller checked that ``secret`` is the
        announced generation's (tenancy/shared_keys.py). Returns True if applied.
        """
        with self._lock:
            if generation <= self._generation:
                return False
            same = secret is None or hmac.compare_digest(secret, self._master)
            if not same:
                check_master_secret(secret)
            versions = {tid: ts.key_version for tid, ts in self._state.tenants.items()}
            self._persist(lambda base: replace(base, master_generation=max(base.master_generation, generation)))
            if same:
                self._generation = generation
            else:
                self._switch_master(secret, generation, versions)
            return True

    def mac_subkeys(self, info: bytes) -> tuple[bytes, ...]:
        """HKDF-SHA256 subkeys (32 bytes) for ``info`` of the current master, then of the retired
        masters still in grace (newest first): the keys of shared-state MACs (issue 16). Cached."""
        from tenancy.salt import hkdf_sha256

        with self._lock:
            self._expire(self._clock())
            out = []
            for gen, master in [(self._generation, self._master)] + [
                    (r.generation, r.master) for r in reversed(self._retired_masters)]:
                key = self._subkeys.get((gen, info))
                if key is None:
                    key = self._subkeys[(gen, info)] = hkdf_sha256(master, info)
                out.append(key)
            return tuple(out)

    def _switch_master(self, new_secret: bytes, generation: int, versions: dict[str, int]) -> None:
        """In memory only (persisted by the caller first); ``versions``: those in use before."""
        self._retired_masters.append(
            _Retired(self._generation, self._master, versions, self._clock() + self._grace_s))
        self._master = bytes(new_secret)
        self._generation = generation
        self._salt_cache.clear()
        self._user_cache.clear()

    def adopt(self, tenant_id: str, key_version: int, salt_epoch: int) -> bool:
        """Move ``tenant_id`` forward to a key version / salt epoch seen on another instance.

        Forward only, field by field: a value not above the current one is
        ignored (a rotation is never rolled back). A higher key version puts
        the current key in grace exactly as :meth:`rotate_tenant` does.
        Persisted like a rotation (the state file keeps the highest seen).
        Returns True when anything changed. Raises :class:`KeyRingError` if
        the state file cannot be written (nothing is applied then) and
        ``ValueError`` for a version < 1 or an epoch < 0.
        """
        if key_version < 1 or salt_epoch < 0:
            raise ValueError("key_version must be >= 1 and salt_epoch >= 0")
        seen = TenantState(key_version, salt_epoch)
        with self._lock:
            ts = self._tenant_state(tenant_id)
            if forward(ts, seen) == ts:
                return False
            self._persist(bumped(tenant_id, seen=seen))
            return True

    @property
    def registry_version(self) -> int:
        """The highest shared tenant-registry version seen (0: none; persisted, never lowered: S20-R1)."""
        return self._state.registry_version

    def adopt_registry_version(self, version: int) -> bool:
        """Persist ``version`` as the highest shared tenant-registry version seen (gateway/shared_state.py).
        Forward only: not above the current one changes nothing (False). :class:`KeyRingError` if the state
        file cannot be written (nothing applied). Returns True if raised."""
        with self._lock:
            if version <= self._state.registry_version:
                return False
            self._persist(registry_seen(version))
            return True

    def tenant_states(self) -> dict[str, tuple[int, int]]:
        """``{tenant id: (key_version, salt_epoch)}`` of every tenant ever rotated or adopted."""
        with self._lock:
            return {tid: (ts.key_version, ts.salt_epoch) for tid, ts in self._state.tenants.items()}

    # -- salts -------------------------------------------------------------
    def cache_salt(self, tenant_id: str) -> str:
        """Return the tenant's cache salt (vLLM ``cache_salt``); see :mod:`tenancy.salt`."""
        with self._lock:
            epoch = (self._state.tenants.get(tenant_id) or _UNROTATED).salt_epoch  # = _tenant_state's, no call (s17)
            ck = (self._generation, tenant_id, epoch)
            salt = self._salt_cache.get(ck)
            if salt is None:
                salt = _cache_salt(derive_salt_key(self._master, tenant_id), tenant_id, epoch)
                if len(self._salt_cache) >= 4096:
                    self._salt_cache.clear()
                self._salt_cache[ck] = salt
            return salt

    def user_pseudonym(self, tenant_id: str, spiffe_id: str) -> str:
        """Return the stable ``user`` pseudonym of a tenant's workload (:func:`user_pseudonym`).

        Independent of the prefix-key version and the salt epoch; changes
        with the master secret only.
        """
        with self._lock:
            ck = (self._generation, tenant_id, "user:" + spiffe_id)
            value = self._user_cache.get(ck)
            if value is None:
                value = user_pseudonym(self._master, tenant_id, spiffe_id)
                if len(self._user_cache) >= 4096:
                    self._user_cache.clear()
                self._user_cache[ck] = value
            return value

    def rotate_salt(self, tenant_id: str) -> int:
        """Bump the tenant's salt epoch (operator action: its replica cache goes cold).

        Persisted; returns the new epoch. Raises :class:`KeyRingError` if the
        state file cannot be written.
        """
        with self._lock:
            self._persist(bumped(tenant_id, salt=1))
            return self._tenant_state(tenant_id).salt_epoch

    # -- internals ---------------------------------------------------------
    def _tenant_state(self, tenant_id: str) -> TenantState:
        return self._state.tenants.get(tenant_id) or _UNROTATED

    def _persist(self, change: Callable[[KeyState], KeyState]) -> KeyState:
        """Write ``change(base)`` (caller holds ``self._lock``), ``base`` = the ring's view merged forward with
        the file's, read under its write lock (no number there is lowered; a rotation gets a number never used);
        adopt the written tenant numbers (the key in use to grace if its version moved); a higher master
        generation in the file stays there (adopting needs the secret). :class:`KeyRingError`: nothing applied."""
        mine = replace(self._state, master_generation=max(self._state.master_generation, self._generation))
        written = change(mine) if self._file is None else self._file.write(mine, change)
        expires = self._clock() + self._grace_s
        for tid, ts in written.tenants.items():
            if ts.key_version != self._tenant_state(tid).key_version:
                self._grace.setdefault(tid, []).append(_GraceKey(self.current(tid), expires))
        self._state = written
        return written

    def _expire(self, now: float) -> None:
        expired = {r.generation for r in self._retired_masters if r.expires_at <= now}
        if expired:
            self._retired_masters = [r for r in self._retired_masters if r.generation not in expired]
            self._cache = {ck: tk for ck, tk in self._cache.items() if ck[0] not in expired}
            self._subkeys = {ck: k for ck, k in self._subkeys.items() if ck[0] not in expired}
        for tid in list(self._grace):
            kept = [g for g in self._grace[tid] if g.expires_at > now]
            if kept:
                self._grace[tid] = kept
            else:
                del self._grace[tid]

    def _derive(self, master: bytes, generation: int, tenant_id: str, version: int) -> TenantKey:
        ck = (generation, tenant_id, version)
        tk = self._cache.get(ck)
        if tk is None:
            key = derive_prefix_key(master, tenant_id, version)
            tk = TenantKey(tenant_id=tenant_id, version=version, kid=key_id(tenant_id, version, key), key=key)
            if len(self._cache) >= 4096:
                self._cache.clear()
            self._cache[ck] = tk
        return tk
