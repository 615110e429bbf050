"""The head of an upstream request, from templates made once (split from gateway/upstream_pool.py, session 16).

A head is the request line, ``Host``, the pool's default headers (``Accept-Encoding: identity``),
the request's own headers and its ``Content-Length`` (RFC 9112 section 3 and 6.2). The request
line, ``Host`` and the defaults of one (method, URL) are a template made once per pool (session 8);
the request's own header *names* are a second template per set of names (session 16: the pipeline
sends the same two or three names on every request), so per request only the values and the
length are formatted. Header names and values containing CR or LF are refused (ValueError; a value
that is not latin-1 too), on every path: a header can never add a line or a field of its own. A
caller header that overrides a default or one of the pool's own fields (``Host``,
``Content-Length``, ``Transfer-Encoding``), or a name given twice in different cases, takes the
general path, which keeps one field per name (the caller's last) and never the caller's ``Host``,
``Content-Length`` or ``Transfer-Encoding``: the same head either way.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import NamedTuple
from urllib.parse import urlsplit

__all__ = ["Origin", "Target", "RequestHeads", "origin_of"]

#: most cached (method, URL) templates and header-name templates per pool (a handful of each in use)
MAX_TEMPLATES = 256
_OWN = frozenset({"host", "content-length", "transfer-encoding"})


class Origin(NamedTuple):
    """Where a URL's requests go: ``key`` (scheme, host, port: the pool's per-origin idle queue),
    ``host``, ``port``, ``tls`` (https), ``target`` (path and query) and the ``Host`` field's value."""

    key: tuple[str, str, int]
    host: str
    port: int
    tls: bool
    target: str
    host_header: str


@lru_cache(maxsize=1024)
def origin_of(url: str) -> Origin:
    """The :class:`Origin` of an ``http``/``https`` ``url``; raises ValueError for any other URL."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    tls = parts.scheme == "https"
    port = parts.port or (443 if tls else 80)
    host = parts.hostname
    shown = f"[{host}]" if ":" in host else host
    host_header = shown if port == (443 if tls else 80) else f"{shown}:{port}"
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Origin((parts.scheme, host, port), host, port, tls, target, host_header)


class Target(NamedTuple):
    """One (method, URL) a pool sends to: its :class:`Origin` and its head's first part (request line,
    ``Host``, default headers; checked once), as bytes."""

    origin: Origin
    prefix: bytes


class RequestHeads:
    """The heads of one pool's requests. ``default_headers``: sent on every request (the caller's
    headers override them by name). Use from one thread (the event loop's)."""

    __slots__ = ("_defaults", "_own", "_targets", "_names")

    def __init__(self, default_headers: Mapping[str, str] | None = None) -> None:
        self._defaults = {k.lower(): (k, v) for k, v in (default_headers or {}).items()}
        # header names the general path must see: a default's, or one the pool writes itself
        self._own = frozenset(self._defaults) | _OWN
        self._targets: dict[tuple[str, str], Target] = {}
        #: caller header names (as given, in order) -> their lines' %-template (None: the general path)
        self._names: dict[tuple[str, ...], str | None] = {}

    def target(self, method: str, url: str) -> Target:
        """The :class:`Target` of ``method`` ``url`` (made once, then cached). Raises ValueError for
        another method than POST/GET or a bad URL."""
        target = self._targets.get((method, url))
        if target is None:
            text = self.general(method, url, {}, 0)
            target = Target(origin_of(url), text[:text.rindex(b"Content-Length: ")])
            if len(self._targets) >= MAX_TEMPLATES:
                self._targets.clear()
            self._targets[(method, url)] = target
        return target

    def head(self, method: str, url: str, headers: Mapping[str, str], body_len: int) -> bytes:
        """The whole head (bytes, ending with the blank line) of ``method`` ``url`` with ``headers`` and
        a body of ``body_len`` bytes. Raises ValueError for another method than POST/GET, a bad URL,
        CR or LF in a header name or value, or a value that is not latin-1."""
        return self.head_on(self.target(method, url), method, url, headers, body_len)

    def head_on(self, target: Target, method: str, url: str, headers: Mapping[str, str], body_len: int) -> bytes:
        """:meth:`head` of ``method`` ``url`` whose :meth:`target` is ``target``."""
        names = tuple(headers)
        template = self._names.get(names, "")
        if template == "":
            template = self._template(names)
        if template is None:  # overrides a default or the pool's own field, or one name twice
            return self.general(method, url, headers, body_len)
        text = template % (*headers.values(), body_len)
        lines = len(names) + 2  # the fields, Content-Length and the blank line
        if text.count("\n") != lines or text.count("\r") != lines:  # a value with CR or LF
            raise ValueError("header names and values must not contain CR or LF")
        return target.prefix + text.encode("latin-1")

    def _template(self, names: tuple[str, ...]) -> str | None:
        """The %-template of the lines of the caller's header ``names`` plus ``Content-Length`` and the
        blank line (``%s`` per value, ``%d`` the length); None when the names need the general path.
        Raises ValueError (nothing cached) for a name with CR or LF."""
        if any("\r" in n or "\n" in n for n in names):
            raise ValueError("header names and values must not contain CR or LF")
        lowered = [n.lower() for n in names]
        if self._own.intersection(lowered) or len(set(lowered)) != len(lowered):
            template = None
        else:
            template = "".join(n.replace("%", "%%") + ": %s\r\n" for n in names) + "Content-Length: %d\r\n\r\n"
        if len(self._names) >= MAX_TEMPLATES:
            self._names.clear()
        self._names[names] = template
        return template

    def general(self, method: str, url: str, headers: Mapping[str, str], body_len: int) -> bytes:
        """The head of any request, field by field (one field per name, the caller's last; the pool's
        own fields never from the caller). Raises ValueError as :meth:`head`."""
        if method not in ("POST", "GET"):
            raise ValueError(f"unsupported method {method!r}")
        o = origin_of(url)
        fields = dict(self._defaults)
        for k, v in headers.items():
            fields[k.lower()] = (k, v)
        fields.pop("host", None)
        fields.pop("content-length", None)
        fields.pop("transfer-encoding", None)
        lines = [f"{method} {o.target} HTTP/1.1", f"Host: {o.host_header}"]
        lines.extend(f"{k}: {v}" for k, v in fields.values())
        lines.append(f"Content-Length: {body_len}")
        text = "\r\n".join(lines)
        if text.count("\n") != len(lines) - 1 or text.count("\r") != len(lines) - 1:
            raise ValueError("header names and values must not contain CR or LF")
        return text.encode("latin-1") + b"\r\n\r\n"
