"""A real ``redis-server`` child on loopback, for the shared-state tests and the scale-out benchmark.

Debian's ``redis-server`` is installed by ``make system-deps`` (like
rsyslogd). :class:`RedisServer` runs one on a free loopback port with its own
directory and no persistence (``--save '' --appendonly no``), waits until
``PING`` answers and stops it (SIGTERM, then SIGKILL); started again after a
stop it takes the same port with empty data (a Redis restart).
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from sim.procs import ProcessStartError, free_port, terminate_popen, wait_for_port

__all__ = ["PING", "REDIS_SERVER", "RedisServer"]

#: The server binary (PATH first, then Debian's location); None when neither exists.
REDIS_SERVER = shutil.which("redis-server") or ("/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server")
                                                else None)
#: A RESP ``PING`` (the answer starts with ``+PONG``).
PING = b"*1\r\n$4\r\nPING\r\n"


class RedisServer:
    """One ``redis-server`` child on ``127.0.0.1:port`` (``url``: ``redis://127.0.0.1:port/0``).

    ``tmp`` (an existing folder) holds its working directory and its log.
    :meth:`start` (again after :meth:`stop` to simulate a Redis restart: same
    port, empty data) and :meth:`stop`. Raises :class:`RuntimeError` when the
    server exits or does not answer ``PING`` within ``timeout_s`` seconds.
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
        """Start the server (a free port the first time, up to 3 tries, then the same one) and wait for ``PING``."""
        attempts = 3 if self.port == 0 else 1
        last = ""
        for _ in range(attempts):
            port = self.port or free_port()
            self.proc = proc = subprocess.Popen(
                [self.binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--dir", str(self.tmp), "--logfile", str(self.log), "--daemonize", "no"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
            try:
                wait_for_port(port, popen=proc, timeout_s=self.timeout_s, send=PING, expect=b"+PONG",
                              what="redis-server", interval_s=0.02)
            except ProcessStartError:
                if proc.poll() is None:
                    self.stop()
                    raise RuntimeError(f"redis-server did not answer PING: {self._tail()}") from None
                last = self._tail()  # exited: most likely the port was taken meanwhile
                continue
            self.port = port
            return self
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
