"""Key versions and salt epochs shared by gateway instances through Redis (issue 16).

Every instance holds the same master secret (provisioned out of band).
A rotation on one instance (:meth:`tenancy.keys.KeyRing.rotate_tenant` /
``rotate_salt``) is published here and adopted by the others
(:meth:`tenancy.keys.KeyRing.adopt`), so a tenant gets the same prefix key
and ``cache_salt`` on every instance.

**Records** (``P`` = ``state.key_prefix``)::

    P keys:check     string  key-check value: hex HMAC(subkey, "pg-state-keycheck-v1"), never the secret
    P keys:tenants   hash    tenant id -> "<key_version>:<salt_epoch>:<hex MAC>";
                             "#master" -> "<master generation>:0:<hex MAC>" (not a tenant id)
    P keys:changed   channel tenant id (or "#master") published after a forward move

The MAC is HMAC-SHA256 under ``subkey = HKDF(master, info="pg-shared-state-mac-v1")`` over the
prefix, the tenant id and both numbers (length-prefixed), so Redis (trusted for counters only)
cannot forge or replay a record across tenants or prefixes. Readers
ignore a record with a bad MAC and count it (``rejected``); values only
move forward (the Lua script refuses to lower a stored record, and
:meth:`KeyRing.adopt` ignores lower values), and every instance persists the
highest it has seen in its state file, so an emptied Redis cannot roll a
rotation back: :meth:`SharedKeyState.sync` re-publishes local values that
Redis lacks.

**Propagation**: :meth:`SharedKeyState.run` listens on the channel and also
re-reads every ``poll_s`` seconds (a missed message or a Redis restart is
healed by the poll).

**The master generation** is one more record of the same hash, script and
rules, under the field ``#master``, MAC'd under the subkey of *the master it
announces* (:meth:`SharedKeyState.publish_master`). The new master secret
is never in Redis: every instance is provisioned with it out of band (its
``tenancy.master_secret_file`` or variable), then one instance's
``rotate-master`` announces the generation. The others (:meth:`sync`) re-read
their own secret source (``master_loader``) and switch only if that secret
authenticates the record (:meth:`tenancy.keys.KeyRing.adopt_master`); until
then the record is *pending* (``master_pending`` > 0, logged as an error,
retried at every sync) and this instance neither adopts nor re-publishes
tenant records (those of the new master cannot be checked here, and its own
must not overwrite them). A lower generation or a record no secret here
authenticates is ignored, counted in ``rejected`` and re-published over.
Records MAC'd under a master still in grace (a lagging instance's, or the
stored ones right after a rotation) are accepted and re-published under the
current master. The key-check follows the master: an instance whose secret
authenticates the current ``#master`` record overwrites a stale key-check.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import struct
from collections.abc import Callable
from typing import Any

from tenancy.keys import KeyRing, KeyRingError
from tenancy.salt import hkdf_sha256, length_prefixed
from tenancy.shared_store import cancel_task, follow_changes, mac_matches, record_number, record_text

__all__ = ["MASTER_FIELD", "SharedKeyState", "STATE_MAC_INFO"]

log = logging.getLogger("prefixgate.state")

#: HKDF ``info`` label of the subkey that MACs shared-state records.
STATE_MAC_INFO = b"pg-shared-state-mac-v1"
_CHECK_LABEL = b"pg-state-keycheck-v1"
#: the hash field of the master-generation record (``#`` never appears in a tenant id)
MASTER_FIELD = "#master"

# KEYS: tenants hash. ARGV: tenant, key_version, salt_epoch, record, channel, forged ('' or the
# stored value the caller found unauthenticated: replaced whatever its numbers say).
# Stores the record only if neither number goes down and one goes up; publishes then.
_LUA_PUBLISH = r"""
local cur = redis.call('HGET', KEYS[1], ARGV[1])
local kv, se = tonumber(ARGV[2]), tonumber(ARGV[3])
if cur and not (ARGV[6] ~= '' and cur == ARGV[6]) then
  local ckv, cse = string.match(cur, '^(%d+):(%d+):')
  ckv, cse = tonumber(ckv), tonumber(cse)
  if ckv and cse and (kv < ckv or se < cse or (kv == ckv and se == cse)) then return 0 end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[4])
redis.call('PUBLISH', ARGV[5], ARGV[1])
return 1
"""


class SharedKeyState:
    """Publish and adopt key versions / salt epochs / the master generation of one :class:`KeyRing`.

    ``client``: a :class:`redis.asyncio.Redis`; ``key_prefix``: ``state.key_prefix``;
    ``master_secret``: unused (kept for callers; the MAC subkeys come from
    ``ring.mac_subkeys``, so they follow the ring's master); ``master_loader``:
    reads this instance's master secret source (file or variable) when a
    higher master generation is announced (None: such a record stays pending).
    ``rejected`` counts records ignored for a bad MAC, shape or a lower
    master generation; ``master_pending`` is the announced generation this
    instance cannot authenticate yet (0: none).
    """

    def __init__(self, client: Any, key_prefix: str, master_secret: bytes | None, ring: KeyRing, *,
                 poll_s: float = 1.0, master_loader: Callable[[], bytes] | None = None) -> None:
        del master_secret
        self._client = client
        self._prefix = key_prefix
        self._ring = ring
        self._poll_s = poll_s
        self._loader = master_loader
        self._publish = client.register_script(_LUA_PUBLISH)
        self._task: asyncio.Task[None] | None = None
        self._last_master_rejected: str | None = None
        #: the generation of the ``#master`` record this instance last stored or found authentic: once
        #: overtaken by a local rotation not yet announced, that record is stale, not a rollback
        self._confirmed = 0
        self.rejected = 0
        self.adopted = 0
        self.master_adopted = 0
        self.master_pending = 0

    @property
    def _hash(self) -> str:
        return f"{self._prefix}keys:tenants"

    @property
    def channel(self) -> str:
        """The Pub/Sub channel of changes."""
        return f"{self._prefix}keys:changed"

    def _keys(self) -> tuple[bytes, ...]:
        return self._ring.mac_subkeys(STATE_MAC_INFO)

    def key_check(self) -> str:
        """The public key-check value of the current master secret (hex; reveals nothing of the secret)."""
        return hmac.new(self._keys()[0], _CHECK_LABEL, hashlib.sha256).hexdigest()

    def _mac(self, tenant_id: str, key_version: int, salt_epoch: int, key: bytes | None = None) -> str:
        msg = (length_prefixed(self._prefix) + length_prefixed(tenant_id)
               + struct.pack(">QQ", key_version, salt_epoch))
        return hmac.new(key if key is not None else self._keys()[0], msg, hashlib.sha256).hexdigest()

    async def join(self) -> None:
        """Publish this instance's key-check value, or compare it with the one stored.

        A stored value of another master is replaced when this instance's
        secret authenticates the current ``#master`` record (the master was
        rotated). Raises :class:`KeyRingError` when another instance joined
        with a different master secret (this one must not start).
        """
        mine = self.key_check()
        key = f"{self._prefix}keys:check"
        await self._client.set(key, mine, nx=True)
        stored = await self._client.get(key)
        if stored is not None and mac_matches(record_text(stored), mine):  # not UTF-8 or ASCII: another value
            return
        rec = await self._client.hget(self._hash, MASTER_FIELD)
        parsed = None if rec is None else self._verify(MASTER_FIELD, record_text(rec), self._keys()[:1])
        if parsed is None:
            raise KeyRingError("shared state: the master secret differs from the other instances' "
                               "(key-check mismatch); refusing to join")
        await self._client.set(key, mine)

    async def publish(self, tenant_id: str) -> bool:
        """Publish the ring's current version and epoch of ``tenant_id`` (after a rotation).

        Returns True when Redis moved forward (False: it already held these or higher values).
        A stored record that fails its MAC under the current master is replaced
        (tampering cannot block a rotation; a record of a master in grace is re-MAC'd).
        """
        kv, se = self._ring.key_version(tenant_id), self._ring.salt_epoch(tenant_id)
        return await self._store(tenant_id, kv, se)

    async def publish_master(self) -> bool:
        """Announce the ring's master generation (after ``rotate-master`` here), MAC'd under the
        new master's subkey, and make its key-check the stored one. Returns True if Redis moved."""
        self._confirmed = self._ring.master_generation
        moved = await self._store(MASTER_FIELD, self._confirmed, 0)
        await self._client.set(f"{self._prefix}keys:check", self.key_check())
        return moved

    async def _store(self, field: str, kv: int, se: int) -> bool:
        record = f"{kv}:{se}:{self._mac(field, kv, se)}"
        cur = await self._client.hget(self._hash, field)
        # a forged record (any numbers, not UTF-8 included) must not block the real ones: replace it if still
        # there (the script compares the stored bytes, S21-fixutf8-1)
        forged = cur if cur is not None and self._verify(field, record_text(cur), self._keys()[:1]) is None else ""
        return bool(await self._publish(keys=[self._hash], args=[field, kv, se, record, self.channel, forged]))

    def _verify(self, field: str, raw: str, keys: tuple[bytes, ...] | None = None) -> tuple[int, int] | None:
        parts = raw.split(":")
        if len(parts) != 3:
            return None
        kv, se = record_number(parts[0]), record_number(parts[1])  # ASCII digits only (S21-review-1)
        if kv is None or se is None or kv < 1:
            return None
        for key in keys if keys is not None else self._keys():
            if mac_matches(parts[2], self._mac(field, kv, se, key)):  # a non-ASCII MAC: no match (S21-fixutf8-2)
                return kv, se
        return None

    def _reject_master(self, raw: str, why: str) -> None:
        if raw == self._last_master_rejected:  # count and alert a bad record once, not at every poll
            return
        self._last_master_rejected = raw
        self.rejected += 1
        log.error("shared state: ignored a master-generation record (%s)", why)

    async def _sync_master(self, raw: str | None) -> bool:
        """Adopt or refuse the ``#master`` record; False while a higher generation is pending here."""
        local = self._ring.master_generation
        self.master_pending = 0
        gen = record_number(raw.split(":")[0]) if raw is not None else None  # not ASCII digits: forged
        if raw is not None and gen is not None and gen > local:
            if self._verify(MASTER_FIELD, raw, self._keys()[:1]) is not None:  # started with the new secret
                self._ring.adopt_master(gen)
                self.master_adopted += 1
                self._confirmed = gen
                return True
            secret = None
            if self._loader is not None:
                try:
                    secret = self._loader()
                except KeyRingError as exc:
                    log.error("shared state: master generation %d announced; its secret source failed (%s)",
                              gen, exc)
            key = None if secret is None else hkdf_sha256(secret, STATE_MAC_INFO)
            if key is not None and self._verify(MASTER_FIELD, raw, (key,)) is not None:
                self._ring.adopt_master(gen, secret)
                self.master_adopted += 1
                self._confirmed = gen
                log.warning("shared state: adopted master generation %d", gen)
                return True
            self.master_pending = gen
            self._reject_master(raw, f"generation {gen} is not authenticated by this instance's master secret "
                                     "source: provision the new secret, or the record is forged")
            return False
        if raw is not None and gen == local and self._verify(MASTER_FIELD, raw, self._keys()[:1]) is not None:
            self._confirmed = gen
            return True
        if raw is not None and not (gen == self._confirmed and gen < local):  # not our own, since overtaken
            self._reject_master(raw, "lower generation" if gen is not None and gen < local else "unauthenticated")
        if raw is not None or local > 1:  # generation 1 has nothing to announce
            await self._store(MASTER_FIELD, local, 0)  # absent, lower or forged: never rolled back
            self._confirmed = local
        return True

    async def sync(self) -> int:
        """Adopt the master generation and every authenticated higher record; re-publish what Redis lacks.

        Returns the number of tenants adopted from Redis. Records with a bad
        MAC are ignored and counted in ``rejected`` (logged as a warning).
        While a higher master generation is pending, tenant records are left alone.
        """
        # a field or value that is not UTF-8 reads as a text no record authenticates (S21-fixutf8-1)
        raw = {record_text(k): record_text(v) for k, v in (await self._client.hgetall(self._hash)).items()}
        if not await self._sync_master(raw.pop(MASTER_FIELD, None)):
            return 0
        keys = self._keys()
        remote: dict[str, tuple[int, int]] = {}
        stale: set[str] = set()
        for tid, value in raw.items():
            rec = self._verify(tid, value, keys)
            if rec is None:
                self.rejected += 1
                log.warning("shared state: ignored an unauthenticated key record (tenant %s)", tid)
                continue
            if self._verify(tid, value, keys[:1]) is None:
                stale.add(tid)  # MAC'd under a master in grace: adopted, re-MAC'd below
            remote[tid] = rec
        changed = 0
        for tid, (kv, se) in remote.items():
            if self._ring.adopt(tid, kv, se):
                changed += 1
        self.adopted += changed
        for tid, local in self._ring.tenant_states().items():
            if remote.get(tid) != local or tid in stale:  # after adopt, local >= remote field by field
                await self.publish(tid)  # an emptied or stale Redis: heal it, never roll back
        return changed

    async def run(self) -> None:
        """Adopt changes until cancelled: now, on each channel message, and every ``poll_s`` seconds."""
        await follow_changes(self._client, self.channel, self.sync, self._poll_s, "key state")

    def start(self) -> None:
        """Run :meth:`run` as a task of the running loop."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self.run(), name="prefixgate-key-state")

    async def aclose(self) -> None:
        """Stop the task started by :meth:`start`."""
        if self._task is not None:
            await cancel_task(self._task)
            self._task = None
