"""The client side of one request: disconnect detection and a streaming answer
that ends its request however its ASGI call ends."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

__all__ = ["ClientGone", "ConnectionLoss", "EndingStreamingResponse", "LOSS_KEY", "WATCH_AFTER_S",
           "scope_loop", "unless_client_leaves"]

T = TypeVar("T")
log = logging.getLogger("gateway.client_io")

#: the ASGI scope key holding the connection's :class:`ConnectionLoss` (set by the guarded listener)
LOSS_KEY = "prefixgate.connection_loss"


class ConnectionLoss:
    """Callbacks run once, when a client connection is lost (issue 14).

    The guarded listener (gateway/http_guard.py) makes one per connection, puts it in every
    request scope of that connection under :data:`LOSS_KEY` and calls :meth:`fire` from the
    protocol's ``connection_lost``. :func:`unless_client_leaves` registers a callback while its
    work runs, instead of a timer and a watcher task reading ``receive``. Use from the event
    loop's thread only."""

    __slots__ = ("lost", "_callbacks", "abort", "loop", "unsent", "write_through")

    def __init__(self) -> None:
        self.lost = False
        #: the connection's event loop, noted at its first use by :func:`unless_client_leaves` (session 10:
        #: ``asyncio.current_task()`` without a loop looks the running loop up, a ``getpid`` system call on
        #: CPython 3.11; with it, a dict lookup)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._callbacks: set[Callable[[], None]] = set()
        #: aborts the connection (set by the guarded listener; gateway/write_stall.py uses it)
        self.abort: Callable[[], None] | None = None
        #: the bytes its transport still buffers (set by the guarded listener; gateway/answer_cost.py, R10b-5)
        self.unsent: Callable[[], int] | None = None
        #: turns its transport's write-through on (True) or off (set by the guarded listener;
        #: gateway/coalesce.py ``CoalescingTransport.write_through``, session 28); None: no such transport
        self.write_through: Callable[[bool], None] | None = None

    def add(self, callback: Callable[[], None]) -> bool:
        """Call ``callback`` (no arguments) when the connection is lost; False (not added) if it already was."""
        if self.lost:
            return False
        self._callbacks.add(callback)
        return True

    def discard(self, callback: Callable[[], None]) -> None:
        """Forget ``callback`` (no error if it is not there)."""
        self._callbacks.discard(callback)

    def pending(self) -> int:
        """Callbacks registered and not yet called."""
        return len(self._callbacks)

    def fire(self) -> None:
        """The connection is lost: call every callback once (each guarded; errors are logged)."""
        if self.lost:
            return
        self.lost = True
        callbacks, self._callbacks = self._callbacks, set()
        for callback in callbacks:
            try:
                callback()
            except Exception:  # a bug in one callback must not keep the others from running
                log.exception("connection-loss callback failed")


class EndingStreamingResponse(StreamingResponse):
    """A streaming answer that ends its request however its ASGI call ends.

    The body generator ends the request in its own ``finally``; but when the
    generator never started — the first ``send`` failed because the client
    was gone (ASGI 2.4: ``OSError``), or the sending task was cancelled
    before its first step — that ``finally`` never runs, and a generator left
    suspended at a ``yield`` only runs it whenever it is garbage-collected.
    So the call closes the generator (running its ending now if it stopped
    mid-way) and then calls ``on_end`` (idempotent), whatever way it ended.

    Under ASGI < 2.4 (uvicorn's servers say 2.3) Starlette streams in an anyio
    task group beside a disconnect listener; here the stream runs in the
    calling task and is cancelled when the client disconnects — told by the
    guarded listener's :class:`ConnectionLoss` in the scope, or else by one
    asyncio watcher reading ``receive`` (as :func:`unless_client_leaves`): the same ending — the
    stream is cancelled at its current ``await`` and the call returns — for
    less work per answer. ASGI >= 2.4 and websockets go to Starlette.
    """

    #: the connection's :class:`ConnectionLoss` once called (the scope's, under :data:`LOSS_KEY`; None: none): the
    #: body may turn its transport's write-through on and off (``ConnectionLoss.write_through``, session 28)
    loss: ConnectionLoss | None = None

    def __init__(self, content: AsyncGenerator[bytes, None], *, on_end: Callable[[], None], **kw: Any) -> None:
        super().__init__(content, **kw)
        self._on_end = on_end
        self._content = content

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.loss = scope.get(LOSS_KEY)
        try:
            if scope["type"] == "http" and scope.get("asgi", {}).get("spec_version", "2.0") in _LISTENING_SPECS:
                await self._stream_until_disconnect(receive, send, scope.get(LOSS_KEY))
            else:
                await super().__call__(scope, receive, send)
        finally:
            try:
                await self._content.aclose()
            finally:
                self._on_end()


    async def _stream_until_disconnect(self, receive: Receive, send: Send, loss: ConnectionLoss | None) -> None:
        """``stream_response(send)`` in this task, cancelled if the client disconnects first: told by
        ``loss`` (the guarded listener's, not yet fired: no task) or else by a watcher reading ``receive``."""
        task = _current_task(loss)
        assert task is not None
        gone = False

        def on_lost() -> None:
            nonlocal gone
            gone = True
            task.cancel()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            on_lost()

        watcher = asyncio.ensure_future(watch()) if loss is None or not loss.add(on_lost) else None
        try:
            await self.stream_response(send)
        except asyncio.CancelledError:
            if not gone or task.uncancel() > 0:  # not (only) ours: pass it on
                raise
        finally:
            if watcher is not None:
                watcher.cancel()
            elif loss is not None:
                loss.discard(on_lost)
        if gone and task.cancelling():  # the stream swallowed our cancellation after finishing
            task.uncancel()
        if self.background is not None:
            await self.background()


#: ASGI spec versions under which Starlette would listen for the disconnect in a task group
_LISTENING_SPECS = frozenset({"2.0", "2.1", "2.2", "2.3"})


#: seconds ``work`` may run before :func:`unless_client_leaves` starts listening for a disconnect
WATCH_AFTER_S = 0.002


class ClientGone(Exception):
    """The client disconnected before the answer started (its upstream call is cancelled)."""


async def unless_client_leaves(request: Request, work: Awaitable[T]) -> T:
    """Await ``work`` unless the client disconnects first: then cancel it and raise :class:`ClientGone`.

    Call only after the request body was read (it listens on ``receive``).
    ``work`` runs in the calling task; one watcher task waits for the
    disconnect and, if it comes first, cancels the calling task (the
    cancellation lands inside ``work``: the watcher runs only while the
    caller is suspended there), which is turned into :class:`ClientGone`. A
    cancellation from anyone else is passed on unchanged. The watcher is started
    only once ``work`` has been waiting :data:`WATCH_AFTER_S` (a ``call_later``
    callback, cancelled if ``work`` finishes first): work that never waits (flow
    control's fast path) or ends sooner (a short upstream call on a fast replica)
    costs no task; a client that leaves is noticed at most that much later (issue 14).
    On the guarded listener (the request's scope holds a :class:`ConnectionLoss` under
    :data:`LOSS_KEY`, not yet fired) neither timer nor watcher is used: the protocol's
    ``connection_lost`` cancels the calling task at once (a callback registered while ``work``
    runs); a connection already lost takes the timer/watcher path (``receive`` reports it).
    """
    scope = getattr(request, "scope", None)
    loss = scope.get(LOSS_KEY) if scope is not None else None
    task = _current_task(loss)
    if task is None:  # not in a task: nothing to cancel
        return await work
    gone = False
    if loss is not None and not loss.lost:  # the guarded listener tells us: no timer, no task

        def on_lost() -> None:  # runs only while the caller is suspended in ``work``
            nonlocal gone
            gone = True
            task.cancel()

        loss.add(on_lost)
        try:  # _cancelled_means_gone's steps inline: one coroutine frame less per upstream call (session 15)
            result = await work
        except asyncio.CancelledError:
            if not gone or task.uncancel() > 0:  # not (only) ours: someone else cancelled the request too
                raise
            raise ClientGone() from None
        finally:
            loss.discard(on_lost)
        if gone:  # ``work`` swallowed the cancellation: the client is gone all the same
            task.uncancel()
            raise ClientGone()
        return result
    watcher: asyncio.Future[None] | None = None

    async def watch() -> None:
        nonlocal gone
        await _wait_disconnect(request)
        gone = True
        task.cancel()

    def start_watcher() -> None:  # runs only while the caller is suspended in ``work``
        nonlocal watcher
        watcher = asyncio.ensure_future(watch())

    starting = task.get_loop().call_later(WATCH_AFTER_S, start_watcher)
    try:
        return await _cancelled_means_gone(task, work, lambda: gone)
    finally:
        starting.cancel()
        if watcher is not None:
            watcher.cancel()


def _current_task(loss: ConnectionLoss | None) -> asyncio.Task[Any] | None:
    """``asyncio.current_task()``; with ``loss``, on the connection's loop noted there (looked up once per
    connection: on CPython 3.11 each running-loop lookup is a ``getpid`` system call; session 10)."""
    if loss is None:
        return asyncio.current_task()
    return asyncio.current_task(_loss_loop(loss))


def _loss_loop(loss: ConnectionLoss) -> asyncio.AbstractEventLoop:
    loop = loss.loop
    if loop is None:
        loop = loss.loop = asyncio.get_running_loop()
    return loop


def scope_loop(scope: Scope) -> asyncio.AbstractEventLoop:
    """The running event loop, for code running in the ASGI call of ``scope`` (call from that loop's
    thread only). On the guarded listener the loop noted in the connection's :class:`ConnectionLoss`
    (:data:`LOSS_KEY`; looked up once per connection, then an attribute read); elsewhere
    ``asyncio.get_running_loop()``. Session 13: the pipeline's per-request lookup was the gateway's one
    ``getpid`` system call per request (CPython 3.11 checks the process id on each running-loop lookup).
    Raises ``RuntimeError`` when no loop runs and the scope has no connection loop noted yet."""
    loss = scope.get(LOSS_KEY)
    if loss is None:
        return asyncio.get_running_loop()
    return _loss_loop(loss)


async def _cancelled_means_gone(task: asyncio.Task[Any], work: Awaitable[T], gone: Callable[[], bool]) -> T:
    """Await ``work`` in ``task``; a cancellation that ``gone()`` says came from the client's
    departure becomes :class:`ClientGone` (and is taken back with ``uncancel``); any other
    cancellation is passed on. ``work`` that swallowed our cancellation still raises ClientGone."""
    try:
        result = await work
    except asyncio.CancelledError:
        if not gone() or task.uncancel() > 0:  # not (only) ours: someone else cancelled the request too
            raise
        raise ClientGone() from None
    if gone():  # ``work`` swallowed the cancellation: the client is gone all the same
        task.uncancel()
        raise ClientGone()
    return result


async def _wait_disconnect(request: Request) -> None:
    """Return when the client disconnects (consumes no body: call after reading it)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
