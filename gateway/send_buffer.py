"""Bound each accepted client socket's kernel send buffer (``server.client_send_buffer_bytes``, R7b-4).

Linux autotunes a TCP socket's send buffer up to ``net.ipv4.tcp_wmem``'s max (4 MiB on many
hosts): a whole answer of up to ~1 MB was handed to the kernel at once even when the client read
nothing, so ``limits.client_min_read_bytes_per_s`` / ``client_write_stall_s`` (gateway/write_stall.py)
never saw the client, the audit reported the answer as relayed, and the unsent bytes stayed pinned
in kernel memory after the close. Setting ``SO_SNDBUF`` on the accepted socket fixes the buffer
(and turns autotuning off for that socket): Linux doubles the value for its bookkeeping, so the
kernel holds less than twice ``client_send_buffer_bytes`` unsent (measured: 192,512 bytes for 131072) (gateway's own write buffer,
uvicorn's 64 KiB high-water mark, comes on top). Called once per accepted connection by
:class:`gateway.source_cap.SourceCap` (the guard's ``connection_made``); one system call.
"""

from __future__ import annotations

import logging
import socket
from typing import Any

__all__ = ["apply", "apply_to_transport"]

log = logging.getLogger("prefixgate")


def apply(sock: Any, nbytes: int | None) -> None:
    """``setsockopt(SO_SNDBUF, nbytes)`` on ``sock`` (a socket or uvloop's pseudo-socket);
    ``nbytes`` None or ``sock`` None: nothing. Never raises (an OS refusing the option keeps its
    default; logged at debug)."""
    if nbytes is None or sock is None:
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, nbytes)
    except (OSError, AttributeError, ValueError) as exc:  # e.g. a closed socket, an exotic transport
        log.debug("SO_SNDBUF %d not applied: %s", nbytes, exc)


def apply_to_transport(transport: Any, nbytes: int | None) -> None:
    """:func:`apply` to ``transport``'s socket (``get_extra_info("socket")``); a transport without
    one (a test double) is left alone."""
    if nbytes is not None:
        apply(transport.get_extra_info("socket"), nbytes)
