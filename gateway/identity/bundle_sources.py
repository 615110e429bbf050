"""Where one trust domain's bundle comes from: a static bundle, a local file, an HTTPS endpoint.

Sources (file, HTTPS) keep the last good bundle, honour ``spiffe_sequence``
and ``spiffe_refresh_hint``, and fail closed (:class:`BundleUnavailable`)
once a bundle is older than its staleness bound. Parsing is
:func:`gateway.identity.bundle_parse.parse_bundle`; the per-domain registry is
:class:`gateway.identity.bundle.TrustBundleStore`.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import math
import os
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp

from audit.tls import client_context

from .bundle_parse import MAX_BUNDLE_BYTES, BundleError, BundleUnavailable, TrustBundle, parse_bundle
from .spiffe_id import parse_trust_domain

log = logging.getLogger(__name__)


class TrustBundleSource(abc.ABC):
    """Where one trust domain's bundle comes from.

    Subclasses implement :meth:`_refresh_due` and :meth:`_load`; the base keeps
    the last good bundle, refuses ``spiffe_sequence`` regressions (a bundle
    with a lower sequence than the current one is ignored; a bundle without a
    sequence is accepted), and fails closed after ``max_stale_s`` seconds
    without a successful refresh. ``clock`` is monotonic seconds.

    Change signal: :attr:`generation` counts the accepted bundles whose keys
    differ from the previous one (a key added, removed or replaced; a new
    ``spiffe_sequence`` with the same keys is not a change); listeners
    registered with :meth:`add_listener` are called synchronously with
    ``(trust_domain, generation)`` right after such a change. Anything that
    remembers a verification result (the verified-token cache) keys it on
    the generation it was verified under.
    """

    def __init__(
        self,
        trust_domain: str,
        *,
        max_stale_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.trust_domain = parse_trust_domain(trust_domain)
        self.max_stale_s = max_stale_s
        self._clock = clock
        self._bundle: TrustBundle | None = None
        self._last_ok: float | None = None
        self._last_attempt: float = -math.inf
        self._lock = asyncio.Lock()
        self._generation = 0
        self._listeners: list[Callable[[str, int], None]] = []

    @property
    def generation(self) -> int:
        """How many times the set of keys changed (0 before the first bundle)."""
        return self._generation

    def add_listener(self, callback: Callable[[str, int], None]) -> None:
        """Call ``callback(trust_domain, generation)`` after every key change.

        Called synchronously from the refresh (or :meth:`StaticBundleSource.replace`);
        a callback must be quick and must not raise (an exception is logged
        and ignored so that one listener cannot stop a rotation).
        """
        self._listeners.append(callback)

    def _accept(self, bundle: TrustBundle) -> None:
        cur = self._bundle
        if (
            cur is not None
            and cur.sequence is not None
            and bundle.sequence is not None
            and bundle.sequence < cur.sequence
        ):
            log.warning(
                "trust domain %s: ignoring bundle with spiffe_sequence %d < current %d",
                self.trust_domain, bundle.sequence, cur.sequence,
            )
        else:
            if cur is None or set(cur.keys) != set(bundle.keys):
                log.info(
                    "trust domain %s: bundle keys now %s (sequence %s)",
                    self.trust_domain, sorted(bundle.keys), bundle.sequence,
                )
            changed = cur is None or dict(cur.keys) != dict(bundle.keys)
            self._bundle = bundle
            if changed:
                self._generation += 1
                for callback in list(self._listeners):
                    try:
                        callback(self.trust_domain, self._generation)
                    except Exception:  # a listener must never stop a rotation
                        log.exception("trust domain %s: bundle change listener failed", self.trust_domain)
        self._last_ok = self._clock()

    @abc.abstractmethod
    def _refresh_due(self, now: float) -> bool:
        """True when a refresh should be attempted now."""

    @abc.abstractmethod
    async def _load(self, now: float) -> TrustBundle | None:
        """Fetch/read the bundle; ``None`` means "unchanged". Raise on failure."""

    def _serve(self, now: float) -> TrustBundle:
        if self._bundle is None or self._last_ok is None:
            raise BundleUnavailable(f"no trust bundle loaded for {self.trust_domain}")
        if now - self._last_ok > self.max_stale_s:
            raise BundleUnavailable(
                f"trust bundle for {self.trust_domain} is stale "
                f"({now - self._last_ok:.0f} s > {self.max_stale_s:.0f} s)"
            )
        return self._bundle

    async def refresh(self, *, only_if_due: bool = False, min_gap_s: float = 0.0) -> TrustBundle:
        """Refresh now and return the bundle to use (single-flight).

        Concurrent callers queue on one lock and re-check under it, so a burst
        of requests causes one load: with ``only_if_due`` nothing is loaded if
        another caller already refreshed; with ``min_gap_s`` nothing is loaded
        if the last attempt is more recent than that many seconds.
        Raises :class:`BundleUnavailable` when nothing usable is held.
        """
        async with self._lock:
            now = self._clock()
            if self._bundle is not None:
                if only_if_due and not self._refresh_due(now):
                    return self._serve(now)
                if now - self._last_attempt < min_gap_s:
                    return self._serve(now)
            self._last_attempt = now
            try:
                got = await self._load(now)
            except (OSError, BundleError, aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
                log.warning("trust domain %s: bundle refresh failed: %s", self.trust_domain, e)
                self._on_failure(now)
            else:
                if got is None:
                    self._last_ok = now
                else:
                    self._accept(got)
                self._on_success(now)
            return self._serve(self._clock())

    def _on_success(self, now: float) -> None:
        """Hook: schedule the next refresh after a success."""

    def _on_failure(self, now: float) -> None:
        """Hook: schedule the next retry after a failure."""

    async def get(self) -> TrustBundle:
        """The bundle to verify with, refreshed if due.

        Raises :class:`BundleUnavailable` (fail closed) when none is usable.
        """
        now = self._clock()
        if self._bundle is None or self._refresh_due(now):
            return await self.refresh(only_if_due=True)
        return self._serve(now)

    def current(self) -> TrustBundle | None:
        """What :meth:`get` answers when no refresh is due now, without awaiting; ``None`` when one
        is due (or nothing is loaded): the caller then awaits :meth:`get` (issue 14, session 9: a
        verified-token cache hit builds no coroutine for the bundle). Raises
        :class:`BundleUnavailable` as :meth:`get` does for a bundle stale past ``max_stale_s``. A
        subclass that overrides :meth:`get` overrides this too."""
        now = self._clock()
        if (bundle := self._bundle) is None or self._refresh_due(now):
            return None
        if (ok := self._last_ok) is not None and now - ok <= self.max_stale_s:  # = _serve's answer without its call
            return bundle  # (issue 14, session 18); _serve raises otherwise
        return self._serve(now)

    async def refresh_for_unknown_kid(self) -> TrustBundle:
        """Called when a token names a kid the bundle lacks (a rotation may
        have happened). Default: same as :meth:`get`."""
        return await self.get()

    async def aclose(self) -> None:
        """Release network resources (no-op by default)."""


class StaticBundleSource(TrustBundleSource):
    """A fixed in-memory bundle (tests, pinned configuration). Never stale."""

    def __init__(self, bundle: TrustBundle) -> None:
        super().__init__(bundle.trust_domain, max_stale_s=math.inf)
        self._accept(bundle)

    def replace(self, bundle: TrustBundle) -> None:
        """Swap in a new bundle (sequence regressions are still refused)."""
        self._accept(bundle)

    def _refresh_due(self, now: float) -> bool:
        return False

    async def _load(self, now: float) -> TrustBundle | None:
        return None


class FileBundleSource(TrustBundleSource):
    """A bundle read from a local file (e.g. written by SPIRE agent or the demo issuer).

    The file is stat'ed at most every ``check_interval_s`` seconds and re-read
    only when its (mtime_ns, size, inode) changes. A missing or broken file
    keeps the last good bundle for ``max_stale_s`` seconds, then fails closed.
    """

    def __init__(
        self,
        trust_domain: str,
        path: str | os.PathLike[str],
        *,
        check_interval_s: float = 1.0,
        max_stale_s: float = 300.0,
        allow_missing_use: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(trust_domain, max_stale_s=max_stale_s, clock=clock)
        self.path = Path(path)
        self.check_interval_s = check_interval_s
        self.allow_missing_use = allow_missing_use
        self._stamp: tuple[int, int, int] | None = None
        self._checked_at: float | None = None

    def _refresh_due(self, now: float) -> bool:
        return self._checked_at is None or now - self._checked_at >= self.check_interval_s

    async def _load(self, now: float) -> TrustBundle | None:
        self._checked_at = now
        st = self.path.stat()
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp == self._stamp and self._bundle is not None:
            return None
        if st.st_size > MAX_BUNDLE_BYTES:
            raise BundleError("bundle file larger than 1 MiB")
        bundle = parse_bundle(
            self.trust_domain, self.path.read_bytes(), allow_missing_use=self.allow_missing_use
        )
        self._stamp = stamp
        return bundle


class HttpsBundleSource(TrustBundleSource):
    """A bundle fetched from a SPIFFE bundle endpoint (``https_web`` profile).

    Fetched with aiohttp, TLS verified against ``ssl_context`` (system roots by
    default); redirects are not followed; the body is bounded to 1 MiB. The
    next refresh is ``spiffe_refresh_hint`` (or ``default_refresh_s``) clamped
    to [``min_refresh_s``, ``max_refresh_s``]. After a failed fetch the last
    good bundle is served (stale-while-error) and a retry is scheduled after
    ``retry_s``; once ``max_stale_s`` seconds pass since the last success,
    :class:`BundleUnavailable` is raised (fail closed). A token with an
    unknown kid triggers at most one early refresh per ``min_refresh_s``.

    ``http://`` URLs are refused unless ``insecure_http_for_tests`` is set.
    Raises ``ValueError`` for a bad URL at construction.
    """

    def __init__(
        self,
        trust_domain: str,
        url: str,
        *,
        default_refresh_s: float = 300.0,
        min_refresh_s: float = 5.0,
        max_refresh_s: float = 3600.0,
        retry_s: float = 5.0,
        max_stale_s: float = 3600.0,
        timeout_s: float = 5.0,
        ssl_context: ssl.SSLContext | None = None,
        allow_missing_use: bool = False,
        insecure_http_for_tests: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(trust_domain, max_stale_s=max_stale_s, clock=clock)
        parts = urlsplit(url)
        if parts.scheme != "https" and not (insecure_http_for_tests and parts.scheme == "http"):
            raise ValueError("bundle endpoint URL must use https")
        if not parts.hostname:
            raise ValueError("bundle endpoint URL has no host")
        self.url = url
        self.default_refresh_s = default_refresh_s
        self.min_refresh_s = min_refresh_s
        self.max_refresh_s = max_refresh_s
        self.retry_s = retry_s
        self.timeout_s = timeout_s
        self.allow_missing_use = allow_missing_use
        self._ssl: ssl.SSLContext = ssl_context if ssl_context is not None else client_context()
        self._session: aiohttp.ClientSession | None = None
        self._next_refresh: float = -math.inf

    def _refresh_due(self, now: float) -> bool:
        return now >= self._next_refresh

    def _on_success(self, now: float) -> None:
        hint = self._bundle.refresh_hint_s if self._bundle is not None else None
        period = self.default_refresh_s if not hint else hint
        self._next_refresh = now + min(max(period, self.min_refresh_s), self.max_refresh_s)

    def _on_failure(self, now: float) -> None:
        self._next_refresh = now + self.retry_s

    async def _load(self, now: float) -> TrustBundle | None:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s)
            )
        async with self._session.get(
            self.url, ssl=self._ssl, allow_redirects=False,
            headers={"Accept": "application/json"},
        ) as resp:
            if resp.status != 200:
                raise BundleError(f"bundle endpoint answered HTTP {resp.status}")
            body = await resp.content.read(MAX_BUNDLE_BYTES + 1)
        if len(body) > MAX_BUNDLE_BYTES:
            raise BundleError("bundle document larger than 1 MiB")
        return parse_bundle(self.trust_domain, body, allow_missing_use=self.allow_missing_use)

    async def refresh_for_unknown_kid(self) -> TrustBundle:
        """Refresh early, at most once per ``min_refresh_s``, else serve as usual.

        Goes through the refresh lock so that requests arriving while an early
        refresh is in flight wait for its result instead of failing.
        """
        return await self.refresh(min_gap_s=self.min_refresh_s)

    async def aclose(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None
