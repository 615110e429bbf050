"""The Redis connection of the shared tenant state (issue 16): the client built from the
``state`` config, the registered scripts and key names of one instance, the
background writer that applies updates which must never block a request's end,
and the helpers every shared record uses (:func:`follow_changes`,
:func:`cancel_task`, :func:`record_number`, :func:`record_text`, :func:`mac_matches`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from tenancy import shared_lua as lua
from tenancy.shared_batch import BatchedScript, ScriptBatcher
from tenancy.private_file import read_private_file

__all__ = ["NOT_UTF8", "StateSetupError", "Store", "Writer", "cancel_task", "follow_changes", "mac_matches",
           "record_number", "record_text", "redis_client"]

log = logging.getLogger("prefixgate.state")

_MAX_PASSWORD_BYTES = 4096


class StateSetupError(Exception):
    """The ``state`` configuration cannot be used (password file unsafe, variable unset)."""


# --- task helpers ------------------------------------------------------------------------------


#: the largest number a shared record's MAC covers (``struct.pack(">Q")``: versions, epochs, generations)
_MAX_RECORD_NUMBER = (1 << 64) - 1


#: the start of :func:`record_text`'s text of a value that is not UTF-8 (U+FFFD: not a digit, not ASCII)
NOT_UTF8 = "\ufffd"


def record_number(text: str) -> int | None:
    """The number a version, epoch or generation field of a shared record (read from Redis) holds: ``text``
    of 1-20 ASCII digits up to 2**64 - 1, else None (the record is then not authentic: ignored, counted and
    written over like a bad MAC). ``str.isdigit`` alone is not that check: it is also true of ``"\u00b2"``
    and other Unicode digits, and of more than 4,300 digits, on which ``int()`` raises ``ValueError``, and
    a record that raised stalled every sync and publish over it (session 21, S21-review-1). Raises nothing."""
    if not (0 < len(text) <= 20 and text.isascii() and text.isdigit()):
        return None
    value = int(text)
    return value if value <= _MAX_RECORD_NUMBER else None


def record_text(raw: bytes | str) -> str:
    """The text of a shared record, field, hash key or stream field as read from Redis (the state
    client returns bytes): ``raw`` decoded as strict UTF-8. A value that is not UTF-8 (no instance
    writes one) becomes :data:`NOT_UTF8` followed by its backslash-escaped text: a text no reader
    authenticates (its first field is not digits, its MAC field not ASCII), so the record is ignored,
    counted and written over like a bad MAC; a caller that replaces it passes the stored BYTES to the
    script, which compares them. ``str`` is returned as is. A bare ``decode()`` raised
    ``UnicodeDecodeError`` out of the reader, which stalled every sync and publish over the record as
    S21-review-1's digits did (session 21, S21-fixutf8-1). Raises nothing."""
    if isinstance(raw, str):
        return raw
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return NOT_UTF8 + raw.decode("utf-8", "backslashreplace")


def mac_matches(stored: str, expected: str) -> bool:
    """Whether a MAC (or key-check) field read from Redis equals ``expected`` (hex), in constant time.
    A ``stored`` field with a non-ASCII character is no match: ``hmac.compare_digest`` raises
    ``TypeError`` on such a ``str``, which stalled the reader like a bad number (S21-fixutf8-2).
    Raises nothing for ``str`` arguments."""
    return stored.isascii() and hmac.compare_digest(stored, expected)


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
    logged as a warning naming ``what`` (once per run of failures of one kind: a record this
    instance refuses, R10-1, fails every round until a newer one comes; the rounds after the
    first are logged at debug level); the local state is kept, the loop waits ``poll_s``,
    subscribes again and goes on."""
    pubsub = client.pubsub()
    await pubsub.subscribe(channel)
    failing: str | None = None  # the failure kind of the current run of failed rounds
    try:
        while True:
            try:
                await sync()
                failing = None
                await pubsub.get_message(ignore_subscribe_messages=True, timeout=poll_s)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - Redis down or apply failed: keep state, retry
                kind = exc.__class__.__name__
                (log.debug if kind == failing else log.warning)("shared %s sync failed (%s)", what, kind)
                failing = kind
                await asyncio.sleep(poll_s)
                with contextlib.suppress(Exception):
                    await pubsub.subscribe(channel)
    finally:
        with contextlib.suppress(Exception):
            await pubsub.aclose()


# --- the background writer -------------------------------------------------------------------


class Writer:
    """FIFO of Redis updates that must not block their caller (releases, settlements).

    An update is ``(keys, args)``: the four keys of one tenant (concurrency
    set, ledger prompt and output buckets, ledger totals) and that update's
    arguments of the ``APPLY`` script (:mod:`tenancy.shared_lua`: a release
    ``['r', n, member...]`` or a settle / lower ``['a', ...]``). One task
    drains the queue: up to ``BATCH`` queued updates at a time, one ``APPLY``
    call per tenant holding all of that tenant's updates in order, the calls
    of a drain sent in one pipeline with the request path's script calls
    (:class:`tenancy.shared_batch.ScriptBatcher`), so a release and a settle
    cost no round trip of their own. A call that fails to reach Redis is
    retried (its updates go back to the head of the queue, in order; backoff
    up to 1 s) until it succeeds or the writer is closed; an update that Redis
    refuses by itself (a script error) is logged and dropped (``refused``).
    ``pending`` counts queued updates; at most ``max_pending`` are held
    (Redis unreachable for long): a further update is dropped and counted in
    ``dropped`` (a dropped release costs nothing lasting, its slot expires
    with the lease TTL; a dropped settlement leaves the reservation's tokens
    taken).
    """

    BATCH = 256

    def __init__(self, apply: Callable[..., Awaitable[Any]], max_pending: int = 10_000) -> None:
        if max_pending < 1:
            raise ValueError("max_pending must be >= 1")
        self.apply = apply
        self.max_pending = max_pending
        self.dropped = 0
        self.refused = 0
        self._queue: deque[tuple[tuple[str, ...], list[Any]]] = deque()
        self._event = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self.failures = 0

    @property
    def pending(self) -> int:
        """Updates queued and not yet applied."""
        return len(self._queue)

    def submit(self, keys: tuple[str, ...], args: list[Any]) -> None:
        """Queue one update (see the class doc); starts the drain task on first use."""
        if len(self._queue) >= self.max_pending:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.error("shared state: %d queued updates dropped (Redis unreachable, queue full)", self.dropped)
            return
        self._queue.append((keys, args))
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
            batch = [self._queue.popleft() for _ in range(min(self.BATCH, len(self._queue)))]
            groups: dict[tuple[str, ...], list[tuple[tuple[str, ...], list[Any]]]] = {}
            for update in batch:
                groups.setdefault(update[0], []).append(update)
            try:
                results = await asyncio.gather(
                    *(self.apply(keys=list(k), args=[a for u in us for a in u[1]]) for k, us in groups.items()),
                    return_exceptions=True)
            except asyncio.CancelledError:
                self._queue.extendleft(reversed(batch))
                raise
            failed: list[tuple[tuple[str, ...], list[Any]]] = []
            first_error: BaseException | None = None
            for us, res in zip(groups.values(), results, strict=True):
                if isinstance(res, asyncio.CancelledError):
                    raise res
                if isinstance(res, _unreachable()):
                    failed.extend(us)
                    first_error = first_error or res
                elif isinstance(res, BaseException):  # Redis refused the call itself (a script error)
                    self.refused += len(us)
                    log.error("shared state: Redis refused %d queued updates (%s)", len(us), res.__class__.__name__)
                elif res:
                    self.refused += int(res)
                    log.error("shared state: Redis refused %d queued updates", int(res))
            if failed:
                self._queue.extendleft(reversed(failed))  # back to the head, in order
                self.failures += 1
                log.warning("shared state update failed (%s); retrying", first_error.__class__.__name__)
                await asyncio.sleep(backoff)
                backoff = min(1.0, backoff * 2)
                continue
            backoff = 0.05

    async def flush(self) -> None:
        """Wait until every queued update is applied."""
        await self._idle.wait()

    async def aclose(self) -> None:
        """Stop the drain task (queued updates not yet applied are dropped; leases then expire)."""
        if self._task is not None:
            await cancel_task(self._task)
            self._task = None


def _unreachable() -> tuple[type[BaseException], ...]:
    """Errors that mean "Redis did not get or answer the call" (retry), not "Redis refused it"."""
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    return (RedisConnectionError, RedisTimeoutError, OSError, asyncio.TimeoutError)


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
        self._update_keys: dict[str, tuple[str, str, str, str]] = {}
        #: the request path's script calls (and the writer's) leave in pipelined batches, one per loop tick
        self.batcher = ScriptBatcher(client)
        self.admit = BatchedScript(self.batcher, client.register_script(lua.ADMIT))
        self.slot = BatchedScript(self.batcher, client.register_script(lua.SLOT))
        self.renew = BatchedScript(self.batcher, client.register_script(lua.RENEW))
        self.count = BatchedScript(self.batcher, client.register_script(lua.COUNT))
        self.take = BatchedScript(self.batcher, client.register_script(lua.TAKE))
        self.reserve = BatchedScript(self.batcher, client.register_script(lua.RESERVE))
        self.level = BatchedScript(self.batcher, client.register_script(lua.LEVEL))
        self.writer = Writer(BatchedScript(self.batcher, client.register_script(lua.APPLY)), max_pending)

    def key(self, tenant_id: str, name: str) -> str:
        """``<prefix>{t:<tenant>}:<name>``."""
        return f"{self.prefix}{{t:{tenant_id}}}:{name}"

    def update_keys(self, tenant_id: str) -> tuple[str, str, str, str]:
        """The keys of one tenant's queued updates (:class:`Writer`): concurrency set, ledger
        prompt and output buckets, ledger totals."""
        keys = self._update_keys.get(tenant_id)
        if keys is None:
            if len(self._update_keys) > 4096:
                self._update_keys.clear()
            keys = self._update_keys[tenant_id] = (self.key(tenant_id, "conc"), self.key(tenant_id, "led:ptok"),
                                                   self.key(tenant_id, "led:otok"), self.key(tenant_id, "led:tot"))
        return keys


def _read_password_file(path: str) -> str:
    data = read_private_file(path, "state.password_file", _MAX_PASSWORD_BYTES, StateSetupError)
    return data.decode("utf-8").rstrip("\r\n")


def redis_client(cfg: Any) -> Any:
    """A :class:`redis.asyncio.Redis` for a ``state`` config (:class:`gateway.config.StateConfig`).

    ``url``; ``username``; the password from ``password_file`` (mode 0600,
    checked) or the variable ``password_env``; ``tls_ca_file`` verifies a
    ``rediss://`` server (TLS 1.2 floor and forward-secret suites:
    :mod:`audit.tls`). Raises :class:`StateSetupError` (messages never
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
    if cfg.url.startswith("rediss://"):  # S19-R3: redis-py builds the context; the floor and suites of audit/tls.py
        from audit.tls import FORWARD_SECRET_CIPHERS, MINIMUM_VERSION

        kwargs["ssl_min_version"] = MINIMUM_VERSION
        kwargs["ssl_ciphers"] = FORWARD_SECRET_CIPHERS
    if cfg.tls_ca_file:
        kwargs["ssl_ca_certs"] = cfg.tls_ca_file
        kwargs["ssl_cert_reqs"] = "required"
    return aioredis.Redis.from_url(cfg.url, **kwargs)

