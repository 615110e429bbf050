"""Session 22, fixsec (S21-fixutf8-3): the shared ledger's totals (``RedisLedger.totals``, the operator's
read of every tenant's reserved / charged / refunded tokens) decoded the members of ``ledger:tenants`` with
a bare ``decode()`` and every totals field with ``int()``: one member that is not UTF-8, or one total that
is not a number, written into Redis (trusted for counters only) made the whole read raise. Now such a
member or tenant is skipped, counted (``RedisLedger.foreign_totals``) and logged once per read (tenant ids,
a foreign member only by its length); the other tenants' totals are still answered."""
from __future__ import annotations

import logging

import pytest

from tenancy.ledger import LedgerTotals
from tenancy.registry import Tenant
from tenancy.shared import SharedLimits
from tests.support.redis_server import LIMITS_PREFIX

FOREIGN_MEMBER = b"\xff\xfesecret-looking"


async def _two_tenants(limits: SharedLimits) -> None:
    for tid, prompt in (("acme", 7), ("globex", 11)):
        r = await limits.ledger.reserve(Tenant(id=tid), prompt, 3)
        r.settle(prompt, 2, "usage")
    await limits.flush()


def _totals_of(prompt: int) -> LedgerTotals:
    return LedgerTotals({"prompt": prompt, "output": 3}, {"prompt": prompt, "output": 2},
                        {"prompt": 0, "output": 1}, 0)


@pytest.mark.parametrize("bad_total", [b"12x", b"\xff", "\u00b2".encode(), b"-1", b"9" * 30],
                         ids=["not-digits", "not-utf8", "superscript-two", "negative", "over-2**64"])
async def test_a_foreign_member_or_total_is_skipped_and_the_rest_answered(
        limits: SharedLimits, clients, caplog: pytest.LogCaptureFixture, bad_total: bytes) -> None:
    await _two_tenants(limits)
    raw = clients[3]
    await raw.sadd(f"{LIMITS_PREFIX}ledger:tenants", FOREIGN_MEMBER)
    await raw.hset(f"{LIMITS_PREFIX}{{t:globex}}:led:tot", "charged_prompt", bad_total)
    await raw.hset(f"{LIMITS_PREFIX}{{t:acme}}:led:tot", b"\xfejunk", b"not a number")  # a field no one reads
    with caplog.at_level(logging.WARNING, logger="prefixgate"):
        totals = await limits.ledger.totals()  # before the fix: UnicodeDecodeError / ValueError
    assert dict(totals) == {"acme": _totals_of(7)}
    assert limits.ledger.foreign_totals == 2  # the member and globex's record
    assert len([r for r in caplog.records if r.name == "prefixgate.state"]) == 1  # one warning per read
    logged = caplog.text
    assert "secret-looking" not in logged and "\\xff" not in logged and "12x" not in logged
    assert "globex" in logged  # a tenant id is named; a foreign member only by its length
    assert await limits.ledger.totals() == {"acme": _totals_of(7)}  # every read answers, counted again
    assert limits.ledger.foreign_totals == 4


async def test_clean_totals_are_unchanged(limits: SharedLimits) -> None:
    await _two_tenants(limits)
    assert dict(await limits.ledger.totals()) == {"acme": _totals_of(7), "globex": _totals_of(11)}
    assert limits.ledger.foreign_totals == 0


async def test_a_foreign_total_alone_no_longer_raises(limits: SharedLimits) -> None:
    await _two_tenants(limits)
    await limits.client.hset(f"{LIMITS_PREFIX}{{t:acme}}:led:tot", "open", b"1e3")  # before: ValueError of int()
    assert dict(await limits.ledger.totals()) == {"globex": _totals_of(11)}
    assert limits.ledger.foreign_totals == 1
