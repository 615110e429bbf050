"""Prefix keys: the tenant-keyed block-hash chains of a prompt, its audit fingerprint,
and the tenant's upstream ``cache_salt`` and ``user`` pseudonym (``tenancy.keys``).

Nothing here is a secret shown to anyone: chains stay in process, the
fingerprint is a truncated HMAC keyed per tenant (docs/tenancy.md).
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.identity import WorkloadIdentity
from tenancy.keys import KeyRing, PrefixChains
from tenancy.prefix import hmac_sha256
from tenancy.registry import Tenant

__all__ = ["ChainView", "PrefixKeys"]

_new_view = object.__new__


class ChainView:
    """The prefix chains of one request: ``current`` (indexed) and the
    previous key versions' chains (looked up only, during the rotation grace)."""

    __slots__ = ("current", "kid", "_prev")

    def __init__(self, chains: PrefixChains) -> None:
        self.current = chains.current
        self.kid = chains.kid
        prev = chains.previous
        self._prev = tuple([chain for _, chain in prev]) if prev else ()

    def previous_chains(self) -> tuple[tuple[bytes, ...], ...]:
        """Chains under older key versions still in their grace period."""
        return self._prev


class PrefixKeys:
    """The prefix-keys step over the key ring.

    ``block_size`` and ``max_prefix_blocks`` come from ``routing``;
    ``forward_user`` is the ``tenancy`` default of a tenant's ``forward_user``.
    """

    def __init__(self, keyring: KeyRing, *, block_size: int, max_prefix_blocks: int,
                 forward_user: str | None) -> None:
        self.keyring = keyring
        self.block_size = block_size
        self.max_prefix_blocks = max_prefix_blocks
        self.forward_user = forward_user

    def prefix_chains(self, tenant: Tenant, tokens: Sequence[int]) -> ChainView:
        """The tenant-keyed HMAC block-hash chains of ``tokens`` (current + grace versions)."""
        # at most max_prefix_blocks blocks: = tokens[:max_prefix_blocks * block_size], without the copy
        chains = self.keyring.prefix_chain(tenant.id, tokens, self.block_size, max_blocks=self.max_prefix_blocks)
        if chains.previous:  # a rotation in grace
            return ChainView(chains)
        view = _new_view(ChainView)  # = ChainView(chains) without a grace chain, without its __init__ call (s18)
        view.current, view.kid, view._prev = chains.current, chains.kid, ()
        return view

    @staticmethod
    def prefix_fingerprint(chains: ChainView) -> str | None:
        """A keyed, truncated (64-bit) fingerprint of the request's first full block.

        It is an HMAC of a chain key that is itself keyed per tenant, so two
        tenants' fingerprints of the same prompt never match; audit events use
        it to group requests of one tenant sharing a prefix, never raw hashes.
        """
        if not chains.current:
            return None
        return hmac_sha256(chains.current[0], b"pg-audit-fp-v1").hex()[:16]  # = hmac.new(...).hexdigest()

    def cache_salt(self, tenant: Tenant) -> str:
        """The tenant's upstream ``cache_salt`` (keyed, versioned; see docs/tenancy.md)."""
        return self.keyring.cache_salt(tenant.id)

    def upstream_user(self, tenant: Tenant, identity: WorkloadIdentity) -> str | None:
        """The ``user`` field sent upstream: None (dropped, the default) or the workload's stable pseudonym
        (``forward_user: pseudonym``, per tenant or in ``tenancy``); never the client's own value."""
        mode = tenant.forward_user or self.forward_user
        if mode != "pseudonym":
            return None
        return self.keyring.user_pseudonym(tenant.id, str(identity.spiffe_id))
