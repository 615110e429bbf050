"""Key versions and salt epochs shared by gateway instances through Redis (issue 16).

Every instance holds the same master secret (provisioned out of band).
A rotation on one instance (:meth:`tenancy.keys.KeyRing.rotate_tenant` /
``rotate_salt``) is published here and adopted by the others
(:meth:`tenancy.keys.KeyRing.adopt`), so a tenant gets the same prefix key
and ``cache_salt`` on every instance.

**Records** (``P`` = ``state.key_prefix``)::

    P keys:check     string  key-check value: hex HMAC(subkey, "pg-state-keycheck-v1"), never the secret
    P keys:tenants   hash    tenant id -> "<key_version>:<salt_epoch>:<hex MAC>"
    P keys:changed   channel tenant id published after a forward move

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

**Not yet**: the master generation, registry and policy versions, and
the wiring into the admin API (``rotate`` must call :meth:`publish`).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import struct
from typing import Any

from tenancy.keys import KeyRing, KeyRingError
from tenancy.salt import hkdf_sha256, length_prefixed
from tenancy.shared_store import cancel_task, follow_changes

__all__ = ["SharedKeyState", "STATE_MAC_INFO"]

log = logging.getLogger("prefixgate.state")

#: HKDF ``info`` label of the subkey that MACs shared-state records.
STATE_MAC_INFO = b"pg-shared-state-mac-v1"
_CHECK_LABEL = b"pg-state-keycheck-v1"

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
    """Publish and adopt key versions / salt epochs of one :class:`KeyRing` through Redis.

    ``client``: a :class:`redis.asyncio.Redis`; ``key_prefix``: ``state.key_prefix``;
    ``master_secret``: the instance's master secret (only a derived subkey is used).
    ``rejected`` counts records ignored for a bad MAC or shape.
    """

    def __init__(self, client: Any, key_prefix: str, master_secret: bytes, ring: KeyRing, *,
                 poll_s: float = 1.0) -> None:
        self._client = client
        self._prefix = key_prefix
        self._subkey = hkdf_sha256(master_secret, STATE_MAC_INFO)
        self._ring = ring
        self._poll_s = poll_s
        self._publish = client.register_script(_LUA_PUBLISH)
        self._task: asyncio.Task[None] | None = None
        self.rejected = 0
        self.adopted = 0

    @property
    def _hash(self) -> str:
        return f"{self._prefix}keys:tenants"

    @property
    def channel(self) -> str:
        """The Pub/Sub channel of changes."""
        return f"{self._prefix}keys:changed"

    def key_check(self) -> str:
        """The public key-check value of this master secret (hex; reveals nothing of the secret)."""
        return hmac.new(self._subkey, _CHECK_LABEL, hashlib.sha256).hexdigest()

    def _mac(self, tenant_id: str, key_version: int, salt_epoch: int) -> str:
        msg = (length_prefixed(self._prefix) + length_prefixed(tenant_id)
               + struct.pack(">QQ", key_version, salt_epoch))
        return hmac.new(self._subkey, msg, hashlib.sha256).hexdigest()

    async def join(self) -> None:
        """Publish this instance's key-check value, or compare it with the one stored.

        Raises :class:`KeyRingError` when another instance joined with a
        different master secret (this one must not start).
        """
        mine = self.key_check()
        await self._client.set(f"{self._prefix}keys:check", mine, nx=True)
        stored = await self._client.get(f"{self._prefix}keys:check")
        stored = stored.decode() if isinstance(stored, bytes) else stored
        if stored is None or not hmac.compare_digest(stored, mine):
            raise KeyRingError("shared state: the master secret differs from the other instances' "
                               "(key-check mismatch); refusing to join")

    async def publish(self, tenant_id: str) -> bool:
        """Publish the ring's current version and epoch of ``tenant_id`` (after a rotation).

        Returns True when Redis moved forward (False: it already held these or higher values).
        A stored record that fails its MAC is replaced (tampering cannot block a rotation).
        """
        kv, se = self._ring.key_version(tenant_id), self._ring.salt_epoch(tenant_id)
        record = f"{kv}:{se}:{self._mac(tenant_id, kv, se)}"
        cur = await self._client.hget(self._hash, tenant_id)
        cur = cur.decode() if isinstance(cur, bytes) else cur
        # a forged record (any numbers) must not block the real ones: replace it if still there
        forged = cur if cur is not None and self._verify(tenant_id, cur) is None else ""
        return bool(await self._publish(keys=[self._hash],
                                        args=[tenant_id, kv, se, record, self.channel, forged]))

    def _verify(self, tenant_id: str, raw: str) -> tuple[int, int] | None:
        parts = raw.split(":")
        if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit():
            return None
        kv, se = int(parts[0]), int(parts[1])
        if kv < 1 or not hmac.compare_digest(parts[2], self._mac(tenant_id, kv, se)):
            return None
        return kv, se

    async def sync(self) -> int:
        """Adopt every authenticated higher record and re-publish local values Redis lacks.

        Returns the number of tenants adopted from Redis. Records with a bad
        MAC are ignored and counted in ``rejected`` (logged as a warning).
        """
        raw = await self._client.hgetall(self._hash)
        remote: dict[str, tuple[int, int]] = {}
        for k, v in raw.items():
            tid = k.decode() if isinstance(k, bytes) else k
            value = v.decode() if isinstance(v, bytes) else v
            rec = self._verify(tid, value)
            if rec is None:
                self.rejected += 1
                log.warning("shared state: ignored an unauthenticated key record (tenant %s)", tid)
                continue
            remote[tid] = rec
        changed = 0
        for tid, (kv, se) in remote.items():
            if self._ring.adopt(tid, kv, se):
                changed += 1
        self.adopted += changed
        for tid, local in self._ring.tenant_states().items():
            if remote.get(tid) != local:  # after adopt, local >= remote field by field
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
