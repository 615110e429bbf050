"""Running the audit worker child for :class:`audit.remote.RemoteAuditLog`: spawn, read its frames, restart it.

The worker (:mod:`audit.worker`) gets the ``audit`` config on its stdin and
answers ``ready`` or ``error``; afterwards it sends ``status`` (acknowledged
sequence number, accepting, dropped, spill bytes), ``metrics`` and ``reply``
frames on its stdout. When it exits it is restarted with a doubling backoff
and sent the backlog again.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import orjson

from audit.backoff import Backoff
from audit.event import AuditEvent, Kind, Outcome

# the RemoteAuditLog's logger: these records keep the name they had before the split
log = logging.getLogger("audit.remote")

#: Seconds a worker must have run for the restart backoff to start over.
STABLE_S = 10.0


class AuditWorkerError(RuntimeError):
    """The audit worker could not start; ``kind`` names the worker-side error
    class (e.g. ``AuditConfigError``, ``AuditDirectoryInUse``, ``KeyFileError``)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}" if kind else message)
        self.kind = kind


class WorkerProcess:
    """The child-process side of :class:`audit.remote.RemoteAuditLog` (a mixin):
    spawn the worker and hand it the config, resend the unacknowledged backlog
    in order, read its status/metrics/reply frames, restart it with backoff, wait for it to
    drain (:meth:`drain`, moved here in session 17).

    Uses the log's ``_python``, ``_config``, ``_start_timeout``, ``_restart``,
    ``_unacked``, ``_spool``, ``metrics``, ``_ack``, ``_update_accepting``, ``emit``,
    ``_worker_alive``, ``_write_control``, ``_next_id`` and ``_replies``."""

    async def drain(self, timeout_s: float = 10.0) -> bool:
        """Wait until the worker has taken every event sent so far and its sinks
        have delivered everything (queues and spills empty). False on timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            if self._worker_alive():
                self._next_id += 1
                fut: asyncio.Future[bool] = loop.create_future()
                self._replies[self._next_id] = fut
                remaining = max(0.01, deadline - loop.time())
                self._write_control({"t": "drain", "id": self._next_id, "timeout": remaining})
                try:
                    ok = await asyncio.wait_for(fut, remaining + 1.0)
                except (asyncio.TimeoutError, ConnectionError):
                    ok = False
                finally:
                    self._replies.pop(self._next_id, None)
                if ok and not self._unacked:
                    return True
            await asyncio.sleep(0.02)
        return False

    async def _spawn(self) -> None:
        loop = asyncio.get_running_loop()
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        env["PYTHONSAFEPATH"] = "1"  # with -P: never the working directory's `audit` (R12-4)
        self._proc = await asyncio.create_subprocess_exec(
            self._python, "-P", "-m", "audit.worker", stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            env=env, limit=1 << 24)
        assert self._proc.stdin is not None
        self._proc.stdin.write(self._config + b"\n")
        self._ready = loop.create_future()
        self._reader_task = asyncio.create_task(self._read(self._proc, self._ready), name="audit-worker-reader")
        try:
            await asyncio.wait_for(asyncio.shield(self._ready), self._start_timeout)
        except asyncio.TimeoutError:
            self._proc.kill()
            raise AuditWorkerError("", f"audit worker not ready after {self._start_timeout:g} s") from None
        self.worker_pid = self._proc.pid
        self.metrics.up.set(1)
        # resend, in order, what the previous worker had not acknowledged (every
        # frame still in ``_out`` is among them), before anything newer
        if self._out and self._spool is not None:  # queued while no worker ran: spooled before the resend
            self._spool.write(b"".join(self._out))
        self._out, self._out_bytes = [], 0
        if self._unacked:
            self._proc.stdin.write(b"".join(frame for _, frame, _ in self._unacked))
        self._live = True

    async def _read(self, proc: asyncio.subprocess.Process, ready: asyncio.Future[None]) -> None:
        assert proc.stdout is not None
        try:
            while True:
                line = await proc.stdout.readline()
                if not line:
                    break
                try:
                    frame = orjson.loads(line)
                except orjson.JSONDecodeError:
                    log.error("audit worker: unreadable frame ignored")
                    continue
                t = frame.get("t")
                if t == "status":
                    self._ack(int(frame["ack"]))
                    self._worker_accepting = bool(frame["accepting"])
                    self._worker_dropped = int(frame["dropped"])
                    self._worker_spill = int(frame["spill"])
                    self.metrics.backlog.set(self._backlog)
                    self._update_accepting()
                elif t == "metrics":
                    self.worker_metrics_text = str(frame["text"]).encode()
                elif t == "reply":
                    fut = self._replies.get(int(frame["id"]))
                    if fut is not None and not fut.done():
                        fut.set_result(bool(frame["ok"]))
                elif t == "ready":
                    if not ready.done():
                        ready.set_result(None)
                elif t == "error":
                    if not ready.done():
                        ready.set_exception(AuditWorkerError(str(frame.get("type", "")), str(frame.get("message", ""))))
        finally:
            if not ready.done():
                ready.set_exception(AuditWorkerError("", "audit worker exited before it was ready"))
            for fut in self._replies.values():
                if not fut.done():
                    fut.set_exception(ConnectionError("audit worker exited"))

    async def _supervise(self) -> None:
        """Restart the worker when it exits (backoff), resending the backlog.
        The backoff only starts over after a worker lived ``STABLE_S``: one that
        dies right after becoming ready is not restarted in a tight loop."""
        loop = asyncio.get_running_loop()
        backoff = Backoff(*self._restart)
        while True:
            assert self._proc is not None
            started = loop.time()
            rc = await self._proc.wait()
            if loop.time() - started >= STABLE_S:
                backoff.reset()
            self._live = False
            # the next worker counts from 0: keep what this one had lost
            self._dropped += self._worker_dropped
            self._worker_dropped = 0
            if self._closing:
                return
            self.metrics.up.set(0)
            log.error("audit worker exited (status %s); restarting, %d events kept for resend", rc, len(self._unacked))
            while True:
                await asyncio.sleep(backoff.next())
                try:
                    await self._spawn()
                    break
                except (AuditWorkerError, OSError) as exc:
                    log.error("audit worker restart failed: %s", exc)
            self.metrics.restarts.inc()
            self.emit(AuditEvent(kind=Kind.ALERT, outcome=Outcome.RAISED, alert={
                "alert_id": "audit-worker-restarted", "alert_kind": "audit_worker_restarted",
                "exit_status": rc if rc is not None else -1}))
