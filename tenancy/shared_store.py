"""The Redis connection of the shared tenant state (issue 16): the client built from the
``state`` config, the registered scripts and key names of one instance, the
background writer that applies updates which must never block a request's end,
and the two task helpers every shared record uses (:func:`follow_changes`,
:func:`cancel_task`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from tenancy import shared_lua as lua
from tenancy.private_file import read_private_file

__all__ = ["StateSetupError", "Store", "Writer", "cancel_task", "follow_changes", "redis_client"]

log = logging.getLogger("prefixgate.state")

_MAX_PASSWORD_BYTES = 4096


class StateSetupError(Exception):
    """The ``state`` configuration cannot be used (password file unsafe, variable unset)."""


# --- task helpers ------------------------------------------------------------------------------


async def cancel_task(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and wait for it to end, cancelling again if a library swallowed the
    cancellation (redis-py can lose a cancel that lands as a client-side read timeout fires).
    Whatever the task ended with (cancelled, an exception) is not raised."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=0.5)
    with contextlib.suppress(asyncio.CancelledError, Exception):
        task.result()


async def follow_changes(client: Any, channel: str, sync: Callable[[], Awaitable[object]], poll_s: float,
                         what: str) -> None:
    """Run ``sync()`` now, then after each message on the Pub/Sub ``channel`` and at least every
    ``poll_s`` seconds, until cancelled. A failed round (Redis down, an apply that raised) is
    logged as a warning naming ``what``; the local state is kept, the loop waits ``poll_s``,
    subscribes again and goes on."""
    pubsub = client.pubsub()
    await pubsub.subscribe(channel)
    try:
        while True:
            try:
                await sync()
                await pubsub.get_message(ignore_subscribe_messages=True, timeout=poll_s)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - Redis down or apply failed: keep state, retry
                log.warning("shared %s sync failed (%s)", what, exc.__class__.__name__)
                await asyncio.sleep(poll_s)
                with contextlib.suppress(Exception):
                    await pubsub.subscribe(channel)
    finally:
        with contextlib.suppress(Exception):
            await pubsub.aclose()


# --- the background writer -------------------------------------------------------------------


class Writer:
    """FIFO of Redis updates that must not block their caller (releases, settlements).

    An update is a coroutine function ``op(pipe)`` that queues its commands on
    a Redis pipeline (``pipe``, non-transactional). One task drains the queue
    in order, up to ``BATCH`` updates per round trip; a batch that fails to
    reach Redis is retried (backoff up to 1 s) until it succeeds or the writer
    is closed, an update that Redis refuses by itself (a script error) is
    logged and dropped. ``pending`` counts queued updates; at most
    ``max_pending`` are held (Redis unreachable for long): a further update
    is dropped and counted in ``dropped`` (a dropped release costs nothing
    lasting, its slot expires with the lease TTL; a dropped settlement leaves
    the reservation's tokens taken).
    """

    BATCH = 256

    def __init__(self, client: Any, max_pending: int = 10_000) -> None:
        if max_pending < 1:
            raise ValueError("max_pending must be >= 1")
        self.client = client
        self.max_pending = max_pending
        self.dropped = 0
        self.refused = 0
        self._queue: deque[Callable[[Any], Any]] = deque()
        self._event = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self.failures = 0

    @property
    def pending(self) -> int:
        """Updates queued and not yet applied."""
        return len(self._queue)

    def submit(self, op: Callable[[Any], Any]) -> None:
        """Queue ``op`` (a coroutine function of a pipeline); starts the drain task on first use."""
        if len(self._queue) >= self.max_pending:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.error("shared state: %d queued updates dropped (Redis unreachable, queue full)", self.dropped)
            return
        self._queue.append(op)
        self._idle.clear()
        self._event.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="prefixgate-state-writer")

    async def _run(self) -> None:
        backoff = 0.05
        while True:
            if not self._queue:
                self._idle.set()
                self._event.clear()
                await self._event.wait()
                continue
            batch = [self._queue[i] for i in range(min(self.BATCH, len(self._queue)))]
            try:
                pipe = self.client.pipeline(transaction=False)
                for op in batch:
                    await op(pipe)
                results = await pipe.execute(raise_on_error=False)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - Redis down: retry, never drop silently
                self.failures += 1
                log.warning("shared state update failed (%s); retrying", exc.__class__.__name__)
                await asyncio.sleep(backoff)
                backoff = min(1.0, backoff * 2)
                continue
            backoff = 0.05
            for _ in batch:
                self._queue.popleft()
            errors = [r for r in results if isinstance(r, Exception)]
            if errors:
                self.refused += len(errors)
                log.error("shared state: Redis refused %d queued updates (%s)", len(errors),
                          errors[0].__class__.__name__)

    async def flush(self) -> None:
        """Wait until every queued update is applied."""
        await self._idle.wait()

    async def aclose(self) -> None:
        """Stop the drain task (queued updates not yet applied are dropped; leases then expire)."""
        if self._task is not None:
            await cancel_task(self._task)
            self._task = None


class Store:
    """The client, key prefix, registered scripts and writer of one instance.

    ``lease_ttl_s``: concurrency-slot lease (0 < ttl <= 10 s);
    ``max_pending``: bound of the writer's queue. Raises :class:`ValueError`."""

    def __init__(self, client: Any, key_prefix: str, lease_ttl_s: float, max_pending: int = 10_000) -> None:
        if not 0 < lease_ttl_s <= 10:
            raise ValueError("lease_ttl_s must be in (0, 10]")
        self.client = client
        self.prefix = key_prefix
        self.lease_ttl_ms = max(1, int(lease_ttl_s * 1000))
        self.admit = client.register_script(lua.ADMIT)
        self.renew = client.register_script(lua.RENEW)
        self.count = client.register_script(lua.COUNT)
        self.take = client.register_script(lua.TAKE)
        self.reserve = client.register_script(lua.RESERVE)
        self.adjust = client.register_script(lua.ADJUST)
        self.level = client.register_script(lua.LEVEL)
        self.writer = Writer(client, max_pending)

    def key(self, tenant_id: str, name: str) -> str:
        """``<prefix>{t:<tenant>}:<name>``."""
        return f"{self.prefix}{{t:{tenant_id}}}:{name}"


def _read_password_file(path: str) -> str:
    data = read_private_file(path, "state.password_file", _MAX_PASSWORD_BYTES, StateSetupError)
    return data.decode("utf-8").rstrip("\r\n")


def redis_client(cfg: Any) -> Any:
    """A :class:`redis.asyncio.Redis` for a ``state`` config (:class:`gateway.config.StateConfig`).

    ``url``; ``username``; the password from ``password_file`` (mode 0600,
    checked) or the variable ``password_env``; ``tls_ca_file`` verifies a
    ``rediss://`` server. Raises :class:`StateSetupError` (messages never
    hold the password). Connects lazily (the first command).
    """
    import redis.asyncio as aioredis

    if not cfg.url:
        raise StateSetupError("state.url is required when state.backend is redis")
    password = None
    if cfg.password_file:
        password = _read_password_file(cfg.password_file)
    elif cfg.password_env:
        password = os.environ.get(cfg.password_env)
        if not password:
            raise StateSetupError(f"state.password_env: environment variable {cfg.password_env!r} is not set")
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    # fail fast when Redis is down (admission must not wait seconds): one immediate retry covers a
    # pooled connection that a Redis restart closed; command_timeout_s bounds connect and reply
    timeout = getattr(cfg, "command_timeout_s", 0.5)
    kwargs: dict[str, Any] = {"socket_timeout": timeout, "socket_connect_timeout": timeout,
                              "retry": Retry(NoBackoff(), 1)}
    if cfg.username:
        kwargs["username"] = cfg.username
    if password is not None:
        kwargs["password"] = password
    if cfg.tls_ca_file:
        kwargs["ssl_ca_certs"] = cfg.tls_ca_file
        kwargs["ssl_cert_reqs"] = "required"
    return aioredis.Redis.from_url(cfg.url, **kwargs)

