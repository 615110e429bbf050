"""Start a real rsyslogd on loopback for the audit tests (own config, pid, work dir).

:func:`require_rsyslogd` (the ``rsyslogd_binary`` fixture of tests/conftest.py, used by every module
that starts one): skip without ``rsyslogd``, fail instead under ``CI`` (session 22, S21-newcomer-9;
the rule of :func:`tests.support.system_deps.require_system_binary`, as for ``redis-server``)."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

RSYSLOGD = shutil.which("rsyslogd") or "/usr/sbin/rsyslogd"

CONFIG = """
global(workDirectory="{work}" maxMessageSize="64k")
main_queue(queue.type="Direct")
module(load="imtcp")
template(name="rawmsg" type="string" string="%msg%\\n")
ruleset(name="audit" queue.type="Direct") {{
  action(type="omfile" file="{out}" template="rawmsg" flushOnTXEnd="on" asyncWriting="off")
}}
input(type="imtcp" port="{port}" address="127.0.0.1" ruleset="audit" SupportOctetCountedFraming="on")
"""


from sim.procs import free_port, terminate_popen, wait_for_port  # noqa: E402 - the one free_port of tests and benches
from tests.support.system_deps import require_system_binary  # noqa: E402


def require_rsyslogd() -> str:
    """Return the ``rsyslogd`` path (:data:`RSYSLOGD`); skip the test when it does not exist, or fail it
    when ``CI`` is set (:func:`tests.support.system_deps.require_system_binary`)."""
    return require_system_binary(RSYSLOGD if os.path.exists(RSYSLOGD) else None, "rsyslogd is not installed "
                                 "(run `make system-deps`, Debian package rsyslog)", "the syslog tests")


class Rsyslog:
    """An rsyslogd writing every received message body to ``out`` (one per line)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.port = free_port()
        self.out = tmp / "received.log"
        self.work = tmp / "work"
        self.work.mkdir(exist_ok=True)
        self.conf = tmp / "rsyslog.conf"
        self.conf.write_text(CONFIG.format(work=self.work, out=self.out, port=self.port))
        self.pidfile = tmp / "rsyslogd.pid"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 10.0) -> None:
        self.pidfile.unlink(missing_ok=True)
        self.proc = subprocess.Popen(
            [RSYSLOGD, "-n", "-f", str(self.conf), "-i", str(self.pidfile)],
            stdout=subprocess.DEVNULL, stderr=open(self.tmp / "rsyslogd.err", "ab"),
        )
        wait_for_port(self.port, popen=self.proc, timeout_s=timeout_s, what="rsyslogd",
                      log_path=self.tmp / "rsyslogd.err")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)

    def stop(self) -> None:
        terminate_popen(self.proc, 5.0)

    def lines(self) -> list[str]:
        return self.out.read_text(errors="replace").splitlines() if self.out.exists() else []
