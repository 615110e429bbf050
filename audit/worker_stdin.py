"""The audit worker's stdin, read at most once per ``interval_s`` (issue 14, session 7).

The gateway writes each answer's event into the worker's pipe before the
answer's last body part (docs/audit.md, "What a SIGKILL can lose"), so under
load a reader that waits on the pipe's readability wakes once per answer:
an event-loop wake, a ``read`` syscall, a coroutine resume and a status check
per event. :class:`BatchedPipeReader` instead reads what the pipe holds, then
leaves the pipe alone for ``interval_s`` seconds (frames written meanwhile
wait in the pipe, which is kernel memory: they outlive a SIGKILLed gateway
exactly as before, and the worker still reads the pipe to EOF), so a busy
worker wakes once per interval for however many events arrived, and an idle
one not at all (it waits on readability, with no timer).

The pipe is enlarged to :data:`PIPE_SIZE` bytes where Linux allows it, so
that the frames of one interval fit in it even in a burst (a full pipe only
makes the gateway's transport keep the rest in its own buffer, as when the
worker is behind).
"""
from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os

#: Longest time (seconds) a frame waits in the pipe before the worker reads it
#: (plus the time the worker spends on the previous read's frames). 20 ms from session 7,
#: 50 ms from session 14 (issue 14: fewer, larger bursts; session 7 measured 142 -> 127 us of
#: worker CPU per event for 20 -> 50 ms).
READ_INTERVAL_S = 0.05
#: Bytes read from the pipe at once.
READ_CHUNK = 1 << 18
#: Pipe capacity asked for (bytes; best effort, capped by /proc/sys/fs/pipe-max-size).
PIPE_SIZE = 1 << 20
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)  # Linux


class BatchedPipeReader:
    """Non-blocking reads of the pipe at ``fd``, at most one wake per ``interval_s``.

    Args:
        fd: the read end of a pipe (the worker's stdin, fd 0); set non-blocking here.
        interval_s: least time (seconds) between the end of one :meth:`read` and the
            next read of the pipe; 0 reads as soon as data is there.
        chunk: bytes per ``os.read``.

    Used from one coroutine at a time, on a running event loop (``add_reader``).
    """

    def __init__(self, fd: int, interval_s: float = READ_INTERVAL_S, chunk: int = READ_CHUNK) -> None:
        self.fd = fd
        self.interval_s = interval_s
        self.chunk = chunk
        self._buf = bytearray()
        self._not_before = 0.0
        self.reads = 0  #: :meth:`read` calls that returned data or EOF (for tests and benchmarks)
        os.set_blocking(fd, False)
        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, _F_SETPIPE_SZ, PIPE_SIZE)

    async def _wait_readable(self) -> None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()

        def ready() -> None:
            if not fut.done():
                fut.set_result(None)

        loop.add_reader(self.fd, ready)
        try:
            await fut
        finally:
            loop.remove_reader(self.fd)

    async def read(self) -> bytes:
        """Everything the pipe holds (at least one byte), or ``b""`` at EOF.

        Waits until ``interval_s`` has passed since the previous call returned, then
        until the pipe is readable; returns the bytes left by :meth:`readline` first.
        Raises ``OSError`` for read errors other than "nothing there yet".
        """
        if self._buf:
            data, self._buf = bytes(self._buf), bytearray()
            return data
        loop = asyncio.get_running_loop()
        delay = self._not_before - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        parts: list[bytes] = []
        while True:
            try:
                data = os.read(self.fd, self.chunk)
            except BlockingIOError:
                if parts:
                    break
                await self._wait_readable()
                continue
            if not data:  # EOF: return what came before it first
                break
            parts.append(data)
            if len(data) < self.chunk:
                break
        self.reads += 1
        self._not_before = loop.time() + self.interval_s
        return b"".join(parts)

    async def readline(self) -> bytes:
        """One line including its ``\\n`` (the config line), or what is left at EOF; the bytes
        after it are returned by the next :meth:`read`. Not rate-limited (startup only)."""
        while True:
            nl = self._buf.find(b"\n")
            if nl >= 0:
                line = bytes(self._buf[:nl + 1])
                del self._buf[:nl + 1]
                return line
            try:
                data = os.read(self.fd, self.chunk)
            except BlockingIOError:
                await self._wait_readable()
                continue
            if not data:
                line, self._buf = bytes(self._buf), bytearray()
                return line
            self._buf += data
