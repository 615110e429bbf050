"""Session 6 (issue 14): :meth:`tenancy.keys.KeyRing.lookup_keys` answers from a fast path when
no key version is in grace; the keys it returns are those of the full path through a rotation,
its grace period, another tenant's grace and a master rotation."""

from __future__ import annotations

from tenancy.keys import KeyRing


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _kids(ring: KeyRing, tenant: str) -> list[str]:
    return [k.kid for k in ring.lookup_keys(tenant)]


def test_lookup_keys_through_rotations_and_grace() -> None:
    clock = _Clock()
    ring = KeyRing(b"m" * 32, grace_s=10, clock=clock)
    first = ring.current("acme")
    assert _kids(ring, "acme") == [first.kid]
    new = ring.rotate_tenant("acme")
    assert _kids(ring, "acme") == [new.kid, first.kid]
    assert _kids(ring, "globex") == [ring.current("globex").kid]  # another tenant's grace changes nothing
    clock.t += 11
    assert _kids(ring, "acme") == [new.kid]  # the old version expired
    assert ring.lookup_keys("acme")[0] == ring.current("acme")
    if hasattr(ring, "rotate_master"):
        ring.rotate_master(b"n" * 32)
        kids = _kids(ring, "acme")
        assert kids[0] == ring.current("acme").kid and new.kid in kids
        clock.t += 11
        assert _kids(ring, "acme") == [ring.current("acme").kid]
