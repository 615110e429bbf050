"""RFC 5424 syslog transport for audit events (CEF or OCSF JSON payload).

Framing: octet counting (RFC 6587 §3.4.1, ``MSG-LEN SP SYSLOG-MSG``) over TCP
and over TLS (RFC 5425, same framing); one message per datagram over UDP
(RFC 5426, lossy: only for lab use). The connection is re-opened on the next
``send`` after any error.

Plain syslog over TCP has no application acknowledgement: frames that were in
the socket buffers or in the receiver's memory queue when it died are lost
without an error on our side. The sink therefore keeps the last
``resend_window`` frames and sends them again after every reconnect — made at
once, in the background, when the receiver closes the connection (not only at
the next event, which may never come)
(at-least-once; the receiver drops duplicates by ``externalId`` /
``event_id``). Size the window to cover (event rate × failure detection time
+ receiver queue). End-to-end acknowledged delivery needs RELP, which is not
implemented here.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import socket
import ssl
from collections import deque
from collections.abc import Callable
from datetime import datetime, timezone

from audit.backoff import Backoff
from audit.cef import cef_line, format_cef
from audit.encoded import KIND_VALUE
from audit.event import AuditEvent, Kind, Outcome, iso_ms
from audit.sink import SinkUnavailable
from audit.tls import client_context

log = logging.getLogger(__name__)

FACILITY_LOG_AUDIT = 13  # RFC 5424 table 1: "log audit"
_SEVERITY = {Outcome.RAISED: 1, Outcome.DENIED: 4, Outcome.UNAUTHENTICATED: 4, Outcome.FAILED: 3}


@functools.lru_cache(maxsize=256)
def _sd_name(value: str) -> str:
    """Printable US-ASCII without ``= ]"``, at most 48 chars, ``-`` if empty
    (RFC 5424 §6 SD-NAME / header field charset). Cached: host, app and
    procid repeat on every message."""
    return "".join(c for c in value if 33 <= ord(c) <= 126 and c not in '= ]"')[:48] or "-"


#: |epoch ms| below 2**32 s (years 1833..2106): there ``time_ms / 1000`` as a
#: double is within 2**-21 s < 0.5 us of the true value, so ``datetime``'s
#: microsecond rounding gives exactly ``time_ms % 1000`` ms and the string
#: equals :func:`audit.event.iso_ms`. Farther out the float error can show in
#: the ms digits, so those keep the ``datetime`` path (byte-identical output).
_FAST_TS_LIMIT_MS = (1 << 32) * 1000


def _timestamp(time_ms: int) -> str:
    """RFC 5424 TIMESTAMP (UTC, ms, ``Z``): ``iso_ms`` where it gives the same
    string as ``datetime.isoformat`` (see ``_FAST_TS_LIMIT_MS``), else ``datetime``."""
    if type(time_ms) is int and -_FAST_TS_LIMIT_MS < time_ms < _FAST_TS_LIMIT_MS:
        return iso_ms(time_ms)
    ts = datetime.fromtimestamp(time_ms / 1000, tz=timezone.utc).isoformat(timespec="milliseconds")
    return ts.replace("+00:00", "Z")


def format_rfc5424(
    event: AuditEvent,
    msg: str,
    hostname: str | None = None,
    app_name: str = "prefixgate",
    procid: str = "-",
    facility: int = FACILITY_LOG_AUDIT,
) -> bytes:
    """An RFC 5424 message: ``<PRI>1 TIMESTAMP HOST APP PROCID MSGID SD MSG``.

    PRI = facility*8 + severity (alerts 1, denials 4, else 6 informational);
    MSGID is the event kind; the SD element ``[audit@32473 eventId=".."]``
    uses the documentation PEN 32473 (RFC 5612). ``msg`` is sent as UTF-8
    with a BOM as RFC 5424 §6.4 recommends.
    """
    return _rfc5424(event, msg, f" {_sd_name(hostname or socket.gethostname())} {_sd_name(app_name)} {_sd_name(procid)} ",
                    facility)


def _rfc5424(event: AuditEvent, msg: str, middle: str, facility: int = FACILITY_LOG_AUDIT) -> bytes:
    """:func:`format_rfc5424` with ``middle`` = ``" HOST APP PROCID "`` already made (the sink makes it
    once: ``socket.gethostname`` and three name filters per event before session 10)."""
    kind = event.kind
    sev = _SEVERITY.get(event.outcome, 4 if kind is Kind.ALERT else 6)
    return (f"<{facility * 8 + sev}>1 {_timestamp(event.time_ms)}{middle}"
            f"{KIND_VALUE[kind] if type(kind) is Kind else kind.value} "
            f'[audit@32473 eventId="{event.event_id}"] \ufeff{msg.replace(chr(10), " ")}').encode()


#: Smallest ``max_message_bytes`` accepted: every RFC 5424 receiver must take
#: messages of 480 octets (RFC 5424 section 6.1).
MIN_MESSAGE_BYTES = 480


def truncate_message(message: bytes, limit: int) -> bytes:
    """``message`` cut to at most ``limit`` bytes without splitting a UTF-8
    sequence and without leaving a dangling escape backslash (a CEF ``\\n``
    or ``\\=`` cut in two). Shorter messages are returned unchanged.

    Only the tail is cut: with ``limit`` >= :data:`MIN_MESSAGE_BYTES` the
    RFC 5424 header and structured data (event id) stay whole.
    """
    if len(message) <= limit:
        return message
    cut = limit
    while cut > 0 and message[cut] & 0xC0 == 0x80:  # a continuation byte: back to its lead byte
        cut -= 1
    head = message[:cut]
    backslashes = len(head) - len(head.rstrip(b"\\"))
    if backslashes % 2:
        head = head[:-1]
    return head


def frame_octet_counted(message: bytes) -> bytes:
    """RFC 6587 octet-counting frame: ``b"<len> " + message``."""
    return b"%d %s" % (len(message), message)


def ocsf_payload(event: AuditEvent) -> str:
    """OCSF JSON text for a syslog payload (see :mod:`audit.ocsf`)."""
    from audit.ocsf import to_ocsf

    return json.dumps(to_ocsf(event), separators=(",", ":"), sort_keys=True)


class SyslogSink:
    """Send audit events as RFC 5424 syslog to ``host:port``.

    Args:
        protocol: ``"tcp"``, ``"tls"`` (RFC 5425) or ``"udp"``.
        ssl_context: client TLS context for ``"tls"`` (default: system trust).
        formatter: event → payload text (default CEF; :func:`ocsf_payload` for OCSF).
        resend_window: frames re-sent after a reconnect (see module doc).
        connect_timeout_s: seconds.
        linger_s: seconds :class:`audit.log.AuditLog` lets events accumulate
            before a send (one socket write per batch).
        max_message_bytes: longest RFC 5424 message sent (bytes, the frame's
            MSG-LEN; at least :data:`MIN_MESSAGE_BYTES`); longer ones are cut by
            :func:`truncate_message` and counted in :attr:`truncated`. None: no
            limit. 2048 is what RFC 5425 receivers must accept.

    Raises:
        ValueError: unknown protocol, or ``max_message_bytes`` below the minimum.
    """

    def __init__(
        self,
        host: str,
        port: int,
        protocol: str = "tcp",
        ssl_context: ssl.SSLContext | None = None,
        formatter: Callable[[AuditEvent], str] = format_cef,
        resend_window: int = 10_000,
        connect_timeout_s: float = 2.0,
        hostname: str | None = None,
        name: str = "syslog",
        linger_s: float = 0.02,
        max_message_bytes: int | None = None,
    ) -> None:
        if protocol not in ("tcp", "tls", "udp"):
            raise ValueError(f"protocol must be tcp, tls or udp, not {protocol!r}")
        if max_message_bytes is not None and max_message_bytes < MIN_MESSAGE_BYTES:
            raise ValueError(f"max_message_bytes must be at least {MIN_MESSAGE_BYTES}")
        self.max_message_bytes = max_message_bytes
        #: messages cut to ``max_message_bytes`` so far
        self.truncated = 0
        self.name = name
        #: seconds AuditLog lets events accumulate before a send (one write per batch)
        self.linger_s = linger_s
        self.host, self.port, self.protocol = host, port, protocol
        self._ssl = ssl_context if ssl_context is not None else (client_context() if protocol == "tls" else None)
        # format_cef's fast twin (same line: tests/audit/test_s10_fast_formats.py)
        self._formatter = cef_line if formatter is format_cef else formatter
        self._middle: str | None = None  # " HOST APP PROCID " of every message
        self._recent: deque[bytes] = deque(maxlen=resend_window)
        self._timeout = connect_timeout_s
        self._hostname = hostname
        self._writer: asyncio.StreamWriter | None = None
        self._watch: asyncio.Task[None] | None = None
        self._udp: asyncio.DatagramTransport | None = None
        self._had_connection = False
        self._open_lock: asyncio.Lock | None = None  # created in the running loop
        self._reconnect: asyncio.Task[None] | None = None
        self._closing = False
        #: connections opened again after the first one
        self.reconnects = 0

    async def open(self) -> None:
        """Connect (raises SinkUnavailable). After a reconnect, the last
        ``resend_window`` frames are written again first."""
        if self.protocol == "udp":
            if self._udp is None:
                loop = asyncio.get_running_loop()
                self._udp, _ = await loop.create_datagram_endpoint(
                    asyncio.DatagramProtocol, remote_addr=(self.host, self.port)
                )
            return
        if self._open_lock is None:
            self._open_lock = asyncio.Lock()
        async with self._open_lock:  # send() and the background reconnect never open two connections
            if self._writer is not None:
                return
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(self.host, self.port, ssl=self._ssl), self._timeout
                )
            except (OSError, asyncio.TimeoutError, ssl.SSLError) as exc:
                raise SinkUnavailable(f"syslog connect {self.host}:{self.port}: {exc}") from exc
            self._writer = writer
            self._closing = False
            self._watch = asyncio.get_running_loop().create_task(self._watch_eof(reader, writer))
            if self._had_connection:
                self.reconnects += 1
                # at-least-once: replay what may have died in buffers
                for frame in self._recent:
                    writer.write(frame)
            self._had_connection = True

    async def _watch_eof(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, ssl.SSLError):
            while await reader.read(4096):
                pass
        if self._writer is not writer:
            return  # an older connection, already replaced
        await self._drop_connection()
        if not self._closing and self._recent and self._reconnect is None:
            # the receiver went away: frames it had not processed yet (its socket
            # buffer, its queue) are gone with no error on our side. Reconnect now
            # and resend the window instead of waiting for the next event, which
            # may never come.
            self._reconnect = asyncio.get_running_loop().create_task(self._reconnect_loop())

    async def _reconnect_loop(self) -> None:
        backoff = Backoff(0.05, max(self._timeout, 0.05))
        try:
            while not self._closing and self._writer is None:
                try:
                    await self.open()
                    return
                except SinkUnavailable:
                    await asyncio.sleep(backoff.next())
        finally:
            self._reconnect = None

    async def _drop_connection(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()
            try:  # bounded (session 29, S29-audit29-2): a close waits for unsent bytes, which a peer
                await asyncio.wait_for(writer.wait_closed(), self._timeout)  # that stopped reading never takes
            except Exception:  # noqa: BLE001 -- timed out or failed: the connection is given up either way
                writer.transport.abort()

    async def send(self, events: list[AuditEvent]) -> None:
        """Frame and write ``events``; raises SinkUnavailable on any error."""
        await self.open()
        middle = self._middle
        if middle is None:  # the host name once per sink (format_rfc5424 looks it up per message)
            middle = self._middle = f" {_sd_name(self._hostname or socket.gethostname())} {_sd_name('prefixgate')} - "
        fmt = self._formatter
        frames = [_rfc5424(ev, fmt(ev), middle) for ev in events]
        cap = self.max_message_bytes
        if cap is not None:
            for i, f in enumerate(frames):
                if len(f) > cap:
                    frames[i] = truncate_message(f, cap)
                    self.truncated += 1
                    log.warning("syslog message of event %s cut from %d to %d bytes",
                                events[i].event_id, len(f), len(frames[i]))
        if self.protocol == "udp":
            assert self._udp is not None
            for f in frames:
                self._udp.sendto(f)
            return
        writer = self._writer
        if writer is None:
            raise SinkUnavailable("syslog connection closed")
        try:
            framed = [frame_octet_counted(f) for f in frames]
            writer.write(b"".join(framed))  # one send per batch, not per frame
            self._recent.extend(framed)
            if writer.transport.get_write_buffer_size():  # the kernel did not take it all: wait, bounded
                await asyncio.wait_for(writer.drain(), self._timeout * 5)
            else:  # session 29: all in the socket, so drain() cannot wait (it only raises a lost
                await writer.drain()  # connection); no wait_for task and timer per batch
        except (OSError, asyncio.TimeoutError, ssl.SSLError, RuntimeError) as exc:
            await self._drop_connection()
            raise SinkUnavailable(f"syslog write: {exc}") from exc
        if self._writer is None or writer.is_closing():
            raise SinkUnavailable("syslog peer closed the connection")

    async def close(self) -> None:
        """Close the connection (and stop reconnecting)."""
        self._closing = True
        if self._reconnect is not None:
            self._reconnect.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reconnect
            self._reconnect = None
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
            self._watch = None
        await self._drop_connection()
        if self._udp is not None:
            self._udp.close()
            self._udp = None
