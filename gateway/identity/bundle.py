"""The trust bundle store: trust domain name -> its :class:`TrustBundleSource`.

The verifier asks the store for a domain's bundle; the store finds the
domain's source (:mod:`gateway.identity.bundle_sources`), which holds the
parsed bundle (:mod:`gateway.identity.bundle_parse`). The store also fans
key-change listeners out to every source and names each domain's key
version (:meth:`TrustBundleStore.generation`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from .bundle_parse import TrustBundle, UnknownTrustDomain
from .bundle_sources import TrustBundleSource


class TrustBundleStore:
    """Trust domain name -> :class:`TrustBundleSource`.

    ``get(td)`` raises :class:`UnknownTrustDomain` for an unconfigured domain
    and :class:`BundleUnavailable` when its source has nothing usable.
    """

    def __init__(self, sources: Mapping[str, TrustBundleSource] | None = None) -> None:
        self._sources: dict[str, TrustBundleSource] = {}
        self._listeners: list[Callable[[str, int], None]] = []
        self._epochs: dict[str, int] = {}
        for td, src in (sources or {}).items():
            if td != src.trust_domain:
                raise ValueError(f"source for {src.trust_domain!r} registered under {td!r}")
            self.add(src)

    def add(self, source: TrustBundleSource) -> None:
        """Register (or replace) the source of ``source.trust_domain``.

        Store listeners (:meth:`add_listener`) are attached to it, and called
        once now: a replaced source is a changed bundle."""
        old = self._sources.get(source.trust_domain)
        self._sources[source.trust_domain] = source
        self._epochs[source.trust_domain] = self._epochs.get(source.trust_domain, -1) + 1
        for callback in self._listeners:
            source.add_listener(callback)
        if old is not None and old is not source:
            for callback in self._listeners:
                callback(source.trust_domain, source.generation)

    def add_listener(self, callback: Callable[[str, int], None]) -> None:
        """Call ``callback(trust_domain, generation)`` whenever a domain's keys
        change (every current and future source; see
        :meth:`TrustBundleSource.add_listener`)."""
        self._listeners.append(callback)
        for source in self._sources.values():
            source.add_listener(callback)

    def generation(self, trust_domain: str) -> tuple[int, int]:
        """An opaque version of ``trust_domain``'s keys: (how many times its
        source was replaced, the source's :attr:`~TrustBundleSource.generation`).
        Equal values mean the same keys. Raises :class:`UnknownTrustDomain`."""
        source = self.source(trust_domain)
        return (self._epochs[trust_domain], source.generation)

    def trust_domains(self) -> frozenset[str]:
        """The configured trust domain names."""
        return frozenset(self._sources)

    def source(self, trust_domain: str) -> TrustBundleSource:
        """The source of a trust domain; raises :class:`UnknownTrustDomain`."""
        try:
            return self._sources[trust_domain]
        except KeyError:
            raise UnknownTrustDomain(f"no trust bundle configured for {trust_domain}") from None

    async def get(self, trust_domain: str) -> TrustBundle:
        """The current bundle of ``trust_domain`` (refreshed if due)."""
        return await self.source(trust_domain).get()

    def current(self, trust_domain: str) -> TrustBundle | None:
        """The domain's bundle when no refresh is due (:meth:`TrustBundleSource.current`), else None.
        Raises :class:`UnknownTrustDomain` and, for a stale bundle, :class:`BundleUnavailable`."""
        return self.source(trust_domain).current()

    def current_keys(self, trust_domain: str, kid: str) -> tuple[TrustBundle, tuple[int, int]] | None:
        """``(bundle, generation)`` of ``trust_domain`` when no refresh is due and its bundle holds ``kid``, else
        None: :meth:`current` and :meth:`generation` in one call (issue 14, session 13: the verified-token
        cache hit asks the store once). Raises as :meth:`current` (:class:`UnknownTrustDomain`,
        :class:`BundleUnavailable` for a bundle stale past its bound)."""
        source = self._sources.get(trust_domain)
        if source is None:
            raise UnknownTrustDomain(f"no trust bundle configured for {trust_domain}")
        bundle = source.current()
        if bundle is None or bundle.keys.get(kid) is None:  # = bundle.get(kid), without its call (session 16)
            return None
        return bundle, (self._epochs[trust_domain], source.generation)

    async def refresh_for_unknown_kid(self, trust_domain: str) -> TrustBundle:
        """Give the domain's source a chance to pick up a rotated-in key."""
        return await self.source(trust_domain).refresh_for_unknown_kid()

    async def aclose(self) -> None:
        """Close every source."""
        for src in self._sources.values():
            await src.aclose()
