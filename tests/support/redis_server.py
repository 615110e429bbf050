"""Start a real ``redis-server`` on loopback for the shared-state tests (issue 16).

Debian's ``redis-server`` is installed by ``make system-deps`` (like
rsyslogd). :class:`RedisServer` runs one on a free loopback port with its own
temporary directory and no persistence (``--save '' --appendonly no``), waits
until ``PING`` answers and stops it (SIGTERM, then SIGKILL).

:func:`require_redis_server` is the one place that decides whether the tests
may skip: only when the binary is absent *and* the ``CI`` environment
variable is unset. Under CI a missing binary is a failure, so a CI job cannot
silently skip the shared-state tests.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from sim.procs import free_port, port_answers, terminate_popen
from tests.support.waiting import wait_for_sync

__all__ = ["REDIS_SERVER", "RedisServer", "require_redis_server"]

#: The server binary (PATH first, then Debian's location).
REDIS_SERVER = shutil.which("redis-server") or ("/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server")
                                                else None)


def require_redis_server() -> str:
    """Return the ``redis-server`` path; skip the test when it is absent, or
    fail when it is absent and ``CI`` is set (CI must not skip silently)."""
    if REDIS_SERVER is not None:
        return REDIS_SERVER
    reason = "redis-server is not installed (run `make system-deps`, Debian package redis-server)"
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; CI is set, so the shared-state tests may not be skipped", pytrace=False)
    pytest.skip(reason)


def _ping(port: int) -> bool:
    """True when a RESP ``PING`` on ``127.0.0.1:port`` answers ``+PONG``."""
    return port_answers(port, send=b"*1\r\n$4\r\nPING\r\n", expect=b"+PONG")


class RedisServer:
    """One ``redis-server`` child on ``127.0.0.1:port`` (``url``: ``redis://127.0.0.1:port/0``).

    :meth:`start` (again after :meth:`stop` to simulate a Redis restart: same
    port, empty data) and :meth:`stop`. Raises :class:`RuntimeError` when the
    server exits or does not answer ``PING`` within ``timeout_s``.
    """

    def __init__(self, binary: str, tmp: Path, *, timeout_s: float = 15.0) -> None:
        self.binary = binary
        self.tmp = tmp
        self.timeout_s = timeout_s
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = tmp / "redis-server.log"

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        """Start the server (a free port the first time, then the same one) and wait for ``PING``."""
        attempts = 3 if self.port == 0 else 1
        last = ""
        for _ in range(attempts):
            port = self.port or free_port()
            self.proc = subprocess.Popen(
                [self.binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--dir", str(self.tmp), "--logfile", str(self.log), "--daemonize", "no"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
            proc = self.proc
            try:
                wait_for_sync(lambda: proc.poll() is not None or _ping(port), timeout_s=self.timeout_s,
                              what="redis-server answering PING")
            except AssertionError:
                self.stop()
                raise RuntimeError(f"redis-server did not answer PING: {self._tail()}") from None
            if proc.poll() is None:
                self.port = port
                return self
            last = self._tail()  # exited: most likely the port was taken meanwhile
        raise RuntimeError(f"redis-server exited: {last}")

    def stop(self) -> None:
        """Stop the server (SIGTERM, SIGKILL after 10 s); idempotent."""
        proc, self.proc = self.proc, None
        terminate_popen(proc, 10.0)

    def _tail(self) -> str:
        try:
            return self.log.read_text("utf-8", "replace")[-2000:]
        except OSError:
            return "(no log)"

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


