"""Process helpers for the demo and the benchmark: start, wait for readiness, stop.

Child processes are started in their own session (process group) so that
:func:`stop_process` can end the child and anything it spawned by the
child's own id, never by name. Readiness waits are simple bounded polls.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

__all__ = [
    "ProcessStartError",
    "ManagedProcess",
    "free_port",
    "port_answers",
    "wait_for_port",
    "start_process",
    "stop_process",
    "terminate_popen",
    "wait_for_url",
    "wait_for_json_file",
    "python_module_cmd",
    "PROJECT_ROOT",
]


#: the directory holding this process's ``sim`` package (a checkout, or site-packages)
PROJECT_ROOT = str(Path(__file__).resolve().parents[1])


class ProcessStartError(RuntimeError):
    """Raised when a child exits early or does not become ready in time (message has its log tail)."""


@dataclass
class ManagedProcess:
    """A started child: its ``Popen`` handle, a display ``name`` and the path of its combined log."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    _log_fh: Any = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        """Process id of the child (also its process-group id)."""
        return self.popen.pid

    def alive(self) -> bool:
        """True while the child has not exited."""
        return self.popen.poll() is None

    def log_tail(self, max_bytes: int = 4000) -> str:
        """Return the last ``max_bytes`` bytes of the child's log as text."""
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return data[-max_bytes:].decode("utf-8", "replace")


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that was free on ``host`` a moment ago (bind to port 0, read, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_answers(port: int, *, host: str = "127.0.0.1", send: bytes = b"", expect: bytes = b"",
                 timeout_s: float = 0.5) -> bool:
    """True when a TCP connection to ``host:port`` opens within ``timeout_s`` seconds and, when
    ``send`` is given, the first reply to it (up to 64 bytes) starts with ``expect``."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as s:
            if not send:
                return True
            s.sendall(send)
            return s.recv(64).startswith(expect)
    except OSError:
        return False


def wait_for_port(port: int, *, popen: subprocess.Popen[bytes] | None = None, timeout_s: float = 15.0,
                  send: bytes = b"", expect: bytes = b"", what: str = "server", log_path: Path | None = None,
                  interval_s: float = 0.05) -> None:
    """Block until :func:`port_answers` on ``127.0.0.1:port`` (with ``send``/``expect``), polling
    every ``interval_s`` seconds, for a server started as ``popen`` (a plain ``Popen``, not a
    :class:`ManagedProcess`, for servers with their own logging).

    Raises :class:`ProcessStartError` (a RuntimeError) naming ``what`` when ``popen`` exits
    first or ``timeout_s`` seconds pass; the message ends with the last 2000 bytes of
    ``log_path`` when given."""
    deadline = time.monotonic() + timeout_s
    problem = f"{what} did not answer on port {port} within {timeout_s:g} s"
    while time.monotonic() < deadline:
        if popen is not None and popen.poll() is not None:
            problem = f"{what} exited with {popen.returncode}"
            break
        if port_answers(port, send=send, expect=expect):
            return
        time.sleep(interval_s)
    tail = ""
    if log_path is not None:
        try:
            tail = ": " + log_path.read_bytes()[-2000:].decode("utf-8", "replace")
        except OSError:
            pass
    raise ProcessStartError(problem + tail)


def python_module_cmd(module: str, *args: str) -> list[str]:
    """Return ``[sys.executable, "-P", "-m", module, *args]`` (the current interpreter, e.g. the venv's).

    ``-P``: the working directory is not put first on ``sys.path``, so a directory there named
    like one of PrefixGate's packages is never imported instead (R12-4); :func:`start_process`
    puts :data:`PROJECT_ROOT` on ``PYTHONPATH`` so that a source checkout still resolves."""
    return [sys.executable, "-P", "-m", module, *args]


def start_process(
    name: str,
    cmd: Sequence[str],
    log_dir: str | Path,
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
) -> ManagedProcess:
    """Start ``cmd`` in a new session with stdout+stderr to ``log_dir/name.log``.

    ``env`` entries are added to the current environment, whose ``PYTHONPATH`` starts with
    :data:`PROJECT_ROOT` (for :func:`python_module_cmd`'s ``-P``). Raises
    :class:`OSError` if the executable cannot be started.
    """
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    fh = open(log_path, "ab")
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in (PROJECT_ROOT, full_env.get("PYTHONPATH", "")) if p)
    if env:
        full_env.update(env)
    try:
        popen = subprocess.Popen(
            list(cmd), stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=full_env, cwd=cwd, start_new_session=True,
        )
    except OSError:
        fh.close()
        raise
    return ManagedProcess(name, popen, log_path, fh)


def stop_process(proc: ManagedProcess, timeout_s: float = 5.0) -> int | None:
    """Stop ``proc`` and its process group: SIGTERM, wait ``timeout_s`` seconds, then SIGKILL.

    Returns the child's exit code (``None`` if it could not be reaped).
    Safe to call twice.
    """
    pgid = proc.pid
    if proc.alive():
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
    try:  # anything left in the group (grandchildren), then the child itself
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        code = proc.popen.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        code = None
    if proc._log_fh is not None:
        proc._log_fh.close()
        proc._log_fh = None
    return code


def terminate_popen(popen: subprocess.Popen[bytes] | None, timeout_s: float = 5.0) -> int | None:
    """Stop a plain ``Popen`` child (not its process group: see :func:`stop_process`): SIGTERM,
    wait ``timeout_s`` seconds, then SIGKILL and wait again. Does nothing when ``popen`` is None
    or has exited. Returns the exit code (None when nothing was stopped).

    Raises :class:`subprocess.TimeoutExpired` when it has not exited ``timeout_s`` s after SIGKILL."""
    if popen is None or popen.poll() is not None:
        return None
    popen.terminate()
    try:
        return popen.wait(timeout_s)
    except subprocess.TimeoutExpired:
        popen.kill()
        return popen.wait(timeout_s)


async def wait_for_url(
    url: str,
    *,
    timeout_s: float = 30.0,
    interval_s: float = 0.1,
    expect_status: int = 200,
    proc: ManagedProcess | None = None,
) -> None:
    """Poll ``GET url`` until it answers ``expect_status``, at most ``timeout_s`` seconds.

    If ``proc`` is given and exits meanwhile, fail at once. Raises
    :class:`ProcessStartError` on timeout or early exit.
    """
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    timeout = aiohttp.ClientTimeout(total=2.0)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while time.monotonic() < deadline:
            if proc is not None and not proc.alive():
                raise ProcessStartError(f"{proc.name} exited with {proc.popen.returncode}:\n{proc.log_tail()}")
            try:
                async with session.get(url) as resp:
                    if resp.status == expect_status:
                        return
                    last = f"HTTP {resp.status}"
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                last = type(exc).__name__
            await asyncio.sleep(interval_s)
    tail = f"\n{proc.log_tail()}" if proc is not None else ""
    raise ProcessStartError(f"{url} not ready after {timeout_s:.0f} s (last: {last}){tail}")


async def wait_for_json_file(
    path: str | Path,
    *,
    timeout_s: float = 30.0,
    interval_s: float = 0.1,
    proc: ManagedProcess | None = None,
) -> Any:
    """Poll until ``path`` holds valid JSON (a ready-file written by a child), then return it.

    Raises :class:`ProcessStartError` on timeout or if ``proc`` exits first.
    """
    path = Path(path)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and not proc.alive():
            raise ProcessStartError(f"{proc.name} exited with {proc.popen.returncode}:\n{proc.log_tail()}")
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            await asyncio.sleep(interval_s)
    tail = f"\n{proc.log_tail()}" if proc is not None else ""
    raise ProcessStartError(f"ready file {path} not written after {timeout_s:.0f} s{tail}")
