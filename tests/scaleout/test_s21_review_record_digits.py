"""Session 21, review (S21-review-1): a shared-state record whose number field is not plain ASCII digits.

Redis is trusted for counters only (tenancy/shared_keys.py, gateway/shared_docs.py): a record it holds that no
key authenticates is ignored, counted and written over by the instance's own. The readers checked a number
field with ``str.isdigit()``, which is also true of ``"²"`` (superscript two) and of a run of more than 4,300
digits, on which ``int()`` raises ``ValueError`` (and 20 digits above 2**64 - 1, which the MAC's
``struct.pack('>Q')`` refuses): the record was then neither ignored nor written over but
raised out of ``_verify``, so one such value stalled every sync (all tenants' key records, the master
generation, the shared documents) and failed every publish over it (a rotation or a policy change not shared),
for as long as it stayed in Redis. Now such a field is "no number": the record counts as unauthenticated.
"""
from __future__ import annotations

import os

import pytest

from gateway.shared_docs import DOCS_MAC_INFO, SharedDocument, state_metrics
from tenancy.keys import KeyRing
from tenancy.shared_keys import MASTER_FIELD, SharedKeyState
from tenancy.shared_store import record_number
from tests.scaleout.s2_instances import PREFIX

MASTER = os.urandom(32)
#: number fields that ``str.isdigit()`` accepts and ``int()`` refuses (or that are not ASCII digits at all)
BAD_NUMBERS = ["\u00b2", "1\u00b2", "\u0663", "1" * 5000, "\uff11", "99999999999999999999"]


@pytest.mark.parametrize("text, value", [("0", 0), ("7", 7), ("18446744073709551615", (1 << 64) - 1),
                                         ("", None), ("-1", None), ("+1", None), (" 1", None), ("1.0", None),
                                         ("1" * 21, None)] + [(b, None) for b in BAD_NUMBERS])
def test_record_number_reads_plain_ascii_digits_only(text: str, value: int | None) -> None:
    assert record_number(text) == value


@pytest.mark.parametrize("bad", BAD_NUMBERS)
async def test_a_tenant_record_with_a_bad_number_is_ignored_and_written_over(clients, bad: str) -> None:
    a, b = KeyRing(MASTER), KeyRing(MASTER)
    sa, sb = SharedKeyState(clients[0], PREFIX, MASTER, a), SharedKeyState(clients[1], PREFIX, MASTER, b)
    a.rotate_tenant("acme")
    a.rotate_tenant("globex")
    await clients[2].hset(f"{PREFIX}keys:tenants", "acme", f"{bad}:0:" + "00" * 32)
    assert await sa.publish("acme")  # the bad record does not block a rotation's publish: written over
    assert await sa.publish("globex")
    await clients[2].hset(f"{PREFIX}keys:tenants", "junk", f"1:{bad}:" + "00" * 32)
    assert await sb.sync() == 2  # the other tenants' records are still adopted
    assert b.key_version("acme") == 2 and b.key_version("globex") == 2
    assert sb.rejected == 1  # the bad one counted as unauthenticated


@pytest.mark.parametrize("bad", BAD_NUMBERS)
async def test_a_master_record_with_a_bad_number_is_written_over(clients, bad: str) -> None:
    ring = KeyRing(MASTER)
    ring.rotate_tenant("acme")
    shared = SharedKeyState(clients[0], PREFIX, MASTER, ring)
    await clients[2].hset(f"{PREFIX}keys:tenants", MASTER_FIELD, f"{bad}:0:" + "00" * 32)
    assert await shared.sync() == 0
    assert shared.master_pending == 0 and shared.rejected == 1
    stored = await clients[2].hget(f"{PREFIX}keys:tenants", MASTER_FIELD)
    assert stored.startswith(b"1:0:")  # healed with this instance's generation
    assert (await clients[2].hget(f"{PREFIX}keys:tenants", "acme")).startswith(b"2:0:")


async def _noop(version: int, body: object) -> None:
    return None


@pytest.mark.parametrize("bad", BAD_NUMBERS)
async def test_a_shared_document_with_a_bad_version_is_ignored_and_written_over(clients, bad: str) -> None:
    key = KeyRing(MASTER).mac_subkeys(DOCS_MAC_INFO)[0]
    doc = SharedDocument(clients[0], PREFIX, "policy", key, lambda: 3, _noop, state_metrics(None),
                         local_body=lambda: {"rules": ["a"]})
    await clients[2].set(doc.key, f"{bad}:{'00' * 32}:{{}}")
    assert await doc.remote_version() == 0
    assert not await doc.sync()  # not adopted; healed with this instance's document
    assert doc.rejected == 1
    assert await doc.remote_version() == 3
    await clients[2].set(doc.key, f"{bad}:{'00' * 32}:{{}}")
    assert await doc.publish(4, {"rules": ["b"]})  # a change is not blocked by it
    assert await doc.remote_version() == 4
