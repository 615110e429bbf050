"""The proxy of the audit worker's OTLP/HTTP POSTs (session 11): one rule for logs and spans.

Both OTLP senders of the audit worker, the log sink (:class:`audit.otlp.OtlpLogSink`) and the span
sender (:class:`audit.span_post.SpanPoster`), send through the proxy the environment names for the
endpoint's scheme (``http_proxy`` / ``https_proxy``, either case, as ``urllib.request.getproxies``
reads them; what ``requests`` and the OpenTelemetry SDK exporters honour), unless ``no_proxy``
covers the endpoint's host (``urllib.request.proxy_bypass``, plus CIDR entries such as
``10.0.0.0/8`` for an IP-literal host, which ``requests`` honours and urllib ignores: review R11b-3). The environment is read once, when
the sender is built (aiohttp's ``trust_env`` re-read it, and ``~/.netrc``, in a thread before every
POST). ``~/.netrc`` is not read: collector credentials go in the ``headers`` setting, proxy
credentials in the proxy URL. Only ``http://`` proxies (an ``https://`` proxy URL is ignored with a
warning, as aiohttp does). Proxy credentials are never logged.
"""
from __future__ import annotations

import ipaddress
import logging
import os
import urllib.request
from typing import Any

import aiohttp
from yarl import URL

__all__ = ["env_proxy"]

log = logging.getLogger(__name__)


def _no_proxy_cidr(host: str) -> bool:
    """Whether ``host`` is an IP address inside a CIDR entry of ``no_proxy`` / ``NO_PROXY``
    (``10.0.0.0/8``, ``fd00::/8``); names and malformed entries are left to urllib's rule."""
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    entries = os.environ.get("no_proxy") or os.environ.get("NO_PROXY") or ""
    for entry in entries.split(","):
        entry = entry.strip()
        if "/" not in entry:
            continue
        try:
            if ip in ipaddress.ip_network(entry, strict=False):
                return True
        except ValueError:
            continue
    return False


def env_proxy(endpoint: str) -> tuple[dict[str, Any], dict[str, str]]:
    """``(keyword arguments of aiohttp's ``post`` for the proxy, headers to add to every POST)`` for
    POSTs to ``endpoint`` (an http:// or https:// URL); ``({}, {})``: direct (no proxy variable for
    its scheme, ``no_proxy`` covers its host, or the proxy is not an http:// URL). The keyword
    arguments are ``proxy`` (the URL without credentials) and, for an https:// endpoint whose proxy
    URL has credentials, ``proxy_headers`` (a ``Proxy-Authorization`` Basic header for the CONNECT);
    for an http:// endpoint that header goes with each POST instead (the proxy sees the request
    itself). Reads the environment now; never raises for a malformed proxy variable (logged, direct)."""
    url = URL(endpoint)
    proxy = urllib.request.getproxies().get(url.scheme)
    if not proxy or (url.host and (urllib.request.proxy_bypass(url.host) or _no_proxy_cidr(url.host))):
        return {}, {}
    try:
        purl = URL(proxy)
    except ValueError:
        log.warning("%s_proxy is not a URL; OTLP export to %s goes direct", url.scheme, url.host)
        return {}, {}
    if purl.scheme != "http" or not purl.host:
        log.warning("%s_proxy %s is not an http:// proxy URL; OTLP export to %s goes direct", url.scheme,
                    purl.with_user(None).with_password(None) if purl.host else purl.scheme, url.host)
        return {}, {}
    kwargs: dict[str, Any] = {"proxy": str(purl.with_user(None).with_password(None))}
    if not purl.user:
        return kwargs, {}
    try:
        auth = {"Proxy-Authorization": aiohttp.encode_basic_auth(purl.user, purl.password or "")}
    except ValueError:  # a ":" in the user name (RFC 7617)
        log.warning("%s_proxy user name is not usable; OTLP export to %s goes direct", url.scheme, url.host)
        return {}, {}
    if url.scheme == "https":
        kwargs["proxy_headers"] = auth
        return kwargs, {}
    return kwargs, auth
