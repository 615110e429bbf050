"""Issue 16 / review R3-2 across instances: the early prompt-token debt check reads the SHARED bucket.

Before tokenizing, admission asks what the tenant's prompt-token bucket admits now
(``Admission.prompt_room``). With ``state.backend: redis`` that used to be ``None`` while
Redis answered (only the local view was read), so a tenant that ran its shared bucket into
debt through instance A had its huge prompts tokenized in full on instances B and C before
the reservation refused them. The admit script now returns the shared prompt bucket's level
in the same round trip; these tests run three gateways on one real ``redis-server``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.scaleout.test_s2_shared_admission import _redis, instances

RATE = 1 / 60  # one token a minute: the bucket does not refill during a test
LIMITS = {"prompt_tokens_per_s": RATE, "prompt_tokens_burst": 100}


def _words(n: int) -> str:
    return " ".join(f"w{i}" for i in range(n))


class _Spy:
    """Wraps a gateway's tokenizer: records (limit, ids produced) of each ``encode``."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.calls: list[tuple[int | None, int]] = []

    def encode(self, text: str, limit: int | None = None) -> list[int]:
        ids: list[int] = self.inner.encode(text, limit)
        self.calls.append((limit, len(ids)))
        return ids

    def max_text_bytes(self, tokens: int) -> int:
        return int(self.inner.max_text_bytes(tokens))

    def max_messages(self, tokens: int) -> int:
        return int(self.inner.max_messages(tokens))


def _spies(inst: Any) -> list[_Spy]:
    out = []
    for gw in inst.gateways:
        adm = gw.admission
        spy = _Spy(adm.tokenizer)
        adm.tokenizer = spy
        out.append(spy)
    return out


async def test_a_tenant_in_debt_through_one_instance_is_refused_untokenized_on_the_others(
        tmp_path: Path, redis_server) -> None:
    async with instances(tmp_path, _redis(redis_server.url), LIMITS) as inst:
        spies = _spies(inst)
        first = await inst.complete(0, prompt=_words(500))  # a full bucket admits it, into debt
        assert first.status_code == 200, first.text
        await inst.gateways[0].admission.limits.flush()  # its settlement is in Redis
        huge = _words(40_000)
        for i in (1, 2, 0):
            before = len(spies[i].calls)
            r = await inst.complete(i, prompt=huge)
            assert r.status_code == 429, (i, r.text)
            assert r.json()["error"]["code"] == "token_rate_limited"
            assert int(r.headers["Retry-After"]) >= 1
            assert spies[i].calls[before:] == [], (i, spies[i].calls[before:])  # nothing tokenized


async def test_the_tokenizing_limit_on_another_instance_is_the_shared_room(tmp_path: Path, redis_server) -> None:
    async with instances(tmp_path, _redis(redis_server.url), LIMITS) as inst:
        spies = _spies(inst)
        r = await inst.complete(0, prompt=_words(60))  # the shared bucket: 100 -> about 40
        assert r.status_code == 200, r.text
        await inst.gateways[0].admission.limits.flush()
        level = await inst.gateways[0].admission.ledger.level("tenant-lim", "prompt")
        assert level is not None and 30 <= level < 50, level
        for i in (1, 2):
            before = len(spies[i].calls)
            r = await inst.complete(i, prompt=_words(200))  # fits no room: early stop at the room
            assert r.status_code == 429 and r.json()["error"]["code"] == "token_rate_limited", r.text
            limits = [lim for lim, _ in spies[i].calls[before:]]
            assert limits and all(lim is not None and lim <= int(level) + 1 for lim in limits), limits
        before = len(spies[2].calls)
        r = await inst.complete(2, prompt=_words(5))  # within the room: admitted, counted exactly
        assert r.status_code == 200, r.text
        assert spies[2].calls[before:] and spies[2].calls[before][1] <= 10


def test_shared_room_refills_caps_and_follows_a_changed_limit() -> None:
    from tenancy.prompt_room import shared_room
    from tenancy.registry import Tenant

    t = Tenant(id="t", spiffe_ids=("spiffe://x.test/t/",), prompt_tokens_per_s=10.0, prompt_tokens_burst=100)
    room = shared_room(t, -50.0, 10.0, 100.0, 2.0)  # in debt, refilled 20 since the read
    assert room is not None and room.cap == 0 and room.level == -30.0 and room.wait_s(1) == 3.1
    assert shared_room(t, 95.0, 10.0, 100.0, 1.0) is None  # full again: any prompt (debt semantics)
    assert shared_room(t, 40.0, 10.0, 200.0, 0.0).cap == 40  # burst lowered to 100 by a reload
    assert shared_room(t, 150.0, 10.0, 200.0, 0.0) is None  # capped at the new burst: full
    unlimited = Tenant(id="u", spiffe_ids=("spiffe://x.test/u/",))
    assert shared_room(unlimited, -50.0, 10.0, 100.0, 0.0) is None
