"""Versioned documents shared by gateway instances through Redis: the policy set and the
tenant registry (issue 16, ``state.backend: redis``).

A change through one instance's admin API is published as a record
``P docs:<name>`` = ``"<version>:<hex MAC>:<JSON body>"`` (``P`` =
``state.key_prefix``), MAC'd with HMAC-SHA256 under the HKDF subkey
``pg-shared-docs-mac-v1`` over the prefix, the document name, the version
and the body, and announced on the channel ``P docs:changed``. Every other
instance reads it on the message (and every ``poll_s`` seconds, for a
missed message or a restarted Redis) and applies it only when it is
authenticated and *higher* than the version it holds; anything else is
ignored, counted (``prefixgate_shared_state_rejected_records{kind}``) and
logged as a warning. Versions only move forward: the Lua script refuses to
store a version not above the stored one, unless the stored record is the
one the publisher found forged (it fails *every* subkey accepted here) or
the same version and body under a master still in grace (re-MAC'd under the
current one); a record under a master in grace is authentic, so a lower
version never replaces it (S20-R2). ``floor()`` is the lowest version an
instance may adopt (the registry's persisted highest version seen: a
restarted instance refuses an older record replayed into Redis, S20-R1).
Two changes made at once on two instances
get one version; the first stored wins: the other instance finds the stored
record at its own version with another body and adopts it (``apply`` may
number it above its own version, which is then published), so every
instance converges on one document (session 17, S17-1; the losing change is
logged as an error and counted ``{reason="conflict"}``; a policy change is
published inside its admin request, so the loser answers 409, session 18, SF17-1).

Redis is trusted for counters only: it cannot forge or roll back a document
(it can withhold one: an instance then keeps what it has).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import struct
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from tenancy.salt import length_prefixed
from tenancy.shared_store import cancel_task, follow_changes, mac_matches, record_number, record_text

__all__ = ["DOCS_MAC_INFO", "SharedDocument", "state_metrics"]

log = logging.getLogger("prefixgate.state")

#: HKDF ``info`` label of the subkey that MACs shared documents.
DOCS_MAC_INFO = b"pg-shared-docs-mac-v1"

# KEYS: record. ARGV: version, record, channel, name, replaceable ('' or the stored value this record may replace
# whatever its version: one found forged, or the same version and body MAC'd under a master in grace).
# The very record already stored answers 1 and publishes nothing: the client retries a command once when
# its reply times out (tenancy/shared_store.py), and the retry of a script that ran must not read as a
# conflict (session 19: CI under load answered a first change 409; the record holds version, MAC and text).
_LUA_PUBLISH = r"""
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[2] then return 1 end
if cur and not (ARGV[5] ~= '' and cur == ARGV[5]) then
  local v = tonumber(string.match(cur, '^(%d+):'))
  if v and tonumber(ARGV[1]) <= v then return 0 end
end
redis.call('SET', KEYS[1], ARGV[2])
redis.call('PUBLISH', ARGV[3], ARGV[4])
return 1
"""


def _text(body: Any) -> str:
    """The canonical JSON text of a document body (what is MAC'd and stored)."""
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


class _StateMetrics:
    """Counters of shared-state records, by kind (keys, policy, registry)."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        reg = registry if registry is not None else CollectorRegistry()
        self.rejected = Counter("prefixgate_shared_state_rejected_records",
                                "Shared-state records ignored: unauthenticated (bad MAC/shape) or lower than held",
                                ["kind", "reason"], registry=reg)
        self.adopted = Counter("prefixgate_shared_state_adopted_records",
                               "Shared-state records adopted from other instances", ["kind"], registry=reg)


def state_metrics(registry: CollectorRegistry | None = None) -> _StateMetrics:
    """The shared-state counters registered on ``registry`` (None: a private registry)."""
    return _StateMetrics(registry)


class SharedDocument:
    """One named, versioned JSON document shared through Redis (see module doc).

    ``client``: :class:`redis.asyncio.Redis`; ``name``: e.g. ``policy``;
    ``mac_key``: the 32-byte HKDF subkey (:data:`DOCS_MAC_INFO`), or a callable
    giving the subkeys accepted now, the one to MAC with first (a record
    under a master still in grace is adopted and re-published under the current one);
    ``local_version()``: the version this instance holds; ``apply(version, body)``:
    adopt a higher document (async; raising leaves the version unchanged and
    is retried at the next poll); ``metrics``: from :func:`state_metrics`;
    ``local_body()``: the document this instance holds (None: nothing to
    share), re-published when Redis lacks it or holds a lower or forged
    record (an emptied Redis is healed, never rolls anything back);
    ``floor()``: the lowest version this instance may adopt (default: none
    below ``local_version()``), for a document whose version is persisted
    apart from its body (the registry: a started instance holds version 0
    but has seen a higher one; a stored record below the floor is refused,
    counted ``{reason="lower"}`` and logged as a warning, S20-R1);
    ``heal_unauthenticated()``: whether :meth:`sync` may overwrite a stored
    record it cannot authenticate (default: always; False while a higher
    master generation is pending here: the record may be the new master's,
    and overwriting it made the rotated instances re-publish it at once, a
    publish loop until the secret was provisioned, S20-FS1).
    """

    def __init__(self, client: Any, key_prefix: str, name: str, mac_key: bytes | Callable[[], Sequence[bytes]],
                 local_version: Callable[[], int], apply: Callable[[int, Any], Awaitable[None]],
                 metrics: _StateMetrics, *, local_body: Callable[[], Any] | None = None,
                 floor: Callable[[], int] | None = None,
                 heal_unauthenticated: Callable[[], bool] | None = None, poll_s: float = 1.0) -> None:
        self._client = client
        self._prefix = key_prefix
        self.name = name
        self._mac_keys: Callable[[], Sequence[bytes]] = mac_key if callable(mac_key) else (lambda: (mac_key,))
        self._local_version = local_version
        self._apply = apply
        self._local_body = local_body
        self._floor = floor if floor is not None else local_version
        self._heal_unauthenticated = heal_unauthenticated if heal_unauthenticated is not None else (lambda: True)
        self._metrics = metrics
        self._poll_s = poll_s
        self._script = client.register_script(_LUA_PUBLISH)
        self._task: asyncio.Task[None] | None = None
        self._last_rejected: str | None = None
        self._local_text: tuple[int, str | None] | None = None
        self._last_conflict: str | None = None
        self.rejected = 0
        self.adopted = 0

    @property
    def key(self) -> str:
        """The record's Redis key."""
        return f"{self._prefix}docs:{self.name}"

    @property
    def channel(self) -> str:
        """The change channel (shared by every document)."""
        return f"{self._prefix}docs:changed"

    def _mac(self, version: int, body: str, key: bytes | None = None) -> str:
        msg = (length_prefixed(self._prefix) + length_prefixed(self.name) + struct.pack(">Q", version)
               + body.encode())
        return hmac.new(key if key is not None else self._mac_keys()[0], msg, hashlib.sha256).hexdigest()

    def _verify(self, raw: str, current_only: bool = False) -> tuple[int, Any] | None:
        parts = raw.split(":", 2)
        version = record_number(parts[0]) if len(parts) == 3 else None  # ASCII digits only (S21-review-1)
        if version is None:
            return None
        keys = self._mac_keys()
        if version < 1 or not any(mac_matches(parts[1], self._mac(version, parts[2], k))  # S21-fixutf8-2
                                  for k in (keys[:1] if current_only else keys)):
            return None
        try:
            return version, json.loads(parts[2])
        except ValueError:
            return None

    async def _get(self) -> tuple[bytes | str | None, str | None]:
        """The stored record as Redis holds it (None: absent) and as text (:func:`record_text`: a record that
        is not UTF-8 reads as one no key authenticates, S21-fixutf8-1)."""
        raw = await self._client.get(self.key)
        return raw, None if raw is None else record_text(raw)

    async def publish(self, version: int, body: Any) -> bool:
        """Store ``body`` at ``version`` if above the stored version; returns True when stored, or
        when the same record (version and body) is already stored: a retried publish is not a conflict.

        A stored record that fails the MAC under every accepted subkey is replaced (tampering cannot
        block a change); one under a master still in grace is authentic: replaced only from above, or
        at its own version by the same body (re-MAC'd under the current master), never by a lower
        version or another body at its version (that is the race answered 409, S20-R2). While
        ``heal_unauthenticated()`` is False (a higher master pending here) a record this instance cannot
        authenticate may be the new master's: it is replaced only from above, as an authentic one (S21-review-4:
        it was replaced whatever its version, a change answered 200 and lost).
        """
        text = _text(body)
        stored, cur = await self._get()
        rec = None if cur is None else self._verify(cur)
        forged = cur is not None and rec is None and self._heal_unauthenticated()
        replaceable = stored if cur is not None and (forged or (  # the stored bytes: the script compares them
            rec is not None and rec[0] == version and cur.split(":", 2)[2] == text)) else ""
        record = f"{version}:{self._mac(version, text)}:{text}"
        return bool(await self._script(keys=[self.key], args=[version, record, self.channel, self.name,
                                                              replaceable]))

    async def remote_version(self) -> int:
        """The authenticated version stored in Redis (0: none or forged)."""
        _, cur = await self._get()
        rec = None if cur is None else self._verify(cur)
        return 0 if rec is None else rec[0]

    async def holds(self, version: int, body: Any) -> bool:
        """Whether Redis stores ``body`` at ``version`` (authenticated under an accepted subkey, the same text), or
        nothing while ``version`` is 0 (nothing was ever shared): this instance's document is the shared one
        (session 27, S27-review27-2: a write that changes nothing answers ``unchanged`` only then). Raises the
        client's errors."""
        _, cur = await self._get()
        if cur is None:
            return version == 0
        rec = self._verify(cur)
        return rec is not None and rec[0] == version and cur.split(":", 2)[2] == _text(body)

    async def stored_unauthenticated(self) -> bool:
        """True when Redis holds a record that no accepted subkey authenticates (a forgery, or a newer
        master's record while that master is pending here: :meth:`sync` then neither adopts nor replaces it)."""
        _, cur = await self._get()
        return cur is not None and self._verify(cur) is None

    async def sync(self) -> bool:
        """Adopt the stored document if authenticated and higher than the local one; returns True if adopted."""
        _, cur = await self._get()
        rec = None if cur is None else self._verify(cur)
        if cur is not None and rec is None:
            self._reject(cur, "unauthenticated")
        local = self._local_version()
        low = max(local, self._floor())  # below: a lower (older, replayed) record
        if rec is not None and rec[0] < low:
            self._reject(cur or "", "lower")
        stale = rec is not None and cur is not None and self._verify(cur, current_only=True) is None
        # stale: a master in grace; the same body is re-MAC'd, another one at this version is the race (S17-1)
        if rec is None or rec[0] < low or (stale and rec[0] == local and not self._differs(cur or "", local)):
            if rec is not None or cur is None or self._heal_unauthenticated():
                await self._heal(local)
            return False
        version, body = rec
        if version == local and not self._differs(cur or "", local):
            return False
        if version == local and cur != self._last_conflict:  # S17-1: two changes raced to one version
            self._last_conflict = cur  # counted and logged once; the stored one wins everywhere
            self._metrics.rejected.labels(self.name, "conflict").inc()
            log.error("shared state: this instance's %s version %d is not the stored one (two changes made "
                      "at once on two instances); adopting the stored one", self.name, version)
        await self._apply(version, body)
        self._local_text = None
        self.adopted += 1
        self._metrics.adopted.labels(self.name).inc()
        log.info("shared state: adopted %s version %d", self.name, version)
        if self._local_version() > version:  # adopted under a new number (apply's choice): share it
            await self._heal(self._local_version())
        return True

    def _differs(self, raw: str, local: int) -> bool:
        """True when the stored record (at this instance's version ``local``) holds another body
        than this instance's (S17-1); the local text is cached per local version."""
        if self._local_body is None:
            return False
        if self._local_text is None or self._local_text[0] != local:
            body = self._local_body()
            self._local_text = (local, None if body is None else _text(body))
        text = self._local_text[1]
        return text is not None and raw.split(":", 2)[2] != text

    async def _heal(self, local: int) -> None:
        body = self._local_body() if self._local_body is not None and local > 0 else None
        if body is not None:
            await self.publish(local, body)

    def _reject(self, raw: str, reason: str) -> None:
        if raw == self._last_rejected:  # count and alert a bad record once, not at every poll
            return
        self._last_rejected = raw
        self.rejected += 1
        self._metrics.rejected.labels(self.name, reason).inc()
        log.warning("shared state: ignored a %s record (%s)", self.name, reason)

    async def run(self) -> None:
        """Adopt changes until cancelled: now, on each channel message and every ``poll_s`` seconds."""
        await follow_changes(self._client, self.channel, self.sync, self._poll_s, self.name)

    def start(self) -> None:
        """Run :meth:`run` as a task of the running loop."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self.run(), name=f"prefixgate-shared-{self.name}")

    async def aclose(self) -> None:
        """Stop the task started by :meth:`start`."""
        if self._task is not None:
            await cancel_task(self._task)
            self._task = None
